"""Simulator builds of the engine, on top of the one cache of generated engines.

Converted Verilog tops and the source digest are :mod:`netreduce.hw.cache`'s (``$NETREDUCE_CACHE``,
outside the work tree, shared by clones; re-exported here). What this module adds is where the
simulators build a top: :func:`build_root` (``build/`` at the top of the work tree), with
``fastsim/``, ``icarus/`` and ``cocotb/`` below it, each build keyed by the top's Verilog digest
and the build flags (the harnesses key them); :func:`use_build_root` points it elsewhere for a
while (a bench timing a build from scratch).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from netreduce.hw.cache import (  # noqa: F401 - the API of this module
    cache_dir,
    cache_key,
    cached_top,
    load_top,
    save_top,
    source_digest,
)

__all__ = ["repo_root", "build_root", "use_build_root", "gen_cache_root", "source_digest",
           "save_top", "load_top", "cached_top", "cache_key"]

_BUILD_ROOT: Path | None = None


def repo_root() -> Path:
    import netreduce
    return Path(netreduce.__file__).resolve().parents[1]


def build_root() -> Path:
    """``build/`` at the top of the work tree (or the folder of :func:`use_build_root`)."""
    return _BUILD_ROOT or repo_root() / "build"


@contextlib.contextmanager
def use_build_root(path):
    """Simulator builds go to ``path`` inside this block."""
    global _BUILD_ROOT
    old, _BUILD_ROOT = _BUILD_ROOT, Path(path)
    try:
        yield
    finally:
        _BUILD_ROOT = old


def gen_cache_root() -> Path:
    """Where converted test tops are kept (:func:`netreduce.hw.cache.cached_top`)."""
    return cache_dir("gen")
