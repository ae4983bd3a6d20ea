"""The READMEs' code blocks that use DCP, Lightning or DeepSpeed, run as written against a real
daemon with PyPI's torch and Lightning (tests/python/readme_snippets.py says how; the others
run in tests/python/test_readme.py)."""
import os

import pytest

import readme_snippets as rs
from conftest import Daemon, DSCKPTD

BLOCKS = [b for b in rs.all_blocks() if b.modern]
BUILD = os.path.dirname(os.path.abspath(DSCKPTD))


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_modern(block, tmp_path):
    """The block runs as written (or is skipped with its README's reason)."""
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    d = Daemon(cache_gib=0.25)
    try:
        rs.run(block, d.root, d.socket, str(tmp_path), BUILD)
    finally:
        d.stop()
