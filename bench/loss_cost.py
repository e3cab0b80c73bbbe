"""Loss-recovery cost of an all-reduce through the reference engine, against the loss rate.

N ranks (software RC endpoints, rxe behaviour) all-reduce an int32 buffer through the engine model
on a 100 Gb/s network model; the same loss probability on every link, both directions, every kind
of traffic ("all"), or only on data ("data": contributions and results) or only on ACK/NAK/CNP
("ack"). Per loss rate (averaged over seeds): packets retransmitted per packet of payload, extra
frames on the wire compared with the loss-free run, the engine's re-emits / duplicates /
behind-window probes, RC timeouts and NAKs, and the completion time against the loss-free run.
Every run is checked bit-exact. Writes bench/results/loss_cost.json.

    .venv/bin/python bench/loss_cost.py [--world 4] [--kib 512] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from netreduce.sim.fabric_model import ModelFabric
from netreduce.sim.network import DIRECTIONS, LinkConfig, NetConfig
from netreduce.sw_driver.collective import CollectiveConfig, allreduce

LOSSES = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05)


def net_for(where: str, loss: float) -> NetConfig:
    if where == "all":
        return NetConfig(LinkConfig(loss=loss))
    return NetConfig(LinkConfig(), {(d, where): LinkConfig(loss=loss) for d in DIRECTIONS})


def run(world: int, n: int, where: str, loss: float, seed: int, cfg: CollectiveConfig) -> dict:
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(world)]
    fab = ModelFabric(net=net_for(where, loss), seed=seed)
    t = time.perf_counter()
    res = allreduce(fab, xs, cfg, seed=seed)
    wall = time.perf_counter() - t
    want = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    exact = all(np.array_equal(y, want) for y in res.results) and res.stats["slots_left"] == 0
    st, eng = res.stats, res.stats["engine"]
    links = fab.link_stats()
    return {"exact": exact, "sim_ns": fab.now(), "wall_s": wall,
            "wire_frames": links["up"]["frames"] + links["down"]["frames"],
            "lost": links["up"]["lost"] + links["down"]["lost"],
            "sent": st["sent"], "retransmitted": st["retransmitted"], "timeouts": st["timeouts"],
            "naks": st["naks_sent"], "reemits": eng.get("reemits", 0),
            "duplicates": eng.get("duplicates", 0), "behind_window": eng.get("behind_window", 0),
            "drop_ahead": eng.get("drop_ahead", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--kib", type=int, default=512, help="buffer per rank")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pmtu", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=8, help="QP timeout exponent")
    a = ap.parse_args()
    n = a.kib * 1024 // 4
    cfg = CollectiveConfig(pmtu=a.pmtu, timeout=a.timeout)
    pkts = a.world * -(-n * 4 // a.pmtu)  # contributions of a loss-free run
    rows = []
    base = {}
    for where in ("all", "data", "ack"):
        for loss in LOSSES:
            if where != "all" and loss == 0.0:
                continue
            rs = [run(a.world, n, where, loss, s, cfg) for s in range(a.seeds)]
            avg = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if k != "exact"}
            if loss == 0.0:
                base = avg
            row = {"where": where, "loss": loss, "exact": all(r["exact"] for r in rs),
                   "retransmitted_per_packet": round(avg["retransmitted"] / pkts, 4),
                   "extra_wire_frames_pct": round(100 * (avg["wire_frames"] / base["wire_frames"]
                                                         - 1), 2),
                   "completion_time_x": round(avg["sim_ns"] / base["sim_ns"], 2),
                   **{k: round(v, 1) for k, v in avg.items()}}
            rows.append(row)
            print(f"{where:4s} loss {loss:6.3f}: retx/pkt {row['retransmitted_per_packet']:.4f} "
                  f"extra frames {row['extra_wire_frames_pct']:7.2f} % time x"
                  f"{row['completion_time_x']:6.2f} timeouts {avg['timeouts']:5.1f} reemits "
                  f"{avg['reemits']:7.1f} probes {avg['behind_window']:5.1f} "
                  f"exact {row['exact']}", flush=True)
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "world": a.world, "bytes_per_rank": n * 4, "pmtu": a.pmtu,
           "qp_timeout_us": round(4.096 * 2 ** a.timeout, 1), "packets": pkts,
           "seeds": a.seeds, "rows": rows}
    p = Path(__file__).parent / "results" / "loss_cost.json"
    p.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
