"""A complete Vivado project tree for a board, written without Vivado, and its structural checks.

:func:`write_project` elaborates :class:`.shell.BoardShell` around a core for a board and writes
the Amaranth build plan into a directory:

* ``netreduce_top.v`` (the shell; the CMACs are black-box instances of ``cmac_port<c>``, the
  engine core an instance of ``netreduce_engine``),
* ``netreduce_engine.v`` (the engine core, :func:`netreduce.hw.engine.engine_verilog` with the
  board's build parameters :data:`BOARD_PARAMS`; cached by design digest, because converting
  the 512-bit engine takes minutes),
* ``netreduce_top.tcl`` (Vivado batch flow: read sources and XDC, create the IP, synthesise,
  place, route, reports, bitstream), ``build_netreduce_top.sh`` (runs it),
* ``netreduce_top.xdc`` (pins, I/O standards, the board clock) and ``constraints/*.xdc`` (device
  configuration, clocks, QSFP28 sideband, clock-domain crossings),
* ``ip/cmac_port<c>.tcl`` (``create_ip`` + configuration of each MAC) and ``ip/create_ips.tcl``
  (sources them, ``generate_target``, ``synth_ip``), sourced by the flow right after the sources
  are read,
* ``manifest.json``: board, part, ports, IP configurations, the facts not confirmed from a public
  source, and a SHA-256 of every file.

:func:`check_project` checks the tree structurally (no Vivado needed) and returns the list of
problems (empty when the tree is consistent): every ``get_ports`` names a port of the top module,
every ``get_pins`` a pin of an instance that exists in the netlist, every black-box module of the
netlist is created by exactly one ``create_ip`` or defined in a Verilog file the flow reads (with
every connected pin a port of that module), every IP ``CONFIG`` key is one the IP documents
(:func:`.cmac.validate_config`), every file the Tcl sources or reads is in the tree.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..rams import large_ram_style, omit_large_ram_init
from ..verilog import native_conversion
from .bringup import LoopbackCore
from .cmac import validate_config
from .coreclock import CORE_HZ
from .platforms import NetReducePlatform
from .shell import ENGINE_MODULE, TOP_NAME, BoardShell, EngineCore

__all__ = ["BOARDS", "BOARD_PARAMS", "BOARD_LANE_PARAMS", "board_params", "CORES", "make_core",
           "platform_for", "write_project", "check_project", "engine_verilog_cached",
           "board_ram_style", "Project", "verilog_ports", "verilog_instances", "xdc_object_refs"]

BOARDS = ("vcu118", "vcu108")

# Engine build parameters per board (the rest: netreduce.regmap.DEFAULT_PARAMS). The slot memory
# (2 copies x slots x pmtu_max bytes) and the header store (slots x 2**ceil(log2(max_world))
# entries of ~632 bits) dominate the on-chip RAM:
# * VCU118 (xcvu9p, 960 URAM288 + 2160 RAMB36): the defaults, 1024 slots x 4096 B, max_world 64:
#   slot memory 64 Mib (228 URAM in Yosys's mapping) + header store 41 Mib (~144 URAM).
# * VCU108 (xcvu095, no URAM, 1728 RAMB36 = 62 Mib): 1024 slots alone would take 1824 RAMB36;
#   512 slots x 4096 B (912 RAMB36) + max_world 32 (512 x 32 x 632 b = 10 Mib, 288 RAMB36)
#   leave ~30% for the FIFOs and margin.
BOARD_PARAMS = {
    "vcu118": {},
    "vcu108": {"slots": 512, "max_world": 32},
}
# With two or more cages in use a board build takes one contribution lane per port (lanes =
# ports: every port at line rate, docs/engine.md "Every port at line rate", its memory table):
# 2P slot-memory copies, so fewer slots. VCU118, P = 2: 512 slots x 4096 B (256 URAM) + the
# header store at max_world 32 (36 URAM), 292 of the 320 URAM of the SLR that holds both CMACs
# (max_world 64 would need 328: a second SLR; docs/engine.md "Memories", placement). The VCU108
# has one cage (P = 1, no lanes); a 2-port xcvu095 would take 256 slots (4 copies x 256 RAMB36
# + 144 RAMB36 of header store).
BOARD_LANE_PARAMS = {
    "vcu118": {"slots": 512, "max_world": 32},
    "vcu108": {"slots": 256},
}


def board_params(board: str, ports: int) -> dict:
    """The engine build parameters of ``board`` with ``ports`` ports (besides ``ports`` and
    ``data_width``): :data:`BOARD_PARAMS`, and with 2 or more ports ``lanes = ports`` at the
    sizes of :data:`BOARD_LANE_PARAMS`."""
    if board not in BOARD_PARAMS:
        raise ValueError(f"unknown board {board!r}; expected one of {BOARDS}")
    p = dict(BOARD_PARAMS[board])
    if ports > 1:
        p.update(BOARD_LANE_PARAMS[board], lanes=ports)
    return p


def platform_for(board: str) -> NetReducePlatform:
    """A fresh platform object for ``board`` (``vcu118`` or ``vcu108``)."""
    if board == "vcu118":
        from .vcu118 import VCU118Platform
        return VCU118Platform()
    if board == "vcu108":
        from .vcu108 import VCU108Platform
        return VCU108Platform()
    raise ValueError(f"unknown board {board!r}; expected one of {BOARDS}")


@dataclass
class Project:
    """What :func:`write_project` produced."""

    board: str
    part: str
    ports: list[int]
    out_dir: Path
    files: dict[str, str]
    manifest: dict
    problems: list[str] = field(default_factory=list)


# ---- structural checks -------------------------------------------------------------------------

_ID = r"(?:\\\S+|[A-Za-z_][\w$]*)"
_MODULE_RE = re.compile(rf"^module ({_ID}) ?\((.*?)\);", re.M | re.S)
_INST_RE = re.compile(rf"^  ({_ID}) +({_ID}) ?\(\s*$", re.M)
_INST_PARAM_RE = re.compile(rf"^  ({_ID}) #\(.*?^  \) ({_ID}) ?\(\s*$", re.M | re.S)
_KEYWORDS = {"always", "assign", "if", "else", "case", "begin", "end", "initial", "wire", "reg",
             "input", "output", "inout", "module", "endmodule", "function", "generate"}


def _clean(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


def verilog_modules(text: str) -> dict[str, tuple[list[str], str]]:
    """``{module name: (port names, body)}`` of a Verilog file written by Amaranth/Yosys."""
    mods = {}
    for m in _MODULE_RE.finditer(text):
        pos = m.start()
        end = text.find("\nendmodule", pos)
        body = text[m.end():end if end >= 0 else len(text)]
        # non-ANSI (``module m(a, b);``, Yosys) or ANSI (``input wire [7:0] a``, the AXI top)
        ports = [_clean(p.split()[-1]) for p in m.group(2).split(",") if p.strip()]
        mods[_clean(m.group(1))] = (ports, body)
    return mods


def verilog_ports(text: str, top: str = TOP_NAME) -> list[str]:
    """Port names of module ``top``."""
    mods = verilog_modules(text)
    if top not in mods:
        raise ValueError(f"module {top!r} not found in the Verilog")
    return mods[top][0]


def verilog_instances(text: str, top: str = TOP_NAME) -> dict[str, str]:
    """``{hierarchical instance path: module name}`` below ``top`` (paths joined with ``/``)."""
    mods = verilog_modules(text)
    children: dict[str, list[tuple[str, str]]] = {}
    for name, (_, body) in mods.items():
        found = [(_clean(a), _clean(b)) for a, b in _INST_RE.findall(body)
                 if _clean(a) not in _KEYWORDS]
        found += [(_clean(a), _clean(b)) for a, b in _INST_PARAM_RE.findall(body)]
        children[name] = found
    out: dict[str, str] = {}

    def walk(mod: str, prefix: str):
        for sub, inst in children.get(mod, []):
            path = f"{prefix}{inst}"
            out[path] = sub
            if sub in mods:
                walk(sub, path + "/")

    walk(top, "")
    return out


def _instance_pins(text: str, module: str, inst: str) -> set[str]:
    """Named port connections (``.pin(...)``) of instance ``inst`` inside ``module``."""
    mods = verilog_modules(text)
    body = mods.get(module, ([], ""))[1]
    m = re.search(rf"^  \S+ +{re.escape(inst)} ?\(\s*$(.*?)^  \);", body, re.M | re.S)
    if not m:
        return set()
    return set(re.findall(r"\.(\\?\S+?)\(", m.group(1)))


# a lookahead, so a query nested in another one's -of_objects is found too
_OBJ_RE = re.compile(r"(?=\[\s*get_(ports|pins|cells|clocks|nets)\s+((?:-\S+\s+)*)"
                     r"(\{[^}]*\}|\"[^\"]*\"|[^\s\]]+))")


def xdc_object_refs(text: str) -> list[tuple[str, list[str], int]]:
    """``(kind, names, line number)`` for every ``[get_ports|get_pins|... <names>]`` in an XDC
    (comments skipped; ``-of_objects`` and other options are not name lists)."""
    refs = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        for kind, opts, arg in _OBJ_RE.findall(code):
            if "-of_objects" in opts or arg.startswith("-") or arg.startswith("["):
                continue
            arg = arg.strip("{}\"")
            names = [a.replace("\\[", "[").replace("\\]", "]") for a in arg.split()]
            refs.append((kind, names, n))
    return refs


def _port_base(name: str) -> str:
    return re.sub(r"\[\d+\]$", "", name)


def check_project(files: dict[str, str], ip: str, top: str = TOP_NAME) -> list[str]:
    """Problems found in a project tree ``{path: text}`` (see the module docstring)."""
    problems: list[str] = []
    v = files.get(f"{top}.v")
    if v is None:
        return [f"{top}.v missing"]
    ports = set(verilog_ports(v, top))
    insts = verilog_instances(v, top)
    mods = verilog_modules(v)
    for path, text in sorted(files.items()):
        if not path.endswith(".xdc"):
            continue
        for kind, names, line in xdc_object_refs(text):
            for name in names:
                if kind == "ports":
                    base = _port_base(name)
                    if not any(fnmatch.fnmatchcase(p, base) for p in ports):
                        problems.append(f"{path}:{line}: get_ports {name!r} is not a port of "
                                        f"{top}")
                elif kind == "pins":
                    cell, _, pin = name.rpartition("/")
                    if cell not in insts:
                        problems.append(f"{path}:{line}: get_pins {name!r}: no instance "
                                        f"{cell!r} in the netlist")
                        continue
                    parent, _, leaf = cell.rpartition("/")
                    parent_mod = insts[parent] if parent else top
                    if pin not in _instance_pins(v, parent_mod, leaf):
                        problems.append(f"{path}:{line}: get_pins {name!r}: instance {cell!r} "
                                        f"has no connected pin {pin!r}")
                elif kind == "cells" and not any(fnmatch.fnmatchcase(i, n)
                                                 for n in names for i in insts):
                    problems.append(f"{path}:{line}: get_cells {names} matches no instance")
    # black boxes: instantiated, not defined, not a Xilinx primitive we know
    primitives = {"IBUFDS", "IBUF", "OBUF", "OBUFT", "IOBUF", "BUFG", "BUFGCE", "BUFGCTRL",
                  "FDPE", "FDCE", "FDRE", "FDSE", "IBUFDS_GTE4", "IBUFDS_GTE3", "STARTUPE3",
                  "IDDRE1", "ODDRE1", "MMCME4_BASE", "MMCME3_BASE"}
    # modules defined in the other Verilog files of the tree (the flow adds every .v file)
    defined_elsewhere: dict[str, list[str]] = {}
    for path, text in files.items():
        if path.endswith(".v") and path != f"{top}.v" and not path.endswith(".debug.v"):
            for name, (mports, _) in verilog_modules(text).items():
                defined_elsewhere[name] = mports
            if not re.search(rf"^\s*add_files [\"{{]?{re.escape(path)}[\"}}]?\s*$",
                             files.get(f"{top}.tcl", ""), re.M):
                problems.append(f"{top}.tcl does not add {path}")
    for path, module in insts.items():
        if module in defined_elsewhere and module not in mods:
            parent, _, leaf = path.rpartition("/")
            pins = {_clean(p) for p in _instance_pins(v, insts[parent] if parent else top, leaf)}
            missing = sorted(pins - set(defined_elsewhere[module]))
            if missing:
                problems.append(f"instance {path!r} of {module!r} connects pins {missing} that "
                                f"the module does not have")
    blackboxes = sorted({m for m in insts.values()
                         if m not in mods and m not in primitives and m not in defined_elsewhere})
    # the Tcl that actually runs: the main script and what it sources, transitively
    reachable, todo = set(), [f"{top}.tcl"]
    while todo:
        path = todo.pop()
        if path in reachable or path not in files:
            continue
        reachable.add(path)
        todo += [s.strip("{}\"") for s in re.findall(r"^\s*source\s+(\S+)", files[path], re.M)]
    for path in sorted(files):
        if path.endswith(".tcl") and path not in reachable:
            problems.append(f"{path} is never sourced by {top}.tcl")
    created: dict[str, int] = {}
    for path in sorted(reachable):
        text = files[path]
        for name, module in re.findall(r"create_ip -name (\S+) .*?-module_name (\S+)", text):
            created[module] = created.get(module, 0) + 1
            if name != ip:
                problems.append(f"{path}: create_ip -name {name}, the board uses {ip}")
            cfg = dict(re.findall(r"CONFIG\.(\w+) \{([^}]*)\}", text))
            try:
                validate_config(ip, cfg)
            except ValueError as e:
                problems.append(f"{path}: {e}")
        for ref in re.findall(r"^\s*(?:source|read_xdc|add_files)\s+(\S+)", text, re.M):
            ref = ref.strip("{}\"")
            if "$" not in ref and ref not in files:
                problems.append(f"{path}: refers to {ref!r}, which is not in the tree")
    for bb in blackboxes:
        if created.get(bb, 0) != 1:
            problems.append(f"black-box module {bb!r} is created by {created.get(bb, 0)} "
                            f"create_ip commands (want 1)")
    for module in sorted(set(created) - set(blackboxes)):
        problems.append(f"IP {module!r} is created but never instantiated")
    main = files.get(f"{top}.tcl", "")
    if "source ip/create_ips.tcl" not in main:
        problems.append(f"{top}.tcl does not source ip/create_ips.tcl")
    for path in files:
        if path.startswith("constraints/") and f"read_xdc {path}" not in main \
                and f'read_xdc "{path}"' not in main and f"read_xdc {{{path}}}" not in main:
            problems.append(f"{top}.tcl does not read {path}")
    return problems


# ---- writing the tree --------------------------------------------------------------------------

CORES = {
    "engine": "the NetReduce engine (default): its own Verilog file, instantiated in the shell",
    "engine-inline": "the engine elaborated inside the shell (one netlist; slower to convert)",
    "loopback": "bring-up core: RX->TX loopback per port + the register bank",
    "loopback-lite": "the loopback without the register bank (AXI-Lite answers DECERR): quick "
                     "builds",
}


def make_core(spec: str, ports: int, data_width: int = 512, board: str | None = None):
    """The core named ``spec`` (a key of :data:`CORES`, or ``package.module:attr`` called with
    the keyword arguments ``ports`` / ``data_width`` it accepts). The engine cores take the build
    parameters of ``board`` (:func:`board_params`; the defaults without a board)."""
    if spec in ("engine", "engine-inline"):
        # the core runs on the shell's core clock: GLOBAL.CLOCK_HZ tells the driver so
        params = dict(board_params(board, ports) if board is not None else {},
                      clock_hz=int(CORE_HZ))
        return EngineCore(ports, params, data_width=data_width,
                          netlist="instance" if spec == "engine" else "inline")
    if spec == "loopback":
        return LoopbackCore(ports, data_width)
    if spec == "loopback-lite":
        return LoopbackCore(ports, data_width, regs=False)
    if ":" not in spec:
        raise ValueError(f"unknown core {spec!r}: use one of {sorted(CORES)} or "
                         f"'package.module:attr'")
    import importlib
    import inspect

    mod, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load core {spec!r}: {e}") from None
    try:
        accepted = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        accepted = {}
    kw = {k: v for k, v in {"ports": ports, "data_width": data_width}.items() if k in accepted}
    return obj(**kw)


def engine_verilog_cached(core: EngineCore, *, ram_style: str = "ultra", progress=None) -> str:
    """Verilog text of module ``netreduce_engine`` for ``core``'s parameters, its large RAMs
    for ``ram_style`` (:mod:`netreduce.hw.rams`: ``"ultra"`` or ``"block"``).

    Cached by :func:`netreduce.hw.cache.engine_top` (the one cache of converted engines, keyed
    by the engine's source digest and parameters); ``progress(phase, text)`` reports the
    conversion (:func:`.verilog.to_verilog`)."""
    from ..cache import engine_top

    return engine_top(core.params, ram_style=ram_style, progress=progress).verilog


def board_ram_style(platform: NetReducePlatform) -> str:
    """``"ultra"`` for a device with UltraRAM (the large RAMs go there), else ``"block"``."""
    return "ultra" if platform.capacity.uram else "block"


def write_project(board: str, out_dir, *, ports=None, core=None, mgmt=None,
                  rs_fec: bool | None = None, cmac_site: dict[int, str] | None = None,
                  clean: bool = False, progress=None) -> Project:
    """Write the Vivado project tree of ``board`` to ``out_dir`` (see the module docstring).

    ``core``: a component, or a :func:`make_core` spec (default ``"engine"``: the engine with
    the board's :func:`board_params`, one port per cage in use, as its own Verilog file from
    :func:`engine_verilog_cached`). ``mgmt``: optional AXI4-Lite master driving the core's
    register bank (without it the bus is idle). Raises
    ``ValueError`` if the written tree fails :func:`check_project` (the tree is still written,
    with the problems in ``manifest.json``, so it can be inspected).
    """
    platform = platform_for(board)
    ports = [c.index for c in platform.qsfp_cages] if ports is None else list(ports)
    if core is None:
        core = "engine"
    if isinstance(core, str):
        core = make_core(core, len(ports), board=board)
    try:
        shell = BoardShell(platform, core, ports=ports, mgmt=mgmt, rs_fec=rs_fec,
                           cmac_site=cmac_site)
    except (TypeError, ValueError):
        core._MustUse__silence = True  # never elaborated because the shell refused it
        raise
    style = board_ram_style(platform)
    if isinstance(core, EngineCore) and core.netlist == "instance":
        platform.add_file(f"{ENGINE_MODULE}.v",
                          engine_verilog_cached(core, ram_style=style, progress=progress))
    if progress is not None:
        progress("shell", f"elaborating and converting the {board} shell "
                 f"({len(ports)} port(s)) and rendering the Vivado project")
    with large_ram_style(style), omit_large_ram_init(), native_conversion():
        plan = platform.build(shell, name=TOP_NAME, do_build=False,
                              script_after_read="source ip/create_ips.tcl")
    files = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in plan.files.items()}
    problems = check_project(files, platform.cmac_ip)
    out = Path(out_dir)
    if clean and out.exists():
        shutil.rmtree(out)
    plan.extract(str(out))
    script = out / f"build_{TOP_NAME}.sh"
    if script.exists():
        script.chmod(0o755)
    manifest = {
        "board": board,
        "part": platform.part,
        "top": TOP_NAME,
        "core": type(core).__name__,
        "core_params": dict(getattr(core, "params", {})),
        "ports": ports,
        "cmac_ip": platform.cmac_ip,
        "ip": {f"cmac_port{c}": cfg for c, cfg in shell.ip_configs.items()},
        "unconfirmed": [f"cage {c.index}: {c.note}" for c in shell.cages if not c.confirmed],
        "capacity": platform.capacity.as_dict(),
        "run": f"./build_{TOP_NAME}.sh (needs vivado on PATH)",
        "problems": problems,
        "files": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sorted(files.items())},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    project = Project(board, platform.part, ports, out, files, manifest, problems)
    project.plan = plan
    if problems:
        raise ValueError(f"project tree for {board} in {out} is inconsistent:\n  "
                         + "\n  ".join(problems))
    return project
