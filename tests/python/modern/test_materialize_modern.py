"""dsckpt.torch.materialize under a modern torch: the tests of test_materialize, a model built
under ``with torch.device("meta")``, and the other way the README shows, dsckpt.torch.load
then ``load_state_dict(assign=True)`` (torch >= 2.1), read by the daemon."""
import torch

import dsckpt.torch as dt
from test_materialize import *  # noqa: F401,F403 - collected here too
from test_materialize import GPT, CTX, assert_resumes, loads_seen, new_opt, trained


def test_materialize_built_under_torch_device_meta(daemon, conn):
    d, loss, ref = trained(daemon.root, conn)
    with torch.device("meta"):
        model = GPT()
    assert model.mask.is_meta  # the model's own buffer: made again by the caller
    model.mask = torch.ones(CTX, CTX).tril().bool()
    opt = new_opt(model)
    before = loads_seen(daemon)
    assert dt.materialize(model, opt, d, conn=conn, device="cpu").how == "daemon"
    assert loads_seen(daemon) == before + 1
    assert_resumes(d, loss, ref, model, opt)


def test_load_then_assign_reads_through_daemon(daemon, conn):
    d, loss, ref = trained(daemon.root, conn)
    with torch.device("meta"):
        model = GPT()
    model.mask = torch.ones(CTX, CTX).tril().bool()
    before = loads_seen(daemon)
    state = dt.load(d, "rank0", map_location="cpu", conn=conn)
    assert loads_seen(daemon) == before + 1
    model.load_state_dict(state["model"], assign=True)
    model.head.weight = model.wte.weight  # assign replaces each key's parameter: tie again
    opt = new_opt(model)
    opt.load_state_dict(state["optimizer"])
    assert_resumes(d, loss, ref, model, opt)


def test_dcp_reader_into_model_built_on_meta(daemon, conn):
    """DCP's way, which needs its destinations allocated: a meta model given memory without
    initialisation (to_empty), its optimizer state made by get_state_dict, then dcp.load
    through dsckpt.dcp.Reader (the daemon fills every tensor) and set_state_dict."""
    import os

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import dsckpt.dcp
    from test_materialize import T, batches, step

    torch.manual_seed(0)
    model = GPT()
    opt = new_opt(model)
    data = batches(3)
    for b in data[:2]:
        step(model, opt, b)
    tag = os.path.join(daemon.root, "job", "dcp")
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, no_dist=True,
             storage_writer=dsckpt.dcp.Writer(tag, conn=conn, timeout=T))
    loss = step(model, opt, data[2])
    with torch.device("meta"):
        fresh = GPT()
    fresh.to_empty(device="cpu")  # memory, no initialisation; made buffers made again
    fresh.head.weight = fresh.wte.weight  # to_empty unties them (torch 2.13)
    fresh.mask = torch.ones(CTX, CTX).tril().bool()
    fresh.scale = torch.empty(())
    fopt = new_opt(fresh)
    msd, osd = get_state_dict(fresh, fopt)
    reader = dsckpt.dcp.Reader(tag, conn=conn)
    dcp.load({"model": msd, "optim": osd}, storage_reader=reader, no_dist=True)
    assert set(reader.sources.values()) == {"daemon"}, reader.sources
    set_state_dict(fresh, fopt, model_state_dict=msd, optim_state_dict=osd)
    assert fresh.head.weight is fresh.wte.weight
    assert torch.equal(step(fresh, fopt, data[2]), loss)
    for p, q in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(p, q)
