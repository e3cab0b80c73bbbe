"""Ranks of the torch.distributed backend tests (tests/sw_driver/test_torch_backend.py), started by
``torch.multiprocessing`` (spawn). Each rank runs one scenario against the switch at
``cfg["switch"]`` and pickles what it saw to ``OUT/rank<r>.pkl``; the test checks it. Inputs are
generated from (seed, rank), so every rank (and the test) can rebuild every rank's inputs.
Not a test module itself.
"""

from __future__ import annotations

import copy
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SEG = 64 << 10  # max_bytes of the flat scenario: a 100k-element all-reduce crosses 7 segments
CHUNK = 16 * 1024 // 4  # quantisation chunk: one 16-packet message of int32


def inputs(rank: int) -> dict[str, np.ndarray]:
    """This rank's inputs for the SUM and MAX checks (deterministic per rank)."""
    g = np.random.default_rng(1234 + rank)
    big = (g.standard_normal(100_003) * (1 + 3 * rank)).astype(np.float32)
    big[5000:9000] *= 1e-6  # a chunk of small values: its own exponent
    return {
        "big": big,
        "bf16": g.standard_normal(999).astype(np.float32),
        "f16": (g.standard_normal(777) * 4).astype(np.float32),
        "mx": g.standard_normal(3000).astype(np.float32),
        "mx64": g.standard_normal(300),
        "i64": g.integers(-(2**62), 2**62, 500, dtype=np.int64),
    }


def _err(fn) -> str | None:
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return None


def flat(rank: int, world: int, cfg: dict, pg) -> dict:
    from netreduce.sw_driver.torch_backend import Options, ProcessGroupNetReduce

    res: dict = {"backend_name": dist.get_backend()}
    mine = inputs(rank)
    # ---- dtypes and ops
    t = torch.from_numpy(mine["big"].copy())
    dist.all_reduce(t)
    res["big"] = t.numpy()
    b = torch.from_numpy(mine["bf16"]).to(torch.bfloat16)
    dist.all_reduce(b)
    res["bf16_sum"] = b.float().numpy()
    h = torch.from_numpy(mine["f16"]).to(torch.float16)
    dist.all_reduce(h, op=dist.ReduceOp.AVG)
    res["f16_avg"] = h.float().numpy()
    i32 = torch.tensor([2**31 - 1, -(2**31), 7 * rank, -3], dtype=torch.int32)
    dist.all_reduce(i32)
    res["i32"] = i32.numpy()
    i64 = torch.from_numpy(mine["i64"].copy())
    dist.all_reduce(i64)
    res["i64"] = i64.numpy()
    i64w = torch.tensor([2**63 - 1, -(2**63), rank], dtype=torch.int64)
    dist.all_reduce(i64w)
    res["i64w"] = i64w.numpy()
    i8 = torch.tensor([100, -100, rank], dtype=torch.int8)
    dist.all_reduce(i8)
    res["i8"] = i8.numpy()
    avg_i = torch.tensor([7 * (rank + 1), -7 * (rank + 1), 1], dtype=torch.int32)
    dist.all_reduce(avg_i, op=dist.ReduceOp.AVG)
    res["avg_i"] = avg_i.numpy()
    mx = torch.from_numpy(mine["mx"].copy())
    if rank == 1:
        mx[7] = float("nan")
        mx[8] = float("inf")
    mx[9] = -0.0 if rank else -1e-30
    mn = mx.clone()
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    dist.all_reduce(mn, op=dist.ReduceOp.MIN)
    res["max"], res["min"] = mx.numpy(), mn.numpy()
    m64 = torch.from_numpy(mine["mx64"].copy())
    n64 = m64.clone()
    dist.all_reduce(m64, op=dist.ReduceOp.MAX)
    dist.all_reduce(n64, op=dist.ReduceOp.MIN)
    res["max64"], res["min64"] = m64.numpy(), n64.numpy()
    e64 = torch.tensor([2**63 - 1 - rank, -(2**63) + rank, (rank << 32) - 1], dtype=torch.int64)
    f64 = e64.clone()
    dist.all_reduce(e64, op=dist.ReduceOp.MAX)
    dist.all_reduce(f64, op=dist.ReduceOp.MIN)
    res["imax64"], res["imin64"] = e64.numpy(), f64.numpy()
    bm = torch.tensor([0.5, -2.0, rank], dtype=torch.bfloat16)
    dist.all_reduce(bm, op=dist.ReduceOp.MAX)
    res["bf16_max"] = bm.float().numpy()
    # ---- contiguity: a transposed view and a strided slice are reduced in place
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (rank + 1)
    view = base.t()
    dist.all_reduce(view)
    res["view_base"] = base.numpy()
    strided = torch.arange(10, dtype=torch.int32) * (rank + 1)
    dist.all_reduce(strided[::3])
    res["strided"] = strided.numpy()
    res["empty"] = _err(lambda: dist.all_reduce(torch.empty(0)))
    # ---- async: queued in order, waited in reverse; futures carry the tensors
    ts = [torch.full((1000 * (k + 1),), float(k + rank)) for k in range(4)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    fut = works[0].get_future()
    for w in reversed(works):
        w.wait()
    res["async"] = [float(x[0]) for x in ts]
    res["future"] = float(fut.value()[0][0])
    # ---- errors
    res["err_product"] = _err(lambda: dist.all_reduce(torch.ones(3),
                                                      op=dist.ReduceOp.PRODUCT))
    res["err_bxor"] = _err(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                                   op=dist.ReduceOp.BXOR))
    res["err_f64"] = _err(lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64)))
    # ---- delegated to gloo
    x = torch.tensor([float(rank)])
    dist.broadcast(x, src=world - 1)
    res["bcast"] = float(x)
    ag = torch.empty(world)
    dist.all_gather_single(ag, torch.tensor([float(rank * 10)]))
    res["ag"] = ag.numpy()
    rs = torch.empty(1)
    dist.reduce_scatter_single(rs, torch.arange(world, dtype=torch.float32) + rank)
    res["rs"] = float(rs)
    a2a = torch.empty(world)
    dist.all_to_all_single(a2a, torch.arange(world, dtype=torch.float32) + 100 * rank)
    res["a2a"] = a2a.numpy()
    red = torch.tensor([float(rank + 1)])
    dist.reduce(red, dst=0, op=dist.ReduceOp.PRODUCT)
    res["reduce"] = float(red)
    ob = [None]
    dist.broadcast_object_list(ob if rank else [{"k": 1}], src=0)
    res["obj"] = ob[0] if rank else {"k": 1}
    # ---- DDP without a hook: gradients are the engine's average
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 10))
    replica = copy.deepcopy(model)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    lossf = nn.CrossEntropyLoss()
    local, avg = [], []
    for step in range(2):
        g = torch.Generator().manual_seed(1000 * step + rank)
        xb = torch.randn(32, 20, generator=g) * (1 + 3 * rank)
        yb = torch.randint(0, 10, (32,), generator=g)
        replica.load_state_dict(model.state_dict())
        replica.zero_grad()
        lossf(replica(xb), yb).backward()
        mine_g = torch.cat([p.grad.reshape(-1) for p in replica.parameters()])
        every = torch.empty(world * mine_g.numel())
        dist.all_gather_single(every, mine_g)  # gloo: for the check only
        local.append(every.reshape(world, -1).numpy())
        opt.zero_grad()
        lossf(ddp(xb), yb).backward()
        avg.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy())
        opt.step()
    res["ddp_local"], res["ddp_avg"] = np.array(local), np.array(avg)
    res["ddp_params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    res["qp"] = pg.comm.qp_stats()
    # ---- the switch is not there (a second process group, pointed at a closed port)
    t0 = time.monotonic()
    res["err_no_switch"] = _err(lambda: ProcessGroupNetReduce(
        dist.PrefixStore("bad/", cfg["store"]), rank, world, timedelta(seconds=30),
        Options(switch=f"127.0.0.1:{cfg['closed_port']}", connect_timeout_s=0.5,
                init_timeout_s=20)))
    res["no_switch_s"] = time.monotonic() - t0
    dist.barrier()
    # ---- the last rank dies; the others get a clear error, not a hang
    if rank == world - 1:
        _save(cfg, rank, res)
        os._exit(3)
    time.sleep(0.3)
    t0 = time.monotonic()
    res["err_dead"] = _err(lambda: dist.all_reduce(torch.ones(5000)))
    res["dead_s"] = time.monotonic() - t0
    res["err_after"] = _err(lambda: dist.all_reduce(torch.ones(5)))
    return res


def hierarchical(rank: int, world: int, cfg: dict, pg) -> dict:
    mine = inputs(rank)
    res = {"local_size": pg.local_size, "comm_world": pg.comm.world, "jobs": pg.comm.jobs,
           "hosts": pg.hosts}
    t = torch.from_numpy(mine["bf16"].copy())  # 999 elements: not a multiple of L
    dist.all_reduce(t)
    res["sum"] = t.numpy()
    i64 = torch.from_numpy(mine["i64"].copy())
    dist.all_reduce(i64)
    res["i64"] = i64.numpy()
    mx = torch.from_numpy(mine["mx"].copy())
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    res["max"] = mx.numpy()
    a = torch.full((7,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    res["avg"] = a.float().numpy()
    res["qp"] = pg.comm.qp_stats()
    return res


def rtl(rank: int, world: int, cfg: dict, pg) -> dict:
    t = torch.arange(300, dtype=torch.float32) * (rank + 1) - 100.5
    dist.all_reduce(t)
    m = torch.tensor([1.5, -3.0, float(rank), -float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return {"sum": t.numpy(), "max": m.numpy(),
            "err_int": _err(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32)))}


def _save(cfg: dict, rank: int, res: dict) -> None:
    with open(os.path.join(cfg["out"], f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)


def main(rank: int, world: int, cfg: dict) -> None:
    """``torch.multiprocessing.start_processes`` entry: one rank of ``cfg["scenario"]``."""
    from netreduce.sim.emu.rank import RankCommConfig
    from netreduce.sw_driver.torch_backend import Options

    torch.set_num_threads(1)
    os.environ.update(cfg.get("env", {}))
    try:
        store = dist.TCPStore("127.0.0.1", cfg["store_port"], world, rank == 0,
                              timeout=timedelta(seconds=60))
        cfg["store"] = store
        comm = RankCommConfig(window=128, margin=64, msg_packets=16, exp_window=128,
                              max_bytes=SEG,
                              exp_bytes=SEG // 4, int32=cfg.get("ints", True),
                              timeout=cfg.get("rc_timeout", 16), retry_cnt=4,
                              op_timeout_s=cfg.get("op_timeout_s", 60))
        dist.init_process_group(cfg["backend"], store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=60),
                                pg_options=Options(switch=cfg["switch"], comm=comm, seed=rank))
        pg = dist.distributed_c10d._get_default_group()
        res = globals()[cfg["scenario"]](rank, world, cfg, pg)
        res["backend_name"] = dist.get_backend()
    except BaseException:  # noqa: BLE001 (reported to the test)
        res = {"crash": traceback.format_exc()}
    _save(cfg, rank, res)
    sys.stdout.flush()
    if cfg["scenario"] == "flat" or "crash" in res:
        os._exit(0)  # a peer died: do not wait in the process group's destructor
    dist.destroy_process_group()
