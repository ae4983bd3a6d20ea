"""DCP loads into a model built on the meta device, through dsckpt.dcp.Reader: with
dsckpt.materialize.allocate (no process group needed, ties and buffers kept), and DCP's own
meta path, which allocates on the process group's default device and needs one."""
import os

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

import dsckpt.dcp  # noqa: E402
from dsckpt.materialize import allocate  # noqa: E402
from test_materialize import GPT, T, batches, new_opt, on_meta, step  # noqa: E402


def saved(root, conn):
    """Two steps, a DCP save through dsckpt, the third step: the tag, its loss, the model."""
    torch.manual_seed(0)
    model = GPT()
    opt = new_opt(model)
    data = batches(3)
    for b in data[:2]:
        step(model, opt, b)
    tag = os.path.join(root, "job", "dcp")
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, no_dist=True,
             storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T))
    return tag, step(model, opt, data[2]), model


def test_dcp_load_into_allocated_meta_model(daemon, conn):
    tag, loss, ref = saved(daemon.root, conn)
    model, opt = on_meta()
    allocate(model, "cpu", optimizer=opt)  # memory, no init; the head stays the embedding
    msd, osd = get_state_dict(model, opt)
    reader = dsckpt.dcp.Reader(tag, conn=conn)
    dcp.load({"model": msd, "optim": osd}, storage_reader=reader, no_dist=True)
    assert set(reader.sources.values()) == {"daemon"}, reader.sources
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    assert model.head.weight is model.wte.weight
    assert torch.equal(step(model, opt, batches(3)[2]), loss)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_dcp_own_meta_path_needs_a_process_group(daemon, conn, tmp_path):
    tag, _, ref = saved(daemon.root, conn)
    model, _ = on_meta()
    with pytest.raises(dcp.api.CheckpointException) as e:
        dcp.load({"model": model.state_dict()}, no_dist=True,
                 storage_reader=dsckpt.dcp.Reader(tag, conn=conn))
    assert "process group has not been initialized" in str(e.value.failures[0])
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        sd = {"model": model.state_dict()}
        reader = dsckpt.dcp.Reader(tag, conn=conn)
        dcp.load(sd, storage_reader=reader)  # DCP replaces each meta tensor: gloo's CPU
    finally:
        dist.destroy_process_group()
    assert set(reader.sources.values()) == {"daemon"}, reader.sources
    model.load_state_dict(sd["model"], assign=True)
    model.head.weight = model.wte.weight  # assign replaces each key's parameter: tie again
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert not p.is_meta and p.device.type == "cpu", name
