"""Loss-recovery cost of an all-reduce through the reference engine, against the loss rate.

N ranks (software RC endpoints, rxe behaviour) all-reduce an int32 buffer through the engine model
on a 100 Gb/s network model; the same loss probability on every link, both directions, every kind
of traffic ("all"), or only on data ("data": contributions and results) or only on ACK/NAK/CNP
("ack"). Per loss rate (averaged over seeds): packets retransmitted per packet of payload, extra
frames on the wire compared with the loss-free run, the engine's re-emits / duplicates /
behind-window probes, RC timeouts and NAKs, and the completion time against the loss-free run.
Every run is checked bit-exact. Writes bench/results/loss_cost.json.

    .venv/bin/python bench/loss_cost.py [--world 4] [--kib 512] [--seeds 3]

``--backend verilator``: the cost of *one* lost frame on the engine RTL (the 64-bit Verilator
build of netreduce.sim.rtl.soak_rtl.soak_params: 4 ports, 250 MHz clock, 8 bytes per cycle).
N ranks all-reduce ``--packets`` PMTU packets each through the RTL on a loss-free network, once
without loss and once per case, dropping exactly one frame (its first transmission): rank 1's
contribution of a middle index or of the last index (up link), or the result of a middle or of
the last index on its way to rank 1's successor (down link). Per case and QP timeout: completion
time in RTL cycles, the extra cycles over the loss-free run, that extra as a multiple of the RC
retransmit timeout (4.096 us x 2^timeout), and how RC recovered (timeouts, NAKs, re-emits). The
same cases run on the (untimed) reference model for comparison, and the two contribution losses
again with ``JOB.CTRL.fast_retx`` set (the engine's NAK-sequence on the receiver's behalf, D16).
Stored under the key "verilator" of loss_cost.json; the model sweep's figures are kept (and vice
versa).

    .venv/bin/python bench/loss_cost.py --backend verilator [--world 4] [--packets 32]
        [--timeouts 5,6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from netreduce.sim.model import Engine
from netreduce.sim.net.collective import CollectiveConfig, Communicator, allreduce
from netreduce.sim.net.model_fabric import ModelFabric, ns_to_cycles
from netreduce.sim.net.network import DIRECTIONS, DropOnce, LinkConfig, NetConfig
from netreduce.sim.net.rnic import timeout_ns

from netreduce.regmap import CLOCK_HZ

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


# ------------------------------------------------------------------------------ one lost frame
CASES = ("none", "contribution_mid", "contribution_tail", "result_mid", "result_tail")
# the same losses with JOB.CTRL.fast_retx set (engine D16): the trigger timed on the RTL
FAST_RETX_CASES = ("contribution_mid", "contribution_tail")
START_PSN = 1000  # rank r's send QP starts at START_PSN * (r + 1)
LOSER = 1  # the rank whose contribution (or whose flow's result) is lost



def one_loss(make_fabric, world: int, packets: int, pmtu: int, timeout: int, case: str,
             seed: int = 1, fast_retx: bool = False) -> dict:
    """One all-reduce on ``make_fabric()`` with the loss of ``case``; figures in RTL cycles."""
    fab = make_fabric()
    rng = np.random.default_rng(seed)
    n = packets * pmtu // 4
    xs = [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(world)]
    cfg = CollectiveConfig(pmtu=pmtu, msg_packets=8, window=64, margin=16, timeout=timeout,
                           fast_retx=fast_retx,
                           start_psns=tuple(START_PSN * (r + 1) for r in range(world)))
    comm = Communicator(fab, world, cfg, seed=seed)  # attaches the RNICs (rank order)
    drop = None
    if case != "none":
        what, where = case.split("_")
        k = packets // 2 if where == "mid" else packets - 1
        psn = START_PSN * (LOSER + 1) + k
        if what == "contribution":  # rank LOSER's packet k on its up link
            drop = DropOnce(fab.up[comm.rnics[LOSER].mac], psn)
        else:  # the result of LOSER's flow, on its way to LOSER's successor
            drop = DropOnce(fab.down[comm.rnics[(LOSER + 1) % world].mac], psn)
    res = comm.allreduce(xs)
    done = ns_to_cycles(fab.now())
    want = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    exact = all(np.array_equal(y, want) for y in res.results) and res.stats["slots_left"] == 0
    st, eng = res.stats, res.stats["engine"]
    out = {"case": case, "timeout": timeout, "fast_retx": fast_retx, "exact": exact,
           "dropped": drop.dropped if drop else 0, "cycles": done,
           "retransmitted": st["retransmitted"],
           "timeouts": st["timeouts"], "naks": st["naks_sent"], "reemits": eng.get("reemits", 0),
           "duplicates": eng.get("duplicates", 0), "behind_window": eng.get("behind_window", 0),
           "fast_retx_naks": eng.get("fast_retx", 0)}
    stats = getattr(fab, "backend_stats", None)
    if stats is not None:
        b = stats()
        out.update(rtl_cycles=b["cycles"], rtl_seconds=b["rtl_seconds"])
    close = getattr(fab, "close", None)
    if close is not None:
        close()
    return out


def rtl_main(a) -> dict:
    from netreduce.sim.rtl.fabric import engine_top, probe_rtl
    from netreduce.sim.rtl.fastsim import FastSim
    from netreduce.sim.rtl.soak_rtl import SoakRtlFabric, soak_params

    probe_rtl("verilator")
    params = soak_params(pmtu_max=max(1024, a.pmtu))
    top = engine_top(params)
    net = NetConfig()

    def rtl():
        return SoakRtlFabric(FastSim(top, seed=1), params, net, 1)

    def model():
        return ModelFabric(Engine(**params), net=net, seed=1)

    rows = []
    for t in [int(x) for x in a.timeouts.split(",")]:
        rto = ns_to_cycles(timeout_ns(t))
        base = {}
        for case, fr in [(c, False) for c in CASES] + [(c, True) for c in FAST_RETX_CASES]:
            row = {"rto_cycles": rto}
            for name, make in (("rtl", rtl), ("model", model)):
                r = one_loss(make, a.world, a.packets, a.pmtu, t, case, fast_retx=fr)
                if case == "none":
                    if r["timeouts"]:  # the RTO is shorter than the loss-free all-reduce
                        sys.exit(f"--timeouts {t}: RTO {rto} cycles, and the loss-free run on "
                                 f"the {name} timed out {r['timeouts']} times; use a larger "
                                 f"timeout")
                    base[name] = r["cycles"]
                r["extra_cycles"] = r["cycles"] - base[name]
                r["extra_rto"] = round(r["extra_cycles"] / rto, 3)
                row[name] = r
            rows.append({"case": case, "timeout": t, "fast_retx": fr, **row})
            r, m = row["rtl"], row["model"]
            label = case + (" +fast_retx" if fr else "")
            print(f"timeout {t} (RTO {rto} cycles) {label:29s} RTL {r['cycles']:7d} cycles "
                  f"(+{r['extra_cycles']:6d} = {r['extra_rto']:5.2f} RTO; timeouts "
                  f"{r['timeouts']}, NAKs {r['naks']} + {r['fast_retx_naks']} by the engine, "
                  f"re-emits {r['reemits']}, retx "
                  f"{r['retransmitted']}) model +{m['extra_cycles']} ({m['extra_rto']:.2f} RTO)"
                  f" exact {r['exact'] and m['exact']}", flush=True)
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "engine": {**params, "clock_hz": CLOCK_HZ},
            "world": a.world, "packets_per_rank": a.packets, "pmtu": a.pmtu,
            "lost_rank": LOSER, "network": "100 Gb/s links, 500 ns latency, no other loss",
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("model", "verilator"), default="model")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--kib", type=int, default=512, help="buffer per rank")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pmtu", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=8, help="QP timeout exponent")
    ap.add_argument("--packets", type=int, default=32, help="verilator: packets per rank")
    ap.add_argument("--timeouts", default="5,6", help="verilator: QP timeout exponents")
    a = ap.parse_args()
    p = Path(__file__).parent / "results" / "loss_cost.json"
    try:
        old = json.loads(p.read_text())
    except (OSError, ValueError):
        old = {}
    if a.backend == "verilator":
        p.write_text(json.dumps({**old, "verilator": rtl_main(a)}, indent=1) + "\n")
        return
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
    if "verilator" in old:
        out["verilator"] = old["verilator"]
    p.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
