"""End to end on the GPU machine: a real fluxond (embedded master + owner) and client processes.

put_start -> kernel write from GPU KV buffers -> commit -> get_start -> get_transfer -> kernel
restore into other GPU buffers -> release_views -> byte-exact compare; the same for one layer at a
time, for MHA and MLA; and a second client process restoring what the first one wrote (both on
the same segment). Prints a table and exits 0 only when every check passed.

Usage: FLUXOND=path/to/fluxond python3 tests/gpu/test_e2e_fluxond.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile

import torch

import fluxon
from fluxon import kernels as fk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_harness import Checks, start_daemon, stop_daemon  # noqa: E402

PAGE = 64
DEVICE_PAGES = 256
check = Checks()


def make_cache(attention, layers, row_elems, dtype, registration, poison=None):
    def buf():
        t = torch.empty(DEVICE_PAGES * PAGE, row_elems, dtype=dtype, device="cuda")
        if poison is None:
            t.view(torch.uint8).random_(0, 256)
        else:
            t.view(torch.uint8).fill_(poison)
        return t
    k = [buf() for _ in range(layers)]
    v = [buf() for _ in range(layers)] if attention == "mha" else None
    return fk.TorchKvCache(k, v, PAGE, registration=registration), k, v


def pages_of(bufs, idx):
    return [b.view(DEVICE_PAGES, PAGE, -1)[idx].view(torch.uint8) for b in bufs]


def round_trip(client, registration, attention, dtype, n_pages, layer_wise, tag):
    layers, row = (6, 8 * 128) if attention == "mha" else (6, 576)
    src, k, v = make_cache(attention, layers, row, dtype, registration)
    dst, k2, v2 = make_cache(attention, layers, row, dtype, registration, poison=0x5A)
    value_len = src.layout.value_bytes
    keys = [f"{tag}-{i}" for i in range(n_pages)]
    src_idx = torch.randperm(DEVICE_PAGES, device="cuda")[:n_pages]
    dst_idx = torch.randperm(DEVICE_PAGES, device="cuda")[:n_pages]
    plan = client.local_fast_put_start(keys, value_len)
    src.write(plan, src_idx)
    torch.cuda.synchronize()
    src.take_device_errors()
    client.local_fast_put_commit(plan).wait(timeout=30)
    h = client.get_start(keys)
    assert h.result.all_hit, h.result
    gplan = client.get_transfer(h)
    if layer_wise:
        for layer in range(layers):
            dst.restore(gplan, dst_idx, layer_id=layer)
    else:
        dst.restore(gplan, dst_idx)
    torch.cuda.synchronize()
    dst.take_device_errors()
    client.release_views(gplan)
    for a, b in zip(pages_of(k, src_idx) + pages_of(v or [], src_idx),
                    pages_of(k2, dst_idx) + pages_of(v2 or [], dst_idx)):
        assert torch.equal(a, b), "restored bytes differ"
    untouched = torch.ones(DEVICE_PAGES, dtype=torch.bool, device="cuda")
    untouched[dst_idx] = False
    for b in k2 + (v2 or []):
        assert bool((b.view(DEVICE_PAGES, -1).view(torch.uint8)[untouched] == 0x5A).all()), \
            "a page outside the batch was written"
    return keys, value_len


def child_restore(sock, keys, expected_path, q):
    try:
        import torch as t
        import fluxon as fx
        from fluxon import kernels as k
        c = fx.KvClient(socket_path=sock)
        segs = c.wait_local_segments_ready()
        arena = c.plan_arena()
        reg = k.register_host_mappings(
            [(s["segment_label"], s["write_ptr"], s["len"]) for s in segs] +
            [("plan_arena", arena[0], arena[1])])
        expected = t.load(expected_path)
        layers, n = len(expected["k"]), len(keys)
        bufs = [t.full((DEVICE_PAGES * PAGE, expected["k"][0].shape[-1]), 0, dtype=t.uint8,
                       device="cuda") for _ in range(2 * layers)]
        cache = k.TorchKvCache(bufs[:layers], bufs[layers:], PAGE, registration=reg)
        h = c.get_start(keys)
        if not h.result.all_hit:
            q.put(f"miss {h.result}")
            return
        plan = c.get_transfer(h)
        idx = t.arange(n, device="cuda")
        cache.restore(plan, idx)
        t.cuda.synchronize()
        c.release_views(plan)
        for layer in range(layers):
            got_k = bufs[layer].view(DEVICE_PAGES, PAGE, -1)[:n].cpu()
            got_v = bufs[layers + layer].view(DEVICE_PAGES, PAGE, -1)[:n].cpu()
            if not (t.equal(got_k, expected["k"][layer]) and t.equal(got_v, expected["v"][layer])):
                q.put("bytes differ")
                return
        q.put("ok")
    except Exception as e:  # noqa: BLE001
        q.put(f"error {e!r}")


def main() -> int:
    tmp = tempfile.mkdtemp(prefix="fxe2e", dir="/tmp")
    proc, sock = start_daemon(tmp)
    try:
        client = fluxon.KvClient(socket_path=sock)
        segs = client.wait_local_segments_ready()
        arena = client.plan_arena()
        reg = fk.register_host_mappings(
            [(s["segment_label"], s["write_ptr"], s["len"]) for s in segs] +
            [("plan_arena", arena[0], arena[1])])
        n = 0
        for attention, dtype in (("mha", torch.bfloat16), ("mla", torch.float16),
                                 ("mha", torch.float8_e4m3fn)):
            for pages in (1, 16, 128):
                for layer_wise in (False, True):
                    n += 1
                    name = f"{attention} {str(dtype).split('.')[-1]} {pages} pages " + \
                           ("layer-wise" if layer_wise else "all layers")
                    check(name, lambda a=attention, d=dtype, p=pages, lw=layer_wise, i=n:
                          round_trip(client, reg, a, d, p, lw, f"e2e{i}"))

        def two_processes():
            layers = 4
            src, k, v = make_cache("mha", layers, 8 * 128, torch.bfloat16, reg)
            keys = [f"xproc-{i}" for i in range(32)]
            idx = torch.randperm(DEVICE_PAGES, device="cuda")[:32]
            plan = client.local_fast_put_start(keys, src.layout.value_bytes)
            src.write(plan, idx)
            torch.cuda.synchronize()
            client.local_fast_put_commit(plan).wait(timeout=30)
            expected = {"k": [b.view(DEVICE_PAGES, PAGE, -1)[idx].view(torch.uint8).cpu() for b in k],
                        "v": [b.view(DEVICE_PAGES, PAGE, -1)[idx].view(torch.uint8).cpu() for b in v]}
            path = os.path.join(tmp, "expected.pt")
            torch.save(expected, path)
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            procs = [ctx.Process(target=child_restore, args=(sock, keys, path, q)) for _ in range(2)]
            for p in procs:
                p.start()
            answers = [q.get(timeout=120) for _ in procs]
            for p in procs:
                p.join(timeout=60)
            assert answers == ["ok", "ok"], answers

        check("two client processes restore another's pages", two_processes)

        def baseline():
            s = client.stats()
            for key in ("live_handles", "live_views", "prepared_puts", "slots_Prepared",
                        "slots_PendingLocalVisible", "client_active_plans", "client_handles"):
                assert s[key] == 0, (key, s[key])

        check("owner and client counters back to baseline", baseline)
        reg.close()
    finally:
        stop_daemon(proc, tmp)
    return check.report("fluxond end-to-end on the GPU")


if __name__ == "__main__":
    sys.exit(main())
