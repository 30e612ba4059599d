"""The test stand-ins a launched SGLang server uses on the GPU machine (tests/gpu/standins).

They are harness only (never in the wheel). Checked here without torch or a GPU: the finder
serves its names only where no real package exists, unimplemented kernels raise when called,
CUTLASS placeholders survive module-level use, and every keyword SGLang passes to an implemented
function is a parameter of the stand-in (read from the pinned SGLang's source).
"""

import ast
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

STANDINS = Path(__file__).resolve().parents[1] / "gpu" / "standins"

pytestmark = pytest.mark.skipif(
    not STANDINS.exists(), reason="tests/gpu is not beside these tests (the installed-wheel run "
                                  "copies only tests/python; the build-tree run covers them)")


def _run(code: str, extra_path=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), *map(str, extra_path)])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_finder_serves_missing_packages_and_unimplemented_names_raise(tmp_path):
    # A torch module that is only a name: the stand-in's functions are not called here.
    (tmp_path / "torch.py").write_text("")
    r = _run("""
        import sgl_kernel
        from sgl_kernel import rmsnorm
        from sgl_kernel.kvcacheio import transfer_kv_direct, transfer_kv_per_layer
        from sgl_kernel.scalar_type import scalar_types
        assert rmsnorm.__module__ == "sgl_kernel_standin", rmsnorm.__module__
        assert transfer_kv_direct.__module__ == "sgl_kernel_standin"
        scalar_types.uint4b8  # attribute chains resolve at import time
        try:
            transfer_kv_per_layer(1, 2)
        except RuntimeError as e:
            assert "stand-in" in str(e)
        else:
            raise AssertionError("an unimplemented kernel did not raise")
        import cutlass, cutlass.cute as cute
        from cutlass.cute.runtime import from_dlpack
        @cute.experimental.jit
        def f(x):
            return x + 1
        assert f(1) == 2  # a decorator returns what it decorates
        class K(cute.Base):
            pass
        import cuda.bindings.driver as drv
        drv.CUstream
        for absent in ("flashinfer", "cuda.pathfinder_not_here"):
            try:
                __import__(absent)
            except ImportError:
                pass
            else:
                raise AssertionError(absent + " resolved")
        print("ok")
    """, [tmp_path])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_real_packages_win_over_the_stand_ins(tmp_path):
    real = tmp_path / "sgl_kernel"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    r = _run("import sgl_kernel; print(sgl_kernel.REAL)", [tmp_path])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def _standin_params():
    tree = ast.parse((STANDINS / "sgl_kernel_standin.py").read_text())
    exports = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", "") == "EXPORTS" for t in n.targets))
    params = {n.name: {a.arg for a in n.args.args + n.args.kwonlyargs}
              for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(exports) <= set(params), set(exports) - set(params)
    return {name: params[name] for name in exports}


def test_sglang_calls_match_the_stand_in_signatures():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed (scripts/install-deps.sh installs it)")
    root = Path(list(spec.submodule_search_locations)[0]) / "srt"
    params = _standin_params()
    calls = 0
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if not any(name in text for name in params):
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else None
            if name not in params:
                continue
            calls += 1
            used = {k.arg for k in node.keywords if k.arg}
            assert used <= params[name], f"{path}:{node.lineno}: {name} {used - params[name]}"
            assert len(node.args) <= len(params[name]), f"{path}:{node.lineno}: {name}"
    assert calls >= 5, calls
