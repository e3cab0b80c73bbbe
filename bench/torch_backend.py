"""Per-call cost of ``dist.all_reduce`` on the NetReduce torch.distributed backend against gloo.

``--ranks`` CPU ranks (torch.multiprocessing, spawn) share one process group of each backend:
``init_process_group("netreduce")`` (every all-reduce through the engine in a switch service in
this process, reference model) and a gloo group on the same store. For each message size every
rank times ``dist.all_reduce`` of a float32 tensor (SUM) on both, interleaved, after a warm-up;
the median over the iterations of the slowest rank's time is reported (a collective ends when the
last rank has its result). ``overhead_ms`` = NetReduce - gloo.

    python bench/torch_backend.py            # 2 ranks -> bench/results/torch_backend.json
    python bench/torch_backend.py --ranks 4 --local-size 2   # 2 emulated hosts: the hierarchy

On the 2-core CI machine the engine path is Python end to end (software RNIC, switch, engine
model) and every cross-process loopback send costs a wake-up: the figures are the software
path's cost, not the engine's (docs/torch.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 256, 4096, 65536, 1 << 20)


def _rank(rank: int, world: int, cfg: dict) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from netreduce.sw_driver import torch_backend

    torch.set_num_threads(1)
    if cfg["local_size"]:
        os.environ["NETREDUCE_LOCAL_SIZE"] = str(cfg["local_size"])
    store = dist.TCPStore("127.0.0.1", cfg["store_port"], world, rank == 0,
                          timeout=timedelta(seconds=120))
    dist.init_process_group(torch_backend.BACKEND, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=300),
                            pg_options=torch_backend.Options(switch=cfg["switch"]))
    gloo = dist.new_group(backend="gloo")
    out = []
    for n in cfg["sizes"]:
        t = torch.ones(n)
        times = {"netreduce": [], "gloo": []}
        for it in range(cfg["warmup"] + cfg["iters"]):
            for name, grp in (("netreduce", None), ("gloo", gloo)):
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                dist.all_reduce(t, group=grp)
                dt = time.perf_counter() - t0
                if it >= cfg["warmup"]:
                    times[name].append(dt)
        out.append({k: v for k, v in times.items()})
    # the slowest rank per iteration
    every = [None] * world
    dist.all_gather_object(every, out, group=gloo)
    if rank == 0:
        rows = []
        for i, n in enumerate(cfg["sizes"]):
            row = {"elements": n, "bytes": 4 * n}
            for name in ("netreduce", "gloo"):
                per_it = np.max([every[r][i][name] for r in range(world)], axis=0)
                row[f"{name}_ms"] = round(1e3 * statistics.median(per_it), 3)
            row["overhead_ms"] = round(row["netreduce_ms"] - row["gloo_ms"], 3)
            row["ratio"] = round(row["netreduce_ms"] / row["gloo_ms"], 2)
            row["netreduce_mbit_per_s"] = round(8 * 4 * n / row["netreduce_ms"] / 1e3, 2)
            rows.append(row)
        Path(cfg["out"]).write_text(json.dumps(rows))
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--local-size", type=int, default=0,
                    help="emulate hosts of this many ranks (the hierarchical path)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="float32 elements per all-reduce, comma-separated")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "torch_backend.json"))
    args = ap.parse_args()
    import torch.multiprocessing as mp
    from netreduce.sim.emu.switch import SwitchThread

    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = Path(args.out).with_suffix(".rows.tmp")
    t0 = time.monotonic()
    with SwitchThread() as sw:
        cfg = dict(switch=sw.url, store_port=_free_port(), sizes=sizes, iters=args.iters,
                   warmup=args.warmup, local_size=args.local_size, out=str(tmp))
        mp.start_processes(_rank, args=(args.ranks, cfg), nprocs=args.ranks, join=True,
                           start_method="spawn")
        counters = sw.counters()
    rows = json.loads(tmp.read_text())
    tmp.unlink()
    cmd = " ".join(["python bench/torch_backend.py", *sys.argv[1:]])
    res = {"bench": "torch_backend", "command": cmd, "ranks": args.ranks,
           "local_size": args.local_size, "cpus": os.cpu_count(),
           "load_1min": round(os.getloadavg()[0], 2), "switch": "model (in-process thread)",
           "iters": args.iters, "wall_s": round(time.monotonic() - t0, 1), "sizes": rows,
           "engine_saturations": counters.get("engine.saturations", 0)}
    path = Path(args.out)
    old = json.loads(path.read_text()) if path.exists() else {}
    key = f"ranks{args.ranks}" + (f"_local{args.local_size}" if args.local_size else "")
    old[key] = res
    path.write_text(json.dumps(old, indent=1) + "\n")
    print(f"{'elements':>9} {'netreduce ms':>13} {'gloo ms':>9} {'overhead ms':>12} {'x':>6}")
    for r in rows:
        print(f"{r['elements']:>9} {r['netreduce_ms']:>13.3f} {r['gloo_ms']:>9.3f} "
              f"{r['overhead_ms']:>12.3f} {r['ratio']:>6.1f}")
    print(f"wrote {path} [{key}]")


if __name__ == "__main__":
    main()
