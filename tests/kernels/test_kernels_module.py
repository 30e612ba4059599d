"""CPU-side checks of the `fluxon.kernels` Python surface (no GPU, no torch needed).

Run by ctest with PYTHONPATH holding the built extension and python/.
"""

import sys

from fluxon import kernels as fk

import _fluxon_kernels_testing as fkt  # the test support module (not shipped)


def main() -> int:
    failures = []

    def check(name, cond):
        if not cond:
            failures.append(name)
            print(f"FAIL {name}")

    layout = fk.KvLayout("mha", 36, 64, 1024)
    check("value bytes", layout.value_bytes == 4718592)
    check("chunk offset", layout.chunk_offset(1, 1) == 3 * 65536)
    check("mla buffers", fk.KvLayout("mla", 61, 64, 1152).buffers_per_layer == 1)
    for bad in (("mha", 0, 64, 1024), ("mla", 2, 1, 8), ("gqa", 2, 64, 1024)):
        try:
            fk.KvLayout(*bad)
            check(f"rejects {bad}", False)
        except ValueError:
            pass

    segment = fkt.TestSegment(1 << 20)
    arena = fk.PlanArena()
    plan = arena.issue_put([segment.base + segment.data_offset])
    check("plan in arena", arena.mapping()[1] <= plan < arena.mapping()[1] + arena.mapping()[2])
    try:
        arena.consume_get(plan)  # a put plan consumed as a get plan
        check("kind checked", False)
    except ValueError as e:
        check("kind message", "is a put plan" in str(e))
    arena.consume_put(plan)

    # Without a usable GPU registration must raise, never pretend.
    try:
        fk.register_host_mappings([segment.mapping(), arena.mapping()])
        gpu = True
    except RuntimeError:
        gpu = False
    print(f"registration {'succeeded (GPU present)' if gpu else 'failed hard as expected'}")
    print(f"torch available: {fk.torch_available()}")
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
