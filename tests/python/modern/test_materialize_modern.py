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
