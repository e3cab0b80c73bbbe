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

For a whole engine, :class:`Hierarchy` keeps the gate netlist hierarchical (one module per
sub-block as the engine instantiates it) and answers the same questions per direct sub-block:
its combinational input -> output paths, two such blocks in a row, the fanout of the nets between
blocks (:func:`engine_paths`: the engine at given build parameters, cached).

Both need the native Yosys (:func:`netreduce.hw.estimate.find_yosys`); keep parameters small.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

__all__ = ["gate_netlist", "comb_paths", "port_fanout", "Netlist", "xilinx_levels", "levels",
           "Hierarchy", "hier_netlist", "engine_paths", "base_name"]

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


def gate_netlist(component, *, top: str = "top", timeout: float = 1800,
                 script: str = SCRIPT) -> Netlist:
    """:class:`Netlist` of an Amaranth component (converted to RTLIL, flattened by Yosys with
    ``script``: :data:`SCRIPT`, or e.g. :data:`HIER_SCRIPT` with ``flatten`` added)."""
    from amaranth.back import rtlil

    from .estimate import find_yosys

    cmd, _ = find_yosys()
    text = rtlil.convert(component, name=top, emit_src=False)
    with tempfile.TemporaryDirectory(prefix="nr-paths-") as d:
        il, out = Path(d) / "design.il", Path(d) / "net.json"
        il.write_text(text)
        script = script.format(il=il, top=top, out=out)
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


# ---- paths between the blocks of a hierarchy --------------------------------------------------

# word-level constant folding before the gate mapping, shared gates merged after it (a second
# ``opt -fast`` on the gates doubles the time and changes none of the figures)
HIER_SCRIPT = ("read_rtlil {il}; hierarchy -top {top}; proc; opt -fast; memory -nomap; techmap; "
               "opt_merge; opt_clean; write_json {out}")

_SEQ_MARKS = ("DFF", "DLATCH", "FF")
_MEM_LOADS = ("WR_ADDR", "WR_DATA", "RD_ADDR", "RD_EN", "RD_ARST", "RD_SRST")


def _bits_of(mask: int):
    """Positions of the set bits of ``mask``."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Hierarchy:
    """A gate netlist kept hierarchical (Yosys JSON of :data:`HIER_SCRIPT`: ``techmap`` without
    ``flatten``, one module per sub-block as its parent instantiates it), walked bottom-up.
    A constant the parent ties to a sub-block's input is not propagated into the sub-block's
    gates (only the arcs from that input are dropped), so a path may be reported that the
    flattened netlist would fold away, never the other way round.

    Each module is summarised by its *arcs*: for every output port bit, the input port bits that
    reach it through combinational gates of the module and of its sub-blocks (flip-flops and
    synchronous read ports end a path; an asynchronous read port passes its address to its data;
    a sub-block counts by its own arcs). From those, for the direct sub-blocks of a module:

    * :meth:`block_paths`: which input ports of a sub-block reach which of its output ports
      combinationally (inputs its parent ties to a constant, and ``clk`` / ``rst``, left out);
    * :meth:`chains`: a sub-block's combinational output feeding, through the parent's own
      gates only, an input of a sub-block with a combinational path (two blocks crossed in one
      register-to-register path);
    * :meth:`port_fanout`: for every port of every sub-block, the largest number of gate inputs
      one of its bits drives in the whole design (as in the flattened netlist: a bit passed
      straight through a sub-block counts the loads on both sides);
    * :meth:`comb_paths`: the module's own input -> output pairs.

    A combinational loop in the gate graph (none in a legal design) is cut where the walk meets
    it and counted in ``loops``.
    """

    def __init__(self, doc: dict, top: str):
        self.mods = doc["modules"]
        self.top = top
        self.loops = 0
        self._sum: dict[str, tuple] = {}
        self._load: dict[str, tuple] = {}

    # -- structure
    def _ports(self, mod: str, direction: str) -> list[tuple[str, int, int]]:
        """``(port, index, bit)`` of every ``direction`` port bit of ``mod``, in order."""
        out = []
        for name, p in self.mods[mod]["ports"].items():
            if p["direction"] == direction:
                out += [(name, i, b) for i, b in enumerate(p["bits"])]
        return out

    def children(self, mod: str | None = None) -> dict[str, str]:
        """``{instance name: module name}`` of the direct sub-blocks of ``mod`` (default top)."""
        mod = mod or self.top
        return {self._inst(c): cell["type"] for c, cell in self.mods[mod]["cells"].items()
                if cell["type"] in self.mods}

    @staticmethod
    def _inst(cell_name: str) -> str:
        return cell_name.lstrip("\\")

    def _deps(self, mod: str, glue_only: bool = False):
        """``{net bit: [net bits it follows combinationally]}`` in ``mod`` (sub-blocks by their
        arcs unless ``glue_only``)."""
        deps: dict[int, list[int]] = defaultdict(list)
        for cell in self.mods[mod]["cells"].values():
            t, conn = cell["type"], cell["connections"]
            if t in self.mods:
                if glue_only:
                    continue
                ins, arcs = self.summary(t)
                for (port, idx, _), mask in arcs:
                    o = conn[port][idx]
                    if isinstance(o, int):
                        deps[o] += [b for b in (conn[ins[p][0]][ins[p][1]] for p in _bits_of(mask))
                                    if isinstance(b, int)]
            elif t == "$mem_v2":
                p = cell["parameters"]
                n = int(p["RD_PORTS"], 2) if isinstance(p["RD_PORTS"], str) else p["RD_PORTS"]
                clk_en = str(p["RD_CLK_ENABLE"]).zfill(n)[::-1] if n else ""
                ab, db = len(conn["RD_ADDR"]) // max(n, 1), len(conn["RD_DATA"]) // max(n, 1)
                for i in range(n):
                    if clk_en[i] == "1":
                        continue
                    addr = [b for b in conn["RD_ADDR"][i * ab:(i + 1) * ab] if isinstance(b, int)]
                    for o in conn["RD_DATA"][i * db:(i + 1) * db]:
                        if isinstance(o, int):
                            deps[o] += addr
            elif not any(s in t for s in _SEQ_MARKS):
                dirs = cell.get("port_directions", {})
                ins = [b for pin, bits in conn.items() if dirs.get(pin) != "output"
                       for b in bits if isinstance(b, int)]
                for pin, bits in conn.items():
                    if dirs.get(pin) == "output":
                        for o in bits:
                            if isinstance(o, int):
                                deps[o] += ins
        return deps

    def _masks(self, deps, base: dict[int, int], nets) -> dict[int, int]:
        """``{net: OR of base[n] over the nets n it follows, itself included}`` for ``nets``."""
        memo: dict[int, int] = {}
        busy: set[int] = set()
        for start in nets:
            if start in memo:
                continue
            stack = [start]
            while stack:
                x = stack[-1]
                if x in memo:
                    stack.pop()
                    continue
                if x in busy:
                    acc = base.get(x, 0)
                    for d in deps.get(x, ()):
                        acc |= memo.get(d, 0)
                    memo[x] = acc
                    busy.discard(x)
                    stack.pop()
                    continue
                busy.add(x)
                for d in deps.get(x, ()):
                    if d not in memo:
                        if d in busy:
                            self.loops += 1
                        else:
                            stack.append(d)
        return memo

    def summary(self, mod: str):
        """``(inputs, arcs)`` of ``mod``: ``inputs`` its input port bits ``(port, index)`` in
        mask order; ``arcs`` ``[((port, index, bit), mask), ...]`` for the output bits reached
        combinationally (bit ``p`` of ``mask``: ``inputs[p]``)."""
        if mod not in self._sum:
            ins = self._ports(mod, "input")
            base = {}
            for p, (_, _, b) in enumerate(ins):
                if isinstance(b, int):
                    base[b] = base.get(b, 0) | 1 << p
            outs = self._ports(mod, "output")
            masks = self._masks(self._deps(mod), base, [b for *_, b in outs if isinstance(b, int)])
            arcs = [(o, masks[o[2]]) for o in outs if isinstance(o[2], int) and masks[o[2]]]
            self._sum[mod] = ([(n, i) for n, i, _ in ins], arcs)
        return self._sum[mod]

    def comb_paths(self, mod: str | None = None) -> list[tuple[str, str]]:
        """``(input, output)`` port pairs of ``mod`` (default top) joined combinationally."""
        ins, arcs = self.summary(mod or self.top)
        return sorted({(ins[p][0], port) for (port, _, _), mask in arcs for p in _bits_of(mask)
                       if not _is_clock_or_reset(ins[p][0])})

    def _live_arcs(self, mod: str, inst: str):
        """Arcs of the sub-block ``inst`` of ``mod`` as ``[(out port, out bit in mod, in port,
        in bit in mod)]``: inputs tied to a constant, ``clk`` and ``rst`` left out."""
        cell = self.mods[mod]["cells"].get("\\" + inst) or self.mods[mod]["cells"][inst]
        conn = cell["connections"]
        ins, arcs = self.summary(cell["type"])
        live = []
        for (port, idx, _), mask in arcs:
            o = conn[port][idx]
            for p in _bits_of(mask):
                name, i = ins[p]
                b = conn[name][i]
                if isinstance(b, int) and not _is_clock_or_reset(name):
                    live.append((port, o, name, b))
        return live

    def block_paths(self, mod: str | None = None) -> dict[str, list[tuple[str, str]]]:
        """``{sub-block: sorted [(input port, output port)]}``: the combinational paths through
        each direct sub-block of ``mod`` (default top) as ``mod`` instantiates it; sub-blocks
        without one left out."""
        mod = mod or self.top
        out = {}
        for inst in self.children(mod):
            pairs = sorted({(i, o) for o, _, i, _ in self._live_arcs(mod, inst)})
            if pairs:
                out[inst] = pairs
        return out

    def chains(self, mod: str | None = None) -> list[tuple[str, str, str, str]]:
        """``(block A, A's output port, block B, B's input port)``, sorted: an output of A that
        a combinational path through A drives reaches, through ``mod``'s own gates (its glue,
        no other sub-block), an input of B from which a combinational path runs through B. A
        register-to-register path then crosses two blocks (A may be B)."""
        mod = mod or self.top
        labels, base, heads = [], {}, defaultdict(list)
        for inst in self.children(mod):
            for o_port, o, i_port, i in self._live_arcs(mod, inst):
                key = (inst, o_port)
                if key not in labels:
                    labels.append(key)
                base[o] = base.get(o, 0) | 1 << labels.index(key)
                heads[i].append((inst, i_port))
        masks = self._masks(self._deps(mod, glue_only=True), base, list(heads))
        found = set()
        for i, users in heads.items():
            for p in _bits_of(masks.get(i, 0)):
                a, a_port = labels[p]
                found.update((a, a_port, b, b_port) for b, b_port in users)
        return sorted(found)

    # -- fanout
    def _loads(self, mod: str):
        """``(find, in_load, passes, load, out_load)`` of ``mod``: ``find(bit)`` the net a bit
        is one with (joined through sub-blocks that pass an input straight to an output),
        ``load[net]`` the gate inputs it drives in ``mod`` and below (an output port of the top
        counts one; a memory's write enable once per write port), ``in_load`` / ``out_load``
        that of each input / output port bit's net in ``mod``, ``passes`` the pass-through pairs
        ``{output position: input position}``, for the parent."""
        if mod in self._load:
            return self._load[mod]
        parent: dict[int, int] = {}

        def find(b):
            while parent.get(b, b) != b:
                parent[b] = parent.get(parent[b], parent[b])
                b = parent[b]
            return b

        pins: dict[int, int] = defaultdict(int)
        for cell in self.mods[mod]["cells"].values():
            t, conn = cell["type"], cell["connections"]
            if t in self.mods:
                ins = self._ports(t, "input")
                outs = self._ports(t, "output")
                _, cload, cpass, _, cout = self._loads(t)
                for p, (name, i, _) in enumerate(ins):
                    b = conn[name][i]
                    if isinstance(b, int):
                        pins[b] += cload[p]
                for q, (name, i, _) in enumerate(outs):
                    b = conn[name][i]
                    if isinstance(b, int) and q not in cpass:
                        pins[b] += cout[q]
                for q, p in cpass.items():
                    a, b = conn[outs[q][0]][outs[q][1]], conn[ins[p][0]][ins[p][1]]
                    if isinstance(a, int) and isinstance(b, int):
                        parent[find(a)] = find(b)
                continue
            if t == "$mem_v2":
                # the RTLIL repeats a write port's enable per data bit; a RAM takes it once
                n = cell["parameters"]["WR_PORTS"]
                n = int(n, 2) if isinstance(n, str) else n
                en = conn.get("WR_EN", [])
                for k in range(n):
                    step = len(en) // n
                    for b in set(en[k * step:(k + 1) * step]):
                        if isinstance(b, int):
                            pins[b] += 1
            dirs = cell.get("port_directions", {})
            for pin, bits in conn.items():
                if pin in _MEM_LOADS if t == "$mem_v2" else dirs.get(pin) != "output":
                    for b in bits:
                        if isinstance(b, int):
                            pins[b] += 1
        if mod == self.top:
            for *_, b in self._ports(mod, "output"):
                if isinstance(b, int):
                    pins[b] += 1
        load: dict[int, int] = defaultdict(int)
        for b, n in pins.items():
            load[find(b)] += n
        ins = self._ports(mod, "input")
        in_load = [load.get(find(b), 0) if isinstance(b, int) else 0 for *_, b in ins]
        root_in = {}
        for p, (*_, b) in enumerate(ins):
            if isinstance(b, int):
                root_in.setdefault(find(b), p)
        passes, out_load = {}, []
        for q, (*_, b) in enumerate(self._ports(mod, "output")):
            if isinstance(b, int) and find(b) in root_in:
                passes[q] = root_in[find(b)]
            out_load.append(load.get(find(b), 0) if isinstance(b, int) else 0)
        self._load[mod] = (find, in_load, passes, load, out_load)
        return self._load[mod]

    def port_fanout(self, mod: str | None = None) -> dict[str, int]:
        """``{"<sub-block>.<port>": largest gate-input count of one of its bits}`` for every port
        of the direct sub-blocks of ``mod`` (default top; counted over the whole design below
        ``mod``, as :func:`port_fanout` counts the flattened netlist)."""
        mod = mod or self.top
        find, _, _, load, _ = self._loads(mod)
        fan = {}
        for cname, cell in self.mods[mod]["cells"].items():
            if cell["type"] not in self.mods:
                continue
            for port, bits in cell["connections"].items():
                ints = [b for b in bits if isinstance(b, int)]
                if ints:
                    fan[f"{self._inst(cname)}.{port}"] = max(load.get(find(b), 0) for b in ints)
        return fan


def _clean(name: str) -> str:
    """A port name without the ``$<n>`` suffixes Amaranth adds to keep names unique (they move
    with unrelated edits)."""
    return re.sub(r"(\$\d+)+$", "", name)


def base_name(inst: str) -> str:
    """An instance name without its trailing port / lane number (``txarb1`` -> ``txarb``)."""
    return re.sub(r"\d+$", "", inst)


def hier_netlist(component, *, top: str = "top", timeout: float = 1800) -> Hierarchy:
    """:class:`Hierarchy` of an Amaranth component (converted to RTLIL, not flattened)."""
    from amaranth.back import rtlil

    text = rtlil.convert(component, name=top, emit_src=False)
    with tempfile.TemporaryDirectory(prefix="nr-hier-") as d:
        il = Path(d) / "design.il"
        il.write_text(text)
        return Hierarchy(_hier_json(il, top, timeout), top)


def _hier_json(il: Path, top: str, timeout: float) -> dict:
    from .estimate import find_yosys

    cmd, _ = find_yosys()
    with tempfile.TemporaryDirectory(prefix="nr-hier-") as d:
        out = Path(d) / "net.json"
        r = subprocess.run([*cmd, "-q", "-p", HIER_SCRIPT.format(il=il, top=top, out=out)],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"yosys failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
        return json.loads(out.read_text())


def report(h: Hierarchy, mod: str | None = None) -> dict:
    """The figures of :meth:`Hierarchy` for ``mod``'s direct sub-blocks as plain JSON: ``blocks``
    (instance names), ``comb_paths`` (of ``mod`` itself), ``block_paths`` (``{block: [[in,
    out], ...]}``), ``chains`` (``[[A, A's output, B, B's input], ...]``), ``fanout``
    (``{"block.port": loads}``), ``loops``; port names without their ``$<n>`` suffixes."""
    fan: dict[str, int] = {}
    for k, v in h.port_fanout(mod).items():
        inst, port = k.split(".", 1)
        k = f"{inst}.{_clean(port)}"
        fan[k] = max(v, fan.get(k, 0))
    return {
        "blocks": sorted(h.children(mod)),
        "comb_paths": sorted({(_clean(i), _clean(o)) for i, o in h.comb_paths(mod)}),
        "block_paths": {b: sorted({(_clean(i), _clean(o)) for i, o in pairs})
                        for b, pairs in h.block_paths(mod).items()},
        "chains": sorted({(a, _clean(ap), b, _clean(bp)) for a, ap, b, bp in h.chains(mod)}),
        "fanout": fan,
        "loops": h.loops,
    }


def engine_paths(params: dict, *, timeout: float = 3600, progress=None) -> dict:
    """:func:`report` of :class:`~netreduce.hw.engine.NetReduceEngine` for build ``params``
    (:func:`netreduce.regmap.build_regmap` keywords): the engine's RTLIL
    (:func:`netreduce.hw.estimate.engine_rtlil`, cached), one Yosys run of :data:`HIER_SCRIPT`,
    the walk; the report is cached in ``cache_dir("paths")`` by the digest of the RTLIL, the
    script and this module's source."""
    import hashlib

    from .cache import cache_dir, cache_key, source_digest
    from .estimate import ENGINE_TOP, engine_rtlil

    il = engine_rtlil(params)
    key = cache_key([hashlib.sha256(il.read_bytes()).hexdigest(), HIER_SCRIPT,
                     source_digest("netreduce.hw.pathcheck")])
    path = cache_dir("paths") / f"engine-{key}.json"
    if path.exists():
        if progress is not None:
            progress(f"paths from the cache ({path})")
        return json.loads(path.read_text())
    if progress is not None:
        progress(f"yosys on {il}")
    rep = report(Hierarchy(_hier_json(il, ENGINE_TOP, timeout), ENGINE_TOP))
    rep = json.loads(json.dumps(rep))       # tuples as lists, as read back from the cache
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rep, indent=1, sort_keys=True))
    tmp.replace(path)
    return rep
