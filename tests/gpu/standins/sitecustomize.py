"""Test harness only: stand-ins for compiled packages a launched SGLang server imports.

Put this folder on PYTHONPATH of a test that launches `python -m sglang.launch_server` (and of
every process it spawns: they inherit the environment). Nothing in the fluxon wheel imports it.

The GPU machine cannot load SGLang's kernel wheel (`sgl_kernel`, pinned to another torch) or the
CUTLASS DSL (too large to carry). A finder placed *last* on `sys.meta_path` serves these names
only when no real package was found:

- `sgl_kernel` and its submodules: the functions a dense Llama calls at run time, written in
  PyTorch (`sgl_kernel_standin.py`: RMSNorm and the `direct` host<->device page copies, which
  issue the same asynchronous slice copies as the real ones); every other name resolves, and
  raises when called.
- `cutlass` and `cuda.bindings`: imported by kernels for SM100 that never run on this GPU;
  every name resolves and calls return a placeholder (a decorator returns what it decorates).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    """Stands for any CUTLASS object at import time."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]  # used as a decorator
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, item):
        return _Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _Missing:
    """An sgl_kernel name the stand-in does not implement: resolves, raises when called."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} called, but sgl_kernel is a test stand-in here")

    def __mro_entries__(self, bases):
        return (object,)


def _implemented():
    import sgl_kernel_standin  # beside this file

    return sgl_kernel_standin


class _StandInModule(types.ModuleType):
    def __init__(self, name, kind):
        super().__init__(name)
        self.__path__ = []  # a package: any submodule can be imported
        self.__file__ = f"<stand-in {name}>"
        self._kind = kind

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if self._kind == "sgl_kernel":
            impl = _implemented()
            if attr in impl.EXPORTS:
                return getattr(impl, attr)
            return _Missing(f"{self.__name__}.{attr}")
        return _Placeholder(f"{self.__name__}.{attr}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    ROOTS = {"sgl_kernel": "sgl_kernel", "cutlass": "cutlass", "cuda": "cuda"}

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root not in self.ROOTS:
            return None
        if root == "cuda" and fullname != "cuda" and not fullname.startswith("cuda.bindings"):
            return None  # only cuda.bindings is stood in for; other cuda.* stay real or absent
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StandInModule(spec.name, self.ROOTS[spec.name.split(".")[0]])

    def exec_module(self, module):
        pass


sys.meta_path.append(_StandInFinder())
