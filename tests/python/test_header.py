"""A safetensors header read for a load (dsckpt._fill.header, dsckpt._fill.check): parsed
once while the file is unchanged and again as soon as it changes, never kept for a file
changed too recently for its mtime to tell; its JSON parsed with the garbage collector
paused, which is left as the caller had it."""
import gc
import json
import os
import struct
import time

import torch

from dsckpt import _files, _fill


def write(path, shapes, pad=256):
    """A safetensors file of F32 tensors of shapes (name → shape), its header padded to
    ``pad`` bytes so that a rewrite keeps every offset."""
    header, at = {}, 0
    for name, shape in shapes.items():
        n = 4 * int(torch.Size(shape).numel())
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    assert len(raw) <= pad
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        f.write(struct.pack("<Q", pad) + raw + b" " * (pad - len(raw)))
        f.write(bytes(at))


def set_mtime(path, seconds_ago):
    """Sets path's mtime (and atime) seconds_ago in the past."""
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


def counting(monkeypatch):
    """Counts the header parses (dsckpt._files._json calls) from now on."""
    calls = []
    parse = _files._json

    def wrapped(raw):
        calls.append(len(raw))
        return parse(raw)
    monkeypatch.setattr(_files, "_json", wrapped)
    return calls


def test_header_kept_while_unchanged(tmp_path, monkeypatch):
    path = str(tmp_path / "rank0.safetensors")
    write(path, {"a": (2, 3), "b": (4,)})
    set_mtime(path, 3600)
    parses = counting(monkeypatch)
    first = _fill.header(path)
    assert first == {"a": (torch.float32, (2, 3)), "b": (torch.float32, (4,))}
    assert _fill.header(path) is first
    _fill.check(path, {"a": torch.empty(2, 3), "b": torch.empty(4)}, True)
    assert len(parses) == 1
    # Rewritten in place (same size, same inode), its mtime moved: parsed again.
    write(path, {"a": (2, 3), "b": (2, 2)})
    set_mtime(path, 1800)
    assert _fill.header(path)["b"] == (torch.float32, (2, 2))
    assert len(parses) == 2
    try:
        _fill.check(path, {"a": torch.empty(2, 3), "b": torch.empty(4)}, True)
        raise AssertionError("a destination of another shape passed the check")
    except _fill.StateDictMismatch as e:
        assert e.mismatched == ["b (F32 [4], file F32 [2, 2])"]
    assert len(parses) == 2


def test_header_of_a_recent_file_not_kept(tmp_path, monkeypatch):
    path = str(tmp_path / "rank0.safetensors")
    write(path, {"a": (2, 3)})
    parses = counting(monkeypatch)
    assert _fill.header(path)["a"] == (torch.float32, (2, 3))
    # Changed within the same clock tick, its mtime need not move: it must be parsed again.
    st = os.stat(path)
    write(path, {"a": (3, 2)})
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _fill.header(path)["a"] == (torch.float32, (3, 2))
    assert len(parses) == 2


def test_header_parse_pauses_gc(monkeypatch):
    raw = json.dumps({f"t{i}": {"dtype": "F32", "shape": [i, 2], "data_offsets": [0, 0]}
                      for i in range(2000)}).encode()
    collecting = []  # whether the collector could run, at each parse

    class Spy:
        """json as _files sees it, noting the collector's state at each parse."""
        def loads(self, text):
            collecting.append(gc.isenabled())
            return json.loads(text)
    monkeypatch.setattr(_files, "json", Spy())
    try:
        assert len(_files._json(raw)) == 2000
        assert collecting == [False] and gc.isenabled()
        gc.disable()
        _files._json(raw)
        assert collecting == [False, False] and not gc.isenabled()
    finally:
        gc.enable()
