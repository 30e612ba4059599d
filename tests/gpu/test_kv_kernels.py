"""GPU correctness tests of the hostless data plane (run on the GPU machine by scripts/gpu-run.sh).

Values live in a real memfd Segment (MAP_SHARED) and plans are real PlanRegistry blobs, both
registered through the registration helper. Every check uses fresh random data and random page
indices, poisons the destination first, and compares byte for byte with a torch reference; pages
that must not be touched are checked to still hold the poison.

Usage: python3 tests/gpu/test_kv_kernels.py [--quick] [--bulk]
Exit status 0 only when every check passed; a table of results is printed last.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time
import traceback

import numpy as np
import torch

from fluxon import kernels as fk

# The test support module (a real Segment and PlanRegistry; not shipped): carried beside this file.
import _fluxon_kernels_testing as fkt

POISON_VALUE = 0xA5
POISON_DEVICE = 0x5A
DEVICE_PAGES = 256
SLOTS = 512
SLOT_ALIGN = 4096


class Env:
    def __init__(self, max_value_bytes: int):
        self.slot_bytes = (max_value_bytes + SLOT_ALIGN - 1) // SLOT_ALIGN * SLOT_ALIGN
        self.segment = fkt.TestSegment(self.slot_bytes * SLOTS)
        self.arena = fk.PlanArena(1 << 20)
        self.registration = fk.register_host_mappings(
            [self.segment.mapping(), self.arena.mapping()])
        raw = (ctypes.c_uint8 * self.segment.total_bytes).from_address(self.segment.base)
        self.host = torch.from_numpy(np.ctypeslib.as_array(raw))  # aliases the segment
        self.data = self.segment.base + self.segment.data_offset

    def random_slots(self, n: int, value_bytes: int):
        slots = torch.randperm(SLOTS)[:n].tolist()
        return [self.data + s * self.slot_bytes for s in slots]

    def value_view(self, value_ptr: int, value_bytes: int) -> torch.Tensor:
        off = value_ptr - self.segment.base
        return self.host[off:off + value_bytes]


HOST_LOADS = ["streaming", "prefetch256", "bypass"]  # restore load variants, rotated over batches
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


class Pool:
    """A SGLang layer_first pool: per layer K and V (MHA) or KV (MLA) of [tokens, row]."""

    def __init__(self, attention: str, layers: int, page: int, row_elems: int, dtype):
        self.attention, self.layers, self.page, self.dtype = attention, layers, page, dtype
        tokens = DEVICE_PAGES * page
        nbuf = 2 if attention == "mha" else 1
        self.bufs = [[torch.empty(tokens, row_elems, dtype=dtype, device="cuda")
                      for _ in range(layers)] for _ in range(nbuf)]

    def randomize(self):
        for side in self.bufs:
            for b in side:
                b.copy_(torch.randn(b.shape, device="cuda").to(self.dtype))

    def poison(self):
        for side in self.bufs:
            for b in side:
                b.view(torch.uint8).fill_(POISON_DEVICE)

    def k(self):
        return self.bufs[0]

    def v(self):
        return self.bufs[1] if self.attention == "mha" else None

    def page_bytes(self, layer: int, side: int, page_index: int) -> torch.Tensor:
        b = self.bufs[side][layer]
        return b[page_index * self.page:(page_index + 1) * self.page].view(torch.uint8).flatten()

    def reference_value(self, page_index: int, layers=None) -> torch.Tensor:
        """The value bytes of one page per the documented layout (torch reference)."""
        parts = []
        for layer in (range(self.layers) if layers is None else layers):
            for side in range(len(self.bufs)):
                parts.append(self.page_bytes(layer, side, page_index))
        return torch.cat(parts).cpu()


class Checks:
    def __init__(self):
        self.rows = []  # (group, name, ok, detail)

    def add(self, group, name, ok, detail=""):
        self.rows.append((group, name, bool(ok), detail))
        if not ok:
            print(f"FAIL {group} {name} {detail}", flush=True)

    def run(self, group, name, fn):
        try:
            ok, detail = fn()
        except Exception as e:  # a crash is a failure with its message
            traceback.print_exc()
            ok, detail = False, f"{type(e).__name__}: {e}"
        self.add(group, name, ok, detail)


def expect_raises(fn, exc, needle):
    try:
        fn()
    except exc as e:
        return needle in str(e), str(e)[:160]
    except Exception as e:  # wrong exception type
        return False, f"{type(e).__name__}: {e}"
    return False, "no exception"


def untouched_pages_poisoned(pool: Pool, written: set) -> bool:
    mask = torch.ones(DEVICE_PAGES, dtype=torch.bool)
    if written:
        mask[list(written)] = False
    keep = mask.nonzero().flatten().tolist()
    if not keep:
        return True
    for side in pool.bufs:
        for b in side:
            pages = b.view(torch.uint8).view(DEVICE_PAGES, -1)[keep]
            if not bool((pages == POISON_DEVICE).all()):
                return False
    return True


def layer_pages_match(dst: Pool, src: Pool, dst_idx, src_idx, layers) -> bool:
    for layer in layers:
        for side in range(len(src.bufs)):
            a = dst.bufs[side][layer].view(torch.uint8).view(DEVICE_PAGES, -1)[dst_idx]
            b = src.bufs[side][layer].view(torch.uint8).view(DEVICE_PAGES, -1)[src_idx]
            if not torch.equal(a, b):
                return False
    return True


def layer_pages_poisoned(dst: Pool, dst_idx, layers) -> bool:
    for layer in layers:
        for side in range(len(dst.bufs)):
            a = dst.bufs[side][layer].view(torch.uint8).view(DEVICE_PAGES, -1)[dst_idx]
            if not bool((a == POISON_DEVICE).all()):
                return False
    return True


def run_case(env: Env, checks: Checks, shape, dtype_name: str, batch: int, sm_budget: int,
             bulk: bool, host_load: str):
    name, attention, layers, page, row_elems = shape
    dtype = DTYPES[dtype_name]
    src = Pool(attention, layers, page, row_elems, dtype)
    dst = Pool(attention, layers, page, row_elems, dtype)
    src.randomize()
    # Small staging groups so the staged path cycles its slots many times.
    kv_src = fk.TorchKvCache(src.k(), src.v(), page, env.arena, env.registration,
                             staging_group_pages=4)
    kv_dst = fk.TorchKvCache(dst.k(), dst.v(), page, env.arena, env.registration,
                             staging_group_pages=4, staging_slots=3)
    layout = kv_src.layout
    vb = layout.value_bytes
    group = f"{name} {dtype_name} n={batch}"
    stream = torch.cuda.current_stream()
    cfg = dict(sm_budget=sm_budget, bulk_copy=bulk, host_load=host_load)

    src_idx = torch.randperm(DEVICE_PAGES)[:batch]
    dst_idx = torch.randperm(DEVICE_PAGES)[:batch]
    src_idx_d, dst_idx_d = src_idx.cuda(), dst_idx.cuda()
    values = env.random_slots(batch, vb)
    ref = torch.stack([src.reference_value(int(i)) for i in src_idx])

    def values_equal(expected) -> bool:
        got = torch.stack([env.value_view(v, vb) for v in values])
        return torch.equal(got, expected)

    def poison_values():
        for v in values:
            env.value_view(v, vb).fill_(POISON_VALUE)

    @contextlib.contextmanager
    def plan(kind, kv):
        """A put or get plan over `values` for the block's launches on `kv`; after them the
        stream is drained, device errors raise, and the plan is retired (also on failure)."""
        issued = env.arena.issue_put(values) if kind == "put" else env.arena.issue_get(values)
        ok = False
        try:
            yield issued
            ok = True
        finally:
            stream.synchronize()
            if ok:
                kv.take_device_errors()
            (env.arena.consume_put if kind == "put" else env.arena.consume_get)(issued)

    # Kernel write (backup): all layers of each page -> values.
    def write():
        poison_values()
        with plan("put", kv_src) as put:
            kv_src.write(put, src_idx_d, **cfg)
        return values_equal(ref), ""
    checks.run(group, "kernel write", write)

    # Kernel restore (all layers) into other, poisoned pages.
    def restore():
        dst.poison()
        with plan("get", kv_dst) as get:
            kv_dst.restore(get, dst_idx_d, **cfg)
        ok = layer_pages_match(dst, src, dst_idx, src_idx, range(layers))
        return ok and untouched_pages_poisoned(dst, set(dst_idx.tolist())), ""
    checks.run(group, "kernel restore", restore)

    # Layer-wise restore, one layer at a time as the forward pass would.
    def restore_layers():
        dst.poison()
        ok = True
        mid = layers // 2
        with plan("get", kv_dst) as get:
            for layer in range(layers):
                kv_dst.restore(get, dst_idx_d, layer_id=layer, **cfg)
                if layer == mid:
                    stream.synchronize()
                    ok &= layer_pages_match(dst, src, dst_idx, src_idx, range(mid + 1))
                    ok &= layer_pages_poisoned(dst, dst_idx, range(mid + 1, layers))
        ok &= layer_pages_match(dst, src, dst_idx, src_idx, range(layers))
        return ok and untouched_pages_poisoned(dst, set(dst_idx.tolist())), ""
    checks.run(group, "layer-wise restore", restore_layers)

    # Host rewrites the same slots (as a slot reuse would), then restore again: no stale bytes.
    def host_rewrite():
        fresh = torch.randint(0, 256, (batch, vb), dtype=torch.uint8)
        for i, v in enumerate(values):
            env.value_view(v, vb).copy_(fresh[i])
        dst.poison()
        with plan("get", kv_dst) as get:
            kv_dst.restore(get, dst_idx_d, **cfg)
        got = torch.stack([dst.reference_value(int(i)) for i in dst_idx])
        return torch.equal(got, fresh), ""
    checks.run(group, "restore after host rewrite", host_rewrite)

    # Copy-engine path, both directions.
    def ce_write():
        poison_values()
        with plan("put", kv_src) as put:
            kv_src.copy_engine("write", put, src_idx, num_streams=2)
        return values_equal(ref), ""
    checks.run(group, "copy-engine write", ce_write)

    def ce_restore():
        dst.poison()
        layer = layers - 1
        with plan("get", kv_dst) as get:
            kv_dst.copy_engine("restore", get, dst_idx, num_streams=3)
            stream.synchronize()
            ok = layer_pages_match(dst, src, dst_idx, src_idx, range(layers))
            # and one layer alone
            dst.poison()
            kv_dst.copy_engine("restore", get, dst_idx, layer_id=layer)
        ok &= layer_pages_match(dst, src, dst_idx, src_idx, [layer])
        ok &= layer_pages_poisoned(dst, dst_idx, range(layer))
        return ok and untouched_pages_poisoned(dst, set(dst_idx.tolist())), ""
    checks.run(group, "copy-engine restore", ce_restore)

    # Staged copy-engine path (copy engine + gather/scatter kernel), both directions.
    def staged_write():
        poison_values()
        with plan("put", kv_src) as put:
            kv_src.copy_staged("write", put, src_idx_d, sm_budget=sm_budget)
        return values_equal(ref), ""
    checks.run(group, "staged write", staged_write)

    def staged_restore():
        dst.poison()
        layer = int(torch.randint(0, layers, (1,)))
        with plan("get", kv_dst) as get:
            kv_dst.copy_staged("restore", get, dst_idx_d, sm_budget=sm_budget)
            stream.synchronize()
            ok = layer_pages_match(dst, src, dst_idx, src_idx, range(layers))
            dst.poison()
            kv_dst.copy_staged("restore", get, dst_idx_d, layer_id=layer, sm_budget=sm_budget)
        ok &= layer_pages_match(dst, src, dst_idx, src_idx, [layer])
        others = [x for x in range(layers) if x != layer]
        ok &= layer_pages_poisoned(dst, dst_idx, others)
        return ok and untouched_pages_poisoned(dst, set(dst_idx.tolist())), f"layer {layer}"
    checks.run(group, "staged restore", staged_restore)


    # Staged with several copy streams and without host indices (the kernel checks the range).
    def staged_multi_stream():
        poison_values()
        with plan("put", kv_src) as put:
            kv_src.plane.copy_staged("write", put, src_idx_d.data_ptr(), None, stream.cuda_stream,
                                     sm_budget=sm_budget, copy_streams=3, num_pages=batch)
        ok = values_equal(ref)
        dst.poison()
        with plan("get", kv_dst) as get:
            kv_dst.plane.copy_staged("restore", get, dst_idx_d.data_ptr(), None,
                                     stream.cuda_stream, sm_budget=sm_budget, copy_streams=4,
                                     num_pages=batch)
        ok &= layer_pages_match(dst, src, dst_idx, src_idx, range(layers))
        return ok and untouched_pages_poisoned(dst, set(dst_idx.tolist())), ""
    checks.run(group, "staged, copy streams, no host indices", staged_multi_stream)

    # RestoreLayers, as the SGLang linker drives it: the batch split into two get plans, layers
    # enqueued in chunks (continues=True after the first), an event per layer; each layer's
    # bytes are checked once its event fired while later layers may still be poisoned.
    def restore_layer_calls(path):
        def check():
            dst.poison()
            half = max(1, batch // 2)
            parts = [(values[:half], dst_idx_d[:half]), (values[half:], dst_idx_d[half:])]
            parts = [p for p in parts if p[0]]
            gets = [(env.arena.issue_get(v), idx) for v, idx in parts]
            reqs = [(g, int(idx.data_ptr()), len(v)) for (g, idx), (v, _) in zip(gets, parts)]
            events = fk.LayerEvents(layers)
            side = torch.cuda.Stream()
            side.wait_stream(stream)
            chunk = 3
            for begin in range(0, layers, chunk):
                count = min(chunk, layers - begin)
                kv_dst.plane.restore_layers(reqs, begin, events, begin, count, side.cuda_stream,
                                            path=path, sm_budget=sm_budget, copy_streams=3,
                                            continues=begin > 0)
            events.synchronize(0)
            ok = layer_pages_match(dst, src, dst_idx, src_idx, [0])
            for layer in range(layers):
                events.synchronize(layer)
            ok &= all(events.query(layer) for layer in range(layers))
            side.synchronize()
            kv_dst.take_device_errors()
            for g, _ in gets:
                env.arena.consume_get(g)
            ok &= layer_pages_match(dst, src, dst_idx, src_idx, range(layers))
            return ok and untouched_pages_poisoned(dst, set(dst_idx.tolist())), f"{len(reqs)} plans"
        return check
    checks.run(group, "restore_layers (kernel)", restore_layer_calls("kernel"))
    checks.run(group, "restore_layers (staged)", restore_layer_calls("staged"))


def run_errors(env: Env, checks: Checks):
    group = "errors"
    pool = Pool("mha", 2, 16, 256, torch.bfloat16)
    pool.randomize()
    kv = fk.TorchKvCache(pool.k(), pool.v(), 16, env.arena, env.registration)
    vb = kv.layout.value_bytes
    values = env.random_slots(4, vb)
    idx = torch.tensor([0, 5, 7, 9], device="cuda")
    s = torch.cuda.current_stream()

    put = env.arena.issue_put(values)
    get = env.arena.issue_get(values)
    checks.run(group, "put plan passed to restore", lambda: expect_raises(
        lambda: kv.restore(put, idx), ValueError, "is a put plan, expected a get plan"))
    checks.run(group, "get plan passed to write", lambda: expect_raises(
        lambda: kv.write(get, idx), ValueError, "is a get plan, expected a put plan"))
    checks.run(group, "plan count != page indices", lambda: expect_raises(
        lambda: kv.restore(get, idx[:3]), ValueError, "plan holds 4 values but 3 page indices"))
    checks.run(group, "layer id out of range", lambda: expect_raises(
        lambda: kv.restore(get, idx, layer_id=2), ValueError, "outside the layout's 2 layers"))
    checks.run(group, "sm budget 0", lambda: expect_raises(
        lambda: kv.restore(get, idx, sm_budget=0), ValueError, "sm_budget 0"))
    checks.run(group, "null page indices", lambda: expect_raises(
        lambda: kv.plane.restore_pages(get, 0, 4, 0), ValueError, "device_page_indices is null"))
    checks.run(group, "misaligned page indices", lambda: expect_raises(
        lambda: kv.plane.restore_pages(get, idx.data_ptr() + 4, 4, 0), ValueError,
        "not 8-byte aligned"))
    checks.run(group, "page out of range (host check)", lambda: expect_raises(
        lambda: kv.plane.restore_pages(get, idx.data_ptr(), 4, 0,
                                       host_page_indices=[0, 5, 7, 999]),
        ValueError, "page index 999 at position 3"))
    checks.run(group, "page out of range (copy engine)", lambda: expect_raises(
        lambda: kv.copy_engine("restore", get, [0, 5, 7, 256]), ValueError, "page index 256"))
    checks.run(group, "staged path not configured", lambda: expect_raises(
        lambda: kv.copy_staged("restore", get, idx), RuntimeError, "not configured"))
    def pages_from_slots():
        page = 16
        rows = [torch.arange(p * page, (p + 1) * page) for p in (3, 0, 7, 2)]
        rows[2] = rows[2].clone()
        rows[2][5] += 1  # not consecutive
        rows[3] = rows[3] + 1  # not aligned
        ok = True
        for dtype in (torch.int64, torch.int32):
            slots = torch.cat(rows).to(dtype).cuda()
            out = torch.full((4,), 99, dtype=torch.int64, device="cuda")
            fk.pages_from_slots(slots.data_ptr(), slots.element_size(), slots.numel(), page,
                                out.data_ptr(), s.cuda_stream)
            s.synchronize()
            ok &= out.tolist() == [3, 0, -1, -1]
        return ok, ""
    checks.run(group, "pages_from_slots (whole, broken, unaligned rows)", pages_from_slots)
    def by_token_slots():
        # The kernel path given token slots instead of page indices: it derives each page from
        # its slot row in the same launch (write, then restore into a second pool), skips a row
        # that is not one whole, aligned page and reports it.
        page = 16
        dst = Pool("mha", 2, page, 256, torch.bfloat16)
        dkv = fk.TorchKvCache(dst.k(), dst.v(), page, env.arena, env.registration)
        vals = env.random_slots(3, vb)
        src_pages, dst_pages = [4, 1, 11], [2, 9, 6]
        ok, why = True, []
        for dtype in (torch.int64, torch.int32):
            dst.poison()
            w = env.arena.issue_put(vals)
            slots = torch.cat([torch.arange(p * page, (p + 1) * page) for p in src_pages])
            slots = slots.to(dtype).cuda()
            kv.plane.write_pages(w, 0, 3, s.cuda_stream, token_slots_ptr=slots.data_ptr(),
                                 token_slot_bytes=slots.element_size(), page_size=page)
            s.synchronize()
            kv.plane.take_device_errors()
            env.arena.consume_put(w)
            g = env.arena.issue_get(vals)
            rows = [torch.arange(p * page, (p + 1) * page) for p in dst_pages]
            rows[2] = rows[2] + 1  # not aligned: page skipped and reported
            dslots = torch.cat(rows).to(dtype).cuda()
            dkv.plane.restore_pages(g, 0, 3, s.cuda_stream, token_slots_ptr=dslots.data_ptr(),
                                    token_slot_bytes=dslots.element_size(), page_size=page)
            s.synchronize()
            reported = expect_raises(dkv.plane.take_device_errors, RuntimeError,
                                     "page index was outside")
            env.arena.consume_get(g)
            good = layer_pages_match(dst, pool, [2, 9], [4, 1], range(2))
            skipped = layer_pages_poisoned(dst, [6], range(2))
            ok &= good and skipped and reported[0]
            why.append(f"{dtype}: restored {good}, skipped {skipped}, reported {reported}")
        return ok, "; ".join(why)[:300]
    checks.run(group, "write and restore by token slots (int64, int32)", by_token_slots)
    islots = torch.arange(0, 4 * 16, dtype=torch.int64, device="cuda")
    checks.run(group, "token slots and page indices both given", lambda: expect_raises(
        lambda: kv.plane.restore_pages(get, idx.data_ptr(), 4, 0, token_slots_ptr=islots.data_ptr(),
                                       token_slot_bytes=8, page_size=16), ValueError, "not both"))
    checks.run(group, "token slots of 2 bytes", lambda: expect_raises(
        lambda: kv.plane.restore_pages(get, 0, 4, 0, token_slots_ptr=islots.data_ptr(),
                                       token_slot_bytes=2, page_size=16), ValueError,
        "int32 or int64"))
    checks.run(group, "token slots with page size 0", lambda: expect_raises(
        lambda: kv.plane.restore_pages(get, 0, 4, 0, token_slots_ptr=islots.data_ptr(),
                                       token_slot_bytes=8, page_size=0), ValueError,
        "token_page_size is 0"))
    checks.run(group, "pages_from_slots partial page", lambda: expect_raises(
        lambda: fk.pages_from_slots(idx.data_ptr(), 8, 20, 16, idx.data_ptr(), 0), ValueError,
        "not a whole number"))
    ev = fk.LayerEvents(2)
    req = [(get, idx.data_ptr(), 4)]
    checks.run(group, "restore_layers past the last layer", lambda: expect_raises(
        lambda: kv.plane.restore_layers(req, 1, ev, 0, 2), ValueError, "outside the layout"))
    checks.run(group, "restore_layers event range", lambda: expect_raises(
        lambda: kv.plane.restore_layers(req, 0, ev, 1, 2), ValueError, "outside the LayerEvents"))
    checks.run(group, "restore_layers staged not configured", lambda: expect_raises(
        lambda: kv.plane.restore_layers(req, 0, ev, 0, 2, path="staged"), RuntimeError,
        "not configured"))
    checks.run(group, "restore_layers unknown path", lambda: expect_raises(
        lambda: kv.plane.restore_layers(req, 0, ev, 0, 2, path="dma"), ValueError, "path must"))
    env.arena.consume_put(put)
    checks.run(group, "consumed plan", lambda: expect_raises(
        lambda: kv.write(put, idx), RuntimeError, "already consumed"))

    # Misaligned / unregistered values and a foreign blob: a plane without the registry checks
    # the ABI only (bad magic), one with it rejects blobs it never issued.
    bad_put = env.arena.issue_put([values[0] + 8] + values[1:])
    checks.run(group, "misaligned value pointer", lambda: expect_raises(
        lambda: kv.write(bad_put, idx), ValueError, "not 16-byte aligned"))
    stray = torch.empty(vb + 64, dtype=torch.uint8)  # ordinary, unregistered host memory
    stray_ptr = (stray.data_ptr() + 15) // 16 * 16
    stray_put = env.arena.issue_put([stray_ptr] + values[1:])
    checks.run(group, "value outside registered memory", lambda: expect_raises(
        lambda: kv.write(stray_put, idx), ValueError, "not inside a CUDA-registered"))
    fake = env.value_view(values[3], 64)
    fake.view(torch.int64)[:4] = torch.tensor([0x1234, 1, values[0], 0])
    fake_ptr = values[3]
    checks.run(group, "foreign blob (registry)", lambda: expect_raises(
        lambda: kv.write(fake_ptr, idx[:1]), ValueError, "is not a plan issued"))
    abi_only = fk.DataPlane(kv.layout, [b.data_ptr() for b in pool.k()],
                            [b.data_ptr() for b in pool.v()], 256, None, env.registration)
    checks.run(group, "bad magic (ABI check)", lambda: expect_raises(
        lambda: abi_only.write_pages(fake_ptr, idx.data_ptr(), 1, 0), ValueError, "bad magic"))
    checks.run(group, "null buffer pointer", lambda: expect_raises(
        lambda: fk.DataPlane(kv.layout, [0, pool.k()[1].data_ptr()],
                             [b.data_ptr() for b in pool.v()], 256), ValueError, "is null"))
    checks.run(group, "misaligned buffer pointer", lambda: expect_raises(
        lambda: fk.DataPlane(kv.layout, [pool.k()[0].data_ptr() + 8, pool.k()[1].data_ptr()],
                             [b.data_ptr() for b in pool.v()], 256), ValueError,
        "not 16-byte aligned"))
    checks.run(group, "registering twice fails hard", lambda: expect_raises(
        lambda: fk.register_host_mappings([env.segment.mapping()]), RuntimeError,
        "cudaHostRegister of host mapping 'cpu:0'"))

    # Device-side checks: an out-of-range index only the device sees is skipped and reported.
    def device_range():
        for v in values:
            env.value_view(v, vb).fill_(POISON_VALUE)
        put2 = env.arena.issue_put(values)
        bad_idx = torch.tensor([0, 5, 4096, 9], device="cuda")
        kv.write(put2, bad_idx)
        s.synchronize()
        ok, detail = expect_raises(kv.take_device_errors, RuntimeError, "page index was outside")
        env.arena.consume_put(put2)
        good = all(torch.equal(env.value_view(values[i], vb), pool.reference_value(p))
                   for i, p in [(0, 0), (1, 5), (3, 9)])
        skipped = bool((env.value_view(values[2], vb) == POISON_VALUE).all())
        return ok and good and skipped, detail
    checks.run(group, "page out of range (device check)", device_range)

    # A plan consumed after the launch but before the kernel ran: the kernel sees the consumed
    # magic, moves nothing and reports it.
    def consumed_in_flight():
        pool2 = Pool("mha", 2, 16, 256, torch.bfloat16)
        pool2.poison()
        kv2 = fk.TorchKvCache(pool2.k(), pool2.v(), 16, env.arena, env.registration)
        get2 = env.arena.issue_get(values)
        torch.cuda._sleep(200_000_000)  # keep the stream busy while the host consumes the plan
        kv2.restore(get2, idx)
        env.arena.consume_get(get2)
        s.synchronize()
        ok, detail = expect_raises(kv2.take_device_errors, RuntimeError, "magic was not live")
        untouched = layer_pages_poisoned(pool2, idx.cpu(), range(2))
        return ok and untouched, detail
    checks.run(group, "plan consumed before kernel ran", consumed_in_flight)
    env.arena.consume_get(get)


def main():
    quick = "--quick" in sys.argv
    bulk = "--bulk" in sys.argv  # kernel checks use the cp.async.bulk kernel
    torch.manual_seed(int(time.time()))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    shapes = [
        # name, attention, layers, page_size, row elements (H*D or kv_lora_rank + rope)
        ("MHA", "mha", 4, 64, 4 * 128),
        ("MLA", "mla", 3, 32, 576),
        ("MLA-p1", "mla", 2, 1, 576),
    ]
    max_value = max(2 * 4 * 64 * 512 * 2, 3 * 32 * 576 * 2)
    env = Env(max_value)
    checks = Checks()
    batches = [1, 3, 16, 128] if quick else [1, 2, 7, 16, 64, 128]
    budgets = [1, 2, 4, 8]
    t0 = time.time()
    for shape in shapes:
        for dtype_name in (["fp8"] if shape[0] == "MLA-p1" else list(DTYPES)):
            for i, batch in enumerate(batches):
                run_case(env, checks, shape, dtype_name, batch, budgets[i % len(budgets)], bulk,
                         HOST_LOADS[i % len(HOST_LOADS)])
    run_errors(env, checks)
    elapsed = time.time() - t0

    # Table: one row per shape/dtype, one column per check, batches folded in.
    groups = {}
    for group, name, ok, _ in checks.rows:
        if group == "errors":
            continue
        key = group.rsplit(" n=", 1)[0]
        groups.setdefault(key, {}).setdefault(name, []).append(ok)
    names = ["kernel write", "kernel restore", "layer-wise restore", "restore after host rewrite",
             "copy-engine write", "copy-engine restore", "staged write", "staged restore"]
    print(f"\n## GPU data-plane tests{' (bulk-copy kernel)' if bulk else ''} (byte-exact vs torch "
          f"reference; batches {','.join(map(str, batches))})\n")
    print("| shape dtype | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for key, cols in groups.items():
        cells = []
        for n in names:
            r = cols.get(n, [])
            cells.append(f"{sum(r)}/{len(r)}" + ("" if all(r) else " FAIL"))
        print(f"| {key} | " + " | ".join(cells) + " |")
    errs = [(n, ok) for g, n, ok, _ in checks.rows if g == "errors"]
    print("\n| error case | result |\n|---|---|")
    for n, ok in errs:
        print(f"| {n} | {'raised as expected' if ok else 'FAIL'} |")
    failed = [r for r in checks.rows if not r[2]]
    print(f"\n{len(checks.rows) - len(failed)}/{len(checks.rows)} checks passed "
          f"in {elapsed:.1f} s")
    env.registration.close()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
