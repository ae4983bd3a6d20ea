"""dsckpt.torch.materialize: a GPT-like model built on the meta device and an AdamW made over
it, given their state from a checkpoint through the daemon and, without one, from the file;
the next training step equals the uninterrupted run's bit for bit, tied weights stay tied,
and a checkpoint that does not fit fails before anything is touched."""
import os

import pytest
import torch
from torch import nn

import dsckpt
import dsckpt.torch as dt
from dsckpt.materialize import empty_weights

T = 60  # seconds
VOCAB, WIDTH, CTX = 48, 32, 8


class Block(nn.Module):
    """Causal self-attention and an MLP, each behind a LayerNorm."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, mask):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        att = (q @ k.transpose(-2, -1)) / WIDTH ** 0.5
        att = att.masked_fill(~mask[:x.shape[1], :x.shape[1]], float("-inf")).softmax(-1)
        x = x + self.proj(att @ v)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small GPT: its head tied to the token embedding, a persistent buffer (scale) and a
    non-persistent one (the causal mask, made by the model, in no checkpoint)."""

    def __init__(self, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CTX, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("scale", torch.tensor(0.5))
        self.register_buffer("mask", torch.ones(CTX, CTX).tril().bool(), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.head(self.ln_f(x)) * (2 * self.scale)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batches(n):
    """n (input, target) batches of token ids."""
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, VOCAB, (4, CTX), generator=g),
             torch.randint(0, VOCAB, (4, CTX), generator=g)) for _ in range(n)]


def step(model, opt, batch):
    """One training step; its loss."""
    loss = model(*batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def new_opt(model):
    """The run's optimizer (the checkpoint's settings replace these on a resume)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def trained(root, conn, tag="t"):
    """Two steps, a checkpoint of model and optimizer, then the uninterrupted third step:
    the directory, the third loss and the model after it."""
    torch.manual_seed(0)
    model = GPT()
    opt = new_opt(model)
    data = batches(3)
    for b in data[:2]:
        step(model, opt, b)
    d = os.path.join(root, "job", tag)
    dt.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
             "extra": {"step": 2, "rng": torch.get_rng_state()}}, d, conn=conn).wait_durable(T)
    dt.commit(d, conn=conn, timeout=T)
    return d, step(model, opt, data[2]), model


def on_meta(layers=2):
    """A GPT built without initialising its weights, and an AdamW over it."""
    with empty_weights():
        model = GPT(layers)
    return model, new_opt(model)


def loads_seen(daemon):
    """How many LOAD_BEGIN requests the daemon handled (its debug log)."""
    return daemon.read_log().count("LOAD_BEGIN of")


def assert_resumes(d, loss, ref, model, opt):
    """model and opt resume the run: on no meta device, the head still the embedding, and the
    next step's loss and parameters those of the uninterrupted run."""
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert model.head.weight is model.wte.weight
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], model.parameters()))
    assert opt.param_groups[0]["lr"] == 1e-2
    assert int(opt.state[model.wte.weight]["step"]) == 2
    got = step(model, opt, batches(3)[2])
    assert torch.equal(got, loss), (got, loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.detach(), q.detach()), name


def test_materialize_through_daemon(daemon, conn):
    d, loss, ref = trained(daemon.root, conn)
    model, opt = on_meta()
    assert all(p.is_meta for p in model.parameters())
    before = loads_seen(daemon)
    got = dt.materialize(model, opt, d, conn=conn, device="cpu")
    assert got.how == "daemon" and got.model is model and got.optimizer is opt
    assert got.state["extra"]["step"] == 2 and got.state["extra"]["rng"].dtype == torch.uint8
    assert got.state["model"]["wte.weight"].data_ptr() == model.wte.weight.data_ptr()
    assert loads_seen(daemon) == before + 1
    assert_resumes(d, loss, ref, model, opt)


def test_materialize_without_daemon(daemon, conn, monkeypatch, tmp_path):
    d, loss, ref = trained(daemon.root, conn)
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    try:
        model, opt = on_meta()
        before = loads_seen(daemon)
        assert dt.materialize(model, opt, d, device="cpu").how == "file"
        assert loads_seen(daemon) == before
        assert_resumes(d, loss, ref, model, opt)
    finally:
        dt.set_default_connection(None)


def test_materialize_model_only(daemon, conn):
    d, _, ref = trained(daemon.root, conn)
    model, _ = on_meta()
    assert dt.materialize(model, None, d, conn=conn, device="cpu").how == "daemon"
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert p.device.type == "cpu" and not p.is_meta, name


def untouched(model, opt):
    """Every parameter still on the meta device, the optimizer without state."""
    return all(p.is_meta for p in model.parameters()) and not opt.state \
        and all(p.is_meta for p in opt.param_groups[0]["params"])


def test_materialize_missing_key(daemon, conn):
    d, _, _ = trained(daemon.root, conn)
    model, opt = on_meta(layers=3)  # blocks.2.* are not in the checkpoint
    with pytest.raises(dt.StateDictMismatch) as e:
        dt.materialize(model, opt, d, conn=conn, device="cpu")
    assert "model.blocks.2.qkv.weight" in e.value.missing
    assert "missing from the file: model.blocks.2" in str(e.value)
    assert untouched(model, opt)
    model, opt = on_meta(layers=1)  # the checkpoint's blocks.1.* fit nothing
    with pytest.raises(dt.StateDictMismatch) as e:
        dt.materialize(model, opt, d, conn=conn, device="cpu")
    assert "model.blocks.1.proj.bias" in e.value.unexpected
    assert untouched(model, opt)


def test_materialize_wrong_shape_and_dtype(daemon, conn):
    d, _, _ = trained(daemon.root, conn)
    model, opt = on_meta()
    with empty_weights():
        model.ln_f = nn.LayerNorm(WIDTH + 1)
    model.blocks[0].proj.bias = nn.Parameter(torch.empty(WIDTH, dtype=torch.float64,
                                                         device="meta"))
    opt = new_opt(model)
    with pytest.raises(dt.StateDictMismatch) as e:
        dt.materialize(model, opt, d, conn=conn, device="cpu")
    text = str(e.value)
    assert "model.ln_f.weight (model float32 [33], checkpoint float32 [32])" in text
    assert "model.blocks.0.proj.bias (model float64 [32], checkpoint float32 [32])" in text
    assert untouched(model, opt)


def test_materialize_optimizer_mismatch(daemon, conn):
    d, _, _ = trained(daemon.root, conn)
    model, _ = on_meta()
    opt = torch.optim.AdamW([{"params": list(model.parameters())[:3]},
                             {"params": list(model.parameters())[3:]}])
    with pytest.raises(ValueError, match="has 1 parameter groups, the optimizer 2"):
        dt.materialize(model, opt, d, conn=conn, device="cpu")
    assert untouched(model, opt)


def test_materialize_refuses_meta_buffer(daemon, conn):
    d, _, _ = trained(daemon.root, conn)
    model, opt = on_meta()
    model.mask = model.mask.to("meta")  # as torch.device("meta") would build it
    with pytest.raises(ValueError, match="non-persistent buffers.*: mask"):
        dt.materialize(model, opt, d, conn=conn, device="cpu")
    assert untouched(model, opt)


def test_materialize_corrupted_file_leaves_model(daemon, conn, monkeypatch, tmp_path):
    d, _, _ = trained(daemon.root, conn)
    with open(os.path.join(d, "rank0.safetensors"), "r+b") as f:
        f.seek(-8, os.SEEK_END)
        raw = f.read(4)
        f.seek(-8, os.SEEK_END)
        f.write(bytes(b ^ 0xff for b in raw))
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    try:
        model, opt = on_meta()
        with pytest.raises(dsckpt.LoadFailed, match="checksum"):
            dt.materialize(model, opt, d, device="cpu")
        assert untouched(model, opt)
    finally:
        dt.set_default_connection(None)


# dsckpt.torch.load's paths: which one ran is counted, not timed.

def counting(monkeypatch):
    """Counts the file reads dsckpt.torch.load may make; the serial one fails the test."""
    import dsckpt.torch as mod
    from dsckpt import _files
    calls = {"parallel": 0}
    real = _files.read_safetensors_buffer

    def parallel(*a, **kw):
        calls["parallel"] += 1
        return real(*a, **kw)

    def serial(*a, **kw):
        raise AssertionError("load read the file tensor by tensor, on one thread")

    monkeypatch.setattr(mod, "read_safetensors_buffer", parallel, raising=False)
    monkeypatch.setattr(mod, "read_safetensors", serial)
    return calls


def test_load_without_daemon_reads_in_parallel(daemon, conn, monkeypatch, tmp_path, caplog):
    d, _, _ = trained(daemon.root, conn)
    want = dt.load(d, "rank0", conn=conn)
    calls = counting(monkeypatch)
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    try:
        with caplog.at_level("INFO", logger="dsckpt.torch"):
            state = dt.load(d, "rank0", map_location="cpu")
    finally:
        dt.set_default_connection(None)
    assert calls["parallel"] == 1
    assert "no daemon for loading" in caplog.text
    for k, t in want["model"].items():
        assert torch.equal(state["model"][k], t), k
    assert state["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_load_onto_gpu_and_cpu_goes_through_daemon(daemon, conn, monkeypatch):
    """A model on the GPU with AdamW's step counters on the CPU (map_location None): one
    load by the daemon, each tensor back on its device."""
    torch.manual_seed(0)
    model = GPT().cuda()
    opt = new_opt(model)
    for b in batches(2):
        step(model, opt, tuple(t.cuda() for t in b))
    d = os.path.join(daemon.root, "job", "gpu")
    dt.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, d,
            conn=conn).wait_durable(T)
    dt.commit(d, conn=conn, timeout=T)
    calls = counting(monkeypatch)
    before = loads_seen(daemon)
    state = dt.load(d, "rank0", conn=conn)
    assert loads_seen(daemon) == before + 1 and calls["parallel"] == 0
    assert state["model"]["wte.weight"].is_cuda
    steps = [s["step"] for s in state["optimizer"]["state"].values()]
    assert all(s.device == torch.device("cpu") for s in steps)
    for k, t in model.state_dict().items():
        assert torch.equal(state["model"][k], t), k


@needs_cuda
def test_materialize_on_gpu(daemon, conn):
    """The H200 check: materialized on the GPU through the daemon, the next step equal."""
    torch.manual_seed(0)
    model = GPT().cuda()
    opt = new_opt(model)
    data = [tuple(t.cuda() for t in b) for b in batches(3)]
    for b in data[:2]:
        step(model, opt, b)
    d = os.path.join(daemon.root, "job", "gpu-meta")
    dt.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
             "rng": torch.get_rng_state()}, d, conn=conn).wait_durable(T)
    dt.commit(d, conn=conn, timeout=T)
    loss = step(model, opt, data[2])
    fresh, fopt = on_meta()
    before = loads_seen(daemon)
    got = dt.materialize(fresh, fopt, d, conn=conn, device="cuda:0")
    assert got.how == "daemon" and got.state["rng"].device.type == "cpu"
    assert loads_seen(daemon) == before + 1
    assert all(p.is_cuda for p in fresh.parameters()) and fresh.mask.is_cuda
    assert fresh.head.weight is fresh.wte.weight
    assert fopt.state[fresh.wte.weight]["exp_avg"].is_cuda
    assert torch.equal(step(fresh, fopt, data[2]), loss)
    for p, q in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(p, q)
