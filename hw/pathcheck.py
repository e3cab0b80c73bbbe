"""Paths between blocks: combinational input -> output paths and fanout, from a gate-level netlist.

A per-block logic depth says nothing about a path that runs through several blocks. This module
flattens a component to single-bit gates with Yosys (``proc; flatten; memory -nomap; techmap``),
then walks the netlist:

* :func:`comb_paths`: the (input port, output port) pairs of the component joined by a path of
  combinational gates only (flip-flops and synchronous memory read ports end a path; an
  asynchronous read port passes its address to its data). A block whose ports are all registered
  has none.
* :func:`port_fanout`: for every port of every direct sub-block (the nets between blocks), the
  largest number of gate inputs one of its bits drives in the flattened design.
* :func:`levels`: the longest register-to-register path after ``synth_xilinx -family xcup``, in
  LUT-class cells and in carry cells counted separately, with the nets along one deepest path.

Both need the native Yosys (:func:`netreduce.hw.estimate.find_yosys`); keep parameters small.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

__all__ = ["gate_netlist", "comb_paths", "port_fanout", "Netlist", "xilinx_levels", "levels"]

SCRIPT = ("read_rtlil {il}; hierarchy -top {top}; proc; flatten; memory -nomap; "
          "opt -fast; techmap; opt -fast; opt_clean; write_json {out}")


class Netlist:
    """A flattened single-bit gate netlist (Yosys JSON) of module ``top``."""

    def __init__(self, doc: dict, top: str, module_ports: dict[str, set[str]] | None = None):
        mod = doc["modules"][top]
        self.module_ports = module_ports or {}   # pre-flatten module name -> its port names
        self.ports = {n: (p["direction"], p["bits"]) for n, p in mod["ports"].items()}
        self.names = {n: d["bits"] for n, d in mod["netnames"].items()}
        self.readers: dict[int, list[str]] = defaultdict(list)   # bit -> comb cells reading it
        self.loads: dict[int, int] = defaultdict(int)            # bit -> gate inputs it drives
        self.outputs: dict[str, list[int]] = {}                  # comb cell -> its output bits
        for cname, cell in mod["cells"].items():
            if cell["type"] == "$mem_v2":
                self._memory(cname, cell)
                continue
            seq = "DFF" in cell["type"] or "DLATCH" in cell["type"] or "FF" in cell["type"]
            dirs = cell.get("port_directions", {})
            outs = []
            for pin, bits in cell["connections"].items():
                if dirs.get(pin) == "output":
                    outs += [b for b in bits if isinstance(b, int)]
                else:
                    for b in bits:
                        if isinstance(b, int):
                            self.loads[b] += 1
                            if not seq:
                                self.readers[b].append(cname)
            if not seq:
                self.outputs[cname] = outs
        for _, (d, bits) in self.ports.items():
            if d == "output":
                for b in bits:
                    if isinstance(b, int):
                        self.loads[b] += 1

    def _memory(self, cname: str, cell: dict) -> None:
        """A memory: synchronous read ports end a path; an asynchronous one is a combinational
        cell from its address to its data."""
        p, c = cell["parameters"], cell["connections"]
        n = int(p["RD_PORTS"], 2) if isinstance(p["RD_PORTS"], str) else p["RD_PORTS"]
        clk_en = str(p["RD_CLK_ENABLE"]).zfill(n)[::-1] if n else ""
        abits = len(c["RD_ADDR"]) // max(n, 1)
        dbits = len(c["RD_DATA"]) // max(n, 1)
        for pin in ("WR_ADDR", "WR_DATA", "WR_EN", "RD_ADDR", "RD_EN", "RD_ARST", "RD_SRST"):
            for b in c.get(pin, ()):
                if isinstance(b, int):
                    self.loads[b] += 1
        for i in range(n):
            if clk_en[i] == "1":
                continue
            name = f"{cname}#rd{i}"
            self.outputs[name] = [b for b in c["RD_DATA"][i * dbits:(i + 1) * dbits]
                                  if isinstance(b, int)]
            for b in c["RD_ADDR"][i * abits:(i + 1) * abits]:
                if isinstance(b, int):
                    self.readers[b].append(name)

    def reach(self, bits) -> set[int]:
        """Bits reachable from ``bits`` through combinational gates (``bits`` included)."""
        seen = set(b for b in bits if isinstance(b, int))
        todo = list(seen)
        done_cells = set()
        while todo:
            b = todo.pop()
            for c in self.readers.get(b, ()):
                if c in done_cells:
                    continue
                done_cells.add(c)
                for o in self.outputs[c]:
                    if o not in seen:
                        seen.add(o)
                        todo.append(o)
        return seen


def gate_netlist(component, *, top: str = "top", timeout: float = 1800) -> Netlist:
    """:class:`Netlist` of an Amaranth component (converted to RTLIL, flattened by Yosys)."""
    from amaranth.back import rtlil

    from .estimate import find_yosys

    cmd, _ = find_yosys()
    text = rtlil.convert(component, name=top, emit_src=False)
    with tempfile.TemporaryDirectory(prefix="nr-paths-") as d:
        il, out = Path(d) / "design.il", Path(d) / "net.json"
        il.write_text(text)
        script = SCRIPT.format(il=il, top=top, out=out)
        r = subprocess.run([*cmd, "-q", "-p", script], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"yosys failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
        ports = {}
        for mname, body in re.findall(r"^module \\(\S+)\n(.*?)^end$", text, re.M | re.S):
            ports[mname] = set(re.findall(r"^  wire .*\b(?:input|output) \d+ +\\(\S+)$", body,
                                          re.M))
        return Netlist(json.loads(out.read_text()), top, ports)


def _is_clock_or_reset(name: str) -> bool:
    return name in ("clk", "rst")


def comb_paths(net: Netlist) -> list[tuple[str, str]]:
    """``(input, output)`` port pairs joined by a combinational path (sorted)."""
    out_of = {}
    for name, (d, bits) in net.ports.items():
        if d == "output":
            for b in bits:
                if isinstance(b, int):
                    out_of.setdefault(b, name)
    pairs = set()
    for name, (d, bits) in net.ports.items():
        if d != "input" or _is_clock_or_reset(name):
            continue
        for b in net.reach(bits):
            if b in out_of:
                pairs.add((name, out_of[b]))
    return sorted(pairs)


def port_fanout(net: Netlist, children, top: str = "top") -> dict[str, int]:
    """``{"<child>.<port>": largest gate-input count of one of its bits}`` for the ports of the
    direct sub-blocks ``children`` (instance names) of the flattened design."""
    fan = {}
    for child in children:
        for port in net.module_ports.get(f"{top}.{child}", ()):
            bits = net.names.get(f"{child}.{port}")
            ints = [b for b in bits or () if isinstance(b, int)]
            if ints:
                fan[f"{child}.{port}"] = max(net.loads.get(b, 0) for b in ints)
    return fan


# ---- logic levels on the Xilinx mapping -------------------------------------------------------

LEVELS_SCRIPT = ("read_rtlil {il}; synth_xilinx -family xcup -top {top} -flatten -noiopad "
                 "-noclkbuf; opt_clean; write_json {out}")


def xilinx_levels(doc: dict, top: str) -> dict:
    """Longest register-to-register path of a ``synth_xilinx`` netlist (Yosys JSON): the
    project's one counter, :func:`netreduce.hw.estimate.path_levels` (``lut_levels``: LUT1-6 and
    MUXF7/8/9 cells, INV passed through uncounted; ``carry_levels`` on that path and
    ``carry_max`` on any path, in CARRY8 units; ``lut_path`` / ``lut_nets``: the worst path's
    cell types and the nets they drive), with ``lut_cells``: both as ``"TYPE -> net"``, source
    first, to show the path cell by cell. Flip-flops, RAMs, DSPs, black boxes and ports end a
    path; a combinational loop raises ``ValueError``."""
    from .estimate import path_levels

    lv = path_levels(doc, top)
    lv["lut_cells"] = [f"{t} -> {n}" for t, n in zip(lv["lut_path"], lv["lut_nets"], strict=True)]
    return lv


def levels(component, *, top: str = "top", timeout: float = 3600) -> dict:
    """:func:`xilinx_levels` of an Amaranth component after ``synth_xilinx -family xcup``."""
    from amaranth.back import rtlil

    from .estimate import find_yosys, no_zero_meminit

    cmd, _ = find_yosys()
    with no_zero_meminit():
        text = rtlil.convert(component, name=top, emit_src=False)
    with tempfile.TemporaryDirectory(prefix="nr-levels-") as d:
        il, out = Path(d) / "design.il", Path(d) / "net.json"
        il.write_text(text)
        r = subprocess.run([*cmd, "-q", "-p", LEVELS_SCRIPT.format(il=il, top=top, out=out)],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"yosys failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
        return xilinx_levels(json.loads(out.read_text()), top)
