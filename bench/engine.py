"""Engine top figures on Verilator (512-bit datapath): sustained ingress and release latency.

For each (N, PMTU): one job of N ranks, window = the slot pool, ``indices`` indices; every rank's
full-PMTU WRITE ONLY frame of every index enters port 0 back to back (index by index, ranks in
order), while the output is always ready. Measured (sim/cocotb/tb_engine_perf.py):

* ingress beats per cycle: accepted input beats / cycles from the first to the last one; stall
  cycles (``tvalid`` high, ``tready`` low) count the backpressure;
* latency: cycles from the last beat of an index's completing contribution entering to the first
  beat of its first result leaving;
* every output frame equals the reference model's.

Writes bench/results/engine.json::

    .venv/bin/python bench/engine.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from netreduce.hw.engine import engine_for
from netreduce.sim.cocotb import build, run, simulator_missing
from netreduce.sim.cocotb.runner import generate_cached
from netreduce.sim.model.engine import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.verif.scoreboard import WriteRecorder
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import Op

PARAMS = dict(ports=1, jobs=2, flows=64, slots=64, max_world=32, pmtu_max=4096, data_width=512)


def scenario(n: int, pmtu: int, indices: int, seed: int = 1) -> dict:
    eng = Engine(**{k: v for k, v in PARAMS.items() if k != "data_width"})
    ops: list = []
    job = RingJob(job=0, world=n, window=PARAMS["slots"], slot_base=0, pmtu=pmtu,
                  op=Op.SUM_WRAP)
    EngineControl(WriteRecorder(eng.bus, ops)).add_job(job.config())
    ops.append(["sync", 0, eng.regmap.addr("JOB.STATUS", 0)])
    rng = random.Random(seed)
    frames, out, completing, keys = [], [], [], []
    for k in range(indices):
        for r in range(n):
            f = job.data_bytes(r, k, rng.randbytes(pmtu))
            frames.append(f)
            emits = eng.receive(0, f, 0)
            out += [e.frame for e in emits]
        completing.append(len(frames) - 1)
        keys.append([[job.ip(job.succ(r)).to_bytes(4, "big").hex(),
                      job.rq(job.succ(r)).to_bytes(3, "big").hex(), job.psn(r, k)]
                     for r in range(n)])
    return {"ops": ops, "frames": [f.hex() for f in frames], "expect_out": [f.hex() for f in out],
            "completing": completing, "result_keys": keys, "world": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N in 2, 8 and PMTU 256, 1024 only")
    ap.add_argument("--indices", type=int, default=4)
    ap.add_argument("--out", default="bench/results/engine.json")
    a = ap.parse_args(argv)
    why = simulator_missing("verilator")
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    top = generate_cached(engine_for, name="netreduce_engine", **PARAMS)
    gen_s = time.perf_counter() - t0
    b = build(top, "verilator")
    worlds = (2, 8) if a.quick else (2, 8, 32)
    pmtus = (256, 1024) if a.quick else (256, 1024, 4096)
    rows = []
    for n in worlds:
        for p in pmtus:
            sc = scenario(n, p, a.indices)
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(sc, f)
            r = run(b, "netreduce.sim.cocotb.tb_engine_perf", testcase="test_perf",
                    args={"file": f.name}, tag=f"perf-{n}-{p}", timeout_s=3600)
            os.unlink(f.name)
            m = r.metrics
            lat = m["latency"]
            rows.append({"world": n, "pmtu": p, "frames": len(sc["frames"]),
                         "in_beats": m["in_beats"], "in_cycles": m["in_cycles"],
                         "beats_per_cycle": round(m["beats_per_cycle"], 4),
                         "stall_cycles": m["stall_cycles"],
                         "latency_cycles": {"min": min(lat), "median": statistics.median(lat),
                                            "max": max(lat)},
                         "outputs_match_model": m["matches"], "wall_s": round(r.seconds, 1)})
            print(json.dumps(rows[-1]))
    res = {"command": "python bench/engine.py" + (" --quick" if a.quick else ""),
           "params": PARAMS, "indices": a.indices, "verilog_seconds": round(gen_s, 1),
           "build_seconds": round(b.build_seconds, 1), "cached_build": b.cached, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
