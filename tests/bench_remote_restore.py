"""bench_remote_restore.py — `make bench-remote-restore`: restores from a root's remote tier,
through the daemon, beside plain GETs of the same bytes, in one run (issue 33.4). Not a test:
it prints a table and asserts nothing but that every restore gave the bytes back.

Node A (a dsckptd on a scratch root) saves and commits a tag of --files ranks of --mib MiB
each; the tag and the job's `latest` go into moto's S3 server (started here on 127.0.0.1) with
boto3, and into a directory standing for a shared filesystem. Node B is then a fresh daemon on
an empty root whose remote is one or the other, started again for each row so that the tag is
remote-only each time. Rows:

  daemon load, s3/file    LOAD_BEGIN of every rank into host memory (the first pulls the tag:
                          parallel ranged GETs into the local tier, checked against the
                          manifest; the loads check every tensor again), until all are LOADED
  daemon pull, s3/file    PREFETCH with wait (dsckptctl pull --wait): pulled and read into the
                          cache
  daemon load after pull  the loads after that pull: from the cache
  boto3 GET               download_fileobj of every object into memory, with the daemon's
                          concurrency and part size (TransferConfig)
  curl GET                one `curl -o /dev/null` per object (SigV4-signed), one stream
  cp                      `cp` of the tag's files from the shared directory

with the daemon's CPU time per GB (utime + stime of dsckptd over the row). Run it with the moto
venv's Python (boto3, moto_server): the Makefile target does.
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.path.join(REPO, os.environ.get("BUILD", "build"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
os.environ.setdefault("DSCKPT_LIB", os.path.join(BUILD, "libdsckpt.so"))

import boto3  # noqa: E402
from boto3.s3.transfer import TransferConfig  # noqa: E402
from botocore.config import Config  # noqa: E402

import dsckpt  # noqa: E402

MIB = 1 << 20


def free_port():
    """A TCP port nothing listens on now."""
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Daemon:
    """One dsckptd on config (a dict), in the foreground, until stop()."""

    def __init__(self, scratch, name, config):
        self.socket = os.path.join(scratch, name + ".sock")
        self.config = os.path.join(scratch, name + ".json")
        self.log = os.path.join(scratch, name + ".log")
        config = {"socket": self.socket, "socket_mode": "0600", "log_level": "info", **config}
        with open(self.config, "w") as f:
            json.dump(config, f)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([os.path.join(BUILD, "dsckptd"), "-d", "-c",
                                          self.config], stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket) or not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log, errors="replace") as f:
                    raise RuntimeError("dsckptd did not start: " + f.read()[-2000:])
            time.sleep(0.01)

    def _answers(self):
        """Whether the daemon accepts connections on its socket."""
        s = socketlib.socket(socketlib.AF_UNIX)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def stop(self):
        """SIGTERM, and wait for the exit."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def pattern(buf, n, seed):
    """Fills n bytes at buf with a pattern of seed (a repeated 4 KiB block)."""
    block = bytes((i * 131 + seed * 17) & 0xFF for i in range(4096))
    for off in range(0, n, 4096):
        ctypes.memmove(buf + off, block, min(4096, n - off))
    return block


def node_a_saves(scratch, root, files, nbytes):
    """Node A: a tag of `files` ranks of nbytes each, committed; the tag directory."""
    os.makedirs(root)
    a = Daemon(scratch, "a", {"allowed_roots": [root], "host_cache_size": 0.25})
    tag = os.path.join(root, "job", "t1")
    conns, bufs = [], []
    try:
        for r in range(files):
            conn = dsckpt.Connection(a.socket, job="job", rank=r, world_size=files)
            buf = dsckpt.HostBuffer(nbytes)
            pattern(buf.ptr, nbytes, r)
            with conn.save(tag, f"rank{r}") as s:
                s.add_tensor("t", "U8", [nbytes], buf.ptr, nbytes)
            s.wait(dsckpt.Level.DURABLE, timeout=600)
            conns.append(conn)
            bufs.append(buf)
        conns[0].commit(tag, timeout=600)
    finally:
        for c in conns:
            c.close()
        a.stop()
    return tag


def node_b(scratch, url, port, creds, cache_gib, conc, part):
    """The replacement node: an empty root whose remote is url; (daemon, root)."""
    root = os.path.join(scratch, "b-root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    cfg = {"allowed_roots": [{"path": root, "remote": url}], "host_cache_size": cache_gib,
           "upload_concurrency": conc, "upload_part_size": part}
    if url.startswith("s3://"):
        cfg["s3"] = {"endpoint": f"http://127.0.0.1:{port}", "region": "us-east-1",
                     "addressing": "path", "credentials_file": creds}
    return Daemon(scratch, "b", cfg), root


def load_all(sock, tag, files, nbytes, want):
    """Loads every rank of tag through the daemon; the sources, checked byte for byte."""
    sources = []
    with dsckpt.Connection(sock, job="job", rank=0, world_size=files) as conn:
        for r in range(files):
            buf = dsckpt.HostBuffer(nbytes)
            with conn.load(tag, f"rank{r}") as ld:
                ld.add_tensors([("t", "U8", [nbytes], buf.ptr, nbytes)])
            sources.append(ld.source)
            got = ctypes.string_at(buf.ptr, 4096)
            assert got == want[r] and ctypes.string_at(buf.ptr + nbytes - 4096, 4096) == \
                want[r][:4096], f"rank{r}: bytes differ"
    return sources


def row(rows, name, nbytes, seconds, cpu=None, note=""):
    """Adds a row of the table: bytes moved in seconds, the daemon's CPU seconds, a note."""
    rows.append((name, nbytes, seconds, cpu, note))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2, help="ranks (files) of the tag")
    ap.add_argument("--mib", type=int, default=128, help="MiB per file")
    ap.add_argument("--concurrency", type=int, default=8, help="upload_concurrency")
    ap.add_argument("--part-mib", type=int, default=16, help="upload_part_size")
    args = ap.parse_args()
    moto = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or \
        os.environ.get("MOTO_SERVER")
    if not moto:
        sys.exit("bench-remote-restore: no moto_server beside " + sys.executable)
    nbytes = args.mib * MIB
    total = nbytes * args.files
    cache_gib = max(0.25, total * 1.25 / (1 << 30))
    scratch = tempfile.mkdtemp(prefix="dsckpt-bench-remote-restore.")
    port = free_port()
    mlog = open(os.path.join(scratch, "moto.log"), "wb")
    mproc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=mlog,
                             stderr=mlog)
    rows = []
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        creds = os.path.join(scratch, "creds")
        with open(creds, "w") as f:
            f.write("[default]\naws_access_key_id = AKIDBENCH\naws_secret_access_key = x\n")
        os.chmod(creds, 0o600)
        want = {r: bytes((i * 131 + r * 17) & 0xFF for i in range(4096))
                for r in range(args.files)}
        tag = node_a_saves(scratch, os.path.join(scratch, "a-root"), args.files, nbytes)
        job = os.path.dirname(tag)
        shared = os.path.join(scratch, "shared")
        shutil.copytree(job, os.path.join(shared, "job"))
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                          region_name="us-east-1", aws_access_key_id="AKIDBENCH",
                          aws_secret_access_key="x",
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket="bench")
        keys = []
        for name in sorted(os.listdir(tag)):
            s3.upload_file(os.path.join(tag, name), "bench", f"tier/job/t1/{name}")
            keys.append(f"tier/job/t1/{name}")
        s3.upload_file(os.path.join(job, "latest"), "bench", "tier/job/latest")
        objects = sum(os.path.getsize(os.path.join(tag, n)) for n in os.listdir(tag))
        shutil.rmtree(os.path.dirname(job))

        for tier, url in (("s3", "s3://bench/tier"), ("file", f"file://{shared}")):
            b, root = node_b(scratch, url, port, creds, cache_gib, args.concurrency,
                             args.part_mib)
            try:
                btag = os.path.join(root, "job", "t1")
                c0, t0 = cpu_seconds(b.proc.pid), time.monotonic()
                src = load_all(b.socket, btag, args.files, nbytes, want)
                row(rows, f"daemon load, {tier} tier (pulls the tag)", total,
                    time.monotonic() - t0, cpu_seconds(b.proc.pid) - c0,
                    "sources " + ",".join(src))
            finally:
                b.stop()
            b, root = node_b(scratch, url, port, creds, cache_gib, args.concurrency,
                             args.part_mib)
            try:
                btag = os.path.join(root, "job", "t1")
                c0, t0 = cpu_seconds(b.proc.pid), time.monotonic()
                got = dsckpt.prefetch(os.path.join(root, "job"), wait=True, socket=b.socket)
                row(rows, f"daemon pull --wait, {tier} tier", got["bytes_pulled"],
                    time.monotonic() - t0, cpu_seconds(b.proc.pid) - c0,
                    f"{got['bytes_cached'] / MIB:.0f} MiB cached")
                c0, t0 = cpu_seconds(b.proc.pid), time.monotonic()
                src = load_all(b.socket, btag, args.files, nbytes, want)
                row(rows, "daemon load after the pull", total, time.monotonic() - t0,
                    cpu_seconds(b.proc.pid) - c0, "sources " + ",".join(src))
            finally:
                b.stop()

        conf = TransferConfig(max_concurrency=args.concurrency,
                              multipart_chunksize=args.part_mib * MIB,
                              multipart_threshold=args.part_mib * MIB)
        t0 = time.monotonic()
        for key in keys:
            sink = bytearray()

            class Sink:
                """A file object keeping what boto3 writes in memory."""

                def write(self, b):
                    """Keeps b."""
                    sink.extend(b)
                    return len(b)
            s3.download_fileobj("bench", key, Sink(), Config=conf)
        row(rows, "boto3 GET (same concurrency, part size)", objects, time.monotonic() - t0)
        if shutil.which("curl"):
            t0 = time.monotonic()
            for key in keys:
                subprocess.run(["curl", "-sf", "-o", "/dev/null", "--aws-sigv4",
                                "aws:amz:us-east-1:s3", "--user", "AKIDBENCH:x",
                                f"http://127.0.0.1:{port}/bench/{key}"], check=True)
            row(rows, "curl GET (one stream per object)", objects, time.monotonic() - t0)
        out = os.path.join(scratch, "cp")
        t0 = time.monotonic()
        shutil.copytree(os.path.join(shared, "job", "t1"), out)
        row(rows, "cp from the shared directory", objects, time.monotonic() - t0)
    finally:
        mproc.kill()
        mproc.wait()
        mlog.close()
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\nRestore from the remote tier: {args.files} files of {args.mib} MiB, "
          f"{args.concurrency} requests of {args.part_mib} MiB in flight (moto on 127.0.0.1)\n")
    print(f"| {'method':44} | {'MiB':>7} | {'s':>7} | {'MB/s':>7} | {'daemon CPU s/GB':>15} | note")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 17}|------")
    for name, n, s, cpu, note in rows:
        cpu_s = f"{cpu / (n / 1e9):.2f}" if cpu is not None and n else ""
        print(f"| {name:44} | {n / MIB:7.0f} | {s:7.3f} | {n / 1e6 / s:7.1f} | {cpu_s:>15} | "
              f"{note}")


if __name__ == "__main__":
    main()
