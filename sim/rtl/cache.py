"""The one cache of generated and built engines, and the one source digest.

Two places, one rule (an entry's key is everything it is made from):

* :func:`gen_cache_root`: converted Verilog tops (``<name>-<key>.json``: port map and Verilog),
  ``$NETREDUCE_GEN_CACHE`` or ``$XDG_CACHE_HOME/netreduce/gen`` (default
  ``~/.cache/netreduce/gen``). Outside the work tree on purpose: the key holds the source text
  (:func:`sources_digest`), so every clone of the same sources shares an entry (converting the
  512-bit engine takes minutes).
* :func:`build_root`: simulator builds of a top (``fastsim/``, ``icarus/``, ``cocotb/``), keyed
  by the top's digest and the build flags, ``$NETREDUCE_BUILD`` or ``build/`` in the work tree.

:func:`cached_top` is the read-or-make of the first; the harnesses key the second themselves.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

__all__ = ["repo_root", "build_root", "gen_cache_root", "sources_digest", "save_top", "load_top",
           "cached_top", "cache_key", "GATEWARE_SOURCES"]

#: The packages an engine top is made from (its converted Verilog depends on nothing else).
GATEWARE_SOURCES = ("netreduce.hw", "netreduce.wire", "netreduce.regmap")


def repo_root() -> Path:
    import netreduce
    return Path(netreduce.__file__).resolve().parents[1]


def build_root() -> Path:
    """``$NETREDUCE_BUILD`` or ``build/`` at the top of the work tree."""
    env = os.environ.get("NETREDUCE_BUILD")
    return Path(env) if env else repo_root() / "build"


def gen_cache_root() -> Path:
    """Where converted Verilog tops are kept: ``$NETREDUCE_GEN_CACHE``, else
    ``$XDG_CACHE_HOME/netreduce/gen`` (default ``~/.cache/netreduce/gen``)."""
    env = os.environ.get("NETREDUCE_GEN_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "netreduce" / "gen"


def _not_gateware(package: str, rel: Path) -> bool:
    """Files of netreduce.hw that no core elaborated from it can depend on (board shells and the
    Yosys wrapper): editing them must not invalidate the converted-Verilog caches."""
    return package == "netreduce.hw" and (rel.parts[0] == "boards" or str(rel) == "estimate.py")


def sources_digest(modules: tuple[str, ...]) -> str:
    """Hash of every .py file of the given packages/modules, plus the Amaranth version."""
    h = hashlib.sha256(metadata.version("amaranth").encode())
    for name in modules:
        mod = importlib.import_module(name)
        paths = ([Path(mod.__file__)] if not hasattr(mod, "__path__") else
                 sorted(p for d in mod.__path__ for p in Path(d).rglob("*.py")
                        if not _not_gateware(name, p.relative_to(d))))
        for p in paths:
            h.update(str(p.name).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_key(parts) -> str:
    """The 16-hex-digit key of a JSON-able description of what an entry is made from."""
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def save_top(top, path: Path) -> None:
    """Store ``top`` (an :class:`~netreduce.hw.verilog.AxisTop`: port map and Verilog) as JSON,
    atomically."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(top.info(), verilog=top.verilog)))
    tmp.replace(path)


def load_top(path: Path):
    """The :class:`~netreduce.hw.verilog.AxisTop` stored by :func:`save_top`."""
    from netreduce.hw.verilog import AxisPort, AxisTop

    d = json.loads(Path(path).read_text())
    streams = [AxisPort(**{k: tuple(tuple(x) for x in v) if k.endswith("_fields") else v
                           for k, v in s.items()}) for s in d["streams"]]
    return AxisTop(name=d["name"], verilog=d["verilog"], streams=streams,
                   ports={k: tuple(v) for k, v in d["ports"].items()})


def cached_top(name: str, key: str, make: Callable[[], object], root: Path | None = None):
    """The top stored as ``<root>/<name>-<key>.json`` (default root :func:`gen_cache_root`), made
    with ``make()`` and stored first if it is not there yet."""
    path = (root or gen_cache_root()) / f"{name}-{key}.json"
    if path.exists():
        return load_top(path)
    top = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_top(top, path)
    return top
