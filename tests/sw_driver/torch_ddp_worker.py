"""One rank of the DDP hook tests (launched like torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT).

Phase 1 ("steps"): a few SGD steps of a small MLP under DistributedDataParallel with the NetReduce
hook. Each step also computes the rank's local gradient on an undistributed replica and gathers
those through gloo (for the check only), then saves local gradients and the hook's averaged
gradients to OUT/rank<r>.npz. Phase 2 ("death"): rank 1 exits abruptly; rank 0 runs another
backward and records the error it gets (OUT/rank0.json). Not a test module itself.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(out: str) -> None:
    from netreduce.sw_driver import torch as nrt

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    # 5 x 268 ms of patience: enough for a loaded machine, short for the dead-rank phase
    cfg = nrt.RankCommConfig(timeout=16, retry_cnt=4, op_timeout_s=60, int32=True)
    comm = nrt.init(os.environ["NETREDUCE_SWITCH"], cfg=cfg, seed=rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 10))
    replica = copy.deepcopy(model)
    ddp = DDP(model)
    ddp.register_comm_hook(comm, nrt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    lossf = nn.CrossEntropyLoss()
    local, hooked = [], []
    for step in range(3):
        g = torch.Generator().manual_seed(1000 * step + rank)
        # ranks see differently scaled inputs, so their gradients differ in magnitude
        x = torch.randn(32, 20, generator=g) * (1 + 3 * rank)
        y = torch.randint(0, 10, (32,), generator=g)
        replica.load_state_dict(model.state_dict())
        replica.zero_grad()
        lossf(replica(x), y).backward()
        mine = torch.cat([p.grad.reshape(-1) for p in replica.parameters()])
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)  # gloo: for the check only, not for training
        local.append(torch.stack(every).numpy())
        opt.zero_grad()
        lossf(ddp(x), y).backward()
        hooked.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy())
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    # the plain tensor API: float (a non-contiguous view, bfloat16) and int32
    f = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (rank + 1)
    fv = nrt.allreduce(f.t())  # a transposed view: reduced through a copy, written back
    b = nrt.allreduce(torch.full((5,), 0.5 * (rank + 1), dtype=torch.bfloat16), average=True)
    i = nrt.allreduce(torch.tensor([2**31 - 1, -7, rank], dtype=torch.int32))
    np.savez(os.path.join(out, f"rank{rank}.npz"), local=np.array(local),
             hooked=np.array(hooked), params=params.numpy(), f=f.numpy(),
             fv_is_view=np.array(fv.data_ptr() == f.data_ptr()),
             b=b.to(torch.float32).numpy(), i=i.numpy())
    stats = comm.qp_stats()
    dist.barrier()
    # ---- phase 2: rank 1 dies; rank 0 must get a clear error, not hang
    if rank == 1:
        os._exit(3)
    time.sleep(0.2)
    t0 = time.monotonic()
    err = None
    try:
        opt.zero_grad()
        lossf(ddp(x), y).backward()
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    res = {"error": err, "seconds": time.monotonic() - t0, "qp_stats": stats}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    os._exit(0)  # the gloo group lost a member: do not wait in its destructor


if __name__ == "__main__":
    main(sys.argv[1])
