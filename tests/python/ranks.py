"""ranks.py — runs a function on several torch.distributed ranks (gloo, one machine)."""
import atexit
import os
import sys
import tempfile
import threading
import time

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, rendezvous, fn, args, after=None):
    """One spawned rank: joins the gloo group, runs fn(rank, world, *args), leaves, then runs
    after(rank, world) when given, and ends at once with status 0 (a failure raises before).

    Ending without the interpreter's teardown: after a run that made sub-groups (a 2-D
    DeviceMesh), torch 2.13's gloo groups sometimes abort the process as Python frees them at
    exit ("terminate called without an active exception", SIGABRT), with DCP's own
    FileSystemReader as with ours (issue 31.1 found it so), after everything the rank did
    had finished and been checked. Threads and exit handlers still end as at any exit."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if after is not None:
        after(rank, world)
    # What the interpreter's exit does first: non-daemon threads joined (a committer still
    # finishing a tag), exit handlers run; then no finalization.
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn, world, *args, timeout=120, preload=(), after=None):
    """Spawns world processes running fn; re-raises the first rank's exception; kills all
    of them when they do not finish within timeout seconds (a hang fails, not blocks).
    preload: modules a fork server imports once for every later call's ranks (forked from
    it, they start in a fraction of the time each spawned one takes to import torch).
    after: a module-level function each rank runs after leaving the group."""
    if preload:
        mp.set_forkserver_preload(list(preload))
    fd, rendezvous = tempfile.mkstemp(prefix="dsckpt-rdzv.")
    os.close(fd)
    os.unlink(rendezvous)  # init_method=file:// wants a path nobody uses yet
    ctx = mp.start_processes(_entry, args=(world, rendezvous, fn, args, after), nprocs=world,
                             join=False,
                             start_method="forkserver" if preload else "spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks did not finish within {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        if os.path.exists(rendezvous):
            os.unlink(rendezvous)
