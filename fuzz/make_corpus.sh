#!/usr/bin/env bash
# Regenerates the seed corpus in fuzz/corpus/<target>/: a few valid inputs per target (frames
# encoded with protoc from text-format messages, the shipped configs, well-formed transport
# requests, plan-registry operation sequences). The fuzzers mutate from these.
# Usage: fuzz/make_corpus.sh   (needs protoc and python3)
set -euo pipefail
cd "$(dirname "$0")/.."
C=fuzz/corpus
mkdir -p $C/frame_fuzzer $C/plan_blob_fuzzer $C/config_fuzzer $C/tcp_wire_fuzzer

# --- frame_fuzzer: flags byte, then length-prefixed frames (see frame_fuzzer.cc).
frame() {  # $1 = message type, stdin = text format; prints the frame (length + body) in hex
  local body
  body=$(protoc -Iproto --encode="fluxon.v1.$1" proto/fluxon/v1/client.proto | xxd -p | tr -d '\n')
  printf '%08x' $(( ${#body} / 2 )) | sed -E 's/(..)(..)(..)(..)/\4\3\2\1/'
  printf '%s' "$body"
}
emit() { xxd -r -p > "$1"; }  # hex on stdin -> file
{ printf '01'; frame ClientRequest <<<'id: 1 hello { protocol_version: 2 client_name: "seed" }'; } \
  | emit $C/frame_fuzzer/hello
{ printf '00'
  frame ClientRequest <<<'id: 2 put_start { keys: "a" keys: "b" value_len: 4096 atomic_group_lens: 2 parent_key: "p" }'
  frame ClientRequest <<<'id: 3 put_commit { put_id: 7 }'
  frame ClientRequest <<<'id: 4 get_start { keys: "a" keys: "b" prefix_best_effort: true }'
  frame ClientRequest <<<'id: 5 get_transfer { handle_id: 9 consume_prefix_len: 1 }'
  frame ClientRequest <<<'id: 6 release_views { handle_id: 9 } '
  frame ClientRequest <<<'id: 7 delete_prefix { prefix: "ns:" }'
  frame ClientRequest <<<'id: 8 stats { }'
} | emit $C/frame_fuzzer/session
{ printf '0a'
  frame OwnerMessage <<<'id: 1 hello { segment { segment_label: "s" generation: 3 total_bytes: 4294967296 data_offset: 4096 } client_id: 5 session_secret: "0123456789abcdef" }'
  frame OwnerMessage <<<'id: 2 put_start { put_id: 7 offsets: 0 offsets: 4096 }'
  frame OwnerMessage <<<'id: 4 get_start { handle_id: 9 transferable_len: 2 first_miss_index: -1 offsets: 0 offsets: 4096 lens: 4096 lens: 4096 }'
  frame OwnerMessage <<<'id: 8 stats { counters { key: "puts" value: 3 } }'
} | emit $C/frame_fuzzer/owner_messages
{ printf '0e'; frame OwnerMessage <<<'put_done { put_id: 7 code: 0 }'; } \
  | emit $C/frame_fuzzer/event_with_fd
{ printf '02'; frame OwnerMessage <<<'code: 8 message: "connection limit reached"'; } \
  | emit $C/frame_fuzzer/refusal

# --- config_fuzzer: the shipped and test configs, plus one per role.
cp configs/single-node.yaml $C/config_fuzzer/single-node.yaml
cp tests/configs/prewarm.yaml $C/config_fuzzer/prewarm.yaml
cat > $C/config_fuzzer/master.yaml <<'YAML'
role: master
node_id: 0
master:
  listen_address: 0.0.0.0:50151
  owner_lease_ms: 5000
YAML
cat > $C/config_fuzzer/owner.yaml <<'YAML'
role: owner
node_id: 2
owner:
  segment: {size: 1GiB, numa_node: 0}
  master_address: "[::1]:50151"
  data_address: 127.0.0.1:0
  transports: [tcp]
  max_connections: 16
faults:
  - {point: publish, action: delay, delay_ms: 5, count: 2}
YAML
cat > $C/config_fuzzer/client.yaml <<'YAML'
role: client
client:
  socket_path: /tmp/fluxon/owner.sock
  call_timeout_ms: 1000
YAML

# --- tcp_wire_fuzzer and plan_blob_fuzzer: little-endian binary records.
python3 - "$C" <<'PY'
import struct, sys
c = sys.argv[1]
def req(op, descs, gen=1, rid=1, write=False):
    payload = sum(l for _, l in descs) if write else 0
    h = struct.pack('<IBBHIIQQQ', 0x46585452, 1, op, 0, len(descs), 0, gen, rid, payload)
    return h + b''.join(struct.pack('<QQ', o, l) for o, l in descs)
READ, WRITE = 1, 2  # OpKind
with open('src/transport/transport.h') as f:
    src = f.read()
assert 'kRead = 1' in src and 'kWrite = 2' in src, 'OpKind values changed: update make_corpus.sh'
prefix = struct.pack('<H', 4095) + bytes([0])  # a 4096-byte region of generation 1
seeds = {
    'read': prefix + req(READ, [(0, 4096)]),
    'write': prefix + req(WRITE, [(0, 512), (1024, 512)], write=True),
    'mixed': prefix + req(READ, [(0, 1), (4095, 1), (4000, 200)]) + req(WRITE, [(8, 8)], rid=2, write=True)
             + req(READ, [(0, 16)], gen=2, rid=3),
}
for name, data in seeds.items():
    open(f'{c}/tcp_wire_fuzzer/{name}', 'wb').write(data)
# plan_blob_fuzzer: arena size (u16), then ops (see plan_blob_fuzzer.cc).
def issue(kind, values): return bytes([0, kind]) + struct.pack('<H', len(values)) + b''.join(struct.pack('<Q', v) for v in values)
def peek_issued(i, kind=None): return bytes([1, 0]) + struct.pack('<H', i) + (bytes([1, kind]) if kind is not None else bytes([0]))
def consume_issued(i, kind): return bytes([2, 0]) + struct.pack('<H', i) + bytes([kind])
def scribble(off, data): return bytes([3]) + struct.pack('<Q', off) + bytes([len(data) - 1]) + data
def restore(i): return bytes([4]) + struct.pack('<H', i)
arena = struct.pack('<H', 8192)
open(f'{c}/plan_blob_fuzzer/put_commit', 'wb').write(
    arena + issue(0, [4096, 8192]) + peek_issued(0, 0) + consume_issued(0, 0) + consume_issued(0, 0))
open(f'{c}/plan_blob_fuzzer/get_release_wrong_kind', 'wb').write(
    arena + issue(1, [1, 2, 3]) + consume_issued(0, 0) + peek_issued(0) + consume_issued(0, 1))
open(f'{c}/plan_blob_fuzzer/corrupt_header', 'wb').write(
    arena + issue(0, [5]) + issue(1, [6, 7]) + scribble(0, b'\xff' * 8) + peek_issued(0)
    + restore(0) + peek_issued(0) + consume_issued(1, 1) + issue(1, [8, 9]))
PY
echo "seed corpus written to $C"
