"""setup.py — what pyproject.toml cannot say: dsckpt._match (dsckpt/_match.c, the C
Shape.match and pointer proof, with dsckpt/_freeze.c, which encodes leaves without pickle
and tells those that encode as last time, and dsckpt/_match_ptrs.cc, which catches torch's C++ exceptions), an optional stable-ABI extension for CPython 3.11 and later. pip builds it where
a C and C++ compiler and Python's headers are (Debian: build-essential, python3-dev) and goes
on without it elsewhere: the package then matches and proves in Python (dsckpt/_lib.py,
match_module)."""
import sys

from setuptools import Extension, setup

ext = []
if sys.version_info >= (3, 11) and sys.implementation.name == "cpython":
    ext.append(Extension("dsckpt._match", ["dsckpt/_match.c", "dsckpt/_freeze.c",
                                            "dsckpt/_match_ptrs.cc"],
                         depends=["dsckpt/_freeze.h"], py_limited_api=True, language="c++",
                         optional=True))
setup(ext_modules=ext)
