"""python -m dsckpt export of what needs a modern torch: a DCP tag two gloo ranks saved with
DTensors and a ShardedTensor sharded over them, exported to one torch.save file equal to what
DCP's own dcp_to_torch_save makes of a FileSystemWriter save of the same state (and every
tensor at full size, bit for bit), to safetensors, and through dsckpt.export.dcp_to_torch_save;
and a Lightning checkpoint saved through DsckptCheckpointIO, exported whole (Lightning loads
it) and as its weights alone."""
import os
import subprocess
import sys

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")
pytest.importorskip("torch.distributed.tensor", reason="DTensor missing (torch < 2.4)")

import dsckpt  # noqa: E402
import dsckpt.dcp  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from dsckpt.export import dcp_to_torch_save  # noqa: E402
from conftest import REPO  # noqa: E402
from ranks import run_ranks  # noqa: E402

T = 60
SHAPES = {"w1": ((16, 12), torch.float32), "emb": ((9, 8), torch.bfloat16),
          "ids": ((7,), torch.int64)}
OPT = ((8, 5), torch.float32)  # saved as a ShardedTensor
DSCKPTCTL = os.path.join(os.path.dirname(os.environ.get("DSCKPTD", os.path.join(
    REPO, "build", "dsckptd"))), "dsckptctl")


def cli(*args, ok=True):
    """Runs python -m dsckpt args in a fresh process; its result."""
    env = dict(os.environ, DSCKPT_SOCKET="/nonexistent/dsckpt.sock")
    r = subprocess.run([sys.executable, "-m", "dsckpt", *args], capture_output=True, text=True,
                       env=env, timeout=300)
    assert (r.returncode == 0) == ok, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def same(a, b, path=""):
    """Nested equality, tensors bit for bit (dtype, shape, bytes)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.contiguous().view(torch.uint8) if a.numel() else a,
                           b.contiguous().view(torch.uint8) if b.numel() else b), path
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b), f"{path}: {sorted(a)} vs {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def full(name):
    """The whole tensor name stands for: distinct values in every element."""
    shape, dtype = SHAPES.get(name, OPT)
    n = torch.Size(shape).numel()
    return (torch.arange(n, dtype=torch.float64) * 0.5 + len(name)).reshape(shape).to(dtype)


def sharded_state(world):
    """Every weight a DTensor sharded by rows over the ranks, "opt" a ShardedTensor, a
    replicated plain tensor, and values DCP pickles."""
    from torch.distributed._shard.sharded_tensor import empty
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    opt = empty(spec, *OPT[0], dtype=OPT[1])
    for shard in opt.local_shards():
        rows = shard.metadata.shard_offsets[0]
        shard.tensor.copy_(full("opt")[rows:rows + shard.tensor.shape[0]])
    return {"model": {name: distribute_tensor(full(name), mesh, [Shard(0)]) for name in SHAPES},
            "opt": opt, "bias": torch.ones(12) * 3, "step": 7, "extra": {"lr": 0.25}}


def _save_both(rank, world, socket, tag, fsdir):
    """Each rank: the same sharded state saved through dsckpt.dcp.Writer and through DCP's
    own FileSystemWriter."""
    conn = dsckpt.Connection(socket, job="exp", rank=rank, world_size=world)
    dt.set_default_connection(conn)
    sd = sharded_state(world)
    dcp.save(sd, storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T))
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(fsdir))
    conn.close()


def test_export_dcp(daemon, tmp_path):
    """export of a 2-rank DCP tag equals dcp_to_torch_save of DCP's own save of the same
    state; every sharded tensor is whole; safetensors output holds the same tensors by key
    path and verifies; dsckpt.export.dcp_to_torch_save writes the same file."""
    tag = os.path.join(daemon.root, "exp", "s1")
    fsdir = str(tmp_path / "fs")
    run_ranks(_save_both, 2, daemon.socket, tag, fsdir, timeout=180)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as theirs
    theirs(fsdir, str(tmp_path / "ref.pt"))
    ref = torch.load(str(tmp_path / "ref.pt"), weights_only=False)

    out = str(tmp_path / "ours.pt")
    r = cli("export", tag, out)
    assert "from a dcp tag" in r.stdout
    ours = torch.load(out, weights_only=False)
    same(ref, ours)
    for name in SHAPES:
        same(full(name), ours["model"][name], name)
    same(full("opt"), ours["opt"], "opt")
    assert ours["step"] == 7 and ours["extra"] == {"lr": 0.25}

    st = str(tmp_path / "ours.safetensors")
    cli("export", tag, st)
    from safetensors.torch import load_file
    flat = load_file(st)
    for name in SHAPES:
        same(full(name), flat[f"model.{name}"], name)
    assert subprocess.run([DSCKPTCTL, "verify", st]).returncode == 0

    dcp_to_torch_save(tag, str(tmp_path / "api.pt"))
    same(ref, torch.load(str(tmp_path / "api.pt"), weights_only=False))

    os.unlink(os.path.join(tag, "__1_1.safetensors")
              if os.path.exists(os.path.join(tag, "__1_1.safetensors"))
              else os.path.join(tag, "__1_0.safetensors"))
    r = cli("export", tag, str(tmp_path / "broken.pt"), ok=False)
    assert "__1_" in r.stderr
    assert not os.path.exists(tmp_path / "broken.pt")


def test_export_lightning(daemon, tmp_path):
    """A Lightning checkpoint saved through DsckptCheckpointIO exports to a .ckpt file that
    Lightning's own loader resumes from, and --key state_dict gives its weights alone as
    safetensors, equal to the model's."""
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from dsckpt.lightning import DsckptCheckpointIO
    dirpath = os.path.join(daemon.root, "lit")
    io = DsckptCheckpointIO(socket=daemon.socket)
    torch.manual_seed(0)
    model = BoringModel()
    L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
              enable_model_summary=False, plugins=[io], default_root_dir=str(tmp_path),
              callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=4)]).fit(model)
    io.wait_committed()
    tags = [n for n in os.listdir(dirpath) if n.endswith(".ckpt")]
    assert len(tags) == 1
    tag = os.path.join(dirpath, tags[0])

    out = str(tmp_path / "plain.ckpt")
    cli("export", tag, out)
    ckpt = torch.load(out, weights_only=False)
    assert ckpt["global_step"] == 4
    same({k: v for k, v in model.state_dict().items()}, ckpt["state_dict"])
    resumed = BoringModel()
    L.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_progress_bar=False,
              enable_model_summary=False, enable_checkpointing=False,
              default_root_dir=str(tmp_path)).fit(resumed, ckpt_path=out)

    st = str(tmp_path / "weights.safetensors")
    cli("export", "--key", "state_dict", tag, st)
    from safetensors.torch import load_file
    same(dict(model.state_dict()), load_file(st))
