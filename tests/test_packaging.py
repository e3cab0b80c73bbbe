"""Packaging and layering: every package is installed under its netreduce.* name, imports go down.

netreduce.wire and netreduce.regmap import only the standard library and numpy; hw and sw_driver
import wire/regmap but never each other (nor sim); nothing imports bare hw/sim; no module imports
itself through others (no import cycles, lazy imports inside functions included).
"""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
ROOTS = {"netreduce": "netreduce", "hw": "netreduce.hw", "sim": "netreduce.sim",
         "sw_driver": "netreduce.sw_driver"}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
# The host-side modules allowed above sw_driver: the PyTorch binding and backend run their ranks
# on the software RNIC through the switch service (netreduce.sim.emu.rank.RankComm over
# netreduce.sim.emu.tunnel).
SW_DRIVER_USES_SIM = {"netreduce.sw_driver.torch": {"netreduce.sim.emu.rank"},
                      "netreduce.sw_driver.torch_backend": {"netreduce.sim.emu.rank",
                                                            "netreduce.sim.emu.tunnel"}}


def _dotted(folder: Path) -> str:
    rel = folder.relative_to(ROOT)
    return ".".join([ROOTS[rel.parts[0]], *rel.parts[1:]])


def _package_folders() -> dict[str, Path]:
    found = {}
    for top in ROOTS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            if ".venv" in init.parts or "__pycache__" in init.parts:
                continue
            found[_dotted(init.parent)] = init.parent
    return found


def test_package_dir_mapping():
    assert PACKAGE_DIR == {v: k for k, v in ROOTS.items()}


def test_every_package_is_listed():
    listed = set(SETUPTOOLS["packages"])
    found = _package_folders()
    missing = sorted(set(found) - listed)
    assert not missing, f"add to pyproject [tool.setuptools] packages: {missing}"
    stale = sorted(listed - set(found))
    assert not stale, f"listed in pyproject but no folder with __init__.py: {stale}"


def _module_name(path: Path) -> tuple[str, bool]:
    """Dotted module name of a source file and whether it is a package __init__."""
    pkg = _dotted(path.parent)
    is_pkg = path.name == "__init__.py"
    return (pkg if is_pkg else f"{pkg}.{path.stem}"), is_pkg


def imports_of(source: str, module: str, is_pkg: bool) -> set[str]:
    """Absolute names of every module imported anywhere in ``source`` (relative ones resolved)."""
    package = module if is_pkg else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[:len(parts) - node.level + 1]
                if len(base) < 1 or node.level > len(parts):
                    names.add("<relative import above the top package>")
                    continue
                base_name = ".".join(base)
                if node.module:
                    names.add(f"{base_name}.{node.module}")
                else:  # from . import x: x may be a module of the package
                    names.update(f"{base_name}.{a.name}" for a in node.names)
            else:
                names.add(node.module)
    return names


def violations(source: str, module: str, is_pkg: bool) -> list[str]:
    """Layering rules broken by one module's imports."""
    bad = []
    for name in sorted(imports_of(source, module, is_pkg)):
        top = name.split(".")[0]
        if top in ("hw", "sim", "sw_driver"):
            bad.append(f"{name}: bare import (use netreduce.{top})")
        for layer in ("netreduce.wire", "netreduce.regmap"):
            if module == layer or module.startswith(layer + "."):
                if not (top in STDLIB or top == "numpy" or name == layer
                        or name.startswith(layer + ".")):
                    bad.append(f"{name}: {layer} imports only stdlib, numpy and itself")
        if module.startswith("netreduce.hw"):
            if name.startswith(("netreduce.sw_driver", "netreduce.sim")):
                bad.append(f"{name}: hw never imports sw_driver or sim")
        if module.startswith("netreduce.sw_driver"):
            if name in SW_DRIVER_USES_SIM.get(module, ()):
                continue
            if name.startswith(("netreduce.hw", "netreduce.sim")):
                bad.append(f"{name}: sw_driver never imports hw or sim")
    return bad


def _sources():
    for top in ROOTS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_layering(path):
    module, is_pkg = _module_name(path)
    assert violations(path.read_text(), module, is_pkg) == []


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its source, lazily or not)."""
    modules = {}
    for path in _sources():
        name, is_pkg = _module_name(path)
        modules[name] = (path, is_pkg)
    graph = {}
    for name, (path, is_pkg) in modules.items():
        deps = set()
        for target in imports_of(path.read_text(), name, is_pkg):
            while target and target not in modules:  # "pkg.mod.Class" -> "pkg.mod"
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    return cycles


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert cycles == [], f"modules that import each other (directly or around a loop): {cycles}"


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"x": {"y"}, "y": set()}) == []


@pytest.mark.parametrize(("module", "is_pkg", "source", "expect"), [
    ("netreduce.wire.frame", False, "import scapy", "netreduce.wire imports only"),
    ("netreduce.wire.frame", False, "from .. import cli", "netreduce.wire imports only"),
    ("netreduce.wire.frame", False, "def f():\n    import click", "netreduce.wire imports only"),
    ("netreduce.regmap", True, "from netreduce.wire import parse", "netreduce.regmap imports"),
    ("netreduce.hw.core", False, "from ..sw_driver import x", "hw never imports"),
    ("netreduce.hw.core", False, "import netreduce.sim.model", "hw never imports"),
    ("netreduce.sw_driver.mgmt", False, "from netreduce.hw import top", "sw_driver never"),
    ("netreduce.sw_driver.verbs", False, "from netreduce.sim.net import rnic", "sw_driver never"),
    ("netreduce.sim.x", False, "import hw.core", "bare import"),
])
def test_layering_checker_catches(module, is_pkg, source, expect):
    """The checker itself: each of these sources breaks a rule and must be reported."""
    found = violations(source, module, is_pkg)
    assert any(expect in v for v in found), found


@pytest.mark.parametrize(("module", "source"), [
    ("netreduce.wire.frame", "from .icrc import icrc\nimport numpy as np\nimport zlib"),
    ("netreduce.wire", "from . import batch\nfrom .fields import BTH"),
    ("netreduce.hw.core", "from netreduce.wire import BTH\nfrom ..regmap import x"),
    ("netreduce.sim.model", "from netreduce.hw import core\nfrom netreduce.sw_driver import r"),
])
def test_layering_checker_allows(module, source):
    assert violations(source, module, module == "netreduce.wire") == []


def test_wire_import_loads_only_stdlib_and_numpy():
    """At run time too: importing netreduce.wire pulls in nothing but stdlib, numpy, itself."""
    code = ("import sys, netreduce.wire, netreduce.wire.batch, netreduce.wire.pcap\n"
            "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    extra = sorted(set(out) - STDLIB - {"numpy", "netreduce"} - {m for m in out if m[0] == "_"})
    assert extra == []
