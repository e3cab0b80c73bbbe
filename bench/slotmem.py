"""Yosys resource and logic-depth estimate of the slot memory (netreduce.hw.agg.slotmem).

For each parameter set, the SlotMemory is converted to RTLIL and synthesised with the native
Yosys (``synth_xilinx -family xcup -flatten -noiopad``, and again with ``-uram``). Reported per
run: LUT, FF, CARRY8, MUXF7/8, DSP48E2, RAMB36E2/RAMB18E2, URAM288 and LUT-RAM cells, and the
``ltp`` logic depth: the longest path through combinational cells only (LUT, CARRY8, MUXF*;
flip-flops and RAMs end paths), counted in cells, which is the read-modify-write loop
(forwarded beat -> lane ALU -> write history).

Each memory copy is handed to Yosys as a plain simple-dual-port Verilog RAM without initial
contents (Amaranth's documented ``platform.get_memory()`` override): Amaranth's own RTLIL spells
out a zero init for every bit, which is 67 MB and minutes of Python at the default size.

Usage::

    .venv/bin/python bench/slotmem.py [--sets tiny,small,...] [--variants bram,uram]
                                      [--timeout SECONDS]

Results go to bench/results/slotmem.json after every run (a set that does not finish in time is
recorded as ``"status": "timeout"``). Build files: build/bench_slotmem/<set>/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import ClockSignal, Instance, Module, Signal, Value
from amaranth.utils import ceil_log2
from netreduce.hw.agg.slotmem import SlotMemory

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "slotmem.json"
BUILD = ROOT / "build" / "bench_slotmem"

PARAM_SETS = {
    # name: SlotMemory keyword arguments
    "tiny": dict(width=512, slots=16, pmtu_max=4096, read_latency=2),       # 64 KiB
    "small": dict(width=512, slots=64, pmtu_max=4096, read_latency=2),      # 256 KiB
    "mid": dict(width=512, slots=256, pmtu_max=4096, read_latency=2),       # 1 MiB
    "default": dict(width=512, slots=1024, pmtu_max=4096, read_latency=2),  # 4 MiB
    "default_rl1": dict(width=512, slots=1024, pmtu_max=4096, read_latency=1),
    "default_rl3": dict(width=512, slots=1024, pmtu_max=4096, read_latency=3),
    # netreduce.regmap DEFAULT_PARAMS asks for 4096 slots: 16 MiB logical, 32 MiB physical.
    "slots4096": dict(width=512, slots=4096, pmtu_max=4096, read_latency=2),
}
# Block RAM of the two boards (docs/design.md section 8), to say whether a run fits.
DEVICES = {"xcvu9p": {"BRAM36": 2160, "URAM": 960}, "xcvu095": {"BRAM36": 1728, "URAM": 0}}
VARIANTS = {"bram": "", "uram": " -uram"}

RAM_MODULE = "netreduce_sdp_ram"
RAM_VERILOG = f"""\
// Simple dual-port RAM, synchronous read (old data on a same-address write), no initial value.
module {RAM_MODULE} #(parameter WIDTH = 8, parameter DEPTH = 16, parameter ABITS = 4) (
    input  wire             clk,
    input  wire             we,
    input  wire [ABITS-1:0] waddr,
    input  wire [WIDTH-1:0] wdata,
    input  wire             re,
    input  wire [ABITS-1:0] raddr,
    output reg  [WIDTH-1:0] rdata
);
    reg [WIDTH-1:0] mem [0:DEPTH-1];
    always @(posedge clk) begin
        if (we) mem[waddr] <= wdata;
        if (re) rdata <= mem[raddr];
    end
endmodule
"""

CELL_GROUPS = {
    "LUT": r"LUT[1-6]",
    "FF": r"FD[RSCP]E",
    "CARRY": r"CARRY[48]",
    "MUXF": r"MUXF[789]",
    "DSP": r"DSP48E2",
    "BRAM36": r"RAMB36E2",
    "BRAM18": r"RAMB18E2",
    "URAM": r"URAM288(_BASE)?",
    "LUTRAM": r"RAM(32|64|128|256)[A-Z0-9]*",
}


class SynthPlatform:
    """Just enough platform for conversion: maps each lib.memory.Memory to RAM_MODULE."""

    def get_memory(self, memory):
        (wr,), (rd,) = memory.write_ports, memory.read_ports
        if wr.domain != "sync" or rd.domain != "sync" or rd.transparent_for:
            raise ValueError("only sync, non-transparent 1W1R memories are supported here")
        m = Module()
        m.submodules.ram = Instance(
            RAM_MODULE,
            p_WIDTH=len(wr.data), p_DEPTH=memory.depth, p_ABITS=ceil_log2(memory.depth),
            i_clk=ClockSignal("sync"),
            i_we=wr.en, i_waddr=wr.addr, i_wdata=wr.data,
            i_re=rd.en, i_raddr=rd.addr, o_rdata=rd.data)
        return m


def generate(params, outdir: Path) -> Path:
    dut = SlotMemory(**params)
    # Every signal member (stream payload views included); the always-ready Const members
    # (contrib.ready, events.ready) are not ports.
    ports = [Value.cast(v) for _, _, v in dut.signature.flatten(dut)]
    ports = [v for v in ports if isinstance(v, Signal)]
    outdir.mkdir(parents=True, exist_ok=True)
    il = outdir / "slotmem.il"
    il.write_text(rtlil.convert(dut, name="slotmem", platform=SynthPlatform(), ports=ports))
    (outdir / "ram.v").write_text(RAM_VERILOG)
    return il


def yosys_script(variant: str, outdir: Path) -> str:
    return "\n".join([
        f"read_rtlil {outdir / 'slotmem.il'}",
        f"read_verilog {outdir / 'ram.v'}",
        "hierarchy -top slotmem",
        f"synth_xilinx -family xcup -flatten -noiopad -top slotmem{VARIANTS[variant]}",
        f"tee -q -o {outdir / f'stat_{variant}.json'} stat -json",
        # Wires plus combinational cells: FFs and RAMs are left out, so they end paths.
        "ltp -noff w:* t:LUT* %u t:CARRY* %u t:MUXF* %u",
        "",
    ])


def count_cells(stat_json: Path) -> dict:
    stat = json.loads(stat_json.read_text())
    cells = {}
    for mod in stat["modules"].values():
        for kind, n in mod.get("num_cells_by_type", {}).items():
            cells[kind] = cells.get(kind, 0) + n
    groups = {g: sum(n for k, n in cells.items() if re.fullmatch(rx, k))
              for g, rx in CELL_GROUPS.items()}
    return {"groups": groups, "cells": dict(sorted(cells.items()))}


def parse_ltp(text: str) -> dict:
    """Length of the longest combinational path, its end points and its carry cells."""
    m = re.search(r"Longest topological path in \S+ \(length=(-?\d+)\):\n((?:\s+\d+: .*\n)*)",
                  text)
    if not m:
        return {"ltp_comb_cells": None}
    steps = [line.split(": ", 1)[1] for line in m.group(2).splitlines()]
    net = [step.split(" (via ")[0] for step in steps]
    return {
        "ltp_comb_cells": int(m.group(1)),
        "ltp_from": net[0] if net else None,
        "ltp_to": net[-1] if net else None,
        "ltp_carry_cells": sum(1 for step in steps if "carry" in step.lower().split("(via")[-1]),
    }


def run_one(set_name, params, variant, timeout) -> dict:
    outdir = BUILD / set_name
    entry = {"set": set_name, "params": params, "variant": variant,
             "logical_bytes": params["slots"] * params["pmtu_max"],
             "physical_bytes": 2 * params["slots"] * params["pmtu_max"]}
    script = outdir / f"synth_{variant}.ys"
    script.write_text(yosys_script(variant, outdir))
    log = outdir / f"yosys_{variant}.log"
    t0 = time.monotonic()
    try:
        with open(log, "w") as fh:
            proc = subprocess.run([YOSYS, "-q", "-l", str(log), "-s", str(script)],
                                  stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        entry.update(status="timeout", yosys_seconds=timeout)
        return entry
    entry["yosys_seconds"] = round(time.monotonic() - t0, 1)
    if proc.returncode:
        entry.update(status="error", returncode=proc.returncode,
                     log_tail=log.read_text()[-2000:])
        return entry
    entry.update(count_cells(outdir / f"stat_{variant}.json"))
    entry.update(parse_ltp(log.read_text()))
    if entry.get("ltp_comb_cells") is not None:
        entry["ltp_lut_levels"] = entry["ltp_comb_cells"] - entry["ltp_carry_cells"]
    g = entry["groups"]
    entry["fits"] = {dev: g["BRAM36"] + (g["BRAM18"] + 1) // 2 <= cap["BRAM36"]
                     and g["URAM"] <= cap["URAM"] for dev, cap in DEVICES.items()}
    entry["status"] = "ok"
    return entry


YOSYS = shutil.which("yosys") or "/usr/bin/yosys"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default=",".join(PARAM_SETS),
                    help=f"comma-separated parameter sets from {list(PARAM_SETS)}")
    ap.add_argument("--variants", default="bram,uram", help="bram,uram")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per yosys run")
    args = ap.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    for name in sets:
        if name not in PARAM_SETS:
            ap.error(f"unknown parameter set {name!r}; known: {list(PARAM_SETS)}")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {list(VARIANTS)}")
    version = subprocess.run([YOSYS, "-V"], capture_output=True, text=True).stdout.strip()
    results = {
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *(argv or sys.argv[1:])]),
        "yosys": version,
        "synth": "synth_xilinx -family xcup -flatten -noiopad [-uram]",
        "ltp": "longest path through LUT/CARRY/MUXF cells (FFs and RAMs end paths), in cells; "
               "ltp_lut_levels = cells that are not carry cells (yosys 0.23 maps carries to "
               "CARRY4 even for xcup: 8 per 32-bit add, 4 CARRY8 in Vivado)",
        "devices": DEVICES,
        "note": "two memory copies (1W1R each): physical_bytes = 2 x logical_bytes",
        "runs": [],
    }
    for name in sets:
        t0 = time.monotonic()
        generate(PARAM_SETS[name], BUILD / name)  # fresh RTL for every invocation
        convert_seconds = round(time.monotonic() - t0, 1)
        for variant in variants:
            print(f"[slotmem bench] {name} / {variant} ...", flush=True)
            entry = run_one(name, PARAM_SETS[name], variant, args.timeout)
            entry["convert_seconds"] = convert_seconds
            print(f"  {entry.get('status')}: {entry.get('groups')} ltp="
                  f"{entry.get('ltp_comb_cells')} ({entry.get('yosys_seconds')} s)", flush=True)
            results["runs"].append(entry)
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
