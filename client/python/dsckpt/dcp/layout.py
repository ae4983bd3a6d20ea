"""dsckpt.dcp.layout — what a DCP tag holds besides DCP itself: the files' names, where DCP's
Metadata lives, and the Location recorded for every item (pickled inside that Metadata)."""
from __future__ import annotations

import dataclasses

META_FILE = "dcp_metadata"          # <tag>/dcp_metadata.meta holds DCP's Metadata
META_BLOB = "dcp.metadata"
STAGED, WRITTEN = 0, 1              # file __<rank>_<n>: handed over at stage / at write


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one WriteItem lives: ``kind`` "tensor" (tensor ``name`` of ``file.safetensors``),
    "bytes" (blob ``name`` of ``file.meta``: what DCP pickled) or "pickled" (blob holding a
    torch.save'd tensor of a dtype safetensors cannot name)."""

    file: str
    name: str
    kind: str = "tensor"


def file_name(rank: int, n: int) -> str:
    """The name of a rank's file n."""
    return f"__{rank}_{n}"


def chunk_name(fqn: str, offset) -> str:
    """A chunk's tensor name in our files: the FQN, with the chunk's offset when not 0."""
    offset = tuple(offset or ())
    return fqn if not any(offset) else fqn + "@" + "_".join(str(int(o)) for o in offset)

