"""What every ring communicator shares, whatever carries its RC connections.

One rank per process; one persistent RC ring and engine job per operation: MAX for the
exponents and SUM_SAT for the fixed-point values of the float path, SUM_WRAP for int32.
:class:`netreduce.sw_driver.verbs.VerbsComm` (a real RNIC) and
:class:`netreduce.sim.emu.rank.RankComm` (the software RNIC through the switch service's tunnel)
differ only in their transport; the ring layout, the job registration, the argument checks and
the float path's quantisation live here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from . import quant
from .control import EngineControl, FlowConfig, JobConfig, Op

__all__ = ["check_rank", "make_rings", "share_jobs", "register_jobs", "check_allreduce_args",
           "reduce_segments"]


def check_rank(rank, world) -> None:
    """``world`` must be 2..255 ranks and ``rank`` one of them."""
    if not isinstance(world, int) or not 2 <= world <= 255:
        raise ValueError(f"world must be 2..255, got {world!r}")
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank must be 0..{world - 1}, got {rank!r}")


def make_rings(cfg, make: Callable, *, float32: bool = True, exp_bytes: int = 0) -> dict:
    """The rings of ``cfg``: ``make(name, op, window, margin, msg_packets, region_bytes)`` for
    the MAX ("exp") and SUM_SAT ("sum") rings when ``float32``, the SUM_WRAP ring ("int") when
    ``cfg.int32``. The exponent ring holds one exponent per chunk of ``cfg.max_bytes`` (at least
    ``exp_bytes``) and keeps a quarter of its window as margin."""
    ce = cfg.chunk_elems
    nchunks = -(-(cfg.max_bytes // 4) // ce)
    ew = cfg.exp_window
    rings = {}
    if float32:
        rings["exp"] = make("exp", Op.MAX, ew, ew // 4, min(cfg.msg_packets, ew - ew // 4),
                            max(4 * nchunks, exp_bytes))
        rings["sum"] = make("sum", Op.SUM_SAT, cfg.window, cfg.margin, cfg.msg_packets,
                            cfg.max_bytes)
    if cfg.int32:
        rings["int"] = make("int", Op.SUM_WRAP, cfg.window, cfg.margin, cfg.msg_packets,
                            cfg.max_bytes)
    return rings


def share_jobs(rank: int, exchange: Callable[[object], list],
               register: Callable[[], dict[str, int]], error: type[Exception]) -> dict[str, int]:
    """Collective: rank 0 calls ``register()``; every rank gets its ring -> job map, or raises
    ``error`` with rank 0's failure (every rank must learn about it, not only rank 0)."""
    status = {"ok": True, "jobs": {}}
    if rank == 0:
        try:
            status["jobs"] = register()
        except Exception as e:
            status = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    status = exchange(status)[0]
    if not status["ok"]:
        raise error(f"rank {rank}: rank 0 could not register the engine jobs: "
                    f"{status['error']}")
    return status["jobs"]


def register_jobs(ctrl: EngineControl, rings: Mapping, peers: list[dict], pmtu: int,
                  busy_hint: str = "") -> dict[str, int]:
    """Register one engine job per ring (``.window``, ``.op``) on a free job index. ``peers``:
    every rank's ``{"ip": ..., "rings": {name: {"sq", "rq", "sq_psn"}}}`` in rank order; rank r
    forwards to its successor's receive QP. On any failure the jobs added so far are removed."""
    info = ctrl.identify()
    if pmtu > info.pmtu_max:
        raise ValueError(f"pmtu {pmtu} exceeds the engine's pmtu_max {info.pmtu_max}")
    n = len(peers)
    jobs: dict[str, int] = {}
    try:
        for k, ring in rings.items():
            used = set(ctrl.enabled_jobs())
            free = [j for j in range(info.jobs) if j not in used]
            if not free:
                raise RuntimeError(f"all {info.jobs} engine jobs are in use{busy_hint}")
            flows = []
            for r in range(n):
                me, nx = peers[r], peers[(r + 1) % n]
                flows.append(FlowConfig(rank=r, fwd_ip=me["ip"], fwd_qpn=nx["rings"][k]["rq"],
                                        rev_ip=nx["ip"], rev_qpn=me["rings"][k]["sq"],
                                        start_psn=me["rings"][k]["sq_psn"]))
            ctrl.add_job(JobConfig(job=free[0], world=n, window=ring.window,
                                   slot_base=ctrl.alloc_slots(ring.window), pmtu=pmtu,
                                   op=ring.op, flows=flows))
            jobs[k] = free[0]
    except BaseException:
        for j in jobs.values():
            ctrl.remove_job(j)
        raise
    return jobs


def check_allreduce_args(x: np.ndarray, out: np.ndarray | None, rings: Mapping,
                         cfg_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(a, out, o)``: ``x`` flattened (contiguous), the result array (``out`` or a new one)
    and its flat view. float32 needs the "sum" ring, int32 the "int" ring (``cfg_name`` names the
    config knob in the error); ``out`` must match ``x`` in size and dtype."""
    a = np.ascontiguousarray(x).reshape(-1)
    if a.dtype not in (np.float32, np.int32):
        raise TypeError(f"dtype {a.dtype} not supported (float32 or int32)")
    if a.dtype == np.int32 and "int" not in rings:
        raise TypeError(f"int32 all-reduce needs {cfg_name}(int32=True)")
    if a.dtype == np.float32 and "sum" not in rings:
        raise TypeError(f"float32 all-reduce needs {cfg_name}(float32=True)")
    if out is None:
        out = np.empty_like(a)
    o = out.reshape(-1)
    if o.shape != a.shape or o.dtype != a.dtype:
        raise ValueError(f"out is {o.dtype}{list(o.shape)}, need {a.dtype}{list(a.shape)}")
    return a, out, o


def reduce_segments(comm, a: np.ndarray, o: np.ndarray) -> None:
    """All-reduce the flat array ``a`` into ``o`` in segments of ``comm.cfg.max_bytes`` through
    ``comm.rings`` (``.reduce(bytes) -> bytes``): int32 through the "int" ring; float32 as chunk
    exponents through "exp" (MAX), then the fixed-point values through "sum", then dequantised.
    Each float segment's scales go to ``comm.last_exponents`` (for :func:`quant.error_bound`)."""
    rings, ce = comm.rings, comm.cfg.chunk_elems
    seg = comm.cfg.max_bytes // 4
    for s in range(0, a.size, seg):
        part = a[s:s + seg]
        if a.dtype == np.int32:
            o[s:s + seg] = rings["int"].reduce(part.view(np.uint8)).view(np.int32)
        else:
            exps = quant.chunk_exponents(part, ce)
            gexp = rings["exp"].reduce(exps.view(np.uint8)).view(np.int32)
            e = quant.scales(gexp, comm.world)
            comm.last_exponents = e
            res = rings["sum"].reduce(quant.quantize(part, e, ce).view(np.uint8))
            quant.dequantize(res.view(np.int32), e, ce, out=o[s:s + seg])
