"""Time to all-reduce S bytes with N workers: NetReduce (engine model) against ring all-reduce.

Both run side by side in one process over the same software RC endpoints (rxe behaviour) and the
same physical network model: one 100 Gb/s link per worker and direction (frames serialised with
82 bytes of per-frame overhead incl. preamble/IFG/FCS, ROCE.md), 500 ns propagation, no loss.
NetReduce: the engine model in the middle (one engine port per worker, untimed: it adds no
latency), each worker sends S and receives S. Ring: reduce-scatter + all-gather
(netreduce.sim.net.ring) through a forwarding-only switch; each worker sends 2(N-1)/N x S.
int32 (bit-exact, both results checked), PMTU 4096. The ratio t_ring / t_netreduce is reported next
to the analytic bound 2(N-1)/N. Writes bench/results/vs_ring.json and vs_ring.png.

Default grid (feasible on a loaded 2-core machine at ~10-50k simulated frames/s):
N in {2, 4, 8, 16, 32} x S in {64 KiB, 1 MiB}, plus N in {2, 4, 8, 16} at 16 MiB and
N in {2, 4, 8} at 64 MiB. ``--points N:S,N:S`` runs a custom list (S with KiB/MiB suffix).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from netreduce.sim.net.network import NetworkFabric
from netreduce.sim.net.ring import ring_allreduce
from netreduce.sim.net.simrun import SimConfig, make_inputs, net_config, run_sim, wire_limit_gbps

KIB, MIB = 1024, 1024 * 1024
DEFAULT = ([(n, 64 * KIB) for n in (2, 4, 8, 16, 32)] + [(n, MIB) for n in (2, 4, 8, 16, 32)]
           + [(n, 16 * MIB) for n in (2, 4, 8, 16)] + [(n, 64 * MIB) for n in (2, 4, 8)])


def _size(t: str) -> int:
    t = t.strip().lower()
    for suf, m in (("kib", KIB), ("mib", MIB), ("k", KIB), ("m", MIB)):
        if t.endswith(suf):
            return int(float(t[:-len(suf)]) * m)
    return int(t)


def point(n: int, size: int, pmtu: int, gbps: float, seed: int) -> dict:
    cfg = SimConfig(workers=n, size=size, dtype="int32", pmtu=pmtu, seed=seed, link_gbps=gbps,
                    timeout_ns=60_000_000_000)
    t = time.perf_counter()
    nr = run_sim(cfg)
    nr_wall = time.perf_counter() - t
    if not nr.ok:
        raise SystemExit(f"NetReduce run N={n} S={size} failed: {nr.error or nr.checks}")
    xs = make_inputs(cfg)
    fab = NetworkFabric(net_config(cfg), seed=seed)
    t = time.perf_counter()
    ring = ring_allreduce(fab, xs, pmtu=pmtu, seed=seed)
    ring_wall = time.perf_counter() - t
    ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    ring_ok = all(np.array_equal(y, ref) for y in ring.results)
    if not ring_ok:
        raise SystemExit(f"ring N={n} S={size}: wrong result")
    ideal_ns = size * 8 / wire_limit_gbps(pmtu, gbps)  # S over one link at the goodput ceiling
    row = {"workers": n, "bytes": size,
           "netreduce_us": round(nr.sim_ns / 1e3, 3), "ring_us": round(ring.sim_ns / 1e3, 3),
           "ratio": round(ring.sim_ns / nr.sim_ns, 4), "bound_2(N-1)/N": round(2 * (n - 1) / n, 4),
           "netreduce_fraction_of_wire_limit": round(ideal_ns / nr.sim_ns, 4),
           "ring_fraction_of_bound": round(ideal_ns * 2 * (n - 1) / n / ring.sim_ns, 4),
           "netreduce_retransmitted": nr.stats.get("retransmitted", 0),
           "ring_retransmitted": ring.stats.get("retransmitted", 0),
           "wall_s": {"netreduce": round(nr_wall, 2), "ring": round(ring_wall, 2)}}
    print(json.dumps(row), flush=True)
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    sizes = sorted({r["bytes"] for r in rows})
    for s in sizes:
        rs = sorted((r for r in rows if r["bytes"] == s), key=lambda r: r["workers"])
        lab = f"{s // MIB} MiB" if s >= MIB else f"{s // KIB} KiB"
        ax.plot([r["workers"] for r in rs], [r["ratio"] for r in rs], "o-", label=f"S = {lab}")
    ns = np.arange(2, 33)
    ax.plot(ns, 2 * (ns - 1) / ns, "k--", label="analytic 2(N-1)/N")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers N")
    ax.set_ylabel("t_ring / t_NetReduce")
    ax.set_title("All-reduce time: ring over NetReduce (100 Gb/s links, PMTU 4096, int32)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default=None, help="N:S list, e.g. 4:1MiB,8:64KiB")
    ap.add_argument("--pmtu", type=int, default=4096)
    ap.add_argument("--gbps", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "vs_ring.json"))
    a = ap.parse_args()
    pts = DEFAULT if a.points is None else [
        (int(p.split(":")[0]), _size(p.split(":")[1])) for p in a.points.split(",")]
    t0 = time.perf_counter()
    rows = [point(n, s, a.pmtu, a.gbps, a.seed) for n, s in pts]
    out = {"bench": "vs_ring",
           "command": " ".join(["python", "bench/vs_ring.py", *sys.argv[1:]]),
           "backend": "model", "pmtu": a.pmtu, "link_gbps": a.gbps, "latency_ns": 500,
           "dtype": "int32", "loss": 0.0,
           "wire_limit_gbps": round(wire_limit_gbps(a.pmtu, a.gbps), 4),
           "wall_s": round(time.perf_counter() - t0, 1), "rows": rows}
    p = Path(a.out)
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, p.with_suffix(".png"))
    print(f"wrote {p} and {p.with_suffix('.png')}")


if __name__ == "__main__":
    main()
