"""Benchmark the reference model (netreduce.sim.model.Engine): frames per second through
``Engine.receive`` for an N-rank SUM_WRAP all-reduce of one RC WRITE message per rank, with one
cumulative ACK per flow every 64 packets (as an RNIC coalesces them).

Frames are built beforehand (netreduce.wire.packetise_write) and not timed. Writes
bench/results/model.json and prints a summary; "in" counts every frame fed (data + ACKs), "out"
every frame the engine emitted (results + forwarded ACKs).

    .venv/bin/python bench/model.py [--ranks 8] [--mib 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from netreduce.sim.model.kit import RingJob, engine_with

from netreduce.wire import RoceFrame, packetise_write

ACK_EVERY = 64


def run(ranks: int, pmtu: int, nbytes: int, window: int = 256) -> dict:
    rng = np.random.default_rng(pmtu)
    j = RingJob(world=ranks, window=window, pmtu=pmtu)
    data = rng.integers(-(2**31), 2**31, size=(ranks, nbytes // 4), dtype=np.int64)
    data = data.astype(np.int32)
    streams = []
    for r in range(ranks):
        t = j.data(r, 0, b"")
        tmpl = RoceFrame(opcode=0, dqpn=t.dqpn, smac=t.smac, dmac=t.dmac, src_ip=t.src_ip,
                         dst_ip=t.dst_ip, sport=t.sport)
        streams.append(list(packetise_write(data[r], tmpl, pmtu, j.start_psns[r], va=0x10000,
                                            rkey=0x77, imm=1)))
    npkt = len(streams[0])
    feed: list[bytes] = []
    for k in range(npkt):  # lock-step interleaving, ACKs trail by one ACK period
        feed += [streams[r][k] for r in range(ranks)]
        if k % ACK_EVERY == ACK_EVERY - 1 or k == npkt - 1:
            feed += j.ack_all(k)
    eng, ctl = engine_with(j, pmtu_max=4096)
    t0 = time.perf_counter()
    out = 0
    for i, f in enumerate(feed):
        out += len(eng.receive(0, f, i))
    dt = time.perf_counter() - t0
    if ctl.slots_in_use() != 0 or eng.counters()["released"] != npkt:
        raise SystemExit(f"benchmark run incomplete: {eng.counters()}")
    ndata = ranks * npkt
    return {"ranks": ranks, "pmtu": pmtu, "message_bytes": nbytes, "packets_per_rank": npkt,
            "frames_in": len(feed), "frames_out": out, "seconds": round(dt, 4),
            "frames_in_per_s": round(len(feed) / dt), "data_frames_per_s": round(ndata / dt),
            "frames_out_per_s": round(out / dt),
            "payload_MBps_in": round(ndata * pmtu / dt / 1e6, 1)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mib", type=float, default=4, help="message size per rank in MiB")
    ap.add_argument("--runs", type=int, default=3, help="runs per PMTU; the best is reported")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "model.json")
    args = ap.parse_args(argv)
    nbytes = int(args.mib * (1 << 20)) // 4 * 4
    load_before = os.getloadavg()[0]
    cases = []
    for pmtu in (4096, 1024):
        runs = [run(args.ranks, pmtu, nbytes) for _ in range(args.runs)]
        best = max(runs, key=lambda r: r["frames_in_per_s"])
        best["runs_frames_in_per_s"] = [r["frames_in_per_s"] for r in runs]
        cases.append(best)
    result = {
        "benchmark": "reference model Engine.receive, N-rank SUM_WRAP all-reduce + ACKs",
        "command": " ".join([_rel(sys.executable), *sys.argv]),
        "cases": cases,
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "platform": platform.platform(),
                    "loadavg_1min_before_after": [round(load_before, 2),
                                                  round(os.getloadavg()[0], 2)]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for c in cases:
        print(f"model: {c['ranks']} ranks, PMTU {c['pmtu']}: {c['frames_in_per_s']} frames/s in "
              f"({c['data_frames_per_s']} data frames/s, {c['payload_MBps_in']} MB/s payload), "
              f"{c['frames_out_per_s']} frames/s out")
    print(f"-> {args.out}")
    return result


def _rel(path: str) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(path).absolute().relative_to(root))
    except ValueError:
        return path


if __name__ == "__main__":
    main()
