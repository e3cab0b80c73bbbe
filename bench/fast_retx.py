"""Fast retransmit (JOB.CTRL.fast_retx, model D16): completion time with the bit off and on.

N ranks (software RC endpoints, go-back-N like rxe, QP timeout 4.096 us * 2^8 = 1.05 ms) all-reduce
an int32 buffer through the reference engine on a 100 Gb/s network model with loss on the
contributions only (up links, RC data). Same seeds with the bit off and on, so both runs see the
same loss pattern until their recoveries diverge. Every run is checked bit-exact with every slot
freed. Parts:

* ``random``: loss probability x message size (packets per WRITE, hence the ACK cadence: the
  responder ACKs each message's last packet), averaged over seeds: completion time, RC timeouts,
  rewrites (``fast_retx``), ACK requests (``fast_retx_probes``), retransmitted packets.
* ``single``: exactly one lost contribution (rank 1's first transmission of one PSN) at chosen
  positions in a message: what one loss costs with the bit off and on.
* ``clean``: no loss: the bit changes nothing (no rewrite, same time).

Writes bench/results/fast_retx.json.

    .venv/bin/python bench/fast_retx.py [--world 4] [--kib 256] [--seeds 5]
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
from netreduce.sim.net.network import DropOnce, LinkConfig, NetConfig

LOSSES = (0.005, 0.01, 0.03)
MSG_PACKETS = (64, 16, 4)
START_PSN = 1000



def run(on: bool, world: int, kib: int, seed: int, msg_packets: int, loss: float = 0.0,
        drop_index: int | None = None) -> dict:
    rng = np.random.default_rng(seed)
    n = kib * 256
    xs = [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(world)]
    net = NetConfig(LinkConfig(), {("up", "data"): LinkConfig(loss=loss)} if loss else {})
    fab = ModelFabric(net=net, seed=seed)
    cfg = CollectiveConfig(msg_packets=msg_packets, fast_retx=on,
                           start_psns=tuple(START_PSN * (r + 1) for r in range(world)))
    comm = Communicator(fab, world, cfg, seed)
    drop = None
    if drop_index is not None:
        drop = DropOnce(fab.up[comm.rnics[1].mac], START_PSN * 2 + drop_index)
    t = time.perf_counter()
    res = comm.allreduce(xs)
    wall = time.perf_counter() - t
    want = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    st, eng = res.stats, res.stats["engine"]
    exact = all(np.array_equal(y, want) for y in res.results) and st["slots_left"] == 0
    return {"exact": exact, "sim_us": fab.now() / 1000, "timeouts": st["timeouts"],
            "fast_retx": eng.get("fast_retx", 0),
            "fast_retx_probes": eng.get("fast_retx_probes", 0),
            "naks_received": st["naks_received"],
            "naks_ignored": st["naks_ignored"], "retransmitted": st["retransmitted"],
            "lost": fab.link_stats()["up"]["lost"] + (drop.dropped if drop else 0),
            "wall_s": wall}


def pair(world, kib, seeds, msg, **kw) -> dict:
    row = {}
    for on in (False, True):
        rs = [run(on, world, kib, s, msg, **kw) for s in seeds]
        if not all(r["exact"] for r in rs):
            raise SystemExit(f"not bit-exact: fast_retx={on} msg={msg} {kw}")
        row["on" if on else "off"] = {k: round(float(np.mean([r[k] for r in rs])), 2)
                                      for k in rs[0] if k != "exact"}
    row["speedup"] = round(row["off"]["sim_us"] / row["on"]["sim_us"], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--kib", type=int, default=256, help="buffer per rank")
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    seeds = range(a.seeds)
    out = {"command": "python bench/fast_retx.py " + " ".join(sys.argv[1:]),
           "world": a.world, "bytes_per_rank": a.kib * 1024, "pmtu": 1024,
           "qp_timeout_us": 1048.6, "loss_on": "contributions (up links, RC data)",
           "seeds": a.seeds, "random": [], "single": [], "clean": []}
    for msg in MSG_PACKETS:
        out["clean"].append({"msg_packets": msg, **pair(a.world, a.kib, [0], msg)})
        for loss in LOSSES:
            row = {"msg_packets": msg, "loss": loss, **pair(a.world, a.kib, seeds, msg, loss=loss)}
            out["random"].append(row)
            print(f"msg {msg:3d} loss {loss:.3f}: {row['off']['sim_us']:9.1f} us "
                  f"({row['off']['timeouts']:.1f} timeouts) -> {row['on']['sim_us']:9.1f} us "
                  f"({row['on']['timeouts']:.1f} timeouts, {row['on']['fast_retx']:.1f} "
                  f"rewrites)", flush=True)
    # one loss at the first, middle and last packet of a message in the middle of the pass
    msg = 16
    mid = (a.kib // 2 // msg) * msg
    for where, k in (("first_of_message", mid), ("middle_of_message", mid + msg // 2),
                     ("last_of_message", mid + msg - 1), ("last_of_pass", a.kib - 1)):
        row = {"msg_packets": msg, "lost_index": k, "where": where,
               **pair(a.world, a.kib, [0], msg, drop_index=k)}
        out["single"].append(row)
        print(f"one loss, {where:18s}: {row['off']['sim_us']:9.1f} us -> "
              f"{row['on']['sim_us']:9.1f} us", flush=True)
    path = Path(__file__).with_name("results") / "fast_retx.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
