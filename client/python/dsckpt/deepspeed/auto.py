"""``import dsckpt.deepspeed.auto`` turns dsckpt on for every DeepSpeed engine whose config has
a ``"dsckpt"`` (or ``"datastates_ckpt"``) block: the one line a training script needs, before
``deepspeed.initialize``. It runs :func:`dsckpt.deepspeed.enable`; see that module."""
from . import enable

enable()
