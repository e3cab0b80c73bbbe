"""Engine top on Verilator (FastSim): every port saturated, sustained, outputs against the model.

For each (P, N, PMTU): an engine with P ports (``lanes = P``: one contribution lane per port,
docs/engine.md "Every port at line rate"), one job of N ranks (rank r sends and receives on port
r mod P), window = the slot pool, ``indices`` indices per flow (the window wraps
``indices / slots`` times: every rank's receiver ACKs index k - slots/2 after the contributions of
index k, on the same port). All frames are queued on every port at once, back to back (full-PMTU
WRITE ONLY frames, random payload), outputs always ready. Measured:

* per port: ingress beats per cycle (its input beats / the cycle its last beat was taken) and
  backpressure cycles (cycles it offered a beat that was not taken: cycles - beats);
* egress beats per cycle per port (result beats / cycles to the last output);
* release latency, unloaded: a few more indices, one at a time, each sent only after the last
  one's results left (cycles from the last beat of the completing contribution in to the first
  beat of its first result out);
* every output frame equals the reference model's (per port and flow, in order), and so do the
  counters at the end.

Writes bench/results/engine_ports.json (only when every grid point ran)::

    .venv/bin/python bench/engine_ports.py [--quick] [--width 512] [--indices 4096]

(bench/engine.py keeps measuring the one-port figures the timed model reads.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
from netreduce.sim.model.engine import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.rtl.backend import engine_top
from netreduce.sim.rtl.fastsim import FastSim, verilator_missing
from netreduce.sim.verif.scoreboard import WriteRecorder, flow_of
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import ALL_GLOBAL_COUNTERS, Op, build_regmap

SLOTS = 64


def params_for(ports: int, width: int) -> dict:
    return dict(ports=ports, lanes=ports, jobs=2, flows=64, slots=SLOTS, max_world=32,
                pmtu_max=4096, data_width=width)


class Compare:
    """Expected frames per output flow (from the model), checked as the RTL's arrive."""

    def __init__(self):
        self.want: dict = {}
        self.bad = 0
        self.first_bad = None
        self.matched = 0

    def expect(self, emits):
        for e in emits:
            self.want.setdefault(flow_of(e.port, e.frame), deque()).append(e.frame)

    def got(self, rx):
        for g in rx:
            q = self.want.get(flow_of(g.port, g.frame))
            if q and q[0] == g.frame and not g.error:
                q.popleft()
                self.matched += 1
            else:
                self.bad += 1
                if self.first_bad is None:
                    self.first_bad = (g.port, g.frame[:80].hex())

    def left(self) -> int:
        return sum(len(q) for q in self.want.values())


def point(top, P: int, n: int, pmtu: int, indices: int, width: int, seed: int = 1,
          lat_samples: int = 8) -> dict:
    prm = params_for(P, width)
    nb = width // 8
    eng = Engine(**{k: v for k, v in prm.items() if k != "data_width"}, data_width=width)
    ops: list = []
    job = RingJob(job=0, world=n, window=SLOTS, slot_base=0, pmtu=pmtu, op=Op.SUM_WRAP)
    EngineControl(WriteRecorder(eng.bus, ops)).add_job(job.config())
    rng = np.random.default_rng(seed)
    cmp = Compare()
    beats = [0] * P
    sim = FastSim(top, seed=seed)
    for a, v in ops:
        sim.axil_write(a, v)
    sim.run(4 * prm["flows"] + 4 * SLOTS + 100)   # the enable sequence
    cmp.got(sim.run(0))
    start = sim.cycle
    lag = SLOTS // 2
    drained = [None] * P
    out_beats = [0] * P
    last_out = start
    t_build = 0.0

    def beats_of(f):
        return -(-len(f) // nb)

    def take(rx):
        nonlocal last_out
        for g in rx:
            out_beats[g.port] += beats_of(g.frame)
            last_out = max(last_out, g.cycle)
        cmp.got(rx)

    chunk = max(1, 8192 // (n * max(1, pmtu // 256)))   # indices queued per refill
    k = 0
    while k < indices or any(sim.pending(p) for p in range(P)):
        # keep every port's queue well ahead of the engine
        while k < indices and all(sim.pending(p) < 4 * n // P + 8 for p in range(P)):
            t0 = time.perf_counter()
            for kk in range(k, min(indices, k + chunk)):
                pay = rng.integers(-2**31, 2**31, size=(n, pmtu // 4), dtype=np.int64)
                for r in range(n):
                    f = job.data_bytes(r, kk, pay[r].astype(np.int32))
                    cmp.expect(eng.receive(r % P, f, 0))
                    sim.send(r % P, f)
                    beats[r % P] += beats_of(f)
                if kk >= lag:
                    for r in range(n):
                        a = job.ack(r, kk - lag)
                        cmp.expect(eng.receive(r % P, a, 0))
                        sim.send(r % P, a)
                        beats[r % P] += beats_of(a)
            t_build += time.perf_counter() - t0
            k = min(indices, k + chunk)
        take(sim.run(64))
        for p in range(P):
            if drained[p] is None and k >= indices and sim.pending(p) == 0:
                drained[p] = sim.cycle
    take(sim.run(200_000, until_idle=True, quiet=2000))
    in_cycles = [d - start for d in drained]
    out_cycles = max(1, last_out - start)
    out_loaded = list(out_beats)

    # release latency, unloaded: one index at a time
    lat = []
    for kk in range(indices, indices + lat_samples):
        pay = rng.integers(-2**31, 2**31, size=(n, pmtu // 4), dtype=np.int64)
        t = sim.cycle + 10
        ends = []
        per_port = [t] * P
        for r in range(n):
            f = job.data_bytes(r, kk, pay[r].astype(np.int32))
            cmp.expect(eng.receive(r % P, f, 0))
            sim.send_at(r % P, f, t)
            per_port[r % P] += beats_of(f)
            ends.append(per_port[r % P] - 1)
        rx = sim.run(100_000, until_output=True)
        while not rx and sim.cycle < t + 100_000:
            rx = sim.run(100_000, until_output=True)
        first_out = min(g.cycle - beats_of(g.frame) + 1 for g in rx)
        lat.append(first_out - max(ends))
        take(rx)
        take(sim.run(100_000, until_idle=True, quiet=200))
        for r in range(n):
            a = job.ack(r, kk)
            cmp.expect(eng.receive(r % P, a, 0))
            sim.send(r % P, a)
        take(sim.run(100_000, until_idle=True, quiet=200))

    rm = build_regmap(**prm)
    base = rm.table("CNT").base
    want = eng.counters()
    cnt_bad = [c.name for i, c in enumerate(ALL_GLOBAL_COUNTERS)
               if sim.axil_read(base + 4 * i) != want[c.name] & 0xFFFFFFFF]
    st = sim.stats()
    sim.close()
    frames = indices * n
    return {
        "ports": P, "world": n, "pmtu": pmtu, "indices": indices, "contributions": frames,
        "in_beats_per_port": beats, "in_cycles_per_port": in_cycles,
        "in_beats_per_cycle_per_port": [round(b / c, 4) for b, c in zip(beats, in_cycles,
                                                                          strict=True)],
        "backpressure_cycles_per_port": [c - b for b, c in zip(beats, in_cycles, strict=True)],
        "out_beats_per_port": out_loaded, "out_cycles": out_cycles,
        "out_beats_per_cycle_per_port": [round(b / out_cycles, 4) for b in out_loaded],
        "release_latency_unloaded_cycles": {"min": min(lat), "median": statistics.median(lat),
                                            "max": max(lat)},
        "frames_matched": cmp.matched, "frames_mismatched": cmp.bad,
        "frames_missing": cmp.left(), "first_mismatch": cmp.first_bad,
        "counters_mismatched": cnt_bad,
        "outputs_match_model": cmp.bad == 0 and cmp.left() == 0 and not cnt_bad,
        "drop_ahead": want["drop_ahead"], "freed": want["freed"],
        "sim_cycles": st["cycles"], "sim_cpu_s": round(st["run_cpu_seconds"], 1),
        "frame_build_s": round(t_build, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N 2, 8; PMTU 256, 1024; 256 indices")
    ap.add_argument("--width", type=int, default=512, help="data width (bits)")
    ap.add_argument("--indices", type=int, default=4096)
    ap.add_argument("--ports", default="1,2,4")
    ap.add_argument("--worlds", default="2,8,32")
    ap.add_argument("--pmtus", default="256,1024,4096")
    ap.add_argument("--out", default="bench/results/engine_ports.json")
    a = ap.parse_args(argv)
    why = verilator_missing()
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 1
    ports = [int(x) for x in a.ports.split(",")]
    worlds = [2, 8] if a.quick else [int(x) for x in a.worlds.split(",")]
    pmtus = [256, 1024] if a.quick else [int(x) for x in a.pmtus.split(",")]
    indices = 256 if a.quick else a.indices
    rows, builds = [], {}
    for P in ports:
        t0 = time.perf_counter()
        top = engine_top(params_for(P, a.width))
        FastSim(top).close()   # builds (cached) before the clock starts
        builds[P] = round(time.perf_counter() - t0, 1)
        print(json.dumps({"ports": P, "build_s": builds[P]}), flush=True)
        for n in worlds:
            for pmtu in pmtus:
                t1 = time.perf_counter()
                row = point(top, P, n, pmtu, indices, a.width)
                row["wall_s"] = round(time.perf_counter() - t1, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    res = {"command": "python bench/engine_ports.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:]),
           "params": {P: params_for(P, a.width) for P in ports}, "build_s": builds,
           "rows": rows}
    ok = all(r["outputs_match_model"] for r in rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}; outputs match the model: {ok}")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
