"""PyTorch binding: NetReduce all-reduce for tensors and a DDP communication hook.

Install with the ``[torch]`` extra. One process per rank (torchrun); a gloo process group is used
for the rendezvous and for exchanging QP/buffer information only (:func:`init` all-gathers a few
small dicts), never for gradients: every gradient byte crosses the engine in the switch service,
inside the ranks' RoCEv2 RC connections (:class:`~netreduce.sim.emu.rank.RankComm`).

Usage (every rank)::

    dist.init_process_group("gloo")                      # torchrun's env:// rendezvous
    comm = netreduce.sw_driver.torch.init("127.0.0.1:7000")
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(comm, netreduce.sw_driver.torch.allreduce_hook)
    ...
    netreduce.sw_driver.torch.shutdown()

:func:`allreduce_hook` sums each gradient bucket through the engine (float32 through the
exponent pass and fixed-point SUM, see :mod:`netreduce.sw_driver.quant`), divides by the world
size as DDP's default hook does, and returns an already completed ``torch.futures.Future`` (the
all-reduce runs synchronously in the hook: the driver loop needs this thread). float16/bfloat16
buckets travel as float32. Per element, the averaged gradient g differs from the float64 mean m
of the ranks' float32 gradients by at most ``2^(-e-1) + 2^-23 |g|`` where e is the chunk's shared
exponent: ``N * max|x| * 2^e < 2^31``, so roughly ``2^(-30 + ceil(log2 N)) * max|x|`` over the
chunk (a chunk is one message, 16384 elements by default).

Errors: a failed all-reduce (peer died, switch gone, timeout) is set on the returned future, so
DDP raises it from ``backward()``; the message names the rank and why (see
:class:`~netreduce.sim.emu.rank.CollectiveError`). The communicator is broken afterwards.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's return annotation at
# run time (it must be the object torch.futures.Future[torch.Tensor], not a string).
import numpy as np
import torch
import torch.distributed as dist
from netreduce.sim.emu.rank import CollectiveError, RankComm, RankCommConfig

__all__ = ["init", "get_comm", "allreduce", "allreduce_hook", "shutdown", "CollectiveError",
           "RankCommConfig"]

_default: RankComm | None = None


def init(switch, group=None, cfg: RankCommConfig | None = None, *, seed: int | None = None,
         mgmt: dict | None = None) -> RankComm:
    """Collective over ``group`` (default: the default process group, which must exist): connect
    this rank to the switch at ``switch`` ('HOST:PORT'), set up its QPs and (rank 0) the engine
    jobs; returns the communicator, also kept as the default for :func:`allreduce`."""
    global _default
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call "
                           "dist.init_process_group('gloo') first (torchrun sets the env)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def exchange(obj):
        out = [None] * world
        dist.all_gather_object(out, obj, group=group)
        return out

    comm = RankComm(switch, rank, world, exchange, cfg, seed=seed, mgmt=mgmt)
    _default = comm
    return comm


def get_comm() -> RankComm:
    if _default is None:
        raise RuntimeError("no NetReduce communicator: call netreduce.sw_driver.torch.init() "
                           "first")
    return _default


def _np_view(t: torch.Tensor) -> tuple[np.ndarray, torch.Tensor | None]:
    """(float32/int32 numpy view of a CPU tensor, or of a float32 copy; the copy or None)."""
    if t.device.type != "cpu":
        raise ValueError(f"NetReduce tensors must live on the CPU, got {t.device}")
    if t.dtype in (torch.float32, torch.int32) and t.is_contiguous():
        return t.detach().numpy(), None
    if t.dtype == torch.int32:
        c = t.detach().contiguous()
        return c.numpy(), c
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        c = t.detach().to(torch.float32).contiguous()
        return c.numpy(), c
    raise TypeError(f"dtype {t.dtype} not supported (float32/64/16, bfloat16 or int32)")


def allreduce(tensor: torch.Tensor, comm: RankComm | None = None,
              average: bool = False) -> torch.Tensor:
    """Sum (or average) ``tensor`` over every rank through the engine, in place; returns it.
    Collective: every rank calls it with a tensor of the same size and dtype. Floating tensors
    travel as float32 (within the bound in the module docstring); int32 tensors are summed
    bit-exactly (wrapping) and need ``RankCommConfig(int32=True)``."""
    comm = comm or get_comm()
    a, copy = _np_view(tensor)
    flat = a.reshape(-1)
    comm.allreduce(flat, out=flat)
    if average:
        if flat.dtype == np.int32:
            raise TypeError("average=True needs a floating-point tensor")
        flat /= np.float32(comm.world)
    if copy is not None:
        with torch.no_grad():
            tensor.copy_(copy.view_as(tensor))
    return tensor


def allreduce_hook(state: RankComm | None, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook (``ddp.register_comm_hook(comm, allreduce_hook)``): averages the
    bucket's gradients through the engine; the returned future is already complete (or carries
    the error)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    buf = bucket.buffer()
    try:
        allreduce(buf, state, average=True)
    except Exception as e:  # DDP raises it from backward()
        fut.set_exception(e)
        return fut
    fut.set_result(buf)
    return fut


def shutdown(comm: RankComm | None = None, barrier: bool = True) -> None:
    """Collective when ``barrier``: close the communicator (rank 0 removes the engine jobs)."""
    global _default
    comm = comm or _default
    if comm is None:
        return
    comm.close(barrier=barrier)
    if comm is _default:
        _default = None
