"""Resource estimates of the management gateware: the tag engine (netreduce.hw.mgmt.SipHash24)
and the whole agent (netreduce.hw.mgmt.MgmtAgent, default register map).

Converts each design to RTLIL and synthesises it with the native Yosys
(``synth_xilinx -family xcup -flatten -noiopad``); writes the cell counts and the command to
bench/results/mgmt_siphash.json. Build files: build/bench_mgmt/. Run:
``.venv/bin/python bench/mgmt_siphash.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Signal, Value
from netreduce.hw.mgmt import MgmtAgent, SipHash24

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mgmt_siphash.json"
BUILD = ROOT / "build" / "bench_mgmt"
GROUPS = {"LUT": r"LUT[1-6]", "FF": r"FD[RSCP]E", "CARRY": r"CARRY[48]", "MUXF": r"MUXF[789]",
          "LUTRAM": r"RAM(32|64|128|256)[A-Z0-9]*", "BRAM": r"RAMB(18|36)E2"}
DESIGNS = {"siphash": SipHash24, "agent": MgmtAgent}


def synth(yosys: str, name: str, dut) -> dict:
    ports = [v for v in (Value.cast(x) for _, _, x in dut.signature.flatten(dut))
             if isinstance(v, Signal)]
    il = BUILD / f"{name}.il"
    il.write_text(rtlil.convert(dut, name=name, ports=ports))
    script = f"read_rtlil {il}; synth_xilinx -family xcup -flatten -noiopad -top {name}; stat"
    logf = BUILD / f"{name}.log"
    subprocess.run([yosys, "-q", "-p", script, "-l", str(logf)], capture_output=True, text=True,
                   check=True)
    log = logf.read_text()
    log = log[log.rfind("Number of cells"):]
    cells: dict[str, int] = {}
    for mo in re.finditer(r"^\s+([A-Z0-9_]+)\s+(\d+)\s*$", log, re.M):
        cells[mo.group(1)] = int(mo.group(2))
    groups = {g: sum(v for k, v in cells.items() if re.fullmatch(p, k))
              for g, p in GROUPS.items()}
    return {"yosys_script": script, "cells": cells, "groups": groups}


def main() -> int:
    yosys = shutil.which("yosys")
    if yosys is None:
        print("yosys not found", file=sys.stderr)
        return 1
    BUILD.mkdir(parents=True, exist_ok=True)
    res = {"command": "python bench/mgmt_siphash.py",
           "notes": "SipHash24: 3 cycles per 64-bit message word + 4 (one SipRound per cycle)"}
    for name, cls in DESIGNS.items():
        res[name] = synth(yosys, name, cls())
        print(name, json.dumps(res[name]["groups"]))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
