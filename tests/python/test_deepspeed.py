"""dsckpt.deepspeed without DeepSpeed: a fake engine driver makes the calls DeepSpeed's
DeepSpeedEngine makes (0.19.8's runtime/engine.py: save_checkpoint, which also copies
zero_to_fp32.py into the tag; _commit_decoupled_checkpoint at the next step; load_checkpoint
following `latest` and globbing file names; destroy() calling cleanup()). Real DeepSpeed runs
in tests/gpu/ds_train.py."""
import collections
import copy
import glob
import importlib.util
import logging
import os
import sys
import threading

import pytest
import torch

import dsckpt
import dsckpt.deepspeed as dd
from ranks import run_ranks

T = 60


class FakeDeepSpeed:
    """The checkpoint-engine calls of DeepSpeedEngine, in DeepSpeed's order."""

    def __init__(self, ce, rank, world, zero=True):
        torch.manual_seed(1)
        self.ce, self.rank, self.world, self.zero = ce, rank, world, zero
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.global_steps = 0

    def barrier(self):
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def train_step(self):
        """forward, backward, then engine.step(): commit of a pending tag, optimizer step."""
        loss = self.model(torch.randn(4, 8)).sum()
        loss.backward()
        if self.ce.is_decoupled():
            self._commit_decoupled_checkpoint()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.global_steps += 1

    def save_checkpoint(self, save_dir, tag=None, save_latest=True):
        if self.rank == 0:
            self.ce.makedirs(save_dir, exist_ok=True)
        self.barrier()
        tag = str(tag or f"global_step{self.global_steps}")
        info = dd.CheckpointCommitInfo(tag=tag, save_dir=save_dir, save_latest=save_latest)
        self.ce.create(info)
        self.ce.makedirs(os.path.join(save_dir, tag), exist_ok=True)
        if self.ce.is_data_parallel_writer(self.rank):
            state = {"module": self.model.state_dict(), "global_steps": self.global_steps,
                     "optimizer": None if self.zero else self.optimizer.state_dict(),
                     "param_shapes": {k: v.shape for k, v in self.model.state_dict().items()},
                     # ZeRO-3 puts partitioned parameters in as empty placeholders
                     "frozen_param_fragments": {"placeholder": torch.empty(0)},
                     "ds_version": "0.19.8"}
            if self.ce.preserves_storage_sharing():
                state = copy.deepcopy(state)
            self.ce.save(state_dict=state,
                         path=os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"))
        if self.zero:
            self.ce.save({"optimizer_state_dict": self.optimizer.state_dict(),
                          "ds_config": {"zero_optimization": {"stage": 1}}},
                         os.path.join(save_dir, tag,
                                      f"zero_pp_rank_{self.rank}_mp_rank_00_optim_states.pt"))
            if self.rank == 0:  # _copy_recovery_script: a plain file in the tag directory
                with open(os.path.join(save_dir, tag, "zero_to_fp32.py"), "w") as f:
                    f.write("# recovery script\n")
        if not self.ce.is_decoupled():
            self.ce.commit(info)
            if save_latest and self.rank == 0:
                with open(os.path.join(save_dir, "latest"), "w") as f:
                    f.write(tag)
        self.barrier()

    def destroy(self):
        """DeepSpeedEngine.destroy(): a decoupled engine is cleaned up."""
        if self.ce.is_decoupled():
            self.ce.cleanup()

    def _commit_decoupled_checkpoint(self):
        info = self.ce.get_commit_info()
        if info is None:
            return
        self.ce.commit(info)
        if self.rank == 0 and info.save_latest:
            with open(os.path.join(info.save_dir, "latest"), "w") as f:
                f.write(info.tag)
        self.barrier()

    def save_16bit_model(self, save_dir, name="pytorch_model.bin"):
        info = dd.CheckpointCommitInfo(tag=f"global_step{self.global_steps}",
                                       save_dir=save_dir, save_latest=False)
        self.ce.create(info)
        if self.rank == 0:
            self.ce.makedirs(save_dir, exist_ok=True)
            self.ce.save(self.model.state_dict(), os.path.join(save_dir, name))
        self.ce.commit(info)

    def load_checkpoint(self, load_dir):
        with open(os.path.join(load_dir, "latest")) as f:
            tag = f.read().strip()
        files = sorted(glob.glob(os.path.join(load_dir, tag, "mp_rank_*_model_states.pt")))
        assert files, f"no model states file found in {load_dir}/{tag}"
        sd = self.ce.load(files[0], map_location=lambda storage, loc: storage)
        self.model.load_state_dict(sd["module"])
        if self.zero:
            name = os.path.join(load_dir, tag,
                                f"zero_pp_rank_{self.rank}_mp_rank_00_optim_states.pt")
            assert os.path.exists(name)
            self.optimizer.load_state_dict(self.ce.load(name, "cpu")["optimizer_state_dict"])
        else:
            self.optimizer.load_state_dict(sd["optimizer"])
        self.global_steps = sd["global_steps"]
        return tag


def returns_soon(fn, seconds=10):
    """Runs fn in a thread; fails (instead of hanging) when it has not returned in time."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__qualname__} still waiting after {seconds} s"


def snapshot(ds):
    """A deep copy of what a checkpoint must hold."""
    return copy.deepcopy({"model": ds.model.state_dict(), "opt": ds.optimizer.state_dict()})


def same(a, b):
    """Equality of nested dicts/lists of tensors and values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def run_scenario(rank, world, socket, root, zero, ce=None):
    """Train, checkpoint, train on (the commit happens in the step), resume and compare;
    with ce (an engine DeepSpeed chose), through it."""
    if ce is None:
        ce = dd.DsckptCheckpointEngine({"dsckpt": {"socket": socket, "job": "ds",
                                                   "timeout": T}})
    assert ce.is_decoupled() and not ce.preserves_storage_sharing()
    ds = FakeDeepSpeed(ce, rank, world, zero=zero)
    save_dir = os.path.join(root, "ds", "zero" if zero else "plain")
    for _ in range(2):
        ds.train_step()
    saved = snapshot(ds)
    ds.save_checkpoint(save_dir)  # global_step2
    tag_dir = os.path.join(save_dir, "global_step2")
    assert not os.path.exists(os.path.join(tag_dir, "MANIFEST.json"))
    assert not os.path.exists(os.path.join(save_dir, "latest"))
    ds.train_step()  # waits SNAPSHOT, queues the commit, then changes the weights
    assert not same(snapshot(ds)["model"], saved["model"])
    assert ce.wait_committed() == [tag_dir]
    with open(os.path.join(save_dir, "latest")) as f:
        assert f.read() == "global_step2"
    ranks = {f["rank"] for f in dsckpt.manifest.load(tag_dir)["files"]}
    assert ranks == set(range(world))
    link = os.path.join(tag_dir, "mp_rank_00_model_states.pt")
    assert os.path.islink(link) and os.readlink(link) == "mp_rank_00_model_states.pt.safetensors"
    if not zero and world > 1:  # DeepSpeed gave rank 1 nothing: it left a marker file
        assert os.path.exists(os.path.join(tag_dir, "dsckpt_rank1.safetensors"))

    fresh = FakeDeepSpeed(ce, rank, world, zero=zero)
    for p in fresh.model.parameters():
        torch.nn.init.zeros_(p)
    assert fresh.load_checkpoint(save_dir) == "global_step2"
    assert fresh.global_steps == 2
    assert same(snapshot(fresh), saved)
    # The model's own tensors restored in place, through the daemon, from the model states.
    inplace = FakeDeepSpeed(ce, rank, world, zero=zero)
    for p in inplace.model.parameters():
        torch.nn.init.zeros_(p)
    states = os.path.join(tag_dir, "mp_rank_00_model_states.pt")
    assert ce.load_into({"module": inplace.model.state_dict()}, states, strict=False) == "daemon"
    assert same(inplace.model.state_dict(), saved["model"])

    ds.save_16bit_model(save_dir)  # a file outside any tag: durable, no manifest, no latest
    ce.wait_committed()
    if rank == 0:
        assert os.path.islink(os.path.join(save_dir, "pytorch_model.bin"))
        assert same(ce.load(os.path.join(save_dir, "pytorch_model.bin")),
                    ds.model.state_dict())
    with open(os.path.join(save_dir, "latest")) as f:
        assert f.read() == "global_step2"
    ce.close()
    returns_soon(ds.destroy)  # DeepSpeed may clean up after close()


def fixed_tag_scenario(rank, world, socket, root):
    """save_checkpoint(tag="last") at every step, each before the previous one's commit,
    and twice in a row: `last` is always one whole version, finally the newest, and a fresh
    engine resumes from it."""
    ce = dd.DsckptCheckpointEngine({"dsckpt": {"socket": socket, "job": "ds", "timeout": T}})
    ds = FakeDeepSpeed(ce, rank, world, zero=True)
    save_dir = os.path.join(root, "ds", "fixed")
    tag_dir = os.path.join(save_dir, "last")
    for _ in range(3):
        ds.train_step()
        saved = snapshot(ds)
        ds.save_checkpoint(save_dir, tag="last")  # the previous one still being committed
        ds.save_checkpoint(save_dir, tag="last")  # and again, before any step
    ds.train_step()  # the decoupled commit of the last save
    assert ce.wait_committed() == [tag_dir] * 3
    with open(os.path.join(save_dir, "latest")) as f:
        assert f.read() == "last"
    manifest = dsckpt.manifest.load(tag_dir)
    assert manifest["tag"] == "last"
    assert {f["rank"] for f in manifest["files"]} == set(range(world))
    link = os.path.join(tag_dir, "mp_rank_00_model_states.pt")
    assert os.path.islink(link) and os.readlink(link) == "mp_rank_00_model_states.pt.safetensors"
    assert not os.path.exists(os.path.join(save_dir, ".last.dsckpt-next"))
    fresh = FakeDeepSpeed(ce, rank, world, zero=True)
    for p in fresh.model.parameters():
        torch.nn.init.zeros_(p)
    assert fresh.load_checkpoint(save_dir) == "last"
    assert fresh.global_steps == 3
    assert same(snapshot(fresh), saved)
    ce.close()
    returns_soon(ds.destroy)


def test_engine_fixed_tag(daemon):
    fixed_tag_scenario(0, 1, daemon.socket, daemon.root)


def test_engine_fixed_tag_two_ranks(daemon):
    run_ranks(fixed_tag_scenario, 2, daemon.socket, daemon.root)


def test_import_without_deepspeed():
    if importlib.util.find_spec("deepspeed") is None:
        assert dd._Base is object
    info = dd.CheckpointCommitInfo(tag="t", save_dir="/x", save_latest=True)
    assert info.tag == "t"


def test_config_block_from_datastates_and_ours():
    assert dd.config_block(None) == {}
    assert dd.config_block({"train_batch_size": 8}) == {}
    assert dd.config_block({"datastates_ckpt": {"host_cache_size": 16}}) == \
        {"host_cache_size": 16}
    both = {"dsckpt": {"job": "a"}, "datastates_ckpt": {"host_cache_size": 16}}
    assert dd.config_block(both) == {"job": "a"}

    class DeepSpeedConfigLike:
        _param_dict = {"datastates_ckpt": {"host_cache_size": 0.5}}
    assert dd.config_block(DeepSpeedConfigLike()) == {"host_cache_size": 0.5}


def test_engine_logs_daemon_and_unknown_keys(daemon, caplog):
    caplog.set_level(logging.INFO, logger="dsckpt.deepspeed")
    ce = dd.DsckptCheckpointEngine({"datastates_ckpt": {
        "host_cache_size": 16, "parser_threads": 8, "socket": daemon.socket}})
    try:
        assert ce.job == "deepspeed" and ce.socket == daemon.socket
        text = caplog.text
        assert "host_cache_size=16" in text and "dsckptd.json" in text
        assert "unknown config key 'parser_threads' ignored" in text
    finally:
        ce.close()


def test_engine_single_rank_decoupled(daemon):
    run_scenario(0, 1, daemon.socket, daemon.root, zero=True)


def test_engine_failure_is_logged_not_raised_into_step(daemon, caplog):
    ce = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": T})
    ds = FakeDeepSpeed(ce, 0, 1)
    save_dir = os.path.join(daemon.root, "ds", "bad")
    os.makedirs(os.path.join(save_dir, "global_step0", "mp_rank_00_model_states.pt"
                             ".safetensors"))
    ds.save_checkpoint(save_dir)
    ds.train_step()  # must not raise
    with pytest.raises(dsckpt.SaveFailed):
        ce.wait_committed()
    assert "not committed" in caplog.text
    assert not os.path.exists(os.path.join(save_dir, "latest"))
    ce.close()


class LossScaler:
    """A value of DeepSpeed's own class in its optimizer files (ZeRO's loss scaler)."""

    def __init__(self, scale):
        self.scale = scale


def test_engine_load_unpickles_only_when_configured(daemon):
    """A file holding a value of a class (ZeRO's loss scaler) loads only with the config
    block's "weights_only": false; by default the engine unpickles nothing."""
    path = os.path.join(daemon.root, "ds", "scaler", "global_step1", "zero_optim_states.pt")
    safe = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": T})
    safe.save({"loss_scaler": LossScaler(4.0), "w": torch.ones(2)}, path)
    safe.wait_snapshot()
    with pytest.raises(dsckpt.PickleRefused, match=r"test_deepspeed.LossScaler.*"
                       "weights_only=False"):
        safe.load(path)
    safe.close()
    trusting = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": T,
                                                 "weights_only": False})
    back = trusting.load(path)
    assert back["loss_scaler"].scale == 4.0 and torch.equal(back["w"], torch.ones(2))
    trusting.close()


def _two_ranks(rank, world, socket, root):
    """ZeRO-style (every rank writes) and plain (only rank 0 writes) checkpoints."""
    run_scenario(rank, world, socket, root, zero=True)
    run_scenario(rank, world, socket, root, zero=False)


def test_engine_two_ranks_gloo(daemon):
    run_ranks(_two_ranks, 2, daemon.socket, daemon.root)


class EngineLike:
    """What install() touches of a DeepSpeedEngine."""

    def __init__(self, socket):
        self._config = type("Config", (), {"_param_dict": {"dsckpt": {"socket": socket}}})()
        self.checkpoint_engine = None


def test_install_takes_config_over_the_engines(daemon):
    engine = EngineLike("/nonexistent/socket")
    ce = dd.install(engine, {"socket": daemon.socket, "job": "inst", "timeout": T})
    try:
        assert engine.checkpoint_engine is ce
        assert ce.socket == daemon.socket and ce.job == "inst" and ce.timeout == T
    finally:
        ce.close()
    returns_soon(ce.wait_committed)  # after close: nothing pending, nothing to wait for


# -- DeepSpeed's own choice of engine, from its config (dsckpt.deepspeed.enable) ------------

FAKE_ENGINE_PY = """
class TorchCheckpointEngine:
    def __init__(self, config_params=None):
        self.config_params = config_params


def create_checkpoint_engine(config_params, groups, zero_stage, has_moe_layers,
                             optimize_dp_state):
    return TorchCheckpointEngine(config_params)


class DeepSpeedConfig:
    def __init__(self, config):
        self._param_dict = config


class DeepSpeedEngine:
    def __init__(self, config):
        self._config = DeepSpeedConfig(config)
        self._configure_checkpointing()

    def _configure_checkpointing(self):
        if NEW:  # DeepSpeed >= 0.17: the module-level name, looked up at call time
            self.checkpoint_engine = create_checkpoint_engine(
                config_params=self._config, groups=None, zero_stage=1, has_moe_layers=False,
                optimize_dp_state=True)
        else:    # older ones build it here
            self.checkpoint_engine = TorchCheckpointEngine(self._config)
"""


@pytest.fixture(params=["create_checkpoint_engine", "_configure_checkpointing"])
def fake_deepspeed(request, monkeypatch):
    """A deepspeed package whose initialize() makes its engine pick a checkpoint engine as
    0.19.8's runtime/engine.py does (or, second param, as DeepSpeed before 0.17 did)."""
    import types
    new = request.param == "create_checkpoint_engine"
    ds = types.ModuleType("deepspeed")
    runtime = types.ModuleType("deepspeed.runtime")
    engine = types.ModuleType("deepspeed.runtime.engine")
    engine.NEW = new
    exec(FAKE_ENGINE_PY, engine.__dict__)
    if not new:
        del engine.create_checkpoint_engine

    def initialize(model=None, config=None, **kw):
        return engine.DeepSpeedEngine(config), None, None, None

    ds.initialize, ds.runtime, runtime.engine = initialize, runtime, engine
    for name, mod in (("deepspeed", ds), ("deepspeed.runtime", runtime),
                      ("deepspeed.runtime.engine", engine)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "dsckpt.deepspeed.auto", raising=False)
    return ds


def test_config_block_turns_dsckpt_on_with_one_import(daemon, fake_deepspeed):
    deepspeed = fake_deepspeed
    import dsckpt.deepspeed.auto  # noqa: F401  (the one line a training script adds)
    config = {"train_batch_size": 4,
              "datastates_ckpt": {"socket": daemon.socket, "job": "auto", "timeout": T}}
    engine, _, _, _ = deepspeed.initialize(model=None, config=config)
    ce = engine.checkpoint_engine
    assert isinstance(ce, dd.DsckptCheckpointEngine) and ce.job == "auto"
    run_scenario(0, 1, daemon.socket, daemon.root, zero=True, ce=ce)

    plain, _, _, _ = deepspeed.initialize(config={"train_batch_size": 4})
    assert type(plain.checkpoint_engine).__name__ == "TorchCheckpointEngine"
    off, _, _, _ = deepspeed.initialize(config={"dsckpt": {"enabled": False}})
    assert type(off.checkpoint_engine).__name__ == "TorchCheckpointEngine"
    dd.enable()  # again: nothing changes, nothing wraps twice
    again, _, _, _ = deepspeed.initialize(config={"dsckpt": {"socket": daemon.socket}})
    assert isinstance(again.checkpoint_engine, dd.DsckptCheckpointEngine)
    again.checkpoint_engine.close()


def test_config_block_without_daemon_fails_at_initialize(fake_deepspeed, tmp_path):
    deepspeed = fake_deepspeed
    dd.enable()
    missing = str(tmp_path / "no-daemon.sock")
    errors = []

    def init():
        try:
            deepspeed.initialize(config={"dsckpt": {"socket": missing}})
        except dsckpt.DaemonUnavailable as e:
            errors.append(e)

    returns_soon(init)
    assert errors, "initialize did not raise DaemonUnavailable"
    text = str(errors[0])
    assert missing in text and "dsckptd" in text and "DSCKPT_SOCKET" in text


def _one_rank_without_daemon(rank, world, socket, missing):
    """Rank 1 names a socket nobody listens on: both ranks raise, neither waits."""
    with pytest.raises(dsckpt.DaemonUnavailable) as e:
        dd.DsckptCheckpointEngine({"dsckpt": {"socket": missing if rank else socket}})
    assert (missing if rank else "another rank") in str(e.value)


def test_engine_ranks_agree_when_one_has_no_daemon(daemon, tmp_path):
    run_ranks(_one_rank_without_daemon, 2, daemon.socket, str(tmp_path / "none.sock"),
              timeout=60)


# -- DeepSpeed's own classes in its optimizer files load without unpickling -----------------

FAKE_DS_TYPES = {  # as DeepSpeed defines them (runtime/fp16/loss_scaler.py, ...)
    "deepspeed.runtime.fp16.loss_scaler": """
import torch
class LossScalerBase:
    def __init__(self, cur_scale):
        self.cur_scale = cur_scale
        self.dynamic = False
class LossScaler(LossScalerBase):
    def __init__(self, scale=1):
        super().__init__(scale)
class DynamicLossScaler(LossScalerBase):
    def __init__(self, init_scale, scale_window, min_scale, delayed_shift,
                 consecutive_hysteresis, raise_error_at_min_scale=True, dtype=torch.half):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype
""",
    "deepspeed.runtime.zero.config": """
from enum import Enum
class ZeroStageEnum(int, Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3
""",
    "deepspeed.utils.tensor_fragment": """
from dataclasses import dataclass
@dataclass
class fragment_address:
    numel: int
    start: int
""",
}


@pytest.fixture
def deepspeed_types(monkeypatch, allowlist):
    """DeepSpeed's modules of SAFE_TYPES, with its classes (no DeepSpeed installed)."""
    import types
    mods = {}
    for name, src in FAKE_DS_TYPES.items():
        mod = types.ModuleType(name)
        exec(src, mod.__dict__)
        monkeypatch.setitem(sys.modules, name, mod)
        mods[name.rsplit(".", 1)[1]] = mod
    return types.SimpleNamespace(**mods)


def zero_optim_state(ds, stage, scaler):
    """What DeepSpeed's ZeRO optimizer's state_dict() returns (stage_1_and_2.py's,
    stage3.py's _rigid_state_dict) around a torch optimizer."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    Stage = ds.config.ZeroStageEnum
    sd = {"loss_scaler": scaler, "dynamic_loss_scale": scaler.dynamic, "overflow": False,
          "partition_count": [1]}
    if stage == 3:
        sd.update(zero_stage=Stage.weights, optimizer_state_dict=opt.state_dict(),
                  fp32_flat_groups=[torch.randn(10)])
    else:
        frag = ds.tensor_fragment.fragment_address
        sd.update(clip_grad=1.0, base_optimizer_state=opt.state_dict(),
                  single_partition_of_fp32_groups=[torch.randn(10)],
                  zero_stage=Stage.gradients if stage == 2 else Stage.optimizer_states,
                  group_paddings=[0], ds_version="0.19.8",
                  param_slice_mappings=[collections.OrderedDict(
                      [("weight", frag(numel=8, start=0)), ("bias", frag(numel=2, start=8))])])
    return {"optimizer_state_dict": sd, "ds_config": {"zero_optimization": {"stage": stage}},
            "ds_version": "0.19.8"}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_optimizer_files_load_by_default(daemon, deepspeed_types, stage):
    """ZeRO's optimizer files (loss scaler, ZeroStageEnum, fragment addresses) load with
    the engine's default weights_only: the engine allowed DeepSpeed's classes."""
    ds = deepspeed_types
    scaler = ds.loss_scaler.DynamicLossScaler(2.0 ** 16, 1000, 1.0, 2, False) \
        if stage != 2 else ds.loss_scaler.LossScaler(128.0)
    state = zero_optim_state(ds, stage, scaler)
    ce = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": T})
    assert {c.__name__ for c in ce.safe_types} == {
        "LossScaler", "DynamicLossScaler", "ZeroStageEnum", "fragment_address"}
    save_dir = os.path.join(daemon.root, "ds", f"zero{stage}")
    hows = []
    for tag in ("global_step1", "global_step2"):  # cold, then warm
        path = os.path.join(save_dir, tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        ce.create(dd.CheckpointCommitInfo(tag=tag, save_dir=save_dir, save_latest=True))
        ce.save(state, path)
        hows.append(ce._saves[-1][1].handover)
        ce.commit(ce.get_commit_info())
        ce.wait_committed()
        osd = ce.load(path)["optimizer_state_dict"]
        assert type(osd["loss_scaler"]) is type(scaler)
        assert vars(osd.pop("loss_scaler")) == vars(scaler)
        assert osd["zero_stage"] is state["optimizer_state_dict"]["zero_stage"]
        assert same(osd, {k: v for k, v in state["optimizer_state_dict"].items()
                          if k != "loss_scaler"})
    assert hows == ["cold", "warm"]
    ce.close()
