"""dsckpt.torch.run_connection's agreement on a run id (issue 31): a rank whose connection to
the daemon fails still takes part in it, so no rank waits forever in the collective; the
rank raises its own error and every other rank one naming it. Real gloo ranks, one of them
pointed at a socket that does not exist."""
import gc
import os

import pytest
import torch

import dsckpt
import dsckpt.torch as dt
from ranks import run_ranks

RUN_VARS = ("DSCKPT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
            "SLURM_RESTART_COUNT", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")


def _dsckpt_frames_in_cycles():
    """The names of dsckpt's frames that only reference cycles keep: what the collector
    would free on whatever thread runs it next (at interpreter exit torch aborts the process
    when that is not the main thread). Call with the collector disabled (by _no_collector)
    since the error."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [o.f_code.co_name for o in gc.garbage
                if type(o).__name__ == "frame" and "/dsckpt/" in o.f_code.co_filename]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _no_collector():
    """Frees the garbage made so far (earlier tests'), then stops the collector, so that
    _dsckpt_frames_in_cycles sees only what is made from now on."""
    gc.collect()
    gc.disable()


def _one_rank_without_daemon(rank, world, socket, root, bad):
    """Every rank saves; rank `bad` has no daemon at its socket."""
    os.environ["DSCKPT_SOCKET"] = socket if rank != bad else socket + ".missing"
    tag = os.path.join(root, "nodaemon", "step1")
    state = {"w": torch.full((64,), float(rank))}
    _no_collector()
    with pytest.raises(dsckpt.DaemonUnavailable) as e:
        dt.save(state, tag)
    if rank == bad:  # its own error, naming its socket
        assert "missing" in str(e.value), e.value
    else:
        assert f"rank {bad} of {world} has no connection to dsckptd" in str(e.value), e.value
        assert "missing" in str(e.value), e.value
    del e
    assert _dsckpt_frames_in_cycles() == []
    # A retry once the daemon answers everywhere agrees on a run as a first save does.
    os.environ["DSCKPT_SOCKET"] = socket
    dt.save(state, tag).wait()
    dt.commit(tag, timeout=60)
    assert len(dt.default_connection().run) == 32


@pytest.mark.parametrize("bad", [0, 1])
def test_one_rank_without_daemon(daemon, bad):
    """Rank `bad` cannot connect at its first save: it raises DaemonUnavailable, the other
    raises one naming rank `bad` and its error. Before, the failed rank skipped the
    broadcast of the run id and the other waited in it for as long as the failed rank's
    process lived (here it left, through run_ranks' barrier: gloo's "Connection closed by
    peer"; a trainer catching the error and going on hung the other rank)."""
    run_ranks(_one_rank_without_daemon, 2, daemon.socket, daemon.root, bad, timeout=120)


def test_failed_connection_leaves_no_cycle(monkeypatch, tmp_path):
    """One process, no daemon: the error run_connection raises is in no reference cycle with
    the frames it passed through (before, each frame that kept it in a local did: 15 objects
    freed later by the collector, on whichever thread it ran; issue 31.1's abort)."""
    monkeypatch.setenv("DSCKPT_SOCKET", str(tmp_path / "none.sock"))
    dt.set_default_connection(None)
    _no_collector()
    try:
        with pytest.raises(dsckpt.DaemonUnavailable) as e:
            dt.run_connection(str(tmp_path / "job" / "t"))
        del e
        assert _dsckpt_frames_in_cycles() == []
    finally:
        gc.enable()
        dt.set_default_connection(None)


def test_failed_commit_leaves_no_cycle(daemon, tmp_path):
    """dsckpt.torch.commit's error (a tag outside the daemon's roots) is in no reference
    cycle with its frame, which holds the process group and the saves' handles."""
    conn = dsckpt.Connection(daemon.socket, job="cyc")
    _no_collector()
    try:
        with pytest.raises(dsckpt.DsckptError) as e:
            dt.commit(str(tmp_path / "outside" / "t"), conn=conn, timeout=10)
        del e
        assert _dsckpt_frames_in_cycles() == []
    finally:
        gc.enable()
        conn.close()


class _CommitOutside(dsckpt.Connection):
    """A connection whose COMMIT names a directory outside the daemon's roots: rank 0's
    commit fails there, with the daemon's own error."""

    outside = ""

    def commit(self, dir, timeout=None):
        return super().commit(self.outside, timeout)


@pytest.mark.parametrize("fails", ["save", "commit"])
def test_deepspeed_failed_commit_leaves_no_cycle(daemon, tmp_path, monkeypatch, fails):
    """The error dsckpt.deepspeed's committer raises for a tag (a save that failed, or rank
    0's commit that failed) and wait_committed raises again is in no reference cycle with a
    frame it passed through (before, the frame committing the tag held it in a local)."""
    import dsckpt.deepspeed as dd
    # The committer logs the error: pytest's log capture would hold it (and its frames).
    monkeypatch.setattr(dd.log, "disabled", True)
    ce = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": 60})
    save_dir = os.path.join(daemon.root, "ds-cycle", fails)
    path = os.path.join(save_dir, "step1", "mp_rank_00_model_states.pt")
    if fails == "save":  # a directory where the file goes: the save fails
        os.makedirs(path + ".safetensors")
    else:  # rank 0 commits on its own connection, made at its first commit
        _CommitOutside.outside = str(tmp_path / "outside" / "t")
        ce._commit_conn = _CommitOutside(daemon.socket, job="cyc")
    info = dd.CheckpointCommitInfo(tag="step1", save_dir=save_dir, save_latest=True)
    _no_collector()
    try:
        ce.create(info)
        ce.save({"w": torch.ones(16)}, path)
        ce.commit(info)
        with pytest.raises(dsckpt.DsckptError) as e:
            ce.wait_committed()
        del e
        assert _dsckpt_frames_in_cycles() == []
    finally:
        gc.enable()
        ce.close()


@pytest.mark.parametrize("fails", ["save", "commit", "saved again"])
def test_deepspeed_kept_failure_leaves_no_cycle(daemon, tmp_path, monkeypatch, fails):
    """An error dsckpt.deepspeed's engine keeps for wait_committed (a save that failed, rank
    0's commit that failed, a save that failed before its file was saved again) is in no
    reference cycle with the engine: an engine dropped without wait_committed (a trainer that
    stops after a failed step) leaves no frame to the collector, which would free it on
    whichever thread runs it. Before: engine -> failures -> error -> its traceback -> the
    committer's (or save's) frame -> engine. The error keeps its type and message."""
    import dsckpt.deepspeed as dd
    # The engine logs the error: pytest's log capture would hold it (and its frames).
    monkeypatch.setattr(dd.log, "disabled", True)
    ce = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": 60})
    save_dir = os.path.join(daemon.root, "ds-kept", fails.replace(" ", "-"))
    path = os.path.join(save_dir, "step1", "mp_rank_00_model_states.pt")
    if fails == "commit":
        _CommitOutside.outside = str(tmp_path / "outside" / "t")
        ce._commit_conn = _CommitOutside(daemon.socket, job="cyc")
    else:  # a directory where the file goes: the save fails
        os.makedirs(path + ".safetensors")
    info = dd.CheckpointCommitInfo(tag="step1", save_dir=save_dir, save_latest=True)
    _no_collector()
    try:
        ce.create(info)
        ce.save({"w": torch.ones(16)}, path)
        if fails == "saved again":  # save() waits for the first, which failed
            ce.save({"w": torch.ones(16)}, path)
            assert len(ce.failures) == 1
        ce.commit(info)
        ce.close()
        assert ce.failures and all(isinstance(e, dsckpt.DsckptError) for e in ce.failures)
        assert all(str(e) for e in ce.failures)
        del ce
        assert _dsckpt_frames_in_cycles() == []
    finally:
        gc.enable()


def test_deepspeed_kept_failure_reads_as_raised(daemon, tmp_path, monkeypatch):
    """The failure wait_committed raises after the engine kept it is rank 0's commit's own
    error, of its type and with its message, raised from wait_committed."""
    import dsckpt.deepspeed as dd
    monkeypatch.setattr(dd.log, "disabled", True)
    _CommitOutside.outside = str(tmp_path / "outside" / "t")
    with dsckpt.Connection(daemon.socket, job="cyc") as c:
        with pytest.raises(dsckpt.DsckptError) as direct:
            c.commit(_CommitOutside.outside, 60)
    ce = dd.DsckptCheckpointEngine(config={"socket": daemon.socket, "timeout": 60})
    ce._commit_conn = _CommitOutside(daemon.socket, job="cyc")
    save_dir = os.path.join(daemon.root, "ds-kept", "raised")
    info = dd.CheckpointCommitInfo(tag="step1", save_dir=save_dir, save_latest=True)
    try:
        ce.create(info)
        ce.save({"w": torch.ones(16)}, os.path.join(save_dir, "step1", "model.pt"))
        with pytest.raises(dsckpt.DsckptError) as e:
            ce.wait_committed()
        assert type(e.value) is type(direct.value)
        assert str(e.value) == str(direct.value)
        assert e.value.code == direct.value.code
        assert "wait_committed" in [t.name for t in e.traceback]
        del e, direct
    finally:
        ce.close()


@pytest.mark.parametrize("env", [
    {},
    {"DSCKPT_RUN_ID": "r-1", "TORCHELASTIC_RUN_ID": "te"},
    {"TORCHELASTIC_RUN_ID": "none"},
    {"TORCHELASTIC_RUN_ID": "none", "PMIX_NAMESPACE": "pmix.7"},
    {"DSCKPT_RUN_ID": "", "TORCHELASTIC_RUN_ID": "te-2"},
    {"SLURM_JOB_ID": "42"},
    {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURM_RESTART_COUNT": "1"},
    {"DSCKPT_RUN_ID": "x" * 128},
    {"DSCKPT_RUN_ID": "x" * 129, "OMPI_MCA_ess_base_jobid": "ompi-9"},
    {"DSCKPT_RUN_ID": "tab\there", "SLURM_JOB_ID": "x" * 130},
])
def test_env_run_is_libdsckpts(daemon, monkeypatch, env):
    """The run id dsckpt.torch reads from the environment (every rank's decision to agree on
    one, whether its connection failed or not) is the one libdsckpt sends."""
    for var in RUN_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with dsckpt.Connection(daemon.socket, job="r") as c:
        assert dt._env_run() == c.run
