"""dsckpt.dcp on CUDA: DTensors on a one-rank device mesh ("cuda", (1,)), saved with DCP through
dsckpt.dcp.Writer and loaded with dsckpt.dcp.Reader, bytes equal. One rank because NCCL
cannot put two processes on one GPU; tests/python/modern/test_dcp.py covers resharding
across gloo ranks on the CPU. A model sharded by FSDP2's fully_shard with AdamW state
(dcp.save, loaded into a differently initialised model), and distribute_tensor DTensors
(Shard and Replicate, fp32/bf16/int64) through async_save with the tensors changed right after
staging_completion (the checkpoint must hold the values of the save call). Skipped without a
GPU or without torch >= 2.4; on a GPU node: PYTHON=python3 tests/python/run build/gpu."""
import os
import shutil
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: GPU path not run", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")
if not hasattr(dcp, "async_save"):
    pytest.skip(f"torch {torch.__version__} has no dcp.async_save", allow_module_level=True)
tensor_mod = pytest.importorskip("torch.distributed.tensor", reason="DTensor missing (torch < 2.4)")
ddcp = pytest.importorskip("dsckpt.dcp", reason="dsckpt.dcp needs torch >= 2.4")

import torch.distributed as dist  # noqa: E402

import dsckpt  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

from conftest import Daemon  # noqa: E402

T = 120
Replicate, Shard = tensor_mod.Replicate, tensor_mod.Shard


def fully_shard_fn():
    """FSDP2's fully_shard (public in torch >= 2.6, composable before), or None."""
    try:
        from torch.distributed.fsdp import fully_shard
        return fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
            return fully_shard
        except ImportError:
            return None


@pytest.fixture(scope="module")
def mesh():
    """Rank 0 of a one-rank group (gloo for DCP's CPU collectives, NCCL for CUDA) and its
    one-GPU device mesh."""
    torch.cuda.set_device(0)
    store = tempfile.mkdtemp(prefix="dsckpt-dcp-cuda.")
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{store}/store", rank=0,
                            world_size=1)
    try:
        yield init_device_mesh("cuda", (1,))
    finally:
        dist.destroy_process_group()
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture
def big_daemon():
    """A daemon whose cache holds the model, its AdamW state and the DTensors at once."""
    d = Daemon(cache_gib=0.5)
    yield d
    d.stop()


def model(seed):
    """A small MLP on the GPU whose weights come from seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 256), torch.nn.LayerNorm(256)).cuda()


def local_bytes(t):
    """A copy of a tensor's values (a DTensor's whole tensor) on the CPU, as raw bytes."""
    if isinstance(t, tensor_mod.DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone().reshape(-1).view(torch.uint8)


def flat(sd, prefix=""):
    """{dotted key: tensor} of every tensor in a nested state dict."""
    out = {}
    for k, v in sd.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flat(v, key))
        elif isinstance(v, torch.Tensor):
            out[key] = v
    return out


def test_fsdp2_model_and_optimizer_round_trip(big_daemon, mesh):
    """An FSDP2 model and its AdamW state (DTensors) saved by dcp.save, loaded by dcp.load
    into another model: every tensor byte-equal, every file served by the daemon."""
    fully_shard = fully_shard_fn()
    if fully_shard is None:
        pytest.skip(f"torch {torch.__version__} has no FSDP2 fully_shard")
    conn = dsckpt.Connection(big_daemon.socket, job="pytest", rank=0, world_size=1)
    tag = os.path.join(big_daemon.root, "pytest", "fsdp2")
    m = model(1)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(8, 256, device="cuda")).square().mean().backward()
    opt.step()
    msd, osd = get_state_dict(m, opt)
    assert any(isinstance(v, tensor_mod.DTensor) for v in msd.values())
    want = {k: local_bytes(v) for k, v in flat({"model": msd, "optim": osd}).items()}
    dcp.save({"model": msd, "optim": osd},
             storage_writer=ddcp.Writer(tag, conn=conn, timeout=T))

    m2 = model(2)
    fully_shard(m2, mesh=mesh)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    m2(torch.randn(8, 256, device="cuda")).square().mean().backward()
    opt2.step()  # the optimizer state exists, with other values
    msd2, osd2 = get_state_dict(m2, opt2)
    reader = ddcp.Reader(tag, conn=conn)
    dcp.load({"model": msd2, "optim": osd2}, storage_reader=reader)
    set_state_dict(m2, opt2, model_state_dict=msd2, optim_state_dict=osd2)
    got = {k: local_bytes(v) for k, v in
           flat({"model": get_state_dict(m2, opt2)[0],
                 "optim": get_state_dict(m2, opt2)[1]}).items()}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert set(reader.sources.values()) == {"daemon"}, reader.sources
    conn.close()


def test_distribute_tensor_async_save_snapshot(big_daemon, mesh):
    """DTensors through async_save, changed once staging is complete: the checkpoint holds
    the values of the save call, loaded back into DTensors of the same placements."""
    conn = dsckpt.Connection(big_daemon.socket, job="pytest", rank=0, world_size=1)
    tag = os.path.join(big_daemon.root, "pytest", "dtensors")
    g = torch.Generator(device="cuda").manual_seed(7)
    src = {"w": (torch.randn(1024, 384, device="cuda", generator=g), [Shard(0)]),
           "emb": (torch.randn(300, 64, device="cuda", generator=g).bfloat16(), [Shard(1)]),
           "ids": (torch.arange(5000, device="cuda"), [Replicate()])}
    sd = {k: tensor_mod.distribute_tensor(t, mesh, p) for k, (t, p) in src.items()}
    want = {k: local_bytes(v) for k, v in sd.items()}
    r = dcp.async_save(sd, storage_writer=ddcp.Writer(tag, conn=conn, timeout=T))
    r.staging_completion.result(timeout=T)
    for v in sd.values():  # training goes on: the checkpoint keeps the save call's values
        v.to_local().add_(1)
    r.upload_completion.result(timeout=T)

    back = {k: tensor_mod.distribute_tensor(torch.zeros_like(t), mesh, p)
            for k, (t, p) in src.items()}
    reader = ddcp.Reader(tag, conn=conn)
    dcp.load(back, storage_reader=reader)
    for k in want:
        assert isinstance(back[k], tensor_mod.DTensor) and back[k].placements == sd[k].placements
        assert torch.equal(local_bytes(back[k]), want[k]), k
    assert set(reader.sources.values()) == {"daemon"}, reader.sources
    conn.close()
