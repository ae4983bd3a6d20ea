"""readme_snippets.py — every fenced code block of the READMEs, run as a reader would run it.

    python3 tests/python/readme_snippets.py [README.md...]   lists the blocks and what is done
                                                               with each (runs nothing), and
                                                               references to nothing

tests/python/test_readme.py (Debian's torch) and tests/python/modern/test_readme_modern.py
(PyPI's torch 2.13 and Lightning) run them in `make check`, one pytest case per block, each
against a fresh real daemon. What each block gets:

  python    run as a script of its own (a fresh interpreter, a scratch working directory) with
            $DSCKPT_SOCKET naming the test's daemon; a block that uses DCP, Lightning or
            DeepSpeed belongs to the modern suite, the others to the plain one
  sh, console  run with `sh -e` in a scratch directory, the build's dsckptd and dsckptctl
            first on PATH ("$ " prompts of a console block are taken off)
  c         compiled against client/dsckpt.h and the build's libdsckpt and run, when it is a
            program (it has `int main`); a fragment must be marked (below)
  json      parsed (a fragment `"key": {...}` as the member of an object)
  other     (ini, promql, a block without a language: diagrams, layouts) not run, reported as
            skipped with the language

Paths of a node's daemon in a block stand for the test daemon's: `/var/lib/dsckpt` is its
checkpoint root and `/run/dsckptd/dsckptd.sock` its socket, replaced before the block runs.

A block that cannot run here says why in an HTML comment on the line right before its fence,
which renders as nothing:

    <!-- snippet: skip REASON -->    not run; the test is skipped with REASON
    <!-- snippet: gpu REASON -->     needs a GPU: skipped with "needs a GPU: REASON" (the GPU
                                     node's `make gpu-check` runs what it names)

A runnable block (python, sh, console, json, a C program) without such a comment must run.
"""
import glob
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READMES = ("README.md", os.path.join("client", "python", "README.md"))
RUNNABLE = ("python", "sh", "console", "c", "json")
MODERN = re.compile(r"\b(torch\.distributed\.checkpoint|dsckpt\.dcp|lightning|deepspeed)\b")
MARK = re.compile(r"^\s*<!--\s*snippet:\s*(skip|gpu)\s+(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NODE_ROOT = "/var/lib/dsckpt"
NODE_SOCKET = "/run/dsckptd/dsckptd.sock"
TIMEOUT_S = 600


class Block:
    """One fenced code block: where it is, its language and text, and why it is not run (None
    when it runs)."""

    def __init__(self, readme, line, lang, text, skip, problem=None):
        self.readme, self.line, self.lang, self.text, self.skip = readme, line, lang, text, skip
        self.problem = problem  # why the block can be neither run nor skipped

    @property
    def id(self):
        """A short name for pytest: the README and the line of its fence."""
        return f"{self.readme}:{self.line}:{self.lang or 'text'}"

    @property
    def modern(self):
        """Whether the block needs the modern suite's torch (DCP, Lightning, DeepSpeed)."""
        return self.lang == "python" and bool(MODERN.search(self.text))


def blocks(readme):
    """The fenced blocks of readme (a path relative to the repository), in order."""
    with open(os.path.join(REPO, readme)) as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{readme}:{start + 1}: a fence never closed")
        i += 1
        mark = MARK.match(lines[start - 1]) if start else None
        text = "\n".join(body) + "\n"
        if mark:
            skip = mark.group(2) if mark.group(1) == "skip" else f"needs a GPU: {mark.group(2)}"
        elif lang not in RUNNABLE:
            skip = f"{lang} blocks are not run" if lang else "a block without a language " \
                "(a diagram or a layout) is not run"
        else:
            skip = None
        problem = None
        if not skip and lang == "c" and not re.search(r"\bint\s+main\s*\(", text):
            problem = "a C fragment (no main) needs a <!-- snippet: skip REASON --> line " \
                "right before its fence"
        out.append(Block(readme, start + 1, lang, text, skip, problem))
    return out


def all_blocks():
    """Every block of every README."""
    return [b for r in READMES for b in blocks(r)]


def localise(text, root, socket):
    """text with the node's daemon paths replaced by the test daemon's."""
    return text.replace(NODE_SOCKET, socket).replace(NODE_ROOT, root)


def run(block, root, socket, workdir, build):
    """Runs block in workdir against the daemon of root and socket, with build's binaries;
    raises AssertionError with the output when it fails."""
    if block.problem:
        raise AssertionError(f"{block.id}: {block.problem}")
    text = localise(block.text, root, socket)
    env = dict(os.environ, DSCKPT_SOCKET=socket,
               PATH=os.path.join(REPO, build) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.path.join(REPO, "client", "python"))
    if block.lang == "json":
        try:
            json.loads(text if text.lstrip().startswith(("{", "[")) else "{" + text + "}")
        except ValueError as e:
            raise AssertionError(f"{block.id}: not JSON: {e}\n{text}") from None
        return
    if block.lang == "python":
        path = os.path.join(workdir, "snippet.py")
        cmd = [sys.executable, path]
    elif block.lang in ("sh", "console"):
        if block.lang == "console":
            text = "\n".join(ln[2:] for ln in text.split("\n") if ln.startswith("$ ")) + "\n"
        path = os.path.join(workdir, "snippet.sh")
        cmd = ["sh", "-e", path]
    else:
        src, path = os.path.join(workdir, "snippet.c"), os.path.join(workdir, "snippet")
        with open(src, "w") as f:
            f.write(text)
        lib = os.path.join(REPO, build)
        cc = subprocess.run(["cc", "-std=c11", "-Wall", "-I", os.path.join(REPO, "client"),
                             src, "-o", path, "-L", lib, "-Wl,-rpath," + lib, "-ldsckpt"],
                            capture_output=True, text=True)
        if cc.returncode != 0:
            raise AssertionError(f"{block.id}: does not compile:\n{cc.stderr}")
        text, cmd = None, [path]
    if text is not None:
        with open(path, "w") as f:
            f.write(text)
    p = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    if p.returncode != 0:
        raise AssertionError(f"{block.id} exited {p.returncode}:\n--- block ---\n{text}"
                             f"--- stdout ---\n{p.stdout[-4000:]}--- stderr ---\n"
                             f"{p.stderr[-8000:]}")


def broken_references(readme):
    """What readme (a path relative to the repository) refers to that is not there: links to
    its own sections (#anchor) without such a heading, relative links and backquoted paths of
    the repository (tests/..., client/..., dsckpt/... beside the README, ...) to no file, and
    any DESIGN document (the repository has none). Files a build makes (*.so*, *.built) are
    not looked for. A list of "README:line: what" strings."""
    with open(os.path.join(REPO, readme)) as f:
        text = f.read()
    base = os.path.dirname(os.path.join(REPO, readme))
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", text, re.M)}
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        where = f"{readme}:{n}"
        for a in re.findall(r"\]\(#([^)]+)\)", line):
            if a not in anchors:
                out.append(f"{where}: no section #{a}")
        for link in re.findall(r"\]\(([^)#:]+)\)", line):
            if not os.path.exists(os.path.join(base, link)):
                out.append(f"{where}: no file {link}")
        for p in re.findall(r"`((?:tests|client|daemon|format|proto|conf|systemd|man|dsckpt)"
                            r"/[\w./*-]+)`", line):
            if re.search(r"\.so\b|\.built$", p):
                continue
            if not any(glob.glob(os.path.join(d, p)) for d in (REPO, base)):
                out.append(f"{where}: no file {p}")
        if re.search(r"\bDESIGN\b", line):
            out.append(f"{where}: cites a DESIGN document the repository does not have")
    return out


def main(argv):
    """Lists the blocks of the READMEs named (default: both) and what is done with each."""
    for readme in argv or READMES:
        for b in blocks(readme):
            what = f"skipped: {b.skip}" if b.skip else f"FAILS: {b.problem}" if b.problem \
                else "runs in the modern suite" if b.modern else "runs"
            print(f"{b.id}: {what}")
        for problem in broken_references(readme):
            print(problem)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
