"""python -m dsckpt export and zero-to-fp32 (dsckpt.export, dsckpt.deepspeed.zero_to_fp32)
against checkpoints a real daemon wrote: a dsckpt.torch tag exported to torch.save and to
safetensors, bit for bit; DeepSpeed ZeRO 1, 2 and 3 tags of one and two ranks, laid out as
DeepSpeed lays out its partitions (padding included), consolidated to the fp32 master
weights bit for bit, without DeepSpeed installed; and the errors of bad input (a flipped
byte, a truncated or missing file, a rank's file missing, an ambiguous tag). The DCP and
Lightning cases run under a modern torch: tests/python/modern/test_export_modern.py."""
import collections
import math
import os
import subprocess
import sys

import pytest
import torch

import dsckpt
from dsckpt import _tree
from dsckpt import torch as dtorch
from dsckpt.deepspeed import zero_to_fp32 as zf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTL = os.path.join(os.path.dirname(os.environ.get("DSCKPT_LIB", "build/x")), "dsckptctl")


def cli(*args, ok=True, socket="/nonexistent/dsckpt.sock"):
    """Runs python -m dsckpt args in a fresh process (no daemon to ask, unless socket names
    one); its result."""
    env = dict(os.environ, DSCKPT_SOCKET=socket)
    r = subprocess.run([sys.executable, "-m", "dsckpt", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    assert (r.returncode == 0) == ok, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def same(a, b, path="") -> None:
    """Asserts nested equality, tensors bit for bit (dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} " \
                                                          f"vs {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a.reshape(-1).view(torch.uint8) if a.numel() else a,
                           b.reshape(-1).view(torch.uint8) if b.numel() else b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def verify(path):
    """dsckptctl verify of one file: exit status and output."""
    r = subprocess.run([CTL, "verify", path], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def save_committed(daemon, tag_dir, files, world=1):
    """Saves {file: state dict} into tag_dir, each file by rank files' index (one
    connection per rank of world), and commits it."""
    conns = [dsckpt.Connection(daemon.socket, job="exp", rank=r, world_size=world)
             for r in range(world)]
    try:
        for i, (name, sd) in enumerate(files.items()):
            h = dtorch.save(sd, tag_dir, conn=conns[i % world], file=name, track=False)
            h.wait_durable(60)
        for c in conns:
            c.seal(tag_dir)
        conns[0].commit(tag_dir, 60)
    finally:
        for c in conns:
            c.close()


def plain_state():
    """A state dict of every kind of value dsckpt.torch saves."""
    torch.manual_seed(3)
    w = torch.randn(6, 4)
    return {"model": collections.OrderedDict([("w", w), ("wt", w.t()), ("half", w[:3]),
                                              ("b", torch.randn(4).to(torch.bfloat16))]),
            "opt": {"step": 7, "state": [torch.arange(5), torch.tensor(True)],
                    "lr": 0.25, "name": "adam"},
            "scalar": torch.tensor(2.5, dtype=torch.float64), "empty": torch.empty(0, 3),
            "i8": torch.tensor([-1, 2], dtype=torch.int8)}


def test_export_torch_tag(daemon, tmp_path):
    """A dsckpt.torch tag exports to torch.save (the state dict as it was: containers,
    values, views of one storage still sharing) and to safetensors (its tensors by key
    path, which safetensors' own reader reads bit for bit and dsckptctl verify checks);
    --key narrows it; --format overrides the suffix; dsckptctl export does the same."""
    tag = os.path.join(daemon.root, "exp", "t1")
    sd = plain_state()
    save_committed(daemon, tag, {"rank0": sd})

    out = str(tmp_path / "model.pt")
    r = cli("export", tag, out)
    assert "torch, 9 tensors" in r.stdout and "from a torch tag" in r.stdout
    back = torch.load(out)
    same(sd, back)
    assert back["model"]["wt"].data_ptr() == back["model"]["w"].data_ptr()
    cli("export", tag, str(tmp_path / "via-daemon.pt"), socket=daemon.socket)  # its load path
    same(sd, torch.load(str(tmp_path / "via-daemon.pt")))
    # The daemon fills a file's tensors into one buffer: an entry exported alone carries its
    # own bytes only, not the 4 MiB beside it.
    big = os.path.join(daemon.root, "exp", "big")
    save_committed(daemon, big, {"rank0": {"big": torch.randn(1 << 20), "small": sd["i8"]}})
    cli("export", "--key", "small", big, str(tmp_path / "small.pt"), socket=daemon.socket)
    assert os.path.getsize(tmp_path / "small.pt") < 8192
    same(sd["i8"], torch.load(str(tmp_path / "small.pt")))

    st = str(tmp_path / "model.safetensors")
    r = cli("export", tag, st)
    assert "safetensors, 9 tensors" in r.stdout and "3 non-tensor values left out" in r.stdout
    from safetensors.torch import load_file
    flat = load_file(st)
    assert sorted(flat) == sorted(["model.w", "model.wt", "model.half", "model.b",
                                   "opt.state.0", "opt.state.1", "scalar", "empty", "i8"])
    for name, t in [("model.w", sd["model"]["w"]), ("model.wt", sd["model"]["wt"]),
                    ("model.half", sd["model"]["half"]), ("model.b", sd["model"]["b"]),
                    ("opt.state.0", sd["opt"]["state"][0]), ("scalar", sd["scalar"]),
                    ("empty", sd["empty"]), ("i8", sd["i8"])]:
        same(t.contiguous(), flat[name], name)
    rc, text = verify(st)
    assert rc == 0, text

    cli("export", "--key", "model", "--format", "safetensors", tag, str(tmp_path / "m.bin"))
    assert sorted(load_file(str(tmp_path / "m.bin"))) == ["b", "half", "w", "wt"]

    # dsckptctl export runs the same (the interpreter from $DSCKPT_PYTHON).
    r = subprocess.run([CTL, "export", "--key", "opt", tag, str(tmp_path / "o.safetensors")],
                       env=dict(os.environ, DSCKPT_PYTHON=sys.executable), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    same({"state.0": sd["opt"]["state"][0], "state.1": sd["opt"]["state"][1]},
         load_file(str(tmp_path / "o.safetensors")))


def test_export_bad_input(daemon, tmp_path):
    """A flipped byte, a truncated file and a missing file fail with the file and what is
    wrong; a tag of two ranks' files needs --file; a bad --key names what is there; a
    directory that is no tag says so; a tag not committed (a save in flight) is refused
    unless --allow-uncommitted. Nothing is written on failure."""
    tag = os.path.join(daemon.root, "exp", "bad")
    save_committed(daemon, tag, {"rank0": plain_state(), "rank1": plain_state()}, world=2)
    out = str(tmp_path / "o.pt")
    r = cli("export", tag, out, ok=False)
    assert "holds 2 files (rank0, rank1): name the one to export (--file" in r.stderr
    cli("export", "--file", "rank1", tag, out)
    r = cli("export", "--file", "rank1", "--key", "model.nope", tag, out, ok=False)
    assert "no entry 'model.nope' (at 'nope'; there: w, wt, half, b)" in r.stderr
    os.unlink(out)

    path = os.path.join(tag, "rank1.safetensors")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    r = cli("export", "--file", "rank1", tag, out, ok=False)
    assert "rank1.safetensors" in r.stderr and "checksum mismatch" in r.stderr
    assert not os.path.exists(out)
    os.truncate(path, os.path.getsize(path) - 100)
    r = cli("export", "--file", "rank1", tag, out, ok=False)
    assert "rank1.safetensors" in r.stderr and "truncated" in r.stderr
    os.unlink(path)
    r = cli("export", "--file", "rank1", tag, out, ok=False)
    assert "has no file rank1.safetensors" in r.stderr
    r = cli("export", str(tmp_path), out, ok=False)
    assert "holds no checkpoint dsckpt wrote" in r.stderr
    assert not os.path.exists(out)

    # A tag saved but not committed (its save is DURABLE; nothing sealed or committed).
    pending = os.path.join(daemon.root, "exp", "pending")
    with dsckpt.Connection(daemon.socket, job="exp", rank=0, world_size=1) as c:
        dtorch.save(plain_state(), pending, conn=c, file="rank0", track=False).wait_durable(60)
        r = cli("export", pending, out, ok=False)
        assert "is not committed (no MANIFEST.json): a save into it may be in flight" in r.stderr
        assert not os.path.exists(out)
        cli("export", "--allow-uncommitted", pending, out)
    same(plain_state(), torch.load(out))


# ---- DeepSpeed ZeRO, laid out as DeepSpeed lays it out -------------------------------


class Model(torch.nn.Module):
    """Two linear layers (the second tied to an embedding), a frozen one, a BatchNorm."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.a = torch.nn.Linear(5, 7)
        self.bn = torch.nn.BatchNorm1d(7)
        self.frozen = torch.nn.Linear(7, 3)
        self.frozen.requires_grad_(False)
        self.b = torch.nn.Linear(7, 4, bias=False)
        self.tied = torch.nn.Linear(7, 4, bias=False)
        self.tied.weight = self.b.weight
        self.bn.running_mean.uniform_()


def zero_tag(daemon, tag_dir, stage, world, bf16=False, groups=2):
    """Saves, through dsckpt, the files DeepSpeed's engine writes for a ZeRO stage of world
    ranks of Model (fp32 masters: its parameters plus a known offset, bit patterns DeepSpeed
    never sees in the module's bf16 copy), and returns the state dict zero_to_fp32 must give."""
    zf.allow_deepspeed_types()
    stage_enum = _tree._SAFE_BY_NAME["deepspeed.runtime.zero.config.ZeroStageEnum"][0]
    scaler = _tree._SAFE_BY_NAME["deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"][0]
    m = Model()
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    trainable = {n: p.detach().clone() + 0.125 for n, p in m.named_parameters()
                 if p.requires_grad}
    group_names = [names[:len(names) // 2], names[len(names) // 2:]] if groups == 2 else [names]
    shapes = [collections.OrderedDict((n, trainable[n].shape) for n in g) for g in group_names]
    frozen = {n: p.detach().clone() for n, p in m.named_parameters() if not p.requires_grad}
    buffers = {n: b.detach().clone() for n, b in m.named_buffers()}
    module = {n: t.detach().clone().to(torch.bfloat16 if bf16 else torch.float32)
              if t.is_floating_point() else t.detach().clone()
              for n, t in m.state_dict().items()}

    partitions = [[] for _ in range(world)]   # per rank, per group
    frozen_frags = [{} for _ in range(world)]
    for g in group_names:
        if stage < 3:
            flat = torch.cat([trainable[n].reshape(-1) for n in g])
            align = 2 * world
            flat = torch.cat([flat, torch.full((-flat.numel() % align,), 7.0)])
            for r, part in enumerate(flat.view(world, -1)):
                partitions[r].append(part.clone())
        else:
            pieces = [[] for _ in range(world)]
            for n in g:
                t = trainable[n].reshape(-1)
                part = math.ceil(t.numel() / world)
                t = torch.cat([t, torch.full((part * world - t.numel(),), 9.0)])
                for r in range(world):
                    pieces[r].append(t[r * part:(r + 1) * part])
            for r in range(world):
                partitions[r].append(torch.cat(pieces[r]))
    for n, t in frozen.items():
        if stage < 3:
            frozen_frags[0][n] = t
        else:
            part = math.ceil(t.numel() / world)
            flat = torch.cat([t.reshape(-1), torch.zeros(part * world - t.numel())])
            for r in range(world):
                frozen_frags[r][n] = flat[r * part:(r + 1) * part].clone()

    files = {}
    model_ranks = range(world) if stage == 3 else [0]
    for r in model_ranks:
        name = (f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" if stage == 3
                else "mp_rank_00_model_states.pt")
        files[name] = {"module": module, "buffer_names": list(buffers),
                       "param_shapes": shapes, "frozen_param_shapes":
                       collections.OrderedDict((n, t.shape) for n, t in frozen.items()),
                       "frozen_param_fragments": frozen_frags[r],
                       "shared_params": {"tied.weight": "b.weight"},
                       "ds_config": {"zero_optimization": {"stage": stage}},
                       "ds_version": "0.19.8", "global_steps": 3}
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    prefix = "bf16_" if bf16 else ""
    for r in range(world):
        files[f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"] = {
            "optimizer_state_dict": {
                "zero_stage": stage_enum(stage), "loss_scaler": scaler.__new__(scaler),
                "partition_count": [world] * len(group_names) if stage < 3 else world,
                key: partitions[r],
                "base_optimizer_state": {"state": {0: {"exp_avg": partitions[r][0] * 2}}}},
            "ds_config": {}, "ds_version": "0.19.8"}
    save_committed(daemon, tag_dir, files, world)
    with open(os.path.join(os.path.dirname(tag_dir), "latest"), "w") as f:
        f.write(os.path.basename(tag_dir))
    want = collections.OrderedDict((n, module[n].float()) for n in buffers)  # as saved
    want.update(frozen)
    for g in group_names:
        want.update((n, trainable[n]) for n in g)
    want["tied.weight"] = want["b.weight"]
    return want


@pytest.mark.parametrize("stage,world,bf16", [(1, 1, True), (1, 2, True), (2, 2, False),
                                              (2, 1, False), (3, 1, False), (3, 2, False)])
def test_zero_to_fp32(daemon, tmp_path, stage, world, bf16, allowlist):
    """zero-to-fp32 of a ZeRO tag gives the fp32 masters bit for bit (buffers as fp32,
    frozen parameters, tied ones), from CHECKPOINT_DIR and `latest` (read from the files, and
    through the daemon), from DIR TAG, from the tag directory itself, as torch.save and
    safetensors (and into a directory, as
    DeepSpeed's script names the file); export of the tag gives the same."""
    job = os.path.join(daemon.root, "ds")
    tag = os.path.join(job, f"z{stage}w{world}")
    want = zero_tag(daemon, tag, stage, world, bf16)
    out = str(tmp_path / "fp32.pt")
    r = cli("zero-to-fp32", job, out)
    assert "fp32 weights" in r.stdout
    got = torch.load(out)
    same(want, got)
    assert got["tied.weight"] is got["b.weight"]
    cli("zero-to-fp32", job, str(tmp_path / "d.pt"), socket=daemon.socket)  # through it
    same(want, torch.load(str(tmp_path / "d.pt")))
    cli("zero-to-fp32", job, os.path.basename(tag), str(tmp_path / "b.safetensors"))
    from safetensors.torch import load_file
    flat = load_file(str(tmp_path / "b.safetensors"))
    same(dict(want), {k: flat[k] for k in want})
    os.mkdir(tmp_path / "d")
    cli("zero-to-fp32", tag, str(tmp_path / "d"), "--safe_serialization")
    same(dict(want), {k: v for k, v in load_file(str(tmp_path / "d" / "model.safetensors")
                                                 ).items()})
    cli("export", tag, str(tmp_path / "e.pt"))
    same(want, torch.load(str(tmp_path / "e.pt")))
    cli("zero-to-fp32", "--exclude_frozen_parameters", job, str(tmp_path / "nf.pt"))
    assert "frozen.weight" not in torch.load(str(tmp_path / "nf.pt"))


def test_zero_to_fp32_bad_input(daemon, tmp_path, allowlist):
    """A ZeRO-2 tag of two ranks with a rank's optimizer file gone says how many it expected;
    a flipped byte in a partition fails its checksum; a tag that is not DeepSpeed's, a
    missing tag and a tag not committed say so."""
    job = os.path.join(daemon.root, "ds")
    tag = os.path.join(job, "broken")
    zero_tag(daemon, tag, 2, 2)
    os.unlink(os.path.join(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt.safetensors"))
    r = cli("zero-to-fp32", job, "broken", str(tmp_path / "o.pt"), ok=False)
    assert "expected 2 of '*_optim_states.pt'" in r.stderr and "found 1 files" in r.stderr
    tag2 = os.path.join(job, "flip")
    zero_tag(daemon, tag2, 3, 1)
    path = os.path.join(tag2, "zero_pp_rank_0_mp_rank_00_optim_states.pt.safetensors")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    r = cli("zero-to-fp32", tag2, str(tmp_path / "o.pt"), ok=False)
    assert "checksum mismatch" in r.stderr and "optim_states.pt.safetensors" in r.stderr
    r = cli("zero-to-fp32", job, "nosuch", str(tmp_path / "o.pt"), ok=False)
    assert "nosuch' doesn't exist" in r.stderr
    save_committed(daemon, os.path.join(job, "plain"), {"rank0": plain_state()})
    r = cli("zero-to-fp32", job, "plain", str(tmp_path / "o.pt"), ok=False)
    assert "holds no DeepSpeed file saved through dsckpt" in r.stderr
    os.unlink(os.path.join(tag2, "MANIFEST.json"))
    r = cli("zero-to-fp32", tag2, str(tmp_path / "o.pt"), ok=False)
    assert "is not committed (no MANIFEST.json)" in r.stderr
    assert not os.path.exists(tmp_path / "o.pt")
