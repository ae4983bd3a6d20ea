"""A lost node restored from its peers' copies through the Python binding (issue 35 item 6):
three daemons, each in a network namespace of its own (``ip netns``, a bridge and veths, as
tests/netns.c makes them), UCX forced onto TCP, one peer_secret_file, one shared root. A
three-rank job (one rank per node) saves with ``dsckpt.torch.save`` and seals; each node's
file reaches the next node of the ring (node 1's is on node 2). Node 1 is SIGKILLed and
replaced on an empty root by a daemon of a new name at its address, told node 0 alone (which
holds node 2's copy, not node 1's): node 2 is found as that copy's owner,
``dsckpt.torch.find_latest`` names the tag (the daemon asks the peers for the job's latest) and
``dsckpt.torch.load_into`` restores rank 1's tensors from node 2's copy, bytes exact; the
daemon's log says it pulled them from a peer copy, and no other node's file came with it.
The same job restarted with node 1 replaced by a daemon of a new name at a new address (a
fourth namespace), told nothing: three ranks (torch.distributed, gloo) call
``dsckpt.torch.tell_nodes`` and ``find_latest``, and rank 1 restores its tensors from node 2's
copy through ``load_into``, exact. Skipped without root or ip(8)."""
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

torch = pytest.importorskip("torch")

import dsckpt  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from conftest import Daemon  # noqa: E402
from ranks import run_ranks  # noqa: E402

SECRET = "python-peer-restore-secret-0123456789"
PORT = 18540
T = 60
N = 3


def ip(*args):
    """Runs ip(8); raises on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def nodes():
    """N + 1 namespaces joined by a bridge: their names and addresses."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and ip(8)")
    p, net = f"dpy{os.getpid() % 100000}-", os.getpid() % 250 + 1
    names = [f"{p}{i}" for i in range(N + 1)]  # the last: a replacement's new address
    addrs = [f"10.36.{net}.{i + 1}" for i in range(N + 1)]
    made = []
    try:
        ip("netns", "add", p + "sw")
        made.append(p + "sw")
        ip("-n", p + "sw", "link", "add", "br0", "type", "bridge")
        ip("-n", p + "sw", "link", "set", "br0", "up")
        for i, n in enumerate(names):
            ip("netns", "add", n)
            made.append(n)
            ip("-n", n, "link", "set", "lo", "up")
            ip("link", "add", "peer0", "netns", n, "type", "veth", "peer", "name", f"v{i}",
               "netns", p + "sw")
            ip("-n", p + "sw", "link", "set", f"v{i}", "master", "br0", "up")
            ip("-n", n, "addr", "add", addrs[i] + "/24", "dev", "peer0")
            ip("-n", n, "link", "set", "peer0", "up")
    except subprocess.CalledProcessError as e:
        for m in made:
            subprocess.run(["ip", "netns", "del", m], capture_output=True)
        pytest.skip(f"ip netns/veth failed here: {e.stderr!r}")
    yield names, addrs
    for m in made:
        subprocess.run(["ip", "netns", "del", m], capture_output=True)


def metric(d, key):
    """The daemon's metric key (dsckptctl metrics --json)."""
    ctl = os.path.join(os.path.dirname(os.environ["DSCKPTD"]), "dsckptctl")
    out = subprocess.run([ctl, "-s", d.socket, "metrics", "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)[key]


def commit(d, tag, states):
    """Rank r saves states[r] into tag through daemon d[r]; every rank seals; COMMITTED."""
    conns = [dsckpt.Connection(d[r].socket, job="pyj", rank=r, world_size=N) for r in range(N)]
    handles = [dt.save(states[r], tag, conn=conns[r]) for r in range(N)]
    for r in range(N):
        handles[r].wait_durable(T)
    seals = [threading.Thread(target=conns[r].seal, args=(tag,)) for r in range(N)]
    for t in seals:
        t.start()
    for t in seals:
        t.join()
    for r in range(N):
        assert handles[r].wait(dsckpt.Level.COMMITTED, T) == dsckpt.Level.COMMITTED
        conns[r].close()


def test_lost_node_restored_by_find_latest_and_load_into(nodes, tmp_path, monkeypatch):
    names, addrs = nodes
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "peer0")
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    root = str(tmp_path / "shared")
    os.makedirs(root)
    peer = {"peer_secret_file": str(secret), "replica_cache_size": 0.0625, "chunk_size": 1}
    d = [Daemon(root=root, netns=names[i], host=addrs[i], **peer) for i in range(N)]
    replacement = None
    try:
        states = [{"w": torch.arange(300000, dtype=torch.float32) * (r + 1),
                   "b": torch.full((4096,), r + 7, dtype=torch.int64)} for r in range(N)]
        commit(d, os.path.join(root, "pyj", "step1"), states)
        for i in range(N):
            deadline = time.monotonic() + T
            while metric(d[i], "peer_copies_received") < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert metric(d[i], "peer_copies_received") == 1, d[i].read_log()

        # Node 1 is lost; its replacement has an empty root, a new name and knows node 0.
        d[1].proc.send_signal(signal.SIGKILL)
        d[1].proc.wait()
        root2 = str(tmp_path / "root2")
        replacement = Daemon(root=root2, netns=names[1], host="replacement-node",
                             peer_hosts=addrs[0], **peer)
        monkeypatch.setenv("RANK", "1")
        c = dsckpt.Connection(replacement.socket, job="pyj", rank=1, world_size=N)
        dt.set_default_connection(c)
        job2 = os.path.join(root2, "pyj")
        assert dt.find_latest(job2) == "step1"
        got = {"w": torch.zeros(300000, dtype=torch.float32),
               "b": torch.zeros(4096, dtype=torch.int64)}
        assert dt.load_into(got, os.path.join(job2, "step1"), conn=c) == "daemon"
        assert torch.equal(got["w"], states[1]["w"]) and torch.equal(got["b"], states[1]["b"])
        log = replacement.read_log()
        assert "from 1 peer copies" in log, log
        print(next(line for line in log.splitlines() if "from 1 peer copies" in line))
        assert sorted(f for f in os.listdir(os.path.join(job2, "step1"))
                      if f.endswith(".safetensors")) == ["rank1.safetensors"]
    finally:
        dt.set_default_connection(None)
        if replacement:
            replacement.stop()
        if d[1].proc.poll() is None:
            d[1].proc.kill()
            d[1].proc.wait()
        for i in (0, 2):
            d[i].stop()
        shutil.rmtree(d[1].dir, ignore_errors=True)


def _tell_and_restore(rank, world, sockets, addrs, jobs, want):
    """One rank of the restarted job (run_ranks): its node's daemon is sockets[rank], named
    addrs[rank]; every rank tells the nodes and agrees on the latest; rank 1, on the
    replacement, loads its tensors from the peers' copies and compares them with want."""
    c = dsckpt.Connection(sockets[rank], job="pyj", rank=rank, world_size=world)
    dt.set_default_connection(c)
    assert dt.tell_nodes(jobs[rank], host=addrs[rank]) == sorted(addrs)
    assert dt.find_latest(jobs[rank]) == "step1"
    if rank == 1:
        got = {k: torch.zeros_like(v) for k, v in want.items()}
        assert dt.load_into(got, os.path.join(jobs[1], "step1"), conn=c) == "daemon"
        assert all(torch.equal(got[k], want[k]) for k in want)
    dt.set_default_connection(None)
    c.close()


def test_new_address_restored_once_told(nodes, tmp_path, monkeypatch):
    names, addrs = nodes
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "peer0")
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    root = str(tmp_path / "shared")
    os.makedirs(root)
    peer = {"peer_secret_file": str(secret), "replica_cache_size": 0.0625, "chunk_size": 1}
    d = [Daemon(root=root, netns=names[i], host=addrs[i], **peer) for i in range(N)]
    replacement = None
    try:
        states = [{"w": torch.arange(200000, dtype=torch.float32) * (r + 3)} for r in range(N)]
        commit(d, os.path.join(root, "pyj", "step1"), states)
        deadline = time.monotonic() + T
        while metric(d[2], "peer_copies_received") < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        d[1].proc.send_signal(signal.SIGKILL)
        d[1].proc.wait()
        # Its replacement: a fourth namespace (a new address), a new name, an empty root, no
        # peer_hosts; the ranks tell every daemon where the job runs now.
        root2 = str(tmp_path / "root2")
        replacement = Daemon(root=root2, netns=names[N], host="node-new", **peer)
        sockets = [d[0].socket, replacement.socket, d[2].socket]
        hosts = [addrs[0], addrs[N], addrs[2]]
        jobs = [os.path.join(root, "pyj"), os.path.join(root2, "pyj"), os.path.join(root, "pyj")]
        run_ranks(_tell_and_restore, N, sockets, hosts, jobs, states[1], timeout=240)
        log = replacement.read_log()
        assert "from 1 peer copies" in log, log
        assert sorted(f for f in os.listdir(os.path.join(root2, "pyj", "step1"))
                      if f.endswith(".safetensors")) == ["rank1.safetensors"]
    finally:
        if replacement:
            replacement.stop()
        if d[1].proc.poll() is None:
            d[1].proc.kill()
            d[1].proc.wait()
        for i in (0, 2):
            d[i].stop()
        shutil.rmtree(d[1].dir, ignore_errors=True)
