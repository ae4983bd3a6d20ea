"""conftest.py — the daemon fixtures of tests/python/conftest.py for the tests that need a
current PyTorch. Imported under a name of its own rather than copied, so that this directory
also runs alone (``pytest tests/python/modern``), when pytest does not load the parent's."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "dsckpt_test_daemons",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conftest.py"))
_daemons = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_daemons)

REPO = _daemons.REPO
Daemon = _daemons.Daemon
daemon = _daemons.daemon
make_daemon = _daemons.make_daemon
conn = _daemons.conn
