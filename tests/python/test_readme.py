"""Every fenced code block of README.md and client/python/README.md that needs no modern torch,
run as written against a real daemon (tests/python/readme_snippets.py says how; the blocks
that use DCP, Lightning or DeepSpeed run in modern/test_readme_modern.py). A block that cannot
run here is skipped with the reason its README gives; every cross-reference of both READMEs
leads somewhere. And the runner itself: a marked block is
skipped with its reason, an unmarked C fragment fails, a failing block fails."""
import os

import pytest

import readme_snippets as rs
from conftest import Daemon, DSCKPTD

BLOCKS = [b for b in rs.all_blocks() if not b.modern]
BUILD = os.path.dirname(os.path.abspath(DSCKPTD))


def run_block(block, tmp_path):
    """Runs block against a fresh daemon (0.25 GiB cache), or skips it with its reason."""
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    d = Daemon(cache_gib=0.25)
    try:
        rs.run(block, d.root, d.socket, str(tmp_path), BUILD)
    finally:
        d.stop()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block(block, tmp_path):
    """The block runs as written (or is skipped with its README's reason)."""
    run_block(block, tmp_path)


def test_runner_marks_and_failures(tmp_path):
    """A marked block is skipped with its reason (a GPU one says so), an unmarked C fragment
    and a block that fails make their tests fail, JSON fragments are parsed, and the node's
    paths become the test daemon's."""
    readme = tmp_path / "R.md"
    readme.write_text(
        "<!-- snippet: skip needs root -->\n```sh\nexit 1\n```\n"
        "<!-- snippet: gpu cudaMalloc memory -->\n```python\nimport cuda\n```\n"
        "```c\nint x;\n```\n"
        "```python\nraise SystemExit(3)\n```\n"
        "```json\n\"a\": {\"b\": 1}\n```\n"
        "```python\nimport os\nopen('/var/lib/dsckpt/here', 'w').close()\n"
        "assert os.environ['DSCKPT_SOCKET'] == '/run/dsckptd/dsckptd.sock'\n```\n"
        "```ini\n[Unit]\n```\n")
    skip, gpu, frag, fails, frag_json, paths, ini = rs.blocks(str(readme))
    assert skip.skip == "needs root" and gpu.skip == "needs a GPU: cudaMalloc memory"
    assert ini.skip == "ini blocks are not run"
    assert frag.skip is None and "C fragment" in frag.problem
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(AssertionError, match="C fragment"):
        rs.run(frag, str(root), "/nowhere.sock", str(tmp_path), BUILD)
    with pytest.raises(AssertionError, match="exited 3"):
        rs.run(fails, str(root), "/nowhere.sock", str(tmp_path), BUILD)
    rs.run(frag_json, str(root), "/nowhere.sock", str(tmp_path), BUILD)
    rs.run(paths, str(root), str(tmp_path / "d.sock"), str(tmp_path), BUILD)
    assert (root / "here").exists()


@pytest.mark.parametrize("readme", rs.READMES)
def test_readme_references(readme):
    """Every section link, relative link and repository path of the README leads somewhere,
    and no DESIGN document is cited (the repository has none)."""
    assert rs.broken_references(readme) == []
