"""Test harness only: the sgl_kernel functions a dense Llama calls in a launched SGLang server,
written in PyTorch (see sitecustomize.py beside this file).

The page copies keep the real kernels' shape of work: one asynchronous slice copy per run of
consecutive slots and layer on the current stream (`copy_(..., non_blocking=True)`), no device
synchronize, so the HiCache paths that use them are not slowed down by the stand-in.
"""
from __future__ import annotations

import torch

EXPORTS = (
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
    "is_arch_support_pdl",
)


def is_arch_support_pdl():
    """No programmatic dependent launch here: the stand-ins launch plain PyTorch ops."""
    return False


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * (weight.float() + offset)).to(x.dtype)


def _norm_into(input, weight, eps, out, offset):
    y = _rms(input, weight, eps, offset)
    if out is None:
        return y
    out.copy_(y)
    return out


def _fused_add_norm(input, residual, weight, eps, offset):
    """In place, as the real kernel: residual += input; input = rmsnorm(residual)."""
    residual.copy_((residual.float() + input.float()).to(residual.dtype))
    input.copy_(_rms(residual, weight, eps, offset))


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _norm_into(input, weight, eps, out, 0.0)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _fused_add_norm(input, residual, weight, eps, 0.0)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _norm_into(input, weight, eps, out, 1.0)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _fused_add_norm(input, residual, weight, eps, 1.0)


def _runs(src_indices: torch.Tensor, dst_indices: torch.Tensor):
    """(src start, dst start, length) of each run where both index lists step by one."""
    s = src_indices.to("cpu", torch.int64).tolist()
    d = dst_indices.to("cpu", torch.int64).tolist()
    if len(s) != len(d):
        raise ValueError("source and destination indices must have the same length")
    runs = []
    i = 0
    while i < len(s):
        j = i + 1
        while j < len(s) and s[j] == s[j - 1] + 1 and d[j] == d[j - 1] + 1:
            j += 1
        runs.append((s[i], d[i], j - i))
        i = j
    return runs


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    if len(src_layers) != len(dst_layers):
        raise ValueError("source and destination must have the same number of layers")
    if page_size <= 0 or src_indices.numel() % page_size:
        raise ValueError("indices must be whole pages")
    for s0, d0, n in _runs(src_indices, dst_indices):
        for src, dst in zip(src_layers, dst_layers):
            dst[d0:d0 + n].copy_(src[s0:s0 + n], non_blocking=True)


def _page_first_copies(pf, lf, pf_indices, lf_indices, page_size, start_layer):
    """Pairs (page-first view, layer-first slice) of every page and layer of a direct copy."""
    if pf_indices.numel() % page_size:
        raise ValueError("indices must be whole pages")
    pfi = pf_indices.to("cpu", torch.int64).tolist()[::page_size]
    lfi = lf_indices.to("cpu", torch.int64).tolist()[::page_size]
    is_mla = len(pf) == 1
    layers = len(lf) if is_mla else len(lf) // 2
    for p, l in zip(pfi, lfi):
        page = p // page_size
        for j in range(layers):
            yield pf[0][page][start_layer + j], lf[j][l:l + page_size]
            if not is_mla:
                yield pf[1][page][start_layer + j], lf[j + layers][l:l + page_size]


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id,
                                       page_size):
    for pf_view, lf_view in _page_first_copies(src_ptrs, dst_ptrs, src_indices, dst_indices,
                                               page_size, layer_id):
        lf_view.copy_(pf_view, non_blocking=True)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    for pf_view, lf_view in _page_first_copies(dst_ptrs, src_ptrs, dst_indices, src_indices,
                                               page_size, 0):
        pf_view.copy_(lf_view, non_blocking=True)
