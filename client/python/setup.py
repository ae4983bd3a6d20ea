"""setup.py — what pyproject.toml cannot say: the compiled parts the package carries.

* ``dsckpt/libdsckpt.so.0``, the client library the binding drives through ctypes, built
  here from the repository's C sources (client/lib, proto, and format's errors.c and
  dtype.c, as the Makefile's libdsckpt.so), so that ``pip install client/python`` connects
  with nothing else installed or set: no ``make install``, no ``LD_LIBRARY_PATH``. It links
  msgpack-c, found through pkg-config (Debian: libmsgpack-dev), as the Makefile does; a
  C compiler is required (Debian: build-essential).
* ``dsckpt._match`` (dsckpt/_match.c, the C Shape.match and pointer proof, with
  dsckpt/_freeze.c, which encodes leaves without pickle and tells those that encode as last
  time, and dsckpt/_match_ptrs.cc, which catches torch's C++ exceptions), an optional
  stable-ABI extension for CPython 3.11 and later, built where a C++ compiler and Python's
  headers are (Debian: python3-dev); without it the package matches and proves in Python
  (dsckpt/_lib.py, match_module).
* ``dsckpt.dsckpt_tproof_1``, the C++ proof of a warm save's tensors (dsckpt/_tproof.cpp), only
  where torch is importable while the wheel is built (``pip install --no-build-isolation``
  in the trainer's environment): a torch extension must be compiled against the very torch
  it runs with, so pip's isolated build, which has no torch, cannot make it. Beside it
  ``_tproof.built`` records that torch, this Python and the source's digest; dsckpt/_torchext.py
  uses the module only where they are the running ones, and otherwise builds it on first use.

pip builds in the source tree (pip >= 21.3), so the library's sources are read from the
repository around client/python; a copy of client/python alone cannot build it and says so.
"""
import glob
import hashlib
import os
import shlex
import subprocess
import sys

from setuptools import Distribution, Extension, setup
from setuptools.command.build_ext import build_ext

from distutils.ccompiler import new_compiler  # setuptools' own copy (after setuptools)
from distutils.sysconfig import customize_compiler

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SONAME = "libdsckpt.so.0"  # client/dsckpt.h's ABI; _lib.py loads this name


def lib_sources():
    """The C files of libdsckpt (the Makefile's LIB_SRC, PROTO_SRC and FORMAT_LIB_SRC)."""
    files = sorted(glob.glob(os.path.join(REPO, "client", "lib", "*.c")) +
                   glob.glob(os.path.join(REPO, "proto", "*.c")))
    files += [os.path.join(REPO, "format", f) for f in ("errors.c", "dtype.c")]
    missing = [f for f in files[-2:] if not os.path.exists(f)]
    if len(files) == 2 or missing or not os.path.exists(os.path.join(REPO, "client", "dsckpt.h")):
        sys.exit(f"dsckpt: libdsckpt's C sources are not in {REPO} (client/lib, proto, "
                 "format): pip install client/python from a clone of the whole repository")
    return files


def msgpack_flags():
    """msgpack-c's compile and link flags from pkg-config (msgpack-c from version 6 on,
    msgpack before), else Debian's -lmsgpackc."""
    pkg_config = os.environ.get("PKG_CONFIG", "pkg-config")
    for name in ("msgpack-c", "msgpack"):
        try:
            cflags = subprocess.run([pkg_config, "--cflags", name], check=True,
                                    capture_output=True, text=True).stdout
            libs = subprocess.run([pkg_config, "--libs", name], check=True,
                                  capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        return shlex.split(cflags), shlex.split(libs)
    return [], ["-lmsgpackc"]


class BuildWithLib(build_ext):
    """build_ext that first builds libdsckpt.so.0 into the package, then the extensions."""

    def run(self):
        """Builds the library, then what build_ext builds, and records what the C++ proof
        was built against when it is among them."""
        self.build_lib_dsckpt()
        super().run()
        built = [e for e in self.extensions if e.name.endswith(TPROOF)
                 and os.path.exists(self.get_ext_fullpath(e.name))]
        if built:
            path = os.path.join(os.path.dirname(self.get_ext_fullpath(built[0].name)),
                                "_tproof.built")
            with open(path, "w") as f:
                f.write(tproof_stamp())

    def build_lib_dsckpt(self):
        """Compiles and links libdsckpt.so.0 (soname libdsckpt.so.0) into dsckpt/ of the
        build tree, and of the source tree for an editable install."""
        cflags, libs = msgpack_flags()
        cc = new_compiler(force=self.force)
        customize_compiler(cc)  # CC, CFLAGS and LDFLAGS from the environment, as for extensions
        objects = cc.compile(
            lib_sources(), output_dir=os.path.join(self.build_temp, "libdsckpt"),
            extra_postargs=["-std=gnu11", "-O2", "-fPIC", "-D_GNU_SOURCE",
                            "-fvisibility=hidden"] + cflags)
        where = HERE if self.inplace else self.build_lib
        out = os.path.join(where, "dsckpt", SONAME)
        cc.link_shared_object(
            objects, out, extra_postargs=[f"-Wl,-soname,{SONAME}"] + libs +
            ["-lpthread", "-ldl"])


TPROOF = "dsckpt_tproof_1"  # _tproof.cpp's PyInit_ name (dsckpt/_torchext.py's NAME)


def tproof_extension():
    """The C++ proof as an extension built against the torch importable here (the flags of
    torch.utils.cpp_extension.CppExtension and BuildExtension), or None without torch."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return None
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    return Extension(f"dsckpt.{TPROOF}", ["dsckpt/_tproof.cpp"], language="c++",
                     include_dirs=cpp_extension.include_paths(),
                     library_dirs=cpp_extension.library_paths(),
                     libraries=["c10", "torch", "torch_cpu", "torch_python"],
                     extra_compile_args=["-O2", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                                         f"-DTORCH_EXTENSION_NAME={TPROOF}",
                                         "-DTORCH_API_INCLUDE_EXTENSION_H"],
                     optional=True)


def tproof_stamp():
    """What the proof was built against, as dsckpt/_torchext.py's _stamp writes it."""
    import torch
    with open(os.path.join(HERE, "dsckpt", "_tproof.cpp"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return f"{torch.__version__} {sys.implementation.cache_tag} {digest}\n"


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: it is tagged for this platform even where the
    optional extension is not built."""

    def has_ext_modules(self):
        """Always: libdsckpt.so.0 is built."""
        return True


ext = []
if sys.version_info >= (3, 11) and sys.implementation.name == "cpython":
    ext.append(Extension("dsckpt._match", ["dsckpt/_match.c", "dsckpt/_freeze.c",
                                            "dsckpt/_match_ptrs.cc"],
                         depends=["dsckpt/_freeze.h"], py_limited_api=True, language="c++",
                         optional=True))
tproof = tproof_extension()
if tproof is not None:
    ext.append(tproof)
setup(ext_modules=ext, cmdclass={"build_ext": BuildWithLib}, distclass=BinaryDistribution)
