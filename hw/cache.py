"""The one cache of generated engines and the one source digest.

Everything made from the gateware's source and kept between runs lives under one root,
:func:`cache_dir`: ``$NETREDUCE_CACHE``, else ``$XDG_CACHE_HOME/netreduce`` (default
``~/.cache/netreduce``). Outside the work tree on purpose: an entry's key holds the digest of the
source it is made from, so every clone of the same source shares it (converting the 512-bit
engine takes minutes). Its folders:

* ``engine/``: the engine's Verilog top (:func:`engine_top`: port map and Verilog, as JSON), used
  by the board projects (its Verilog text) and the simulators (:mod:`netreduce.sim.rtl.cache`
  verilates it, keyed by the Verilog's own digest);
* ``gen/``: other converted tops (test harnesses, stand-ins: :func:`cached_top`);
* ``rtlil/``, ``estimate/``, ``synthflow/``: the Yosys estimates (:mod:`.estimate`);
* ``vmlab/``: the VM lab's guest image.

One digest: :func:`source_digest` hashes the source a module is built from (the module and every
netreduce module it imports, transitively), so an edit elsewhere (a board shell, the CLI, the
simulation) invalidates nothing; :func:`design_digest` adds the engine's build parameters.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

__all__ = ["cache_dir", "source_digest", "design_digest", "cache_key", "save_top", "load_top",
           "cached_top", "engine_top", "engine_top_path", "ENGINE_TOP_NAME"]

ENGINE_TOP_NAME = "netreduce_engine"


def cache_dir(sub: str = "") -> Path:
    """Cache root (module doc), ``sub`` appended."""
    env = os.environ.get("NETREDUCE_CACHE")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = Path(base) / "netreduce"
    return root / sub if sub else root


def _imported_sources(root: str) -> list[Path]:
    """Source files of ``root`` and of every netreduce module it imports, transitively (static
    walk of the import statements; parent packages' ``__init__`` included)."""

    def origin(name):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        return spec.origin if spec is not None and spec.origin not in (None, "built-in") else None

    seen: dict[str, Path] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen or not name.startswith("netreduce"):
            continue
        path = origin(name)
        if path is None or not path.endswith(".py"):
            continue
        seen[name] = Path(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]     # parent packages
        is_pkg = path.endswith("__init__.py")
        base = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    mod = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                todo.append(mod)
                todo += [f"{mod}.{a.name}" for a in node.names]     # submodules imported by name
    return [seen[k] for k in sorted(seen)]


def source_digest(*roots: str) -> str:
    """SHA-256 of the source the modules ``roots`` are built from (default: the engine,
    ``netreduce.hw.engine``): each root and every netreduce module it imports (transitively)."""
    files: dict[Path, None] = {}
    for root in roots or ("netreduce.hw.engine",):
        files.update(dict.fromkeys(_imported_sources(root)))
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _engine_params(params: dict | None) -> dict:
    from netreduce.regmap import DEFAULT_PARAMS as RM_DEFAULTS

    return dict(RM_DEFAULTS, **(params or {}))


def design_digest(params: dict | None = None) -> str:
    """Digest of the engine design for build parameters ``params`` (the rest defaults): the
    source digest and the full parameter set. A recorded figure with another digest is stale."""
    p = _engine_params(params)
    return hashlib.sha256(json.dumps([source_digest(), sorted(p.items())],
                                     default=str).encode()).hexdigest()[:16]


def cache_key(parts) -> str:
    """The 16-hex-digit key of a JSON-able description of what an entry is made from (include a
    :func:`source_digest`); the Amaranth version is added."""
    return hashlib.sha256(json.dumps([metadata.version("amaranth"), parts],
                                     default=str).encode()).hexdigest()[:16]


def save_top(top, path: Path) -> None:
    """Store ``top`` (an :class:`~netreduce.hw.verilog.AxisTop`: port map and Verilog) as JSON,
    atomically."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(top.info(), verilog=top.verilog)))
    tmp.replace(path)


def load_top(path: Path):
    """The :class:`~netreduce.hw.verilog.AxisTop` stored by :func:`save_top`."""
    from .verilog import AxisPort, AxisTop

    d = json.loads(Path(path).read_text())
    streams = [AxisPort(**{k: tuple(tuple(x) for x in v) if k.endswith("_fields") else v
                           for k, v in s.items()}) for s in d["streams"]]
    return AxisTop(name=d["name"], verilog=d["verilog"], streams=streams,
                   ports={k: tuple(v) for k, v in d["ports"].items()})


def cached_top(name: str, key: str, make: Callable[[], object], sub: str = "gen"):
    """The top stored as ``<cache>/<sub>/<name>-<key>.json``, made with ``make()`` and stored
    first if it is not there yet."""
    path = cache_dir(sub) / f"{name}-{key}.json"
    if path.exists():
        return load_top(path)
    top = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_top(top, path)
    return top


def _split_roles(params: dict) -> tuple[dict, bool]:
    """``roles`` (flow roles, D17: ``NetReduceEngine(roles=True)``) is a build option, not a
    register-map parameter; a false one is the plain engine."""
    return {k: v for k, v in params.items() if k != "roles"}, bool(params.get("roles", False))


def engine_top_path(params: dict, ram_style: str = "ultra") -> Path:
    """Where :func:`engine_top` keeps the top of build ``params`` (exists once converted)."""
    p, roles = _split_roles(params)
    key = cache_key([design_digest(p), ram_style] + (["roles"] if roles else []))
    return cache_dir("engine") / f"{ENGINE_TOP_NAME}-{key}.json"


def engine_top(params: dict, *, ram_style: str = "ultra", progress=None):
    """The engine's Verilog top (:func:`netreduce.hw.engine.engine_verilog`, module
    ``netreduce_engine``) for build ``params`` (:func:`netreduce.regmap.build_regmap` keywords;
    a true ``roles`` entry builds the engine with flow roles), its large RAMs for ``ram_style``
    (:mod:`.rams`), converted once and cached by :func:`design_digest`. ``progress(phase,
    text)`` reports a conversion or a cache hit."""
    from netreduce.regmap import build_regmap

    from .engine import engine_verilog
    from .rams import large_ram_style

    path = engine_top_path(params, ram_style)
    if path.exists():
        if progress is not None:
            progress("engine", f"engine Verilog from the cache ({path})")
        return load_top(path)
    p, roles = _split_roles(params)
    with large_ram_style(ram_style):
        top = engine_verilog(build_regmap(**p), name=ENGINE_TOP_NAME, progress=progress,
                             **({"roles": True} if roles else {}))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_top(top, path)
    return top
