"""tests/python/test_match.py again with the modern torch: dsckpt._match against the Python
match on the same structures."""
from test_match import *  # noqa: F401,F403 - collected here too
