"""All-reduce time: NetReduce (flat, striped, hierarchical) against ring and hierarchical ring,
with the engine's ports counted.

Topology (netreduce.sim.net.topology): workers on a ToR switch at B Gb/s, the engine on P ports of
C Gb/s, timed from the RTL's measured figures (bench/results/engine_512_p1.json); the ring runs
over the same worker links through the same switch (forwarding only). int32, PMTU 4096, no loss.

Both sides are timed the same way: the analytic model of netreduce.sim.net.perf (capacity terms +
latency terms fitted from two small simulations per link rate) over the whole grid
(N 2..64, S 64 KiB..64 MiB, B 25 and 100 Gb/s, engines of 1 and 2 ports x 100 Gb/s), and
simulations (RC endpoints, the collective driver, the timed engine model, the ring driver) at the
validation points, each printed with the model's error there. Hierarchical: H = N / G hosts of G
devices (G = 8 by default) with an intra-host link of I Gb/s (--intra-gbps; the intra-host phases
are modelled, the inter-host phase of hierarchical NetReduce is simulated at its validation
points). Writes bench/results/vs_ring.json and vs_ring.png::

    .venv/bin/python bench/vs_ring.py [--quick] [--intra-gbps 400] [--gpus 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from netreduce.sim.net import perf

KIB, MIB = 1024, 1024 * 1024
NS = (2, 4, 8, 16, 32, 64)
SIZES = (64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB)
LINKS = (25, 100)
ENGINES = ((1, 100), (2, 100))
PMTU = 4096


def _lab(s: int) -> str:
    return f"{s // MIB} MiB" if s >= MIB else f"{s // KIB} KiB"


def model_row(n, s, b, p, c, g, intra, a) -> dict:
    row = {"workers": n, "bytes": s, "link_gbps": b, "engine_ports": p, "port_gbps": c,
           "netreduce_us": perf.t_netreduce(n, s, b, p, c, PMTU, a=a) / 1e3,
           "striped_us": perf.t_netreduce(n, s, b, p, c, PMTU, striped=True, a=a) / 1e3,
           "ring_us": perf.t_ring(n, s, b, PMTU, a=a) / 1e3}
    if n % g == 0 and n > g:
        h = n // g
        row.update(hosts=h, gpus=g, intra_gbps=intra,
                   hier_netreduce_us=perf.t_hier_nr(h, g, s, b, p, c, intra, PMTU, a=a) / 1e3,
                   hier_ring_us=perf.t_hier_ring(h, g, s, b, intra, PMTU, a=a) / 1e3,
                   flat_netreduce_hosts_us=perf.t_flat_nr_hosts(h, g, s, b, p, c, PMTU,
                                                                a=a) / 1e3,
                   flat_ring_hosts_us=perf.t_flat_ring_hosts(h, g, s, b, intra, PMTU,
                                                             a=a) / 1e3)
    for k in list(row):
        if k.endswith("_us"):
            row[k] = round(row[k], 2)
    best_nr = min(row["netreduce_us"], row["striped_us"])
    row["ring_over_netreduce"] = round(row["ring_us"] / best_nr, 3)
    if "hier_ring_us" in row:
        row["hier_ring_over_hier_netreduce"] = round(row["hier_ring_us"]
                                                     / row["hier_netreduce_us"], 3)
    return row


def crossovers(alphas, g, intra) -> list[dict]:
    """Per (B, engine, S), every N in 2..64 (model): where NetReduce (best of flat/striped) is
    faster than the ring."""
    out = []
    for b in LINKS:
        for p, c in ENGINES:
            for s in SIZES:
                wins = [n for n in range(2, 65)
                        if model_row(n, s, b, p, c, g, intra, alphas[b])["ring_over_netreduce"]
                        > 1]
                out.append({"link_gbps": b, "engine": f"{p}x{c}G", "bytes": s,
                            "netreduce_faster_at_N": _ranges(wins)})
    return out


def _ranges(ns: list[int]) -> str:
    """[2, 3, 4, 7] -> "2-4, 7"; [] -> "none"."""
    if not ns:
        return "none"
    out, lo = [], ns[0]
    for a, b in zip(ns, ns[1:] + [None], strict=True):
        if b != a + 1:
            out.append(f"{lo}-{a}" if a != lo else str(a))
            lo = b
    return ", ".join(out)


def validate(a_by_b, g, intra, quick) -> list[dict]:
    pts = []
    for b in LINKS:
        a = a_by_b[b]
        base = [(n, s) for n in ((4, 8) if quick else (2, 4, 8, 16))
                for s in ((MIB,) if quick else (64 * KIB, MIB))]
        extra = [] if quick else [(3, MIB), (5, MIB), (32, MIB), (8, 16 * MIB)]
        for p, c in ENGINES:
            # odd N (where striping matters) and the larger points on the 2-port engine
            for n, s in base + (extra if p > 1 else []):
                t = time.perf_counter()
                sim = perf.sim_netreduce(n, s, b, p, c, PMTU)
                mod = perf.t_netreduce(n, s, b, p, c, PMTU, a=a)
                row = {"what": "netreduce", "workers": n, "bytes": s, "link_gbps": b,
                       "engine_ports": p, "sim_us": round(sim / 1e3, 2),
                       "model_us": round(mod / 1e3, 2), "model_error": round(mod / sim - 1, 4)}
                if p > 1 and n % p:
                    st = perf.sim_netreduce(n, s, b, p, c, PMTU, stripes=p)
                    sm = perf.t_netreduce(n, s, b, p, c, PMTU, striped=True, a=a)
                    row.update(striped_sim_us=round(st / 1e3, 2),
                               striped_model_us=round(sm / 1e3, 2),
                               striped_model_error=round(sm / st - 1, 4))
                row["wall_s"] = round(time.perf_counter() - t, 2)
                pts.append(row)
                print(json.dumps(row), flush=True)
        for n, s in base + extra:
            sim = perf.sim_ring(n, s, b, PMTU)
            mod = perf.t_ring(n, s, b, PMTU, a=a)
            row = {"what": "ring", "workers": n, "bytes": s, "link_gbps": b,
                   "sim_us": round(sim / 1e3, 2), "model_us": round(mod / 1e3, 2),
                   "model_error": round(mod / sim - 1, 4)}
            pts.append(row)
            print(json.dumps(row), flush=True)
        for h in ((2,) if quick else (2, 4)):
            for p, c in ENGINES:
                r = perf.sim_hier_nr(h, g, MIB, b, p, c, intra, PMTU)
                if not r["ok"]:
                    raise SystemExit(f"hierarchical H={h} G={g}: wrong result")
                mod = perf.t_hier_nr(h, g, MIB, b, p, c, intra, PMTU, a=a)
                row = {"what": "hier_netreduce", "hosts": h, "gpus": g, "bytes": MIB,
                       "link_gbps": b, "engine_ports": p, "intra_gbps": intra,
                       "sim_us": round(r["total_ns"] / 1e3, 2), "model_us": round(mod / 1e3, 2),
                       "model_error": round(mod / r["total_ns"] - 1, 4),
                       "inter_sim_us": round(r["inter_ns"] / 1e3, 2)}
                pts.append(row)
                print(json.dumps(row), flush=True)
    return pts


def hier_condition(a_by_b, g) -> list[dict]:
    """Hierarchical against flat NetReduce on either side of the derived condition
    G I / 2 > min(Be, P Ce / H) (docs/sim.md): simulated, H = 2 hosts, S = 1 MiB. Flat
    NetReduce with G ranks behind each host's NIC is timed as H workers of G x S each, G stripes
    (the same bytes on every link and engine port)."""
    out = []
    h, s = 2, MIB
    for b, (p, c) in ((100, (2, 100)), (25, (1, 100))):
        flat = perf.sim_netreduce(h, g * s, b, p, c, PMTU, stripes=g)
        for intra in (5.0, 10.0, 400.0):
            r = perf.sim_hier_nr(h, g, s, b, p, c, intra, PMTU)
            be, ce = b * perf.eff(PMTU), perf.engine_port_rate(c, PMTU)
            row = {"what": "hier_vs_flat", "hosts": h, "gpus": g, "bytes": s, "link_gbps": b,
                   "engine_ports": p, "intra_gbps": intra,
                   "condition_holds": g * intra / 2 > min(be, p * ce / h),
                   "hier_sim_us": round(r["total_ns"] / 1e3, 2),
                   "flat_sim_us": round(flat / 1e3, 2),
                   "hier_faster": r["total_ns"] < flat, "ok": r["ok"]}
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def plot(rows, path: Path, g: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(LINKS), len(ENGINES), figsize=(12, 8), sharex=True)
    for i, b in enumerate(LINKS):
        for j, (p, c) in enumerate(ENGINES):
            ax = axes[i][j]
            for s in (64 * KIB, MIB, 64 * MIB):
                rs = sorted((r for r in rows if (r["link_gbps"], r["engine_ports"], r["bytes"])
                             == (b, p, s)), key=lambda r: r["workers"])
                x = [r["workers"] for r in rs]
                line, = ax.plot(x, [r["ring_over_netreduce"] for r in rs], "o-",
                                label=f"flat, S={_lab(s)}")
                hr = [r for r in rs if "hier_ring_over_hier_netreduce" in r]
                ax.plot([r["workers"] for r in hr],
                        [r["hier_ring_over_hier_netreduce"] for r in hr], "s--",
                        color=line.get_color(), label=f"hier. G={g}, S={_lab(s)}")
            ax.axhline(1, color="k", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_title(f"workers {b} Gb/s, engine {p} x {c} Gb/s", fontsize=9)
            ax.set_ylabel("t_ring / t_NetReduce (>1: NetReduce faster)", fontsize=8)
            ax.grid(alpha=0.3)
            if i == len(LINKS) - 1:
                ax.set_xlabel("ranks N")
            if i == 0 and j == 0:
                ax.legend(fontsize=6)
    fig.suptitle("Ring time over NetReduce time (best of flat/striped; hierarchical: hier. ring "
                 "over hier. NetReduce), PMTU 4096", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer validation simulations")
    ap.add_argument("--intra-gbps", type=float, default=400.0,
                    help="intra-host link per device and direction (Gb/s)")
    ap.add_argument("--gpus", type=int, default=8, help="devices per host G (hierarchical)")
    ap.add_argument("--out", default="bench/results/vs_ring.json")
    a = ap.parse_args(argv)
    if a.intra_gbps <= 0:
        ap.error(f"--intra-gbps must be > 0, got {a.intra_gbps}")
    if a.gpus < 2 or a.gpus > 16:
        ap.error(f"--gpus must be 2..16, got {a.gpus}")
    t0 = time.perf_counter()
    alphas = {b: perf.fit_alphas(b, PMTU) for b in LINKS}
    alphas = {b: perf.Alphas(x.nr, x.ring, 1000.0) for b, x in alphas.items()}
    print("latency terms (ns):", {b: vars(x) for b, x in alphas.items()}, flush=True)
    rows = [model_row(n, s, b, p, c, a.gpus, a.intra_gbps, alphas[b])
            for b in LINKS for p, c in ENGINES for s in SIZES for n in NS]
    pts = validate(alphas, a.gpus, a.intra_gbps, a.quick)
    cond = hier_condition(alphas, a.gpus)
    cmd = "python bench/vs_ring.py" + (" --quick" if a.quick else "") + (
        f" --intra-gbps {a.intra_gbps:g}" if a.intra_gbps != 400 else "") + (
        f" --gpus {a.gpus}" if a.gpus != 8 else "")
    res = {"command": cmd, "pmtu": PMTU, "engine_timing": vars(perf.engine_timing()),
           "engine_port_payload_gbps": {c: round(perf.engine_port_rate(c, PMTU), 3)
                                        for _, c in ENGINES},
           "alphas_ns": {b: vars(x) for b, x in alphas.items()},
           "gpus_per_host": a.gpus, "intra_gbps": a.intra_gbps, "rows": rows,
           "crossovers": crossovers(alphas, a.gpus, a.intra_gbps), "validation": pts,
           "hier_condition": cond,
           "max_abs_model_error": max(max(abs(p["model_error"]),
                                              abs(p.get("striped_model_error", 0)))
                                          for p in pts),
           "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    plot(rows, out.with_suffix(".png"), a.gpus)
    print(f"wrote {out} and {out.with_suffix('.png')}; max |model error| "
          f"{res['max_abs_model_error']:.3f}; wall {res['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
