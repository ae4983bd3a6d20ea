"""Loading a checkpoint must not run its author's code (issue 29, item 13), through the DCP
Reader and the Lightning plugin, from the attacker's side: dsckpt-atk commits through the real
daemon a tag whose metadata (or a value DCP pickled) is a pickle that runs os.system;
dsckpt-vic loads it with the defaults. The load must refuse, saying why and how to opt in, and
the attacker's command must not have run. Real users (hostile.py); "SKIP:" without root."""
import os

import pytest
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint",
                          reason="torch.distributed.checkpoint missing")
pytest.importorskip("torch.distributed.checkpoint.staging", reason="DCP too old (torch < 2.4)")

import hostile  # noqa: E402
from dsckpt import _blob  # noqa: E402
from dsckpt.dcp import meta  # noqa: E402
from dsckpt.dcp.layout import META_BLOB, META_FILE, Location  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties,
    TensorStorageMetadata)


# torch < 2.13: DCP's load drops what read_metadata raised (see refused()).
DCP_HIDES_READER_ERRORS = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13)


@pytest.fixture
def open_daemon(make_daemon):
    """Both users and a daemon they may both reach (hostile.open_daemon)."""
    hostile.users()
    d = hostile.open_daemon(make_daemon)
    yield d
    hostile.remove_scratch(d)


def commit(d, name, file, blobs):
    """dsckpt-atk commits <root>/atk/<name> holding file (a tensor "w" of 4 float32 and the
    blobs); returns the directory."""
    dir = os.path.join(d.root, "atk", name)
    hostile.as_user(hostile.ATK, "atk_commit", d.socket, dir, file,
                    {k: v.decode("latin-1") for k, v in blobs.items()}, True, home=d.scratch)
    return dir


def refused(got, marker):
    """Asserts the victim's load was refused for unpickling and ran nothing."""
    assert not os.path.exists(marker) and not got["marker"], "the attacker's code ran"
    assert "error" in got, got
    # DCP re-raises a reader's error inside its own (CheckpointException, AssertionError):
    # the words of dsckpt.PickleRefused are what reaches the caller. DCP before torch 2.13
    # (2.11 on the H200) catches an error of read_metadata, logs at most a line without it
    # and raises "metadata is None": there the refusal is all a test can see.
    said = got["message"] + got.get("log", "")
    if "metadata is None" in said and "runs whatever code" not in said and \
            DCP_HIDES_READER_ERRORS:
        return
    assert "runs whatever code the checkpoint's author put" in said, got
    assert "weights_only=False" in said, got


def test_dcp_reader_metadata_pickle_is_refused(open_daemon):
    d = open_daemon
    marker = os.path.join(d.scratch, "dcp.ran")
    dir = commit(d, "dcp", META_FILE, {META_BLOB: hostile.evil_pickle(marker)})
    refused(hostile.as_user(hostile.VIC, "vic_dcp_load", d.socket, dir, marker, False,
                            home=d.scratch), marker)


def test_dcp_reader_pickled_value_is_refused(open_daemon):
    """Metadata of today's format naming a value "x" that DCP pickled: DCP's planner would
    unpickle it with weights_only=False; the Reader hands it over only once torch's
    weights-only unpickler loads it."""
    d = open_daemon
    marker = os.path.join(d.scratch, "bytes.ran")
    md = Metadata(state_dict_metadata={
        "w": TensorStorageMetadata(properties=TensorProperties(dtype=torch.float32),
                                   size=torch.Size([4]),
                                   chunks=[ChunkStorageMetadata(offsets=torch.Size([0]),
                                                                sizes=torch.Size([4]))]),
        "x": BytesStorageMetadata()}, planner_data={"w": ("w",), "x": ("x",)},
        storage_data={MetadataIndex("w", torch.Size([0])): Location(META_FILE, "w"),
                      MetadataIndex("x"): Location(META_FILE, "x", "bytes")})
    dir = commit(d, "dcpbytes", META_FILE, {META_BLOB: meta.dump(md),
                                            "x": hostile.evil_pickle(marker)})
    refused(hostile.as_user(hostile.VIC, "vic_dcp_load", d.socket, dir, marker, True,
                            home=d.scratch), marker)


def test_lightning_load_checkpoint_is_refused(open_daemon):
    pytest.importorskip("lightning.fabric", reason="Lightning missing")
    d = open_daemon
    marker = os.path.join(d.scratch, "lightning.ran")
    dir = commit(d, "epoch=0-step=1.ckpt", "rank0", {_blob.BLOB: hostile.evil_pickle(marker)})
    refused(hostile.as_user(hostile.VIC, "vic_lightning_load", d.socket, dir, marker,
                            home=d.scratch), marker)


Point = __import__("collections").namedtuple("Point", "x y")


def metadata():
    """DCP's Metadata of a tensor "w" in two chunks and a value "x"."""
    props = TensorProperties(dtype=torch.bfloat16, requires_grad=True)
    return Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(properties=props, size=torch.Size([4, 2]), chunks=[
                ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 2])),
                ChunkStorageMetadata(offsets=torch.Size([2, 0]), sizes=torch.Size([2, 2]))]),
            "x": BytesStorageMetadata()},
        planner_data={"w": ("w",), "x": ("x",)},
        storage_data={MetadataIndex("w", torch.Size([0, 0]), 0): Location("__0_0", "w"),
                      MetadataIndex("w", torch.Size([2, 0]), 1): Location("__1_0", "w@2_0"),
                      MetadataIndex("x"): Location("__0_1", "x", "bytes")})


def test_dcp_metadata_round_trip_and_refusals():
    """The Metadata comes back equal without pickle; a pickled one (an older tag) and
    planner data of other types load only with weights_only=False; malformed blobs raise
    ValueError."""
    import dataclasses
    import pickle
    import dsckpt
    md = metadata()
    blob = meta.dump(md)
    assert b"\x80" not in blob[:len(meta.MAGIC)] and meta.load(blob, "m") == md
    old = pickle.dumps(md, protocol=4)
    with pytest.raises(dsckpt.PickleRefused, match="weights_only=False"):
        meta.load(old, "m")
    assert meta.load(old, "m", weights_only=False) == md
    odd = dataclasses.replace(md, planner_data={"w": Point(1, 2)})
    with pytest.raises(dsckpt.PickleRefused, match="test_pickle_attack_modern.Point"):
        meta.load(meta.dump(odd), "m")
    assert meta.load(meta.dump(odd), "m", weights_only=False) == odd
    for n in range(len(meta.MAGIC), len(blob)):
        with pytest.raises(ValueError):
            meta.load(blob[:n], "m")
    for old_text, new_text in ((b"\x05\x00\x00\x00bytes", b"\x05\x00\x00\x00evil!"),
                               (b"\x06\x00\x00\x00tensor", b"\x06\x00\x00\x00tensoR"),
                               (b"\x08bfloat16", b"\x08bfloat17")):
        bad = blob.replace(old_text, new_text)  # a kind, a form, a dtype DCP has not
        assert bad != blob
        with pytest.raises(ValueError, match="malformed"):
            meta.load(bad, "m")
