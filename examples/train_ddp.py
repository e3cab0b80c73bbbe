"""Train a small MLP on scikit-learn's digits with DistributedDataParallel on CPU ranks.

The gradient all-reduce is NetReduce or gloo's own, with the same seed, data order and model, so
the loss curves can be compared:

* ``--backend netreduce``: ``init_process_group("netreduce")`` (the torch.distributed backend of
  :mod:`netreduce.sw_driver.torch_backend`), plain DDP with no hook: every gradient bucket is
  summed by the engine in the switch service, inside the ranks' RoCEv2 RC connections; the
  other collectives (DDP's parameter broadcast, the final check) go to gloo on the same store.
* ``--backend netreduce-hook``: a gloo process group and the DDP communication hook of
  :mod:`netreduce.sw_driver.torch` (only the gradient buckets use the engine).
* ``--backend gloo``: gloo's all-reduce.

::

    netreduce switch --listen 127.0.0.1:7000 &
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend netreduce --switch 127.0.0.1:7000
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend netreduce-hook
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend gloo

Data: the 1797 8x8 digit images that ship inside scikit-learn (no download), pixels scaled to
[0, 1], a fixed 80/20 split; each rank trains on its shard of the training set (the global batch
is ``--batch`` x world size). Rank 0 prints, per epoch, the loss over the whole training set, the
test accuracy and the mean wall time per training step; ``--json`` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def load_digits_split(seed: int = 0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = len(y) // 5
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["netreduce", "netreduce-hook", "gloo"],
                    default="netreduce")
    ap.add_argument("--switch", default="127.0.0.1:7000", help="the switch service, HOST:PORT")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="rank 0 writes the curve here")
    args = ap.parse_args()

    torch.set_num_threads(1)
    if args.backend == "netreduce":
        from netreduce.sw_driver import torch_backend  # registers the "netreduce" backend

        dist.init_process_group(torch_backend.BACKEND, timeout=timedelta(seconds=120),
                                pg_options=torch_backend.Options(switch=args.switch))
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr, xte, yte = load_digits_split(args.seed)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    ddp = DDP(model)
    comm = None
    if args.backend == "netreduce-hook":
        from netreduce.sw_driver import torch as nrt

        comm = nrt.init(args.switch)
        ddp.register_comm_hook(comm, nrt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    curve = []
    if rank == 0:
        nparams = sum(p.numel() for p in model.parameters())
        print(f"digits: {len(ytr)} train / {len(yte)} test, MLP 64-{args.hidden}-10 "
              f"({nparams} parameters), {world} ranks x batch {args.batch}, "
              f"all-reduce: {args.backend}", flush=True)
    for epoch in range(1, args.epochs + 1):
        # the same permutation on every rank; rank r takes every world-th sample of it
        order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(
            args.seed * 1000 + epoch))[rank::world]
        steps = len(order) // args.batch
        t_steps = 0.0
        model.train()
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            t0 = time.perf_counter()
            opt.zero_grad()
            lossf(ddp(xtr[idx]), ytr[idx]).backward()
            opt.step()
            t_steps += time.perf_counter() - t0
        if rank == 0:
            model.eval()
            with torch.no_grad():
                loss = float(lossf(model(xtr), ytr))
                acc = float((model(xte).argmax(1) == yte).float().mean())
            ms = 1e3 * t_steps / max(1, steps)
            curve.append({"epoch": epoch, "loss": loss, "test_acc": acc, "step_ms": ms})
            print(f"epoch {epoch:3d}  loss {loss:.6f}  test acc {acc:.4f}  step {ms:6.2f} ms",
                  flush=True)
    # every rank holds the same parameters: check it (gloo, outside training)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(every[0], e) for e in every)
    if rank == 0:
        print(f"parameters identical on all ranks: {same}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"backend": args.backend, "world": world, "batch": args.batch,
                           "epochs": args.epochs, "lr": args.lr, "seed": args.seed,
                           "curve": curve, "identical": same,
                           "command": "torchrun --nproc-per-node "
                                      f"{world} examples/train_ddp.py --backend {args.backend}"},
                          f, indent=1)
    if comm is not None:
        from netreduce.sw_driver import torch as nrt

        nrt.shutdown()
    dist.destroy_process_group()
    if not same:
        raise SystemExit(f"rank {rank}: parameters differ between ranks")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
