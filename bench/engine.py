"""Engine top on Verilator (FastSim): every port saturated, sustained, outputs against the model.

For each (P, N, PMTU): an engine with P ports (``lanes = P``: one contribution lane per port,
docs/engine.md "Every port at line rate"), one job of N ranks (rank r sends and receives on port
r mod P), window = the slot pool, ``indices`` indices per flow (the window wraps
``indices / slots`` times: every rank's receiver ACKs index k - slots/2 after the contributions of
index k, on the same port). ``--ack-every`` is the receivers' ACK policy: k = 1 (the default, the
worst case) ACKs every result frame; k > 1 coalesces, as RNICs may, since an ACK acknowledges
every PSN up to its own (the model's step 6): only indices j with j mod k = k - 1 are ACKed. All
frames are queued on every port at once, back to back (full-PMTU WRITE ONLY frames, random
payload), outputs always ready. Measured:

* per port: ingress beats per cycle (its input beats / the cycle its last beat was taken) and
  backpressure cycles (cycles it offered a beat that was not taken: cycles - beats);
* egress beats per cycle per port (result beats / cycles to the last output);
* release latency, unloaded: a few more indices, one at a time, each sent only after the last
  one's results left (cycles from the last beat of the completing contribution in to the first
  beat of its first result out);
* every output frame equals the reference model's (per port and flow, in order), and so do the
  counters at the end.

Each row also carries the header-rate law's prediction (:func:`header_law`): the aggregation
control makes one decision per cycle for all ports, a decision being a header, or with
``lanes`` > 1 two ACK/NAKs of different ports (a pair, AggControl ``pairs``), so ingress 1.0 on
every used port needs sum over ports of (frames per cycle) x (1 + 1/k) <= 1 with one lane, of
(frames per cycle) x (1 + 1/2k) <= 1 with lanes and two ports or more used. ``ingress`` is the
steady state;
``ingress_this_run`` applies the same bound to the run's own frame counts in its two phases
(the first W/2 indices carry no ACKs; in each phase the run takes the larger of the busiest
port's beats and all ports' headers in cycles).

Writes ``--out`` (default bench/results/engine_512.json; the committed grids are
bench/results/engine_512_p<P>.json, one per P) after every grid cell (``status``: complete,
or partial with the number of cells done), with each build's parameters and design digest::

    nice .venv/bin/python bench/engine.py [--quick] [--width 512] [--indices 4096]
        [--ports 2,4,1] [--worlds 2,8,32] [--pmtus 256,1024,4096] [--ack-every 1]

At 512 bits each P has the memory of docs/engine.md's memory table (:data:`MEMORY_512`), and
the window is the whole slot pool; the 64-bit grid (bench/results/engine_64.json) has 64 slots.

The one-port 512-bit grid (bench/results/engine_512_p1.json) is what the timed system model reads
(:class:`netreduce.sim.net.topology.EngineTiming`).
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
from netreduce.hw.cache import design_digest
from netreduce.sim.model.engine import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.rtl.backend import engine_top
from netreduce.sim.rtl.fastsim import FastSim, verilator_missing
from netreduce.sim.verif.scoreboard import WriteRecorder, flow_of
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import ALL_GLOBAL_COUNTERS, Op, build_regmap
from netreduce.wire import AETH, BTH, RETH, icrc_bytes, parse

SLOTS = 64
# 512 bits: the memory sizes docs/engine.md's memory table fits on the xcvu9p (P = 1: the default
# 1024 slots x max_world 64; P = 2: 512 x 32, one SLR; P = 4: 256 x 64, one SLR); the 64-bit
# grid keeps its 64 slots
MEMORY_512 = {1: (1024, 64), 2: (512, 32), 4: (256, 64)}


def params_for(ports: int, width: int) -> dict:
    slots, world = MEMORY_512.get(ports, (SLOTS, 32)) if width == 512 else (SLOTS, 32)
    return dict(ports=ports, lanes=ports, jobs=2, flows=64, slots=slots, max_world=world,
                pmtu_max=4096, data_width=width)


class Frames:
    """``job.data_bytes`` / ``job.ack`` at a fraction of their cost: a flow's frames differ from
    index to index only in the PSN, the RETH VA and the payload, so each rank's headers are packed
    once and patched (the ICRC recomputed). Every ``check``-th frame is also built the slow way
    and compared, so a drift from :mod:`netreduce.wire` stops the bench."""

    def __init__(self, job: RingJob, pmtu: int, check: int = 997):
        self.job, self.check, self.n = job, check, 0
        self.data_t, self.ack_t = [], []
        for r in range(job.world):
            f = job.data(r, 0, bytes(pmtu))
            self.data_t.append((bytes(f.headers()), f.l2_len, f.payload_offset - RETH.size
                                - BTH.size))
            a = parse(job.ack(r, 0))
            ab = a.payload_offset - BTH.size - AETH.size
            self.ack_t.append((bytearray(job.ack(r, 0)), a.l2_len, ab))

    def _checked(self, got: bytes, want) -> bytes:
        self.n += 1
        if self.n % self.check == 0 and got != want():
            raise AssertionError("fast frame builder differs from netreduce.wire")
        return got

    def data(self, r: int, k: int, payload: bytes) -> bytes:
        hdr, l2, bth = self.data_t[r]
        f = self.job.data(r, k, b"")   # psn, va (no packing)
        buf = bytearray(hdr)
        BTH.psn.put(buf, f.psn, bth)
        RETH.va.put(buf, f.va, bth + BTH.size)
        buf += payload
        buf += icrc_bytes(memoryview(buf)[l2:])
        return self._checked(bytes(buf), lambda: self.job.data_bytes(r, k, payload))

    def ack(self, r: int, k: int) -> bytes:
        tmpl, l2, bth = self.ack_t[r]
        buf = bytearray(tmpl)
        BTH.psn.put(buf, self.job.psn(r, k), bth)
        end = bth + BTH.size + AETH.size
        buf[end:end + 4] = icrc_bytes(memoryview(buf)[l2:end])
        return self._checked(bytes(buf), lambda: self.job.ack(r, k))


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


def header_law(P: int, n: int, pmtu: int, ack_every: int, width: int,
               pairs: bool | None = None) -> dict:
    """Steady-state ingress the control's one decision per cycle allows.

    Rank r sends on port r mod P, so port p carries n_p ranks; per index each sends one
    contribution of ``b = ceil(frame bytes / (width / 8))`` beats (the frame as
    :mod:`netreduce.wire` builds it for ``pmtu`` payload bytes) and 1/k one-beat ACKs (every
    ``ack_every`` = k indices). At ingress 1.0 port p takes n_p (b + a/k) beats per index for
    n_p (1 + 1/k) headers, and every port runs at the pace of the busiest one, so the control
    must decide H = sum_p n_p (1 + 1/k) / max_p n_p (b + a/k) headers per cycle; with H > 1
    every port's ingress is 1/H. With ``pairs`` (default: P > 1, the ``lanes = P`` builds
    whose control decides two ACK/NAKs of different ports in one cycle) and two ports or more
    used, the ACKs take half a decision each: H = sum_p n_p (1 + 1/2k) / max_p n_p (b + a/k)
    decisions per cycle."""
    job = RingJob(job=0, world=n, window=2, slot_base=0, pmtu=pmtu, op=Op.SUM_WRAP)
    nb = width // 8
    b = -(-len(job.data_bytes(0, 0, bytes(pmtu))) // nb)
    a = -(-len(job.ack(0, 0)) // nb)
    per_port = [len(range(p, n, P)) for p in range(P)]
    used = sum(1 for x in per_port if x)
    paired = (P > 1 if pairs is None else pairs) and used > 1
    acks = 1 / ack_every / (2 if paired else 1)
    h = sum(per_port) * (1 + acks) / (max(per_port) * (b + a / ack_every))
    return {"data_beats": b, "ack_beats": a, "ports_used": used, "acks_paired": paired,
            "decisions_per_cycle": round(h, 4), "ingress": round(min(1.0, 1 / h), 4)}


def point(top, P: int, n: int, pmtu: int, indices: int, width: int, seed: int = 1,
          lat_samples: int = 8, ack_every: int = 1) -> dict:
    prm = params_for(P, width)
    nb = width // 8
    eng = Engine(**{k: v for k, v in prm.items() if k != "data_width"}, data_width=width)
    ops: list = []
    slots = prm["slots"]
    job = RingJob(job=0, world=n, window=slots, slot_base=0, pmtu=pmtu, op=Op.SUM_WRAP)
    EngineControl(WriteRecorder(eng.bus, ops)).add_job(job.config())
    fr = Frames(job, pmtu)
    rng = np.random.default_rng(seed)
    cmp = Compare()
    beats = [0] * P
    # beats and headers (frames) per port, [before, from] index `lag` (the first ACKs)
    ph_beats, ph_frames = [[0] * P, [0] * P], [[0] * P, [0] * P]
    acks_sent = [0] * P
    sim = FastSim(top, seed=seed)
    for a, v in ops:
        sim.axil_write(a, v)
    sim.run(4 * prm["flows"] + 4 * slots + 100)   # the enable sequence
    cmp.got(sim.run(0))
    start = sim.cycle
    lag = slots // 2
    if not 1 <= ack_every <= lag:
        raise ValueError(f"ack_every = {ack_every}: expected 1..{lag} (half the window)")
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
                pay = rng.integers(0, 256, size=(n, pmtu), dtype=np.uint8)
                for r in range(n):
                    f = fr.data(r, kk, pay[r].tobytes())
                    cmp.expect(eng.receive(r % P, f, 0))
                    sim.send(r % P, f)
                    beats[r % P] += beats_of(f)
                    ph_beats[kk >= lag][r % P] += beats_of(f)
                    ph_frames[kk >= lag][r % P] += 1
                if kk >= lag and (kk - lag) % ack_every == ack_every - 1:
                    for r in range(n):
                        a = fr.ack(r, kk - lag)
                        cmp.expect(eng.receive(r % P, a, 0))
                        sim.send(r % P, a)
                        beats[r % P] += beats_of(a)
                        ph_beats[1][r % P] += beats_of(a)
                        ph_frames[1][r % P] += 1
                        acks_sent[r % P] += 1
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
        pay = rng.integers(0, 256, size=(n, pmtu), dtype=np.uint8)
        t = sim.cycle + 10
        ends = []
        per_port = [t] * P
        for r in range(n):
            f = fr.data(r, kk, pay[r].tobytes())
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
            a = fr.ack(r, kk)
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
    # the law on this run's counts, in two phases (the first `lag` indices carry no ACKs): in
    # each, every port waits for the busiest one and for the control's one decision per cycle
    # (a pair of ACK/NAKs is one decision: the second phase's ACKs count half with pairs)
    law = header_law(P, n, pmtu, ack_every, width)
    half = sum(acks_sent) / 2 if law["acks_paired"] else 0
    law_cycles = sum(max(max(b), sum(f) - (half if i else 0))
                     for i, (b, f) in enumerate(zip(ph_beats, ph_frames, strict=True)))
    law_cycles = int(round(law_cycles))
    return {
        "ports": P, "world": n, "pmtu": pmtu, "ack_every": ack_every, "indices": indices,
        "contributions": frames,
        "in_beats_per_port": beats,
        "in_frames_per_port": [a + b for a, b in zip(*ph_frames, strict=True)],
        "in_cycles_per_port": in_cycles,
        "in_beats_per_cycle_per_port": [round(b / c, 4) for b, c in zip(beats, in_cycles,
                                                                          strict=True)],
        "header_law": {**law,
                       "cycles_this_run": law_cycles,
                       "ingress_this_run": [round(b / law_cycles, 4) if b else 0.0
                                            for b in beats]},
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
    ap.add_argument("--ports", default="2,4,1")
    ap.add_argument("--worlds", default="2,8,32")
    ap.add_argument("--pmtus", default="256,1024,4096")
    ap.add_argument("--ack-every", default="1",
                    help="receivers ACK every k-th index (comma list of k; 1: every frame)")
    ap.add_argument("--out", default="bench/results/engine_512.json")
    a = ap.parse_args(argv)
    why = verilator_missing()
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 1
    ports = [int(x) for x in a.ports.split(",")]
    worlds = [2, 8] if a.quick else [int(x) for x in a.worlds.split(",")]
    pmtus = [256, 1024] if a.quick else [int(x) for x in a.pmtus.split(",")]
    indices = 256 if a.quick else a.indices
    acks = [int(x) for x in a.ack_every.split(",")]
    if min(acks) < 1:
        ap.error(f"--ack-every {a.ack_every}: every k must be >= 1")
    cells = [(P, n, pmtu, k) for P in ports for n in worlds for pmtu in pmtus for k in acks]
    res = {"command": "python bench/engine.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:]),
           "params": {P: params_for(P, a.width) for P in ports},
           "design_digest": {P: design_digest(params_for(P, a.width)) for P in ports},
           "grid": [list(c) for c in cells], "build_s": {}, "sim_cycles_per_s": {}, "rows": []}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        done = len(res["rows"])
        res["status"] = "complete" if done == len(cells) else f"partial: {done} of {len(cells)}"
        res["outputs_match_model"] = all(r["outputs_match_model"] for r in res["rows"])
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(out)

    # the results are written after every cell, so a run cut short keeps what it measured
    for P in ports:
        t0 = time.perf_counter()
        top = engine_top(params_for(P, a.width))
        FastSim(top).close()   # builds (cached) before the clock starts
        res["build_s"][P] = round(time.perf_counter() - t0, 1)
        print(json.dumps({"ports": P, "build_s": res["build_s"][P]}), flush=True)
        for n in worlds:
            for pmtu in pmtus:
                for k in acks:
                    t1 = time.perf_counter()
                    row = point(top, P, n, pmtu, indices, a.width, ack_every=k)
                    row["wall_s"] = round(time.perf_counter() - t1, 1)
                    res["rows"].append(row)
                    res["sim_cycles_per_s"][P] = round(
                        sum(r["sim_cycles"] for r in res["rows"] if r["ports"] == P)
                        / max(1e-9, sum(r["sim_cpu_s"] for r in res["rows"] if r["ports"] == P)))
                    print(json.dumps(row), flush=True)
                    save()
    save()
    ok = res["outputs_match_model"]
    print(f"wrote {out}; outputs match the model: {ok}")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
