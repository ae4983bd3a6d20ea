"""dsckpt.materialize.allocate: a model built on the meta device given uninitialised memory for
a loader that fills allocated tensors (DeepSpeed's load_checkpoint, DCP's dcp.load): tied
parameters stay one, real buffers keep their values, the optimizer follows the new
parameters, and a non-persistent buffer on the meta device raises with nothing changed."""
import pytest
import torch

from dsckpt.materialize import allocate, empty_weights
from test_materialize import GPT, CTX, new_opt, on_meta, step, batches


def test_allocate_gives_memory_keeping_ties_and_buffers():
    model, opt = on_meta()
    mask = model.mask.clone()
    assert allocate(model, "cpu", optimizer=opt) is model
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert model.head.weight is model.wte.weight  # to_empty would untie them
    assert torch.equal(model.mask, mask)          # to_empty would leave garbage
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], model.parameters()))
    with torch.no_grad():  # filled as a loader would: the model trains like any other
        torch.manual_seed(0)
        ref = GPT()
        for p, q in zip(model.parameters(), ref.parameters()):
            p.copy_(q)
        model.scale.copy_(ref.scale)
    ref_opt = new_opt(ref)
    b = batches(1)[0]
    assert torch.equal(step(model, opt, b), step(ref, ref_opt, b))


def test_allocate_moves_real_tensors():
    torch.manual_seed(0)
    model = GPT()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    allocate(model, "cpu")
    assert model.head.weight is model.wte.weight
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_allocate_refuses_meta_non_persistent_buffer():
    model, opt = on_meta()
    model.mask = torch.empty(CTX, CTX, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="no checkpoint holds: mask;"):
        allocate(model, "cpu", optimizer=opt)
    assert all(p.is_meta for p in model.parameters())
    assert all(p.is_meta for p in opt.param_groups[0]["params"])
