"""Authentication across real fluxond processes (config `security:`): mutual TLS on every gRPC
port (master, admin, owner -> master), the data plane's cluster-secret handshake, the start-up
refusal of a network-reachable node without them, and admin mutations that need an authenticated
peer. A throw-away CA and certificates are made with the openssl CLI for each test module.
"""

import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import fluxon
import kv_pages
from conftest import FLUXOND, free_port, owner_config

FLUXONCTL = os.environ.get("FLUXONCTL", str(Path(FLUXOND).parent / "fluxonctl"))
VALUE_LEN = 64 * 1024


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_cert(d: Path, name: str, ca: str, san="DNS:localhost,IP:127.0.0.1"):
    (d / f"{name}.ext").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
        "basicConstraints=CA:FALSE\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=d)


@pytest.fixture(scope="module")
def pki():
    d = Path(tempfile.mkdtemp(prefix="fxpki"))
    make_ca(d, "ca")
    make_cert(d, "node", "ca")
    make_cert(d, "operator", "ca")
    make_ca(d, "rogue-ca")  # a CA the cluster does not trust
    make_cert(d, "rogue", "rogue-ca")
    for i, secret in ((1, "cluster-secret-0123456789abcdef"), (2, "another-secret-fedcba9876543210")):
        p = d / f"secret{i}"
        p.write_text(secret + "\n")
        p.chmod(0o600)
    return d


def tls_section(pki: Path, secret=1, extra=""):
    return f"""
security:
  tls: {{cert_file: {pki}/node.pem, key_file: {pki}/node.key, ca_file: {pki}/ca.pem}}
  cluster_secret_file: {pki}/secret{secret}
{extra}"""


def ctl(pki, port, *args, cert="operator", ca="ca", check=True):
    cmd = [FLUXONCTL, "--admin", f"127.0.0.1:{port}", "--timeout-ms", "3000", "--json"]
    if cert:
        cmd += ["--tls-cert", f"{pki}/{cert}.pem", "--tls-key", f"{pki}/{cert}.key",
                "--tls-ca", f"{pki}/{ca}.pem"]
    r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if not k.startswith("FLUXON_TLS")})
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout) if r.stdout.strip().startswith(("{", "[")) else r.stdout
    return r


def tls_refuses_without_client_certificate(port):
    """A TLS client that trusts nothing special and presents no certificate: the server must
    end the connection in the handshake (TLS 1.3 reports it on the first read)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                data = s.recv(1024)
                return data == b""
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return True


def plaintext_is_not_served(port):
    """An HTTP/2 preface in the clear gets no HTTP/2 settings frame back."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        s.settimeout(5)
        try:
            data = s.recv(1024)
        except (ConnectionResetError, socket.timeout):
            return True
        # A TLS server answers garbage with a TLS alert record (0x15) or closes; an HTTP/2
        # server would answer with a SETTINGS frame (type 0x04 at byte 3).
        return data == b"" or data[:1] == b"\x15" or (len(data) > 3 and data[3] != 4)


class TlsCluster:
    def __init__(self, factory, pki):
        self.factory, self.pki = factory, pki
        self.master_port, self.master_admin = free_port(), free_port()
        self.sockdir = Path(tempfile.mkdtemp(prefix="fxs", dir="/tmp"))
        self.master = factory(f"""
role: master
log_level: info
master: {{listen_address: "127.0.0.1:{self.master_port}", owner_lease_ms: 1500,
          owner_grace_ms: 1000}}
admin: {{listen_address: "127.0.0.1:{self.master_admin}", metrics_port: 0}}
{tls_section(pki)}
""", name="master")
        self.admin = {}
        for node in (1, 2):
            self.start_owner(node)

    def sock(self, node):
        return str(self.sockdir / f"owner-{node}.sock")

    def start_owner(self, node, secret=1):
        self.admin[node] = free_port()
        return self.factory(owner_config(node, self.admin[node], f"localhost:{self.master_port}",
                                         self.sock(node), 3000, tls_section(self.pki, secret)),
                            name=f"owner-{node}")

    def client(self, node):
        return fluxon.KvClient(socket_path=self.sock(node))


put_pages = functools.partial(kv_pages.put_pages, value_len=VALUE_LEN)
get_pages = functools.partial(kv_pages.get_pages, value_len=VALUE_LEN)


def test_tls_cluster_serves_members_and_refuses_every_port_without_a_valid_certificate(
        daemon_factory, pki):
    c = TlsCluster(daemon_factory, pki)
    # The owners registered with the master over mutual TLS (localhost names the master's
    # certificate), and their data planes move bytes after the secret handshake.
    owners = ctl(pki, c.master_admin, "owners")["owners"]
    assert sorted(o["node_id"] for o in owners) == [1, 2]
    a, b = c.client(1), c.client(2)
    keys = [f"tls-{i}" for i in range(4)]
    put_pages(a, keys, seed=7)
    t, data = get_pages(b, keys)
    assert t == 4, "owner 2 could not restore owner 1's pages over the authenticated data plane"
    for i in range(4):
        assert (data[i * VALUE_LEN:(i + 1) * VALUE_LEN] == (7 + i) % 251).all()

    grpc_ports = {"master": c.master_port, "master admin": c.master_admin,
                  "owner 1 admin": c.admin[1], "owner 2 admin": c.admin[2]}
    for what, port in grpc_ports.items():
        assert tls_refuses_without_client_certificate(port), f"{what}: served without a cert"
        assert plaintext_is_not_served(port), f"{what}: answered plaintext HTTP/2"
    for what, port in grpc_ports.items():
        if "admin" not in what:
            continue
        for cert, ca in ((None, None), ("rogue", "ca"), ("rogue", "rogue-ca")):
            r = ctl(pki, port, "status", cert=cert, ca=ca or "ca", check=False)
            assert r.returncode == 1, f"{what} answered a client with cert={cert}: {r.stdout}"
        assert ctl(pki, port, "status")["role"] in ("master", "owner")
    # The master's port also refuses an owner-side client with the rogue certificate: a rogue
    # owner cannot register (the master lists the same two owners).
    rogue_port = free_port()
    rogue = subprocess.run([FLUXOND, "--config", "/dev/stdin"], input=f"""
role: owner
node_id: 9
admin: {{listen_address: "127.0.0.1:{rogue_port}", metrics_port: 0}}
owner:
  master_address: "localhost:{c.master_port}"
  socket_path: {c.sockdir}/rogue.sock
  segment: {{size: 1GiB}}
  register_timeout_ms: 1500
security:
  tls: {{cert_file: {pki}/rogue.pem, key_file: {pki}/rogue.key, ca_file: {pki}/ca.pem}}
""", capture_output=True, text=True, timeout=60)
    assert rogue.returncode != 0, "an owner with a certificate of another CA registered"
    assert sorted(o["node_id"] for o in ctl(pki, c.master_admin, "owners")["owners"]) == [1, 2]


def test_owner_with_a_wrong_cluster_secret_is_refused_by_the_data_plane(daemon_factory, pki):
    c = TlsCluster(daemon_factory, pki)
    c.start_owner(3, secret=2)  # a valid certificate, but not the cluster's secret
    deadline = time.time() + 10
    while len(ctl(pki, c.master_admin, "owners")["owners"]) < 3:
        assert time.time() < deadline, "owner 3 never registered"
        time.sleep(0.05)
    keys = [f"sec-{i}" for i in range(3)]
    put_pages(c.client(1), keys, seed=3)
    before = ctl(pki, c.admin[1], "stats").get("owner_data_plane_handshakes_refused", 0)
    t, _ = get_pages(c.client(3), keys)
    assert t == 0, "bytes moved to an owner without the cluster secret"
    after = ctl(pki, c.admin[1], "stats")
    assert after["owner_data_plane_handshakes_refused"] > before
    assert after.get("owner_data_plane_requests_refused", 0) == 0, "a request reached the region"
    # A member still reads them.
    t, _ = get_pages(c.client(2), keys)
    assert t == 3


def check_config(tmp, text):
    p = tmp / "check.yaml"
    p.write_text(text)
    return subprocess.run([FLUXOND, "--check-config", str(p)], capture_output=True, text=True,
                          timeout=30)


def start_once(tmp, text):
    p = tmp / "once.yaml"
    p.write_text(text)
    return subprocess.run([FLUXOND, "--config", str(p), "--once"], capture_output=True, text=True,
                          timeout=60)


def embedded(sock, admin="127.0.0.1:0", master="127.0.0.1:0", data="", extra="", mutations=False):
    data_line = f"  data_address: '{data}'\n" if data else ""
    return f"""
role: embedded
log_level: warn
master: {{listen_address: "{master}"}}
admin: {{listen_address: "{admin}", metrics_port: 0, allow_mutations: {str(mutations).lower()}}}
owner:
  socket_path: {sock}
  segment: {{size: 1GiB}}
{data_line}{extra}"""


def test_network_reachable_node_without_tls_refuses_to_start_unless_insecure(tmp, pki):
    sock = f"/tmp/fxsec-{os.getpid()}.sock"
    tls_only = (f"  tls: {{cert_file: {pki}/node.pem, key_file: {pki}/node.key, "
                f"ca_file: {pki}/ca.pem}}\n")
    cases = (  # (key named in the refusal, config, the `security:` lines it has)
        ("admin.listen_address", embedded(sock, admin="0.0.0.0:0"), ""),
        ("master.listen_address", embedded(sock, master="[::]:0"), ""),
        ("owner.data_address", embedded(sock, data="0.0.0.0:0"), tls_only),
    )
    for key, text, security in cases:
        refused = text + "security:\n" + security if security else text
        r = check_config(tmp, refused)
        assert r.returncode == 2 and key in r.stderr and "security.insecure" in r.stderr, r.stderr
        r = start_once(tmp, refused)
        assert r.returncode != 0 and key in r.stderr, r.stderr
        assert "ready" not in r.stdout
        r = start_once(tmp, text + "security:\n  insecure: true\n" + security)
        assert r.returncode == 0 and "ready" in r.stdout, r.stderr
    # TLS (and a secret for the data plane) lets it start on every interface.
    r = start_once(tmp, embedded(sock, admin="0.0.0.0:0", master="0.0.0.0:0", data="0.0.0.0:0",
                                 extra=tls_section(pki)))
    assert r.returncode == 0 and "ready" in r.stdout, r.stderr


def test_bad_tls_files_fail_the_start_naming_the_file(tmp, pki):
    sock = f"/tmp/fxsec2-{os.getpid()}.sock"
    cases = (
        (f"{{cert_file: {pki}/node.pem, key_file: {pki}/operator.key, ca_file: {pki}/ca.pem}}",
         "is not the key of the certificate"),
        (f"{{cert_file: {pki}/missing.pem, key_file: {pki}/node.key, ca_file: {pki}/ca.pem}}",
         "security.tls.cert_file: cannot read"),
        (f"{{cert_file: {pki}/node.pem, key_file: {pki}/node.key, ca_file: {pki}/secret1}}",
         "security.tls.ca_file"),
        (f"{{cert_file: {pki}/node.pem, key_file: {pki}/node.key}}",
         "security.tls.ca_file: is required"),
    )
    for tls, message in cases:
        r = start_once(tmp, embedded(sock, extra=f"security:\n  tls: {tls}\n"))
        assert r.returncode != 0 and message in r.stderr, (tls, r.stderr)
    short = tmp / "short.secret"
    short.write_text("too-short\n")
    r = start_once(tmp, embedded(sock, extra=f"security: {{cluster_secret_file: {short}}}\n"))
    assert r.returncode != 0 and "at least 16" in r.stderr, r.stderr
    # fluxonctl: the three TLS flags go together.
    r = subprocess.run([FLUXONCTL, "--tls-cert", f"{pki}/operator.pem", "status"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "go together" in r.stderr, r.stderr


def test_unauthenticated_admin_calls_change_nothing(daemon_factory, tmp, pki):
    sock = f"/tmp/fxsec3-{os.getpid()}.sock"
    port = free_port()
    daemon_factory(embedded(sock, admin=f"127.0.0.1:{port}", extra=tls_section(pki),
                            mutations=True), name="tls-admin")
    for cert in (None, "rogue"):
        r = ctl(pki, port, "fault", "set", "master.PublishBatch", "fail", cert=cert, check=False)
        assert r.returncode == 1, r.stdout + r.stderr
    assert ctl(pki, port, "fault", "list").get("rules", []) == []
    ctl(pki, port, "fault", "set", "master.PublishBatch", "delay", "--delay-ms", "1")
    assert len(ctl(pki, port, "fault", "list")["rules"]) == 1
    ctl(pki, port, "fault", "clear")

    # Mutations off: even a valid certificate is refused.
    sock2 = f"/tmp/fxsec4-{os.getpid()}.sock"
    port2 = free_port()
    daemon_factory(embedded(sock2, admin=f"127.0.0.1:{port2}", extra=tls_section(pki)),
                   name="tls-admin-off")
    r = ctl(pki, port2, "fault", "set", "master.PublishBatch", "fail", check=False)
    assert r.returncode == 1 and "allow_mutations" in r.stderr, r.stderr
    assert ctl(pki, port2, "fault", "list").get("rules", []) == []

    # On the network without TLS (insecure: true), mutations are refused whatever the config.
    sock3 = f"/tmp/fxsec5-{os.getpid()}.sock"
    port3 = free_port()
    daemon_factory(embedded(sock3, admin=f"0.0.0.0:{port3}", extra="security: {insecure: true}\n",
                            mutations=True), name="insecure-admin")
    r = ctl(pki, port3, "fault", "set", "master.PublishBatch", "fail", cert=None, check=False)
    assert r.returncode == 1 and "authenticated peer" in r.stderr, r.stderr
    assert ctl(pki, port3, "fault", "list", cert=None).get("rules", []) == []


def test_a_node_id_belongs_to_the_certificate_that_registered_it(daemon_factory, pki):
    """Cluster hardening, item 11: with mutual TLS the master binds each node_id to the
    certificate identity that first used it; another member's certificate naming that node_id
    (here after the first owner was killed) is refused and cannot take its routes."""
    make_cert(pki, "node-b", "ca", san="DNS:node-b,IP:127.0.0.1")
    cluster = TlsCluster(daemon_factory, pki)
    a = cluster.client(1)
    put_pages(a, ["bound-0"], seed=3)
    owners = ctl(pki, cluster.master_admin, "owners")["owners"]
    assert {o["node_id"] for o in owners} == {1, 2}
    impostor_admin = free_port()
    with pytest.raises(RuntimeError) as err:
        daemon_factory(f"""
role: owner
node_id: 1
log_level: info
admin: {{listen_address: "127.0.0.1:{impostor_admin}", metrics_port: 0}}
owner:
  master_address: "localhost:{cluster.master_port}"
  socket_path: {cluster.sockdir}/impostor.sock
  segment: {{size: 1GiB}}
  data_address: "127.0.0.1:0"
security:
  tls: {{cert_file: {pki}/node-b.pem, key_file: {pki}/node-b.key, ca_file: {pki}/ca.pem}}
  cluster_secret_file: {pki}/secret1
""", name="impostor")
    assert "belongs to the certificate" in str(err.value)
    # Owner 1 is untouched: still registered, its value still routed to it.
    owners = {o["node_id"]: o for o in ctl(pki, cluster.master_admin, "owners")["owners"]}
    assert 1 in owners and int(owners[1].get("routes", 0)) >= 1


def cert_section(pki: Path, cert: str, extra_tls: str = "") -> str:
    return f"""
security:
  tls: {{cert_file: {pki}/{cert}.pem, key_file: {pki}/{cert}.key, ca_file: {pki}/ca.pem{extra_tls}}}
  cluster_secret_file: {pki}/secret1
"""


def bound_master_config(pki: Path, port: int, admin: int, node_bound: bool) -> str:
    extra = ", node_bound_certificates: true" if node_bound else ""
    return f"""
role: master
log_level: info
master: {{listen_address: "127.0.0.1:{port}", owner_lease_ms: 1500, owner_grace_ms: 1000}}
admin: {{listen_address: "127.0.0.1:{admin}", metrics_port: 0}}
{cert_section(pki, "node", extra)}"""


def start_owner_with(factory, pki, node, cert, master_port, sockdir, name):
    """An owner as node `node` presenting certificate `cert`: (its Daemon, its admin port)."""
    admin = free_port()
    d = factory(owner_config(node, admin, f"localhost:{master_port}",
                             str(sockdir / f"{name}.sock"), 3000, cert_section(pki, cert)),
                name=name)
    return d, admin


def restart_master(factory, pki, master, port, admin, node_bound):
    master.proc.kill()
    master.proc.wait(timeout=10)
    return factory(bound_master_config(pki, port, admin, node_bound), name="master-again")


def test_node_bound_certificates_keep_a_node_id_across_a_master_restart(daemon_factory, pki):
    """Versions issue, item 5: with certificates issued to their node (CN fluxon-node-<id>) and
    security.tls.node_bound_certificates, no other member can take node 1 while it is paused
    across a master restart — not a certificate naming no node, not one issued to node 2. Node 1
    comes back, and its values are read from node 2 byte-exact."""
    for n in (1, 2):
        make_cert(pki, f"fluxon-node-{n}", "ca")
    make_cert(pki, "unbound-member", "ca")
    port, admin = free_port(), free_port()
    master = daemon_factory(bound_master_config(pki, port, admin, True), name="master")
    sockdir = Path(tempfile.mkdtemp(prefix="fxnb", dir="/tmp"))
    owner1, admin1 = start_owner_with(daemon_factory, pki, 1, "fluxon-node-1", port, sockdir,
                                      "owner-1")
    start_owner_with(daemon_factory, pki, 2, "fluxon-node-2", port, sockdir, "owner-2")
    a = fluxon.KvClient(socket_path=str(sockdir / "owner-1.sock"))
    b = fluxon.KvClient(socket_path=str(sockdir / "owner-2.sock"))
    keys = [f"nb-{i}" for i in range(4)]
    put_pages(a, keys, seed=19)

    # A certificate naming no node is refused at once, even as a fresh node_id.
    with pytest.raises(RuntimeError) as err:
        start_owner_with(daemon_factory, pki, 7, "unbound-member", port, sockdir, "unbound")
    assert "names no node" in str(err.value)

    os.kill(owner1.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(3.0)  # past node 1's lease and grace
        restart_master(daemon_factory, pki, master, port, admin, True)
        for cert in ("unbound-member", "fluxon-node-2"):
            with pytest.raises(RuntimeError) as err:
                start_owner_with(daemon_factory, pki, 1, cert, port, sockdir, f"impostor-{cert}")
            assert "names no node" in str(err.value) or "issued to node 2" in str(err.value)
    finally:
        os.kill(owner1.proc.pid, signal.SIGCONT)
    deadline = time.time() + 15
    while True:
        owners = {o["node_id"]: o for o in ctl(pki, admin, "owners")["owners"]}
        if 1 in owners and int(owners[1].get("routes", 0)) >= len(keys):
            break
        assert time.time() < deadline, owners
        time.sleep(0.1)
    t, data = get_pages(b, keys)
    assert t == len(keys)
    for i in range(len(keys)):
        assert (data[i * VALUE_LEN:(i + 1) * VALUE_LEN] == (19 + i) % 251).all()
    assert ctl(pki, admin1, "status")["master_registered"] is True


def test_an_owner_locked_out_of_its_node_id_says_so(daemon_factory, pki):
    """Versions issue, item 5: without node-bound certificates a restarted master binds node 1 to
    whichever member certificate uses it first. The paused owner that comes back finds its
    registration refused, and says so: master_registered false in status, the refusals counted
    in its stats (and /metrics), until it can register again."""
    make_cert(pki, "node-c", "ca", san="DNS:node-c,IP:127.0.0.1")
    port, admin = free_port(), free_port()
    master = daemon_factory(bound_master_config(pki, port, admin, False), name="master")
    sockdir = Path(tempfile.mkdtemp(prefix="fxlo", dir="/tmp"))
    owner1, admin1 = start_owner_with(daemon_factory, pki, 1, "node", port, sockdir, "owner-1")
    assert ctl(pki, admin1, "status")["master_registered"] is True
    os.kill(owner1.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(3.0)
        restart_master(daemon_factory, pki, master, port, admin, False)
        start_owner_with(daemon_factory, pki, 1, "node-c", port, sockdir, "impostor")
    finally:
        os.kill(owner1.proc.pid, signal.SIGCONT)
    a = fluxon.KvClient(socket_path=str(sockdir / "owner-1.sock"))
    deadline = time.time() + 10
    while ctl(pki, admin1, "status")["master_registered"] is not False:
        assert time.time() < deadline, "the locked-out owner still claims to be registered"
        time.sleep(0.1)
    assert a.stats()["registrations_refused"] >= 1
