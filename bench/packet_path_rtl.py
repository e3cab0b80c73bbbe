"""RTL simulation speed and packet-path figures under cocotb.

Sections:

* ``harness``: the demo skid pass-through (netreduce.sim.cocotb.demo) at 64 and 512 bits on
  Verilator and Icarus: build time (fresh build directory; ccache as configured), simulated cycles
  per wall-clock second with the project's once-per-beat driver/monitor on back-to-back frames,
  the simulator floor (bare clock edges; one tdata write + read per edge), and cocotbext-axi's
  beats per second for comparison.
* ``packet_path`` (when netreduce.hw.packet exists): parser -> deparser loopback at 512 bits on
  Verilator (netreduce.sim.cocotb.packet_top): input beats per cycle over back-to-back frames of
  60..9018 bytes, latency in cycles of isolated frames (first beat in -> first beat out, last ->
  last), simulated cycles per second with the full per-frame checking, and the floor.

Writes bench/results/packet_path_rtl.json.

    .venv/bin/python bench/packet_path_rtl.py [--frames 400] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from netreduce.hw.verilog import generate
from netreduce.sim.cocotb import build, run, simulator_missing
from netreduce.sim.cocotb.demo import SkidPassThrough
from netreduce.sim.rtl.cache import use_build_root


def _rel(p: str) -> str:
    try:
        return str(Path(p).relative_to(Path.cwd()))
    except ValueError:
        return p


def harness(frames: int, sims: list[str], widths: list[int]) -> list[dict]:
    rows = []
    for sim in sims:
        if simulator_missing(sim):
            rows.append({"sim": sim, "skipped": simulator_missing(sim)})
            continue
        for w in widths:
            t0 = time.perf_counter()
            top = generate(SkidPassThrough(w), f"skid{w}")
            gen_s = time.perf_counter() - t0
            b = build(top, sim)
            n = frames if sim == "verilator" else max(20, frames // 4)
            r = run(b, "netreduce.sim.cocotb.tb_stream", testcase="test_back_to_back",
                    args={"frames": n, "min_len": 60, "max_len": 9018, "seed": 1})
            f = run(b, "netreduce.sim.cocotb.tb_speed", testcase="test_speed_floor",
                    args={"cycles": 20000 if sim == "verilator" else 5000})
            c = run(b, "netreduce.sim.cocotb.tb_speed", testcase="test_cocotbext_speed",
                    args={"beats": 2000 if w == 512 else 6000})
            m = r.metrics["back_to_back"]
            rows.append({
                "sim": sim, "data_width": w, "generate_s": round(gen_s, 2),
                "build_s": round(b.build_seconds, 2), "frames": m["frames"], "beats": m["beats"],
                "beats_per_cycle": round(m["beats_per_cycle"], 4),
                "driver_cycles_per_s": round(m["cycles_per_s"]),
                "floor_bare_edges_per_s": round(f.metrics["bare_edges_per_s"]),
                "floor_one_write_one_read_per_s": round(f.metrics["one_write_one_read_per_s"]),
                "cocotbext_axi_beats_per_s": round(c.metrics["cocotbext_beats_per_s"]),
                "run_wall_s": round(r.seconds, 2),
            })
            print(json.dumps(rows[-1]))
    return rows


def packet_path(frames: int) -> dict | None:
    try:
        from netreduce.sim.cocotb.packet_top import packet_loopback_top
    except ImportError as e:
        return {"skipped": f"packet path not available: {e}"}
    if simulator_missing("verilator"):
        return {"skipped": simulator_missing("verilator")}
    t0 = time.perf_counter()
    top = packet_loopback_top(512)
    gen_s = time.perf_counter() - t0
    b = build(top, "verilator")
    r = run(b, "netreduce.sim.cocotb.tb_packet", testcase="test_throughput_and_latency",
            args={"frames": frames, "seed": 1})
    f = run(b, "netreduce.sim.cocotb.tb_speed", testcase="test_speed_floor",
            args={"cycles": 5000})
    out = {"sim": "verilator", "data_width": 512, "generate_s": round(gen_s, 2),
           "generate_cached": gen_s < 1, "build_s": round(b.build_seconds, 2),
           "run_wall_s": round(r.seconds, 2),
           "floor_bare_edges_per_s": round(f.metrics["bare_edges_per_s"]),
           "floor_one_write_one_read_per_s": round(f.metrics["one_write_one_read_per_s"])}
    # cycles_per_s below includes the testbench's per-frame checks (parse, scapy, ICRC)
    out.update(r.metrics.get("throughput", {}))
    print(json.dumps(out))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=400, help="frames per speed run (60..9018 B)")
    ap.add_argument("--quick", action="store_true", help="512 bits, Verilator only")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "packet_path_rtl.json")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="nr-bench-") as tmp, use_build_root(tmp):
        # fresh build directory, so build_s is a real build (ccache may still help the C++)
        sims = ["verilator"] if args.quick else ["verilator", "icarus"]
        widths = [512] if args.quick else [64, 512]
        result = {
            "benchmark": "cocotb RTL simulation: harness speed and packet path",
            "command": " ".join([_rel(sys.executable), *sys.argv]),
            "clock_period_ns_simulated": 4,
            "harness": harness(args.frames, sims, widths),
            "packet_path": packet_path(args.frames),
            "host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                     "loadavg_before": round(load, 2)},
            "ccache": os.environ.get("OBJCACHE") or shutil.which("ccache"),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {_rel(str(args.out))}")
    return result


if __name__ == "__main__":
    main()
