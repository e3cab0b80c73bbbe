"""Wall time of an 8-rank, 16 MiB-per-rank float32 all-reduce through the reference engine model.

Software RC endpoints (rxe behaviour) on a loss-free 100 Gb/s network model with the engine model
in the middle; PMTU 1024. Writes bench/results/allreduce.json (wall time, simulated time,
frames, result check). Options: --workers N --mib M --loss P.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from netreduce.sim.net.collective import CollectiveConfig, Communicator
from netreduce.sim.net.model_fabric import ModelFabric
from netreduce.sim.net.network import NetConfig


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--mib", type=float, default=16)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--pmtu", type=int, default=1024)
    a = ap.parse_args()
    n = int(a.mib * 1024 * 1024) // 4
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(a.workers)]
    fab = ModelFabric(net=NetConfig.faulty(loss=a.loss), seed=0)
    comm = Communicator(fab, a.workers, CollectiveConfig(pmtu=a.pmtu))
    t = time.perf_counter()
    res = comm.allreduce(xs)
    wall = time.perf_counter() - t
    ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
    ok = all(bool((np.abs(y - ref) <= res.error_bound()).all()) for y in res.results)
    st = res.stats
    out = {
        "bench": "allreduce",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "backend": "model", "workers": a.workers, "bytes_per_rank": n * 4, "dtype": "float32",
        "pmtu": a.pmtu, "loss": a.loss,
        "wall_s": round(wall, 3),
        "simulated_us": round(fab.now() / 1e3, 1),
        "frames_out": st["frames_out"], "frames_in": st["frames_in"],
        "data_packets": st["sent"], "retransmitted": st["retransmitted"],
        "frames_per_wall_s": round((st["frames_out"] + st["frames_in"]) / wall),
        "engine_drop_ahead": st["engine"]["drop_ahead"],
        "slots_left": st["slots_left"], "result_within_bound": ok,
    }
    p = Path(__file__).parent / "results" / "allreduce.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    if not ok or st["slots_left"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
