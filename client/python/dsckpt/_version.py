"""The package version: libdsckpt's, client/dsckpt.h's DSCKPT_VERSION_STRING (make check
compares the two: tests/check-docs)."""
__version__ = "0.1.0"
