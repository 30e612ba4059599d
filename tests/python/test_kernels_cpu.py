"""fluxon.kernels from the installed wheel, on a machine without a GPU: the module imports
without torch and rejects bad layouts and registrations before touching CUDA."""

import pytest

kernels = pytest.importorskip("fluxon.kernels", reason="wheel built without CUDA")


def test_layout_arithmetic_and_validation():
    lay = kernels.KvLayout("mha", 36, 64, 4 * 128 * 2)
    assert lay.value_bytes == 4_718_592 // 2 or lay.value_bytes == 36 * 2 * 64 * 1024
    assert lay.chunk_bytes == 64 * 1024
    assert lay.layer_bytes == 2 * lay.chunk_bytes
    with pytest.raises(ValueError):
        kernels.KvLayout("mha", 0, 64, 1024)
    with pytest.raises(ValueError):
        kernels.KvLayout("gqa", 2, 64, 1024)


def test_registration_fails_hard_without_a_gpu():
    with pytest.raises((RuntimeError, ValueError)):
        kernels.register_host_mappings([("cpu:0", 4096, 4096)])
