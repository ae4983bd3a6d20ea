"""tests/python/test_handover.py again with the modern torch (TensorGuards proves dtypes,
shapes, strides and requires_grad there; torch 1.13 compares lists)."""
from test_handover import *  # noqa: F401,F403 - collected here too


def test_tensor_guards_in_use():
    from dsckpt import _handover
    assert _handover._guard_class() is not None
