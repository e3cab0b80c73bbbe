"""Benchmark the batch wire path: packetise a 64 MiB int32 buffer into PMTU-4096 RC WRITE frames
(with ICRC) and parse them back (ICRC verified, payload reassembled).

Writes bench/results/wire.json and prints a one-line summary. MB/s counts payload bytes
(10^6 bytes per MB); each direction reports the best and the median of ``--runs`` runs, and the
first (cold) run separately, since it also pays the page faults of fresh output memory.

    .venv/bin/python bench/wire.py [--mib 64] [--pmtu 4096] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from netreduce.wire import RoceFrame, packetise_write, parse_write_batch


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="buffer size in MiB (default 64)")
    ap.add_argument("--pmtu", type=int, default=4096, help="path MTU (default 4096)")
    ap.add_argument("--runs", type=int, default=7, help="runs per direction; best is reported")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "wire.json")
    args = ap.parse_args(argv)

    nbytes = args.mib << 20
    buf = np.random.default_rng(1).integers(-(2**31), 2**31, nbytes // 4, dtype=np.int32)
    tmpl = RoceFrame(opcode=0, dqpn=0x000012, vlan_tci=None, tos=0x02)

    load_before = os.getloadavg()[0]
    pack_s, parse_s = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        batch = packetise_write(buf, tmpl, args.pmtu, 0xFFF000, va=0x7F0000000000, rkey=0x1234,
                                imm=1)
        t1 = time.perf_counter()
        wb = parse_write_batch(batch, pmtu=args.pmtu, expect_psn=0xFFF000)
        t2 = time.perf_counter()
        pack_s.append(t1 - t0)
        parse_s.append(t2 - t1)
        if not np.array_equal(wb.payload_as(np.int32), buf):
            raise SystemExit("round trip changed the payload")
        del wb
    mbs = lambda s: nbytes / s / 1e6  # noqa: E731

    result = {
        "benchmark": "wire batch packetise/parse, RC WRITE with ICRC",
        "command": " ".join([_rel(sys.executable), *sys.argv]),
        "buffer_bytes": nbytes,
        "dtype": "int32",
        "pmtu": args.pmtu,
        "frames": len(batch),
        "frame_bytes": batch.nbytes,
        "runs": args.runs,
        "packetise_MBps": round(mbs(min(pack_s)), 1),
        "parse_MBps": round(mbs(min(parse_s)), 1),
        "packetise_median_MBps": round(mbs(statistics.median(pack_s)), 1),
        "parse_median_MBps": round(mbs(statistics.median(parse_s)), 1),
        "packetise_cold_MBps": round(mbs(pack_s[0]), 1),
        "parse_cold_MBps": round(mbs(parse_s[0]), 1),
        "packetise_s": [round(s, 4) for s in pack_s],
        "parse_s": [round(s, 4) for s in parse_s],
        "machine": {
            "nproc": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "platform": platform.platform(),
            # other jobs on the machine slow every figure down: record how busy it was
            "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wire: {args.mib} MiB int32, PMTU {args.pmtu}, {len(batch)} frames: packetise "
          f"{result['packetise_MBps']:.0f} MB/s, parse {result['parse_MBps']:.0f} MB/s "
          f"(best of {args.runs}; median {result['packetise_median_MBps']:.0f}/"
          f"{result['parse_median_MBps']:.0f}; cold {result['packetise_cold_MBps']:.0f}/"
          f"{result['parse_cold_MBps']:.0f}) on {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__} -> {args.out}")
    return result


def _rel(path: str) -> str:
    """``path`` relative to the repository root when it lies inside it (e.g. .venv/bin/python)."""
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(path).absolute().relative_to(root))
    except ValueError:
        return path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
