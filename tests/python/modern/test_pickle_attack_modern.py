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
    # the words of dsckpt.PickleRefused are what reaches the caller.
    assert "runs whatever code the checkpoint's author put" in got["message"], got
    assert "weights_only=False" in got["message"], got


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
