"""fluxonctl, the admin CLI, against a real fluxond: exit statuses (0 ok, 1 RPC failure, 2 usage
error), the help, the --json documents (64-bit fields are JSON integers, not the strings proto3
JSON prints) and fault injection through set / list / clear."""

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import fluxon
from conftest import FLUXOND, free_port

FLUXONCTL = os.environ.get("FLUXONCTL", str(Path(FLUXOND).parent / "fluxonctl"))
VALUE_LEN = 64 * 1024
KEYS = [f"ctl/{i}" for i in range(5)]

# The 64-bit (uint64 / int64) fields of each document, from proto/fluxon/v1/{admin,master}.proto.
STATUS_64 = ("generation", "uptime_ms", "segment_bytes", "grants", "grant_capacity", "keys",
             "clients")
OWNER_64 = ("generation", "capacity_bytes", "routes", "last_heard_ms_ago", "lease_ms_left",
            "inflight_gets", "source_pins")
ROUTE_64 = ("generation", "put_id", "offset", "len")
SLOT_CLASS_64 = ("slot_size", "slots_per_grant", "grants", "free", "waiting_claims", "used")


def ctl(admin, *args, timeout=20):
    return subprocess.run([FLUXONCTL, "--admin", admin, *args], capture_output=True, text=True,
                          timeout=timeout)


def ctl_json(admin, *args):
    r = ctl(admin, "--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def assert_ints(doc, fields):
    for f in fields:
        assert f in doc, (f, doc)
        assert type(doc[f]) is int, (f, doc[f])  # bool is no int here, nor is "123"


def assert_no_numeric_strings(doc, path="$"):
    """No value anywhere is a string of digits (what proto3 JSON makes of a 64-bit integer)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            assert_no_numeric_strings(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            assert_no_numeric_strings(v, f"{path}[{i}]")
    else:
        assert not (isinstance(doc, str) and doc.lstrip("-").isdigit()), (path, doc)


def node_config(sock, admin_port, allow_mutations):
    return f"""
role: embedded
log_level: warn
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:{admin_port}", metrics_port: 0,
         allow_mutations: {"true" if allow_mutations else "false"}}}
owner:
  socket_path: {sock}
  segment: {{size: 1GiB}}
  local_reserve: {{claim_soft_timeout_ms: 5, claim_hard_timeout_ms: 1000}}
  eviction_interval_ms: 10
"""


@pytest.fixture
def node(daemon_factory, sock):
    """An embedded fluxond (mutations allowed) holding KEYS, published; its admin address."""
    port = free_port()
    daemon_factory(node_config(sock, port, allow_mutations=True))
    admin = f"127.0.0.1:{port}"
    client = fluxon.KvClient(socket_path=sock)
    plan = client.local_fast_put_start(KEYS, VALUE_LEN)
    data = np.full(len(KEYS) * VALUE_LEN, 7, dtype=np.uint8)
    fluxon.copy_to_plan(plan, data.ctypes.data, VALUE_LEN)
    client.local_fast_put_commit(plan).wait(10)
    deadline = time.time() + 10
    while len(ctl_json(admin, "keys")["keys"]) < len(KEYS):  # published to the master
        assert time.time() < deadline, "keys were not published"
        time.sleep(0.02)
    return admin


def test_help_lists_every_command_and_exits_zero():
    r = subprocess.run([FLUXONCTL, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    for text in ("status", "owners", "slots", "route KEY", "keys [--prefix P] [--limit N]",
                 "stats", "fault set POINT ACTION [--delay-ms N] [--count N]",
                 "fault clear [POINT]", "fault list", "--admin", "--json", "--timeout-ms",
                 "Exit status"):
        assert text in r.stdout, (text, r.stdout)
    for args in (["fault", "--help"], ["keys", "--help"], ["help"]):
        h = subprocess.run([FLUXONCTL, *args], capture_output=True, text=True, timeout=10)
        assert h.returncode == 0 and h.stdout, (args, h.stderr)
    assert "--limit" in subprocess.run([FLUXONCTL, "keys", "--help"], capture_output=True,
                                       text=True, timeout=10).stdout


# Each parses to an error before any RPC: the address is unreachable, so a call would exit 1.
@pytest.mark.parametrize("args,says", [
    ([], "command"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["fault", "explode"], "unknown command 'fault explode'"),
    (["fault"], "fault"),
    (["route"], "KEY"),
    (["route", "a", "b"], "b"),
    (["status", "extra"], "extra"),
    (["--no-such-flag", "status"], "--no-such-flag"),
    (["keys", "--limit", "many"], "--limit"),
    (["keys", "--limit", "0"], "--limit"),
    (["keys", "--limit", "-1"], "--limit"),
    (["keys", "--limit", "99999999999"], "--limit"),
    (["keys", "--limit"], "--limit"),
    (["fault", "set", "master.Lookup"], "ACTION"),
    (["fault", "set", "master.Lookup", "explode"], "explode"),
    (["fault", "set", "master.Lookup", "fail", "--count", "0"], "--count"),
    (["fault", "set", "master.Lookup", "delay", "--delay-ms", "-5"], "--delay-ms"),
    (["--timeout-ms", "0", "status"], "--timeout-ms"),
])
def test_usage_errors_exit_two(args, says):
    r = ctl(f"127.0.0.1:{free_port()}", *args)
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    assert r.stdout == "", (args, r.stdout)
    assert says in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("args", [["status"], ["--json", "owners"], ["fault", "list"]])
def test_unreachable_admin_exits_one(args):
    address = f"127.0.0.1:{free_port()}"
    r = ctl(address, "--timeout-ms", "2000", *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"cannot reach fluxond admin at {address}" in r.stderr


def test_json_documents_carry_64_bit_fields_as_integers(node):
    status = ctl_json(node, "status")
    assert_ints(status, STATUS_64)
    assert type(status["node_id"]) is int and status["role"] == "embedded"
    assert status["keys"] == len(KEYS)

    owners = ctl_json(node, "owners")["owners"]
    assert len(owners) == 1
    assert_ints(owners[0], OWNER_64)
    assert owners[0]["node_id"] == 0 and owners[0]["transports"] == []
    assert owners[0]["routes"] == len(KEYS)
    # A random 64-bit generation survives exactly (a double would round it), as in the table.
    assert owners[0]["generation"] == status["generation"]
    table = ctl(node, "status").stdout
    assert f"generation  {status['generation']}" in table, table

    route = ctl_json(node, "route", KEYS[1])
    assert route["key"] == KEYS[1] and route["found"] is True
    assert route["local_state"] == "committed"
    assert_ints(route["route"], ROUTE_64)
    assert route["route"]["key"] == KEYS[1] and route["route"]["len"] == VALUE_LEN
    assert len(route["route"]["locations"]) == 1
    loc = route["route"]["locations"][0]
    assert_ints(loc, ROUTE_64)
    assert type(loc["node_id"]) is int
    assert loc["put_id"] == route["route"]["put_id"]
    missing = ctl_json(node, "route", "ctl/none")
    assert missing["found"] is False and missing["route"] is None
    assert missing["local_state"] == "absent"

    keys = ctl_json(node, "keys")["keys"]
    assert [k["key"] for k in keys] == sorted(KEYS)
    for k in keys:
        assert_ints(k, ROUTE_64)
        for l in k["locations"]:
            assert_ints(l, ROUTE_64)
    assert [k["key"] for k in ctl_json(node, "keys", "--prefix", "ctl/", "--limit", "2")
            ["keys"]] == sorted(KEYS)[:2]
    assert ctl_json(node, "keys", "--prefix=zzz")["keys"] == []

    slots = ctl_json(node, "slots")
    assert slots["by_state"] and all(type(v) is int for v in slots["by_state"].values())
    assert slots["by_state"]["Committed"] == len(KEYS)
    assert len(slots["classes"]) == 1
    assert_ints(slots["classes"][0], SLOT_CLASS_64)
    assert slots["classes"][0]["slot_size"] == VALUE_LEN
    assert slots["classes"][0]["used"] == len(KEYS)

    stats = ctl_json(node, "stats")  # flat: counter name -> integer
    assert stats and all(type(v) is int for v in stats.values()), stats
    assert stats["owner_put_pages"] == len(KEYS) and stats["master_routes"] == len(KEYS)

    for doc in (status, owners, route, missing, keys, slots, stats):
        assert_no_numeric_strings(doc)
    # The global flags stand after the command too.
    after = subprocess.run([FLUXONCTL, "route", KEYS[1], "--json", "--admin", node],
                           capture_output=True, text=True, timeout=20)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == route


def test_fault_set_list_clear(node):
    r = ctl(node, "fault", "set", "master.Lookup", "delay", "--delay-ms", "250", "--count", "3")
    assert r.returncode == 0, r.stderr
    assert "master.Lookup delay" in r.stdout
    rules = ctl_json(node, "fault", "list")["rules"]
    assert rules == [{"point": "master.Lookup", "action": "delay", "delay_ms": 250, "count": 3}]

    set_json = ctl_json(node, "fault", "set", "master.RemoveRoutes", "fail")
    assert set_json == {"ok": True, "rule": {"point": "master.RemoveRoutes", "action": "fail",
                                             "delay_ms": 0, "count": -1}}
    table = ctl(node, "fault", "list").stdout.splitlines()
    assert table[0].split() == ["POINT", "ACTION", "DELAY_MS", "REMAINING"]
    assert ["master.Lookup", "delay", "250", "3"] in [l.split() for l in table]
    assert ["master.RemoveRoutes", "fail", "0", "until-cleared"] in [l.split() for l in table]

    assert ctl_json(node, "fault", "clear", "master.Lookup") == {"ok": True,
                                                                 "cleared": "master.Lookup"}
    assert [f["point"] for f in ctl_json(node, "fault", "list")["rules"]] == ["master.RemoveRoutes"]
    r = ctl(node, "fault", "clear")
    assert r.returncode == 0 and "faults cleared: all" in r.stdout, r.stderr
    assert ctl_json(node, "fault", "list")["rules"] == []


def test_fault_set_is_refused_without_allow_mutations(daemon_factory, sock):
    port = free_port()
    daemon_factory(node_config(sock, port, allow_mutations=False))
    admin = f"127.0.0.1:{port}"
    r = ctl(admin, "fault", "set", "master.Lookup", "fail")
    assert r.returncode == 1 and "allow_mutations" in r.stderr, (r.stdout, r.stderr)
    assert ctl_json(admin, "fault", "list")["rules"] == []


def test_keys_pages_past_the_message_limit_and_the_page_count(daemon_factory, sock):
    """11,000 keys of ~4,000 bytes (44 MB of keys: past gRPC's 4 MiB default and the master's
    10,000 routes per page) are all listed, sorted, each once; --limit still bounds the list."""
    port = free_port()
    daemon_factory(node_config(sock, port, allow_mutations=False))
    admin = f"127.0.0.1:{port}"
    client = fluxon.KvClient(socket_path=sock)
    n, vlen = 11_000, 4096
    keys = [f"long/{i:06d}/" + "x" * 3990 for i in range(n)]
    for b in range(0, n, 1000):
        batch = keys[b:b + 1000]
        plan = client.local_fast_put_start(batch, vlen)
        data = np.full(len(batch) * vlen, 5, dtype=np.uint8)
        fluxon.copy_to_plan(plan, data.ctypes.data, vlen)
        client.local_fast_put_commit(plan).wait(30)
    deadline = time.time() + 30
    while ctl_json(admin, "owners")["owners"][0]["routes"] < n:
        assert time.time() < deadline, "keys were not published"
        time.sleep(0.1)
    r = ctl(admin, "--json", "keys", "--prefix", "long/", "--limit", "20000", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    listed = [k["key"] for k in json.loads(r.stdout)["keys"]]
    assert listed == keys  # every key once, in order
    r = ctl(admin, "--json", "keys", "--prefix", "long/", "--limit", "10500", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [k["key"] for k in json.loads(r.stdout)["keys"]] == keys[:10500]
