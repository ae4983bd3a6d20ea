"""setup.py — what pyproject.toml cannot say: dsckpt._match (dsckpt/_match.c, the C
Shape.match), an optional stable-ABI extension for CPython 3.11 and later. pip builds it where a
compiler and Python's headers are (Debian: python3-dev) and goes on without it elsewhere: the
package then matches in Python (dsckpt/_lib.py, match_module)."""
import sys

from setuptools import Extension, setup

ext = []
if sys.version_info >= (3, 11) and sys.implementation.name == "cpython":
    ext.append(Extension("dsckpt._match", ["dsckpt/_match.c"], py_limited_api=True,
                         optional=True))
setup(ext_modules=ext)
