"""Goodput per engine port versus PMTU and N against the docs/roce.md wire limit (``netreduce
sim``).

Each point is one ``run_sim`` (the ``netreduce sim`` engine): N software RC endpoints (rxe
behaviour), one 100 Gb/s link per worker and direction (82 bytes per-frame overhead), 500 ns
propagation, no loss, the reference engine model with one port per worker, int32 (bit-exact
check). Goodput of a port = payload bytes of distinct result packets leaving it over the
simulated time of the whole all-reduce (start-up and drain included), compared with the payload
ceiling PMTU / (PMTU + 82) x 100 Gb/s. Writes bench/results/goodput.json and goodput.png.

Default grid: PMTU {256, 1024, 4096} x N {2, 4, 8, 16, 32}, S = 1 MiB per worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from netreduce.sim.net.report import build_report
from netreduce.sim.net.simrun import SimConfig, run_sim, wire_limit_gbps


def point(n: int, pmtu: int, size: int, seed: int) -> dict:
    cfg = SimConfig(workers=n, size=size, dtype="int32", pmtu=pmtu, seed=seed)
    run = run_sim(cfg)
    if not run.ok:
        raise SystemExit(f"N={n} PMTU={pmtu}: run failed: {run.error or run.checks}")
    rep = build_report(run)
    g = [p["gbps"] for p in rep["goodput"]["ports"]]
    row = {"workers": n, "pmtu": pmtu, "bytes": size, "simulated_us": round(run.sim_ns / 1e3, 3),
           "wire_limit_gbps": round(wire_limit_gbps(pmtu), 3),
           "port_gbps_min": round(min(g), 3), "port_gbps_mean": round(sum(g) / len(g), 3),
           "fraction_of_wire_limit": round(min(g) / wire_limit_gbps(pmtu), 4),
           "slot_latency_p99_ns": rep["slot_latency_ns"].get("p99"),
           "max_slots_in_flight": rep["slots"]["max_in_flight"],
           "wall_s": round(run.wall_s, 2), "frames_per_wall_s": round(run.frames_per_s)}
    print(json.dumps(row), flush=True)
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, pmtu in enumerate(sorted({r["pmtu"] for r in rows})):
        rs = sorted((r for r in rows if r["pmtu"] == pmtu), key=lambda r: r["workers"])
        line, = ax.plot([r["workers"] for r in rs], [r["port_gbps_min"] for r in rs], "o-",
                        label=f"PMTU {pmtu}")
        ax.axhline(wire_limit_gbps(pmtu), color=line.get_color(), ls="--", lw=1,
                   label=f"wire limit {wire_limit_gbps(pmtu):.1f} Gb/s" if i == 0 else
                   f"{wire_limit_gbps(pmtu):.1f} Gb/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers N")
    ax.set_ylabel("goodput per port, slowest port (Gb/s)")
    ax.set_title(f"netreduce sim goodput ({rows[0]['bytes'] // 1024} KiB per worker, "
                 "100 Gb/s links)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="2,4,8,16,32")
    ap.add_argument("--pmtus", default="256,1024,4096")
    ap.add_argument("--kib", type=int, default=1024, help="bytes per worker, KiB")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "goodput.json"))
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = [point(n, pmtu, a.kib * 1024, a.seed) for pmtu in map(int, a.pmtus.split(","))
            for n in map(int, a.workers.split(","))]
    out = {"bench": "goodput", "command": " ".join(["python", "bench/goodput.py", *sys.argv[1:]]),
           "backend": "model", "link_gbps": 100.0, "latency_ns": 500, "overhead_bytes": 82,
           "dtype": "int32", "wall_s": round(time.perf_counter() - t0, 1), "rows": rows}
    p = Path(a.out)
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, p.with_suffix(".png"))
    print(f"wrote {p} and {p.with_suffix('.png')}")


if __name__ == "__main__":
    main()
