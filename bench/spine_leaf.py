"""All-reduce time across racks: spine-leaf NetReduce vs one large engine vs ring baselines.

For each (R racks, M ranks per rack, S bytes per rank), int32, loss-free, all on the model and
the same link model (100 Gb/s, 500 ns, FIFO serialisation with the wire overhead; ACKs overtake
data), simulated in one run:

* ``spine_leaf``: R leaf engines and a spine engine (``netreduce sim --racks R``); inter-switch
  links 100 Gb/s like the host links (no oversubscription);
* ``one_engine``: the same N = R*M workers as one star around one engine of N ports (the
  single-rack design, if one engine had the ports and flow entries);
* ``ring``: the flat ring all-reduce (reduce-scatter + all-gather) over the rack topology with
  plain switches (the ring crosses each inter-switch link once per direction);
* ``hier_ring``: the hierarchical ring: reduce-scatter in each rack, M ring all-reduces of S/M
  bytes across racks (one per local rank, concurrently), all-gather in each rack. The intra-rack
  reduce-scatter and all-gather together are one intra-rack ring all-reduce (the ring
  all-reduce *is* reduce-scatter then all-gather), so its time is simulated as the intra-rack
  ring all-reduce (R racks concurrently) plus the inter-rack phase, each on its own fabric.

Every result is checked bit-exact against the integer sum. Output: a table,
``bench/results/spine_leaf.json`` and ``spine_leaf.png`` (``--replot``: the PNG from the JSON).

With loss (``--loss P``, repeatable; ``--lossy-size``, default 256 KiB, ``--seeds``): the same
per-frame loss, duplication and reordering probability P on every link (the inter-switch links
too), QP timeout 8 (1.05 ms), spine-leaf against one engine and the flat ring, mean over seeds.

    python bench/spine_leaf.py [--size 1MiB] [--shape 2x4 --shape 4x4 ...] [--loss 0.001 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from netreduce.sim.net.ring import RingAllReduce
from netreduce.sim.net.simrun import SimConfig, net_config, run_sim
from netreduce.sim.net.spine_leaf import RackFabric, run_rack_sim

OUT = Path(__file__).resolve().parent / "results" / "spine_leaf.json"


def _inputs(n: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, n])
    return [rng.integers(-2**31, 2**31, size // 4, dtype=np.int64).astype(np.int32)
            for _ in range(n)]


def _exact(xs: list[np.ndarray]) -> np.ndarray:
    return np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)


def _rings(fab, groups: list[list[np.ndarray]], pmtu: int) -> tuple[int, list]:
    """Run one ring all-reduce per group concurrently on ``fab``; (time to the last, results)."""
    rings = [RingAllReduce(fab, g, pmtu=pmtu, seed=i) for i, g in enumerate(groups)]
    for r in rings:
        r.start()
    fab.run_until(lambda: all(r.finished() for r in rings), 60_000_000_000)
    for r in rings:
        if r.error is not None:
            raise r.error
        r.teardown()
    return max(r.t_end - r.t0 for r in rings), [r.acc for r in rings]


def measure(racks: int, per_rack: int, size: int, pmtu: int = 1024, seed: int = 1) -> dict:
    n = racks * per_rack
    cfg = SimConfig(workers=n, size=size, dtype="int32", pmtu=pmtu, seed=seed)
    net = net_config(cfg)
    out: dict = {"racks": racks, "per_rack": per_rack, "workers": n, "bytes_per_rank": size,
                 "pmtu": pmtu, "link_gbps": cfg.link_gbps}
    t = time.perf_counter()
    sl = run_rack_sim(cfg, racks)
    assert sl.ok, (sl.error, sl.checks, sl.slots_left)
    out["spine_leaf_us"] = sl.sim_ns / 1000
    one = run_sim(cfg)
    assert one.ok, (one.error, one.checks)
    out["one_engine_us"] = one.sim_ns / 1000
    xs = _inputs(n, size, seed)
    ref = _exact(xs)
    fab = RackFabric(racks, per_rack, None, net, seed)
    t_ring, res = _rings(fab, [xs], pmtu)
    assert all(np.array_equal(a, ref) for a in res[0])
    out["ring_us"] = t_ring / 1000
    # hierarchical: intra-rack ring all-reduce (RS + AG), then M inter-rack rings of S/M bytes
    fab = RackFabric(racks, per_rack, None, net, seed)
    t_intra, res = _rings(fab, [xs[a * per_rack:(a + 1) * per_rack] for a in range(racks)],
                          pmtu)
    rack_sum = [res[a][0] for a in range(racks)]
    chunks = [np.array_split(s, per_rack) for s in rack_sum]
    fab = RackFabric(racks, per_rack, None, net, seed, placement=lambda i: i % racks)
    t_inter, res = _rings(fab, [[chunks[a][j] for a in range(racks)]
                                for j in range(per_rack)], pmtu)
    assert np.array_equal(np.concatenate([res[j][0] for j in range(per_rack)]), ref)
    out["hier_ring_us"] = (t_intra + t_inter) / 1000
    out["hier_intra_us"], out["hier_inter_us"] = t_intra / 1000, t_inter / 1000
    # the physics bound: every rank sends S and receives S through its 100G link
    wire = (size + -(-size // pmtu) * 82) * 8 / cfg.link_gbps  # ns, one link, docs/roce.md overhead
    out["wire_bound_us"] = wire / 1000
    out["wall_s"] = round(time.perf_counter() - t, 1)
    return out


def measure_lossy(racks: int, per_rack: int, size: int, loss: float, seeds: int,
                  pmtu: int = 1024) -> dict:
    n = racks * per_rack
    acc: dict = {"spine_leaf_us": [], "one_engine_us": [], "ring_us": [],
                 "spine_leaf_timeouts": [], "one_engine_timeouts": []}
    for seed in range(1, seeds + 1):
        cfg = SimConfig(workers=n, size=size, dtype="int32", pmtu=pmtu, seed=seed, loss=loss,
                        dup=loss, reorder=loss)
        sl = run_rack_sim(cfg, racks)
        assert sl.ok, (sl.error, sl.checks, sl.slots_left)
        one = run_sim(cfg)
        assert one.ok, (one.error, one.checks)
        xs = _inputs(n, size, seed)
        t_ring, res = _rings(RackFabric(racks, per_rack, None, net_config(cfg), seed), [xs],
                             pmtu)
        assert all(np.array_equal(a, _exact(xs)) for a in res[0])
        acc["spine_leaf_us"].append(sl.sim_ns / 1000)
        acc["one_engine_us"].append(one.sim_ns / 1000)
        acc["ring_us"].append(t_ring / 1000)
        acc["spine_leaf_timeouts"].append(sl.stats["timeouts"])
        acc["one_engine_timeouts"].append(one.stats["timeouts"])
    return {"racks": racks, "per_rack": per_rack, "workers": n, "bytes_per_rank": size,
            "loss": loss, "seeds": seeds, **{k: round(float(np.mean(v)), 1)
                                             for k, v in acc.items()}}


def plot(data: dict, path: Path) -> None:
    """Bars per shape: loss-free times of the four ways, the wire bound as a line; with lossy
    rows a second panel (log scale) per loss rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, lossy = data["rows"], data.get("lossy", [])
    keys = [("spine_leaf_us", "spine-leaf"), ("one_engine_us", "one engine"),
            ("ring_us", "ring"), ("hier_ring_us", "hierarchical ring")]
    fig, axes = plt.subplots(1, 2 if lossy else 1, figsize=(12 if lossy else 7, 4.2),
                             squeeze=False)
    ax = axes[0][0]
    x = np.arange(len(rows))
    for i, (k, lab) in enumerate(keys):
        ax.bar(x + (i - 1.5) * 0.2, [r[k] for r in rows], 0.2, label=lab)
    ax.plot(x, [r["wire_bound_us"] for r in rows], "k_", markersize=40, label="wire bound")
    ax.set_xticks(x, [f"{r['racks']}x{r['per_rack']} (N={r['workers']})" for r in rows])
    ax.set_ylabel("all-reduce time (us)")
    ax.set_title(f"loss-free, {rows[0]['bytes_per_rank'] >> 10} KiB int32 per rank, 100 Gb/s")
    ax.legend(fontsize=8)
    if lossy:
        ax = axes[0][1]
        losses = sorted({r["loss"] for r in lossy})
        shapes = list(dict.fromkeys(f"{r['racks']}x{r['per_rack']}" for r in lossy))
        xl = np.arange(len(shapes) * len(losses))
        for i, (k, lab) in enumerate(keys[:3]):
            ys = [next(r[k] for r in lossy if r["loss"] == p
                       and f"{r['racks']}x{r['per_rack']}" == sh)
                  for p in losses for sh in shapes]
            ax.bar(xl + (i - 1) * 0.27, ys, 0.27, label=lab)
        ax.set_xticks(xl, [f"{sh}\n{p:g}" for p in losses for sh in shapes], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("all-reduce time (us), log")
        ax.set_title(f"loss/dup/reorder on every link, {lossy[0]['bytes_per_rank'] >> 10} KiB, "
                     f"QP timeout 1.05 ms")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[:-len(u)]) * m
    return int(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=_size, default=1 << 20)
    ap.add_argument("--shape", action="append", default=None,
                    help="RxM: R racks of M ranks (default 2x2, 2x4, 4x2, 4x4)")
    ap.add_argument("--loss", type=float, action="append", default=None)
    ap.add_argument("--lossy-size", type=_size, default=256 << 10)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=OUT)
    ap.add_argument("--replot", action="store_true", help="only redraw the PNG from --json")
    a = ap.parse_args()
    png = a.json.with_suffix(".png")
    if a.replot:
        plot(json.loads(a.json.read_text()), png)
        print(f"wrote {png}")
        return
    shapes = a.shape or ["2x2", "2x4", "4x2", "4x4"]
    rows = []
    print(f"{'R x M':>6} {'N':>3} {'wire':>8} {'spine-leaf':>11} {'one engine':>11} "
          f"{'ring':>9} {'hier ring':>10}   (us, {a.size} B per rank)")
    for sh in shapes:
        r, m = (int(x) for x in sh.split("x"))
        row = measure(r, m, a.size)
        rows.append(row)
        print(f"{sh:>6} {row['workers']:>3} {row['wire_bound_us']:8.1f} "
              f"{row['spine_leaf_us']:11.1f} {row['one_engine_us']:11.1f} {row['ring_us']:9.1f} "
              f"{row['hier_ring_us']:10.1f}", flush=True)
    lossy = []
    if a.loss:
        print(f"\n{'R x M':>6} {'loss':>6} {'spine-leaf':>11} {'one engine':>11} {'ring':>9} "
              f"{'timeouts sl/one':>16}   (us, {a.lossy_size} B per rank, {a.seeds} seeds)")
    for p in a.loss or []:
        for sh in shapes:
            r, m = (int(x) for x in sh.split("x"))
            row = measure_lossy(r, m, a.lossy_size, p, a.seeds)
            lossy.append(row)
            print(f"{sh:>6} {p:6g} {row['spine_leaf_us']:11.1f} {row['one_engine_us']:11.1f} "
                  f"{row['ring_us']:9.1f} {row['spine_leaf_timeouts']:7.1f} / "
                  f"{row['one_engine_timeouts']:.1f}", flush=True)
    cmd = ("python bench/spine_leaf.py" + (f" --size {a.size}" if a.size != 1 << 20 else "")
           + "".join(f" --shape {s}" for s in (a.shape or []))
           + "".join(f" --loss {p}" for p in (a.loss or []))
           + (f" --lossy-size {a.lossy_size}" if a.lossy_size != 256 << 10 else "")
           + (f" --seeds {a.seeds}" if a.seeds != 2 else ""))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    data = {"command": cmd, "rows": rows, "lossy": lossy}
    a.json.write_text(json.dumps(data, indent=1) + "\n")
    plot(data, png)
    print(f"wrote {a.json}, {png}")


if __name__ == "__main__":
    main()
