"""dsckpt.lightning with Lightning itself (tests/python/modern/requirements.txt's pin), on
the CPU against real daemons: a fit that checkpoints through DsckptCheckpointIO, ModelCheckpoint
removing old checkpoints, a new Trainer resuming from ours with equal state, the optimizer
step waiting for SNAPSHOT after the closure, and the constructor without a daemon."""
import atexit
import copy
import json
import os
import subprocess
import sys

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import dsckpt  # noqa: E402
import dsckpt.torch as dt  # noqa: E402
from dsckpt import _blob  # noqa: E402
from dsckpt._files import read_meta  # noqa: E402
from dsckpt.lightning import DsckptCheckpointIO  # noqa: E402
from conftest import REPO  # noqa: E402

DSCKPTCTL = os.path.join(os.path.dirname(os.environ.get("DSCKPTD", os.path.join(
    REPO, "build", "dsckptd"))), "dsckptctl")


class Tiny(L.LightningModule):
    """Two linear layers and Adam; eight batches an epoch, always in the same order."""

    def __init__(self, lr=0.05, seed=0):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 1))
        self.events = []

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("progress", float(self.global_step))  # monitored: newest is best
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.events.append(("closure",))  # inside the closure, after backward

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        opt.register_step_post_hook(lambda *a: self.events.append(("step",)))
        return opt

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(64, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


class SpyIO(DsckptCheckpointIO):
    """Records what each save held (copies) and when it was called."""

    def __init__(self, *a, events=None, **kw):
        super().__init__(*a, **kw)
        self.saved = {}
        self.events = events

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saved[os.path.basename(path)] = copy.deepcopy(
            {k: checkpoint[k] for k in ("state_dict", "optimizer_states", "global_step")})
        if self.events is not None:
            self.events.append(("save", checkpoint["global_step"]))
        super().save_checkpoint(checkpoint, path, storage_options)


class Restored(Callback):
    """Copies the model's and optimizer's state when training (re)starts."""

    def on_train_start(self, trainer, module):
        self.step = trainer.global_step
        self.state = copy.deepcopy(module.state_dict())
        self.optim = copy.deepcopy(trainer.optimizers[0].state_dict())


def trainer(io, dirpath, max_steps, callbacks=(), strategy="auto", devices=1, **ckpt):
    """A CPU Trainer checkpointing every 4 steps into dirpath through io."""
    ckpt = {"every_n_train_steps": 4, "save_top_k": 2, "monitor": "progress",
            "mode": "max", **ckpt}
    return L.Trainer(max_steps=max_steps, accelerator="cpu", devices=devices,
                     strategy=strategy, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=os.path.dirname(dirpath), plugins=[io],
                     callbacks=[ModelCheckpoint(dirpath=dirpath, **ckpt), *callbacks])


def assert_equal(a, b):
    """Nested dicts/lists of tensors and values are equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b.to(a.device)), (a, b)
    else:
        assert a == b


def verify(path):
    """dsckptctl verify exits 0 on a committed checkpoint directory."""
    r = subprocess.run([DSCKPTCTL, "verify", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_fit_saves_removes_and_resumes(daemon):
    job = os.path.join(daemon.root, "tiny")
    io = SpyIO(daemon.socket)
    model = Tiny()
    trainer(io, job, 12).fit(model)
    # saves at steps 4, 8, 12; save_top_k=2 removed step 4's; teardown committed all
    assert sorted(os.listdir(job)) == [".dsckpt-no-latest", "epoch=0-step=8.ckpt",
                                       "epoch=1-step=12.ckpt"]
    assert sorted(io.saved) == ["epoch=0-step=4.ckpt", "epoch=0-step=8.ckpt",
                                "epoch=1-step=12.ckpt"]
    assert io.wait_committed() == [os.path.join(job, n) for n in sorted(io.saved)]
    for name in ("epoch=0-step=8.ckpt", "epoch=1-step=12.ckpt"):
        ckpt = os.path.join(job, name)
        assert sorted(os.listdir(ckpt)) == ["MANIFEST.json", "rank0.meta",
                                            "rank0.safetensors"]
        verify(ckpt)
    # Issue 31.12: no `latest` beside Lightning's checkpoints; dsckpt's resume finds the
    # newest by the manifests.
    assert dt.find_latest(job) == "epoch=1-step=12.ckpt"

    # What Lightning gets back is what it handed over.
    loaded = io.load_checkpoint(os.path.join(job, "epoch=0-step=8.ckpt"))
    assert_equal(io.saved["epoch=0-step=8.ckpt"],
                 {k: loaded[k] for k in ("state_dict", "optimizer_states", "global_step")})
    assert loaded["hyper_parameters"] == {"lr": 0.05, "seed": 0}
    assert "loops" in loaded and "callbacks" in loaded

    # A new Trainer and a differently initialised model resume from step 8.
    io2 = DsckptCheckpointIO(daemon.socket)
    restored = Restored()
    model2 = Tiny(seed=7)
    t2 = trainer(io2, os.path.join(daemon.root, "tiny2"), 16, callbacks=[restored])
    t2.fit(model2, ckpt_path=os.path.join(job, "epoch=0-step=8.ckpt"))
    assert restored.step == 8
    assert_equal(io.saved["epoch=0-step=8.ckpt"]["state_dict"], restored.state)
    assert_equal(io.saved["epoch=0-step=8.ckpt"]["optimizer_states"][0], restored.optim)
    assert t2.global_step == 16
    assert sorted(os.listdir(os.path.join(daemon.root, "tiny2"))) == [
        ".dsckpt-no-latest", "epoch=1-step=12.ckpt", "epoch=1-step=16.ckpt"]

    # Training on from the resumed state gave what the first run gave at step 12.
    model3, io3 = Tiny(seed=9), DsckptCheckpointIO(daemon.socket)
    again = trainer(io3, os.path.join(daemon.root, "tiny3"), 12)
    again.fit(model3, ckpt_path=os.path.join(job, "epoch=0-step=8.ckpt"))
    assert_equal(io.saved["epoch=1-step=12.ckpt"]["state_dict"], model3.state_dict())


def test_step_waits_for_snapshot_after_the_closure(daemon, monkeypatch):
    levels = []
    wait = dt.SaveHandle.wait_snapshot

    def spy(self, timeout=None):
        level = wait(self, timeout)
        model.events.append(("snapshot", level))
        levels.append(level)
        return level

    monkeypatch.setattr(dt.SaveHandle, "wait_snapshot", spy)
    model = Tiny()
    io = SpyIO(daemon.socket, events=model.events)
    trainer(io, os.path.join(daemon.root, "job"), 10).fit(model)
    ev = [e[0] for e in model.events]
    saves = [i for i, e in enumerate(ev) if e == "save"]
    assert len(saves) == 2  # steps 4 and 8
    for i in saves:  # the next step: its closure ran, then the wait, then the update
        assert ev[i + 1:i + 4] == ["closure", "snapshot", "step"]
    assert all(lv >= dsckpt.Level.SNAPSHOT for lv in levels)
    assert ev.count("snapshot") == 2  # and no wait where nothing was pending


def test_save_last_overwrites_and_links(daemon):
    job = os.path.join(daemon.root, "last")
    io = DsckptCheckpointIO(daemon.socket)
    trainer(io, job, 12, save_top_k=1, save_last=True).fit(Tiny())
    assert sorted(os.listdir(job)) == [".dsckpt-no-latest", "epoch=1-step=12.ckpt",
                                       "last.ckpt"]
    verify(os.path.join(job, "last.ckpt"))  # saved three times, committed each time
    assert io.load_checkpoint(os.path.join(job, "last.ckpt"))["global_step"] == 12

    link = os.path.join(daemon.root, "link")
    io = DsckptCheckpointIO(daemon.socket)
    trainer(io, link, 8, save_top_k=1, save_last="link").fit(Tiny())
    assert os.readlink(os.path.join(link, "last.ckpt")) == "epoch=0-step=8.ckpt"
    assert io.load_checkpoint(os.path.join(link, "last.ckpt"))["global_step"] == 8


class LastIO(DsckptCheckpointIO):
    """At each save of last.ckpt after the first: its commit is held back (GATE) while the
    test looks at last.ckpt, which must still be the previous version, whole."""

    GATE = None

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.looked = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        dir = os.path.abspath(path)
        if os.path.basename(dir) != "last.ckpt":
            return super().save_checkpoint(checkpoint, path, storage_options)
        self._wait_pending(dir)  # the previous version's commit is over
        before = dt.load(dir, "rank0", "cpu")["global_step"] if os.path.isdir(dir) else None
        LastIO.GATE.clear()
        try:
            super().save_checkpoint(checkpoint, path, storage_options)
            if before is not None:  # the new version is staged, not committed: the old one
                verify(dir)
                assert dt.load(dir, "rank0", "cpu")["global_step"] == before
                self.looked.append((before, checkpoint["global_step"]))
        finally:
            LastIO.GATE.set()


def test_save_last_replaces_in_one_step(daemon, monkeypatch):
    """ModelCheckpoint(save_last=True) saves last.ckpt again and again: until each new
    version is committed, last.ckpt is the previous one, whole and loadable; then the new
    one, with nothing left beside it."""
    import threading
    LastIO.GATE = threading.Event()
    LastIO.GATE.set()
    commit = dsckpt.Connection.commit

    def gated(self, dir, timeout=None):
        if os.path.basename(dir) == "last.ckpt":
            LastIO.GATE.wait(60)
        return commit(self, dir, timeout)

    monkeypatch.setattr(dsckpt.Connection, "commit", gated)
    job = os.path.join(daemon.root, "gated")
    io = LastIO(daemon.socket)
    trainer(io, job, 12, save_top_k=1, save_last=True).fit(Tiny())
    assert io.looked == [(4, 8), (8, 12)]
    assert sorted(os.listdir(job)) == [".dsckpt-no-latest", "epoch=1-step=12.ckpt", "last.ckpt"]
    verify(os.path.join(job, "last.ckpt"))
    assert io.load_checkpoint(os.path.join(job, "last.ckpt"))["global_step"] == 12


def test_remove_only_ours(daemon, tmp_path):
    io = DsckptCheckpointIO(daemon.socket)
    ckpt = os.path.join(daemon.root, "j", "a.ckpt")
    io.save_checkpoint({"w": torch.ones(3), "step": 1}, ckpt)
    io.wait_committed()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "rank0.safetensors").write_bytes(b"x")
    link = os.path.join(daemon.root, "j", "b.ckpt")
    os.symlink(foreign, link)
    io.remove_checkpoint(link)  # the link goes, not what it points at
    assert not os.path.lexists(link) and (foreign / "rank0.safetensors").exists()
    mixed = os.path.join(daemon.root, "j", "mixed.ckpt")
    os.mkdir(mixed)
    open(os.path.join(mixed, "notes.txt"), "w").close()
    io.remove_checkpoint(mixed)  # not ours: left alone
    assert os.listdir(mixed) == ["notes.txt"]
    with pytest.raises(FileExistsError):
        io.save_checkpoint({"w": torch.ones(1)}, mixed)
    io.remove_checkpoint(ckpt)
    assert not os.path.exists(ckpt)
    io.remove_checkpoint(ckpt)  # gone already: nothing to do
    io.teardown()


def test_without_a_daemon_the_constructor_fails(tmp_path):
    sock = str(tmp_path / "none.sock")
    with pytest.raises(dsckpt.DaemonUnavailable, match="no dsckptd answers on .*none.sock"):
        DsckptCheckpointIO(sock)


def _no_gloo_thread_at_exit():
    """At exit, after the plugin's own exit handler: a gloo thread still running when the
    interpreter finalizes may abort the rank (see GroupGoneAtExit); the rank exits 3."""
    left = sorted(n for n in (open(f"/proc/self/task/{t}/comm").read().strip()
                              for t in os.listdir("/proc/self/task"))
                  if n.startswith(("pt_gloo", "gloo")))
    if left:
        sys.stderr.write(f"rank {os.environ.get('LOCAL_RANK')}: the process group is still "
                         f"up as the interpreter finalizes: {left}\n")
        sys.stderr.flush()
        os._exit(3)


class GroupGoneAtExit(Callback):
    """Issue 31.1: Lightning leaves a gloo group up until the interpreter finalizes, where a
    gloo thread dropping a barrier's work (holding an earlier all_reduce's Python tensor)
    takes the GIL: pthread_exit, and "terminate called without an active exception"
    (SIGABRT, rarely: a set_terminate hook showed that stack). Registered before the
    plugin's teardown registers its own handler, this check runs after it."""

    def setup(self, trainer, module, stage):
        if torch.distributed.is_initialized():
            atexit.register(_no_gloo_thread_at_exit)


def test_ddp_spawn_saves_on_rank_zero_and_every_rank_resumes(daemon):
    """Two CPU ranks (gloo): the plugin is pickled into each; only rank 0 saves, and the
    commit's world is that one saver's. Resuming loads on both ranks, without pickle: the
    spawned processes allow the AttributeDict of the hyper-parameters too. Each rank's
    process group is gone before its interpreter finalizes (GroupGoneAtExit)."""
    from lightning.fabric.utilities.data import AttributeDict
    job = os.path.join(daemon.root, "ddp")
    kw = dict(strategy="ddp_spawn", devices=2, callbacks=[GroupGoneAtExit()])
    io = DsckptCheckpointIO(daemon.socket)
    t = trainer(io, job, 8, **kw)
    t.fit(WithArgs(cfg=AttributeDict(width=8)))
    # a DistributedSampler halves the epoch: four steps each
    assert sorted(os.listdir(job)) == [".dsckpt-no-latest", "epoch=0-step=4.ckpt",
                                       "epoch=1-step=8.ckpt"]
    for name in ("epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"):
        assert sorted(os.listdir(os.path.join(job, name))) == [
            "MANIFEST.json", "rank0.meta", "rank0.safetensors"]
        verify(os.path.join(job, name))
    t2 = trainer(DsckptCheckpointIO(daemon.socket), os.path.join(daemon.root, "ddp2"), 12,
                 **kw)
    t2.fit(WithArgs(seed=3), ckpt_path=os.path.join(job, "epoch=0-step=4.ckpt"))
    # the workers resumed at step 4 (the main process's trainer does not see their steps)
    assert sorted(os.listdir(os.path.join(daemon.root, "ddp2"))) == [
        ".dsckpt-no-latest", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt"]


class Stats:
    """A value of the user's own class in a checkpoint (a callback's state, say)."""

    def __init__(self, n):
        self.n = n


def test_load_unpickles_only_with_weights_only_false(daemon):
    """A checkpoint of plain values loads as it is; one holding a value of another class
    raises dsckpt.PickleRefused unless Lightning's weights_only is False."""
    io = DsckptCheckpointIO(daemon.socket)
    plain = os.path.join(daemon.root, "w", "plain.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "epoch": 1,
                        "loops": {"fit": {"done": True, "lr": float("inf")}}}, plain)
    odd = os.path.join(daemon.root, "w", "odd.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "callbacks": {"s": Stats(3)}}, odd)
    io.wait_committed()
    assert io.load_checkpoint(plain)["loops"] == {"fit": {"done": True, "lr": float("inf")}}
    with pytest.raises(dsckpt.PickleRefused, match="test_lightning.Stats"):
        io.load_checkpoint(odd)
    with pytest.raises(dsckpt.PickleRefused):
        io.load_checkpoint(odd, weights_only=True)
    assert io.load_checkpoint(odd, weights_only=False)["callbacks"]["s"].n == 3
    io.teardown()


class WithArgs(Tiny):
    """Hyper-parameters as scripts pass them: an argparse.Namespace and a dict of Lightning's
    AttributeDict."""

    def __init__(self, args=None, cfg=None, lr=0.05, seed=0):
        super().__init__(lr=lr, seed=seed)
        self.save_hyperparameters()


def test_hyper_parameters_of_allowed_classes_resume_without_pickle(daemon):
    """A fit whose hyper-parameters hold an argparse.Namespace and an AttributeDict saves
    them as allowed objects (no pickled section), and a new Trainer resumes from it with
    Lightning's default weights_only."""
    from lightning.fabric.utilities.data import AttributeDict
    import argparse
    job = os.path.join(daemon.root, "hp")
    io = DsckptCheckpointIO(daemon.socket)
    args = argparse.Namespace(layers=2, names=["a", "b"])
    cfg = AttributeDict(width=8, act="tanh")
    trainer(io, job, 4).fit(WithArgs(args=args, cfg=cfg))
    ckpt = os.path.join(job, "epoch=0-step=4.ckpt")
    io.wait_committed()
    loaded = io.load_checkpoint(ckpt)
    hp = loaded["hyper_parameters"]
    assert hp["args"] == args and type(hp["cfg"]) is AttributeDict and hp["cfg"] == cfg
    info = _blob.read(read_meta(os.path.join(ckpt, "rank0.meta"))[_blob.BLOB], ckpt)
    assert not info["pickled"]
    assert json.loads(info["header"])["safe"] == [
        "argparse.Namespace", "lightning.fabric.utilities.data.AttributeDict"]
    io2 = DsckptCheckpointIO(daemon.socket)
    restored = Restored()
    t2 = trainer(io2, os.path.join(daemon.root, "hp2"), 8, callbacks=[restored])
    t2.fit(WithArgs(seed=3), ckpt_path=ckpt)
    assert restored.step == 4 and t2.global_step == 8
