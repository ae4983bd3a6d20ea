"""dsckpt.dcp — a torch.distributed.checkpoint (DCP) storage backend on dsckptd (PyTorch ≥ 2.4).

::

    resp = dcp.async_save(state_dict, storage_writer=dsckpt.dcp.Writer(dir))
    resp.staging_completion.result()   # SNAPSHOT: the tensors may change now
    resp.upload_completion.result()    # the checkpoint is DURABLE and COMMITTED
    dcp.load(state_dict, storage_reader=dsckpt.dcp.Reader(dir))

Saving. :class:`Writer` is also DCP's AsyncStager: ``async_save`` calls :meth:`Writer.stage`
on the trainer's thread, which hands every tensor of the rank — DTensor and ShardedTensor local
shards included — to the node's daemon by reference as file ``__<rank>_0`` and returns a
future that resolves at SNAPSHOT (``staging_completion``). DCP then plans in its own thread;
:meth:`Writer.write_data` only maps each WriteItem to the tensor already handed over (by
address), saves what was not (pickled objects as blobs, tensors DCP made on the way, and all
of a plain ``dcp.save``) as ``__<rank>_1`` and waits until its files are DURABLE. The
coordinator's :meth:`Writer.finish` saves DCP's Metadata, without pickle, as blob
``dcp.metadata`` of ``dcp_metadata.meta`` and commits, so the upload future resolves when
the tag is COMMITTED. No rank seals the tag (the daemons would commit it without the
Metadata DCP needs). A rank
whose write fails raises in ``write_data``: DCP gathers it and the save raises on every rank;
nothing is committed.

A chunk several ranks hold (a plain tensor, a Replicate DTensor, a DTensor replicated over
some mesh dimensions) is staged by one of them only, the same one on every rank without a
collective (picked by the FQN's CRC-32 among the replicas the placements name; a plain
tensor's among the default group's ranks), and the coordinator's
:meth:`Writer.prepare_global_plan` has that rank write it: each is written once, as DCP's
FileSystemWriter writes it. A chunk its chosen replica does not hold (a plain tensor on some
ranks only, or a save over a subgroup) is written, with a warning, from the memory of the
rank DCP's planner picked, as it is then. Staging that fails (no daemon, a refused save, a
save FAILED before SNAPSHOT) fails ``staging_completion`` with the error; the upload still
runs DCP's collectives and raises on every rank.

Loading. :class:`Reader` reads the Metadata back (a tag must be committed), so DCP's planner
reshards: any world size, any sharding. For each file it has the daemon fill the stored chunks
that the rank's ReadItems need (from its host cache when it still holds the tag, checksums
checked), straight into the destination where a destination is exactly one stored chunk, else
into a buffer that is then narrowed and copied; without a daemon the file is read here.

The files stay plain safetensors under our manifest: ``dsckptctl verify`` checks them.
Loading unpickles nothing by default: the Metadata is encoded without pickle (meta.py), and
the values DCP itself pickled (non-tensor items, which DCP's DefaultLoadPlanner loads with
``torch.load(weights_only=False)``, as it does from a FileSystemReader) reach the planner only
once torch's weights-only unpickler has loaded them; anything else raises
:class:`dsckpt.PickleRefused` unless ``Reader(dir, weights_only=False)``.

Files: layout.py (what a tag holds), meta.py (DCP's Metadata as a blob), writer.py (Writer),
reader.py (Reader).
"""
from __future__ import annotations

import torch

try:  # what the backend builds on, asked for once here for a clear error
    from torch.distributed.checkpoint.metadata import StorageMeta  # noqa: F401
    from torch.distributed.checkpoint.staging import AsyncStager  # noqa: F401
    from torch.distributed.checkpoint.storage import StorageWriter  # noqa: F401
except ImportError as e:  # Debian 12's torch 1.13, say
    raise ImportError(f"dsckpt.dcp needs PyTorch >= 2.4 (DCP's AsyncStager and StorageMeta); "
                      f"this is torch {torch.__version__}: {e}") from e

from .layout import META_BLOB, META_FILE, Location  # noqa: E402
from .reader import Reader  # noqa: E402
from .writer import Writer  # noqa: E402

__all__ = ["Writer", "Reader", "Location", "META_FILE", "META_BLOB"]
