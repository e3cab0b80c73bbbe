"""A 2:1 overloaded engine port in the system simulation: PFC on/off, ECN/CNP, DCQCN (issue 22).

Two ranks all-reduce ``--size`` bytes each (int32, model backend, ToR topology); rank r's flow
enters engine port r at 100 Gb/s, and each port's datapath takes 50 Gb/s, so every engine port
is 2:1 overloaded. The port's input buffer is the shell's RX FIFO (32 KiB); PFC XOFF/XON and
the ECN (D19) threshold are the register map's reset values (7/3.5/3.5 KiB,
``netreduce.regmap.FC_RESETS``; ``netreduce.sim.net.overload``). Modes (``overload_run.MODES``):

* ``pfc``: PFC on, ECN/CNP on, the RNICs run DCQCN;
* ``pfc_only``: PFC on, no ECN/CNP, no DCQCN;
* ``ecn_dcqcn``: PFC off, ECN/CNP and DCQCN (the lossy-fabric configuration);
* ``ecn_dcqcn_fast_retx``: the same with the engine's fast retransmit (D16);
* ``no_reaction``: PFC off, CNPs sent but the RNICs ignore them (rxe).

Each mode at ``--latency`` ns per hop (default 500 and 2000: the control loop acts one round
trip late), and at 2000 ns also PFC with the XOFF/XON that the headroom rule of docs/fabric.md
gives for that latency (``pfc_headroom``). Output: a table and bench/results/fabric_overload.json.

    python bench/fabric_overload.py [--size 1MiB] [--latency 500 --latency 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from netreduce.sim.net.overload import BufferConfig, pfc_thresholds
from netreduce.sim.net.overload_run import MODES, run_overload

OUT = Path(__file__).resolve().parent / "results" / "fabric_overload.json"
COLS = ("latency_ns", "mode", "ok", "sim_us", "bound_us", "drops", "pfc_tx", "cnp_sent",
        "rate_cuts", "retransmitted", "timeouts", "max_level")


def _size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    for u, f in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * f)
    return int(s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=_size, default=1 << 20)
    ap.add_argument("--latency", type=int, action="append")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    lats = a.latency or [500, 2000]
    rows = []
    t0 = time.perf_counter()
    for lat in lats:
        for m in MODES:
            rows.append(run_overload(m, a.size, latency_ns=lat))
        if lat != 500:
            # the run's largest frame: PMTU 1024 plus headers (< 64 bytes)
            xoff, xon = pfc_thresholds(BufferConfig().buffer_bytes, 100.0, 50.0, lat,
                                       max_frame=1024 + 64)
            r = run_overload("pfc", a.size, latency_ns=lat,
                             buf=BufferConfig(xoff_bytes=xoff, xon_bytes=xon, ecn_bytes=xon))
            r["mode"] = "pfc_headroom"
            rows.append(r)
    print(" | ".join(COLS))
    for r in rows:
        print(" | ".join(str(r[c]) for c in COLS))
    cmd = "python bench/fabric_overload.py " + " ".join(argv if argv is not None else sys.argv[1:])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    wall = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps({"command": cmd.strip(), "wall_s": wall, "rows": rows},
                                indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
