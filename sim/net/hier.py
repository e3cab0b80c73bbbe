"""Hierarchical all-reduce for H hosts of G devices each: the paper's "parallel all-reduce".

1. *Intra-host reduce-scatter*: device k of every host ends up with shard k (the k-th of G
   contiguous, element-aligned pieces) summed over the host's G devices. On a real host this is
   NVLink / PCIe traffic (NCCL's reduce-scatter); here it is computed in place, and its time is
   the intra-host link model: G-1 ring steps of S/G bytes at ``intra_gbps`` plus
   ``intra_step_ns`` each.
2. *Inter-host all-reduce through the engine*: the G shards are G jobs over the H hosts' NICs
   (one RNIC per host, ``comm`` has H ranks): a striped all-reduce (:mod:`.stripe`) with one
   stripe per shard, each its own job, QP ring and engine port (or engine).
3. *Intra-host all-gather*: every device receives the G reduced shards; timed like step 1.

int32 sums wrap (two's complement) at every step, so the result is bit-exact against the sum
over all H x G devices. float32: the host sums are float32 sums in device order, then the
engine's quantised sum (its error bound applies to the host sums).

"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .collective import Communicator, run
from .stripe import stripe_bounds, striped_allreduce_async

__all__ = ["intra_phase_ns", "HierarchicalResult", "hierarchical_allreduce"]


def intra_phase_ns(devices: int, nbytes: int, intra_gbps: float, step_ns: float = 1000.0):
    """One intra-host reduce-scatter or all-gather (ring over the G devices): G-1 steps of S/G
    bytes at ``intra_gbps`` plus ``step_ns`` each; 0 for one device."""
    if not intra_gbps > 0:
        raise ValueError(f"intra_gbps must be > 0, got {intra_gbps!r}")
    if devices <= 1:
        return 0.0
    return (devices - 1) * (nbytes * 8 / (devices * intra_gbps) + step_ns)


class HierarchicalResult:
    """``results[h][k]``: device k of host h's output; ``*_ns``: the phases' times (the inter
    phase simulated on the fabric's clock), ``total_ns`` their sum; ``inter``: the striped
    all-reduce's own result (stats, error bound)."""

    def __init__(self, results, intra_rs_ns, inter_ns, intra_ag_ns, inter):
        self.results = results
        self.intra_rs_ns, self.inter_ns, self.intra_ag_ns = intra_rs_ns, inter_ns, intra_ag_ns
        self.total_ns = intra_rs_ns + inter_ns + intra_ag_ns
        self.inter = inter


def hierarchical_allreduce(comm: Communicator, arrays: Sequence[Sequence[np.ndarray]],
                           intra_gbps: float, intra_step_ns: float = 1000.0,
                           buses: Sequence | None = None,
                           timeout_ns: int | None = None) -> HierarchicalResult:
    """All-reduce ``arrays[h][k]`` (host h, device k; equal shapes, int32 or float32) over the
    ``comm.world`` hosts; runs the fabric's event loop for the inter-host phase."""
    h = comm.world
    if len(arrays) != h:
        raise ValueError(f"need the devices of {h} hosts, got {len(arrays)}")
    g = len(arrays[0])
    if g < 1 or any(len(d) != g for d in arrays):
        raise ValueError(f"every host needs the same number (>= 1) of devices, got "
                         f"{[len(d) for d in arrays]}")
    first = np.asarray(arrays[0][0])
    dt, shape = first.dtype, first.shape
    if dt not in (np.int32, np.float32):
        raise TypeError(f"dtype {dt} not supported (int32 or float32)")
    for hi, devs in enumerate(arrays):
        for k, a in enumerate(devs):
            a = np.asarray(a)
            if a.dtype != dt or a.shape != shape:
                raise ValueError(f"host {hi} device {k}: {a.dtype}{list(a.shape)} differs from "
                                 f"host 0 device 0's {dt}{list(shape)}")
    n = first.size
    stripe_bounds(n, g)  # every shard needs an element
    # 1. reduce-scatter inside each host: the host sum, shard k held by device k
    host = []
    for devs in arrays:
        acc = np.array(devs[0], dtype=dt).reshape(-1).copy()
        for a in devs[1:]:
            acc += np.asarray(a, dtype=dt).reshape(-1)  # int32 wraps, as the engine's SUM_WRAP
        host.append(acc)
    nbytes = n * first.itemsize
    rs = intra_phase_ns(g, nbytes, intra_gbps, intra_step_ns)
    # 2. the G shards across the hosts: one stripe (job) per shard
    fab = comm.fabric
    t0 = fab.now()
    op = (striped_allreduce_async(comm, host, g, buses=buses) if g > 1 or buses
          else comm.allreduce_async(host))
    run(fab, [op], timeout_ns=timeout_ns or comm.cfg.sim_timeout_ns)
    inter = op.result()
    inter_ns = fab.now() - t0
    # 3. all-gather inside each host: every device gets every reduced shard
    results = [[inter.results[hi].reshape(shape).copy() for _ in range(g)] for hi in range(h)]
    ag = intra_phase_ns(g, nbytes, intra_gbps, intra_step_ns)
    return HierarchicalResult(results, rs, float(inter_ns), ag, inter)
