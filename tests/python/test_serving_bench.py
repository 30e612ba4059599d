"""bench/gpu/serving_bench.py's workload driver and summary against a stand-in HTTP server (no
GPU, no SGLang): multi-turn requests carry the whole conversation so far, a round ends when every
conversation had its turn, at most `--parallel` requests are in flight, and the summary's
cached-token ratio and per-round figures add up. The real servers run on the GPU machine
(scripts/gpu-run.sh servebench)."""

import argparse
import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "gpu" / "serving_bench.py"

pytestmark = pytest.mark.skipif(
    not BENCH.exists(), reason="bench/ is not beside these tests (the installed-wheel run copies "
                               "only tests/python; the build-tree run covers it)")


def load_bench():
    spec = importlib.util.spec_from_file_location("serving_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeServer:
    """Answers /generate like a server whose device cache keeps every prefix it saw (whole pages
    of 64 tokens): cached_tokens is the longest page-aligned prefix seen before."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = set()
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.flushes = []  # how many /generate requests had come when each flush came
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                if self.path == "/flush_cache":  # the device cache forgets every prefix
                    with outer.lock:
                        outer.seen.clear()
                        outer.flushes.append(len(outer.requests))
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                ids = body["input_ids"]
                with outer.lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    cached = 0
                    for n in range(64, len(ids), 64):
                        if tuple(ids[:n]) in outer.seen:
                            cached = n
                    for n in range(64, len(ids) + 1, 64):
                        outer.seen.add(tuple(ids[:n]))
                    outer.requests.append(ids)
                threading.Event().wait(0.01)
                out = {"output_ids": [7] * body["sampling_params"]["max_new_tokens"],
                       "meta_info": {"cached_tokens": cached,
                                     "cached_tokens_details": {"device": cached, "host": 0}}}
                raw = json.dumps(out).encode()
                with outer.lock:
                    outer.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_multi_turn_driver_and_summary():
    bench = load_bench()
    fake = FakeServer()

    class Client(bench.Server):  # the real client methods, no process
        def __init__(self, port):
            self.name, self.port = "fake", port

    a = argparse.Namespace(parallel=2, rate=200.0, output_len=1, seed=3)
    turns = bench.conversations(clients=4, rounds=3, request_len=128, seed=3)
    records, wall = bench.run_workload(Client(fake.port), turns, a)
    try:
        assert len(records) == 12 and len(fake.requests) == 12
        assert fake.max_in_flight <= 2
        # Round r of a conversation sends its r+1 turns of 128 tokens and the r answers.
        for r in records:
            assert r["prompt_tokens"] == 128 * (r["round"] + 1) + r["round"]
        # Every request of a round comes after every request of the round before (barrier).
        last_end = {}
        for r in records:
            last_end[r["round"]] = max(last_end.get(r["round"], 0), r["end_s"])
        firsts = {}
        for r in records:
            start = r["end_s"] - r["ttft_s"]
            firsts[r["round"]] = min(firsts.get(r["round"], 1e9), start)
        assert firsts[1] >= last_end[0] - 1e-3 and firsts[2] >= last_end[1] - 1e-3
        s = bench.summary("fake", records, wall)
        assert s["requests"] == 12 and len(s["round_p50_ms"]) == 3
        # Later rounds find the earlier turns cached: 2 of 3 rounds, a whole page short each.
        assert 0.3 < s["cached_ratio"] < 0.7
        assert s["gb_from_below"] == 0  # all of it from the device cache
    finally:
        fake.httpd.shutdown()


def test_warm_up_serves_its_own_conversations_and_flushes_after():
    bench = load_bench()
    fake = FakeServer()

    class Client(bench.Server):
        def __init__(self, port):
            self.name, self.port = "fake", port

    a = argparse.Namespace(warmup=2, request_len=128, output_len=1, seed=3)
    try:
        assert bench.warm_up(Client(fake.port), a) >= 0
        # Two conversations of two turns, one request at a time; a flush after each first turn
        # (the second turn restores from below the device) and one after the last request.
        assert len(fake.requests) == 4 and fake.max_in_flight == 1
        assert fake.flushes == [1, 3, 4]
        first, second = fake.requests[0], fake.requests[1]
        assert len(first) == 128 and second[:128] == first and len(second) == 128 + 1 + 128
        # The warm-up's tokens are not the measured conversations' (nothing of them is cached).
        measured = bench.conversations(clients=2, rounds=2, request_len=128, seed=3)
        assert first != measured[0][0] and first != measured[1][0]
        assert not fake.seen  # flushed at the end
    finally:
        fake.httpd.shutdown()


def test_the_floor_configuration_holds_every_conversation_on_the_gpu():
    bench = load_bench()
    a = argparse.Namespace(clients=16, rounds=10, request_len=2048, output_len=1, warmup=2,
                           parallel=4, gpu_tokens=60000, host_gib=56)
    floor = bench.floor_tokens(a)
    assert floor % bench.PAGE == 0
    # Every turn and answer of every conversation, and the warm-up's, fit at once.
    assert floor >= 16 * 10 * (2048 + 1) + 2 * 2 * (2048 + 1)

    def pool(name):
        flags = bench.server_flags(name, a, "/tmp", None, None)
        return int(flags[flags.index("--max-total-tokens") + 1])

    assert pool("gpu-floor") == floor
    assert pool("gpu") == 60000
