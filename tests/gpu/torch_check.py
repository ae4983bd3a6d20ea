#!/usr/bin/env python3
"""torch_check.py LIBDSCKPT SOCKET ROOT JOB — PyTorch CUDA tensors saved through libdsckpt.

Loads libdsckpt with ctypes and saves a small model's tensors (bf16 and fp32, separate
allocations, slices of one flat buffer, an odd-sized tensor, a 256 MiB one) as PyTorch allocated
them: with the default caching allocator (legacy CUDA IPC), or with expandable segments (VMM
file descriptors) when PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set by the caller.
For each of two steps: the tensors get new values from kernels queued on a side stream right
before save_end (behind about a second of matrix products, so they are still running when
save_end returns), the daemon must order its copies after them; after SNAPSHOT the tensors are overwritten at once;
after DURABLE the checkpoint is committed and safetensors.safe_open(framework="pt") must give
back exactly the values the stream wrote (compared bit for bit). Steps 3 and 4 hand the same
tensors over as a save plan (dsckpt_add_plan must find it still good; step 4 with its driver
queries prepared on the library's thread, dsckpt_plan_prepare). Then the plan is prepared
for a save that is abandoned, every tensor is freed (release_gpu, empty_cache) and allocated
again: where the new tensors lie at the plan's addresses, step 5's dsckpt_add_plan must not
take those stale answers but see that the memory changed and send the plan anew. Freed and
allocated once more, step 6 prepares its plan after the change: the prepared answers must
show it (sent anew); step 7, prepared, finds the plan good. Every file must hold the new
values.

Exit status: 0 passed, 1 failed, 77 skipped (no torch, no safetensors, no GPU).
"""
import ctypes
import time
import os
import sys

SKIP = 77
SNAPSHOT, DURABLE = 2, 3
TIMEOUT_MS = 120000


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    sys.exit(1)


try:
    import torch
except ImportError as e:
    skip(f"no torch ({e})")
try:
    from safetensors import safe_open
except ImportError as e:
    skip(f"no safetensors ({e})")
if not torch.cuda.is_available():
    skip("torch sees no CUDA device")


class Lib:
    """The libdsckpt calls this test uses, with their C signatures."""

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        sigs = {
            "dsckpt_connect": (i, [cp, ctypes.POINTER(vp)]),
            "dsckpt_identify": (i, [vp, cp, i, i]),
            "dsckpt_close": (None, [vp]),
            "dsckpt_last_error": (cp, [vp]),
            "dsckpt_err_name": (cp, [i]),
            "dsckpt_save_begin": (i, [vp, cp, cp, ctypes.POINTER(vp)]),
            "dsckpt_add_tensor": (i, [vp, cp, cp, ctypes.POINTER(ctypes.c_int64), i, vp,
                                      ctypes.c_size_t]),
            "dsckpt_save_set_stream": (i, [vp, vp]),
            "dsckpt_save_end": (i, [vp]),
            "dsckpt_wait": (i, [vp, i, i]),
            "dsckpt_save_free": (None, [vp]),
            "dsckpt_commit": (i, [vp, cp, i]),
            "dsckpt_plan_create": (i, [vp, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.POINTER(vp)]),
            "dsckpt_add_plan": (i, [vp, vp]),
            "dsckpt_plan_prepare": (i, [vp, vp]),
            "dsckpt_plan_free": (None, [vp]),
            "dsckpt_release_gpu": (i, [vp]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.conn = None

    def check(self, rc, what, minimum=0):
        """Fails the test when a call returned less than minimum."""
        if rc < minimum:
            msg = self.lib.dsckpt_last_error(self.conn).decode()
            fail(f"{what}: {self.lib.dsckpt_err_name(rc).decode()} ({msg})")
        return rc

    def connect(self, socket, job):
        conn = ctypes.c_void_p()
        rc = self.lib.dsckpt_connect(socket.encode(), ctypes.byref(conn))
        self.check(rc, f"dsckpt_connect {socket}")
        self.conn = conn
        self.check(self.lib.dsckpt_identify(conn, job.encode(), 0, 1), "dsckpt_identify")


DTYPES = {torch.float32: ("F32", torch.int32), torch.bfloat16: ("BF16", torch.int16)}


def make_tensors():
    """A model's worth of tensors, allocated the ways a trainer allocates them."""
    t = {}
    dev = "cuda"
    t["embed.weight"] = torch.empty(8192, 1024, dtype=torch.bfloat16, device=dev)
    for i in range(6):
        t[f"layers.{i}.attn.weight"] = torch.empty(1024, 1024, dtype=torch.float32, device=dev)
        t[f"layers.{i}.norm.weight"] = torch.empty(1024, dtype=torch.bfloat16, device=dev)
    flat = torch.empty(3 * 512 * 1024, dtype=torch.float32, device=dev)
    for i in range(3):  # slices of one storage, as a flattened optimizer state holds them
        t[f"flat.{i}"] = flat[i * 512 * 1024:(i + 1) * 512 * 1024].view(512, 1024)
    t["odd"] = torch.empty(3, 5, 7, dtype=torch.bfloat16, device=dev)  # 210 bytes
    t["big"] = torch.empty(64, 1024, 1024, dtype=torch.float32, device=dev)  # 256 MiB
    return t


class Plan:
    """A dsckpt_plan_t of the tensors (dsckpt_tensor_t records kept alive with it)."""

    def __init__(self, lib, tensors):
        self.keep, recs = [], []
        for name, x in tensors.items():
            shape = (ctypes.c_int64 * x.dim())(*x.shape)
            nm, dt = ctypes.c_char_p(name.encode()), ctypes.c_char_p(DTYPES[x.dtype][0].encode())
            self.keep += [shape, nm, dt]
            recs.append((ctypes.cast(nm, ctypes.c_void_p).value,
                         ctypes.cast(dt, ctypes.c_void_p).value, ctypes.addressof(shape),
                         x.dim(), x.data_ptr(), x.numel() * x.element_size()))
        import struct
        raw = b"".join(struct.pack("PPPiPN", *r) for r in recs)  # dsckpt_tensor_t
        self.ptrs = [x.data_ptr() for x in tensors.values()]
        self.p = ctypes.c_void_p()
        lib.check(lib.lib.dsckpt_plan_create(lib.conn, raw, len(recs), ctypes.byref(self.p)),
                  "dsckpt_plan_create")


def save_step(lib, root, job, step, tensors, side, plan=None, sent=None, prepare=False):
    """One checkpoint as described at the top (through plan when given: dsckpt_add_plan
    must return sent; prepared first when prepare); returns the values the file must hold."""
    ckdir = f"{root}/{job}/step{step}"
    save = ctypes.c_void_p()
    lib.check(lib.lib.dsckpt_save_begin(lib.conn, ckdir.encode(), b"rank0",
                                        ctypes.byref(save)), "dsckpt_save_begin")
    if prepare:
        lib.check(lib.lib.dsckpt_plan_prepare(save, plan.p), "dsckpt_plan_prepare")
    if plan is not None:
        rc = lib.check(lib.lib.dsckpt_add_plan(save, plan.p), "dsckpt_add_plan")
        if rc != sent:
            fail(f"step {step}: dsckpt_add_plan returned {rc}, want {sent}")
    for name, x in (tensors.items() if plan is None else ()):
        shape = (ctypes.c_int64 * x.dim())(*x.shape)
        nbytes = x.numel() * x.element_size()
        lib.check(lib.lib.dsckpt_add_tensor(save, name.encode(), DTYPES[x.dtype][0].encode(),
                                            shape, x.dim(), x.data_ptr(), nbytes),
                  f"dsckpt_add_tensor {name}")
    lib.check(lib.lib.dsckpt_save_set_stream(save, side.cuda_stream), "dsckpt_save_set_stream")
    busy = torch.randn(8192, 8192, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(40):  # ~1 s of matrix products queued before the new values
            busy = busy @ busy.clamp(-1, 1)
        for x in tensors.values():
            x.normal_()
    t0 = time.monotonic()
    lib.check(lib.lib.dsckpt_save_end(save), "dsckpt_save_end")
    took = (time.monotonic() - t0) * 1e3
    if side.query():
        fail(f"the side stream was idle when save_end returned ({took:.1f} ms): "
             "ordering not exercised")
    print(f"  save_end {took:.2f} ms with the side stream still busy")
    with torch.cuda.stream(side):  # queued behind the writes: the expected values
        expected = {n: x.clone() for n, x in tensors.items()}
    lib.check(lib.lib.dsckpt_wait(save, SNAPSHOT, TIMEOUT_MS), "wait SNAPSHOT", SNAPSHOT)
    with torch.cuda.stream(side):
        for x in tensors.values():
            x.fill_(float("nan"))
    lib.check(lib.lib.dsckpt_wait(save, DURABLE, TIMEOUT_MS), "wait DURABLE", DURABLE)
    lib.lib.dsckpt_save_free(save)
    lib.check(lib.lib.dsckpt_commit(lib.conn, ckdir.encode(), TIMEOUT_MS), "dsckpt_commit")
    side.synchronize()
    return ckdir, {n: x.cpu() for n, x in expected.items()}


def reallocate(lib, plan):
    """Allocates the tensors again once the caller dropped them (the daemon lets go of the
    old memory, the allocator gives it back): (tensors, plan, whether they lie at the plan's
    addresses); the caller's rule: other pointers need a new plan."""
    lib.check(lib.lib.dsckpt_release_gpu(lib.conn), "dsckpt_release_gpu")
    torch.cuda.empty_cache()
    tensors = make_tensors()
    same = [x.data_ptr() for x in tensors.values()] == plan.ptrs
    if not same:
        lib.lib.dsckpt_plan_free(plan.p)
        plan = Plan(lib, tensors)
    return tensors, plan, same


def verify(ckdir, expected):
    """Loads the file with safetensors and compares every tensor bit for bit."""
    path = f"{ckdir}/rank0.safetensors"
    with safe_open(path, framework="pt", device="cpu") as f:
        keys = set(f.keys())
        if keys != set(expected):
            fail(f"{path}: tensors {sorted(keys ^ set(expected))} differ from those saved")
        for name, want in expected.items():
            got = f.get_tensor(name)
            if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
                fail(f"{path}: {name}: {got.dtype}{tuple(got.shape)}, "
                     f"saved {want.dtype}{tuple(want.shape)}")
            bits = DTYPES[want.dtype][1]
            if not torch.equal(got.view(bits), want.contiguous().view(bits)):
                fail(f"{path}: {name}: values differ from those the stream wrote")


def main():
    if len(sys.argv) != 5:
        print(__doc__.splitlines()[0], file=sys.stderr)
        sys.exit(2)
    libpath, socket, root, job = sys.argv[1:]
    mode = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "default allocator"
    torch.manual_seed(1)
    lib = Lib(libpath)
    lib.connect(socket, job)
    tensors = make_tensors()
    side = torch.cuda.Stream()
    total = sum(x.numel() * x.element_size() for x in tensors.values())
    for step in (1, 2):
        ckdir, expected = save_step(lib, root, job, step, tensors, side)
        verify(ckdir, expected)
    plan = Plan(lib, tensors)
    for step in (3, 4):
        ckdir, expected = save_step(lib, root, job, step, tensors, side, plan, 0, step == 4)
        verify(ckdir, expected)
    # Answers prepared for a save that is abandoned: stale once the memory changes.
    save = ctypes.c_void_p()
    lib.check(lib.lib.dsckpt_save_begin(lib.conn, f"{root}/{job}/abandoned".encode(),
                                        b"rank0", ctypes.byref(save)), "dsckpt_save_begin")
    lib.check(lib.lib.dsckpt_plan_prepare(save, plan.p), "dsckpt_plan_prepare")
    lib.lib.dsckpt_save_free(save)
    sames = []
    for step, prepare in ((5, False), (6, True)):
        del tensors, expected
        tensors, plan, same = reallocate(lib, plan)
        sames.append(same)
        ckdir, expected = save_step(lib, root, job, step, tensors, side, plan,
                                    1 if same else 0, prepare)
        verify(ckdir, expected)
    ckdir, expected = save_step(lib, root, job, 7, tensors, side, plan, 0, True)
    verify(ckdir, expected)
    lib.lib.dsckpt_plan_free(plan.p)
    lib.lib.dsckpt_close(lib.conn)
    moved = ", ".join("at the same addresses: the plan was sent anew" if same else
                      "at other addresses: a new plan" for same in sames)
    print(f"torch {torch.__version__} ({mode}): {len(tensors)} tensors, "
          f"{total / 2**20:.1f} MiB, 7 checkpoints verified bit for bit (5 through a plan, "
          f"3 of them prepared; reallocated twice: {moved})")


if __name__ == "__main__":
    main()
