"""One job across racks: programming a leaf engine per rack and a spine engine (docs/spine-leaf.md).

:class:`SpineLeafControl` turns the ring flows of one all-reduce (rank r's send QP to rank r+1,
as :mod:`netreduce.sim.net.collective` and :mod:`.ring_comm` connect them) into one job per engine:

* leaf a: every flow whose sender is in rack a (``MEMBER`` if its receiver is too, ``UP`` for the
  one that leaves the rack) and the flow that enters rack a (``DOWN``);
* spine: the R flows that cross racks, each as a ``RACK`` contributor.

Racks must hold consecutive ranks of the ring (exactly one flow leaves and one enters each
rack); :class:`ConfigError` names the rack otherwise. Every engine's job is validated before the
first register write of any engine; if an engine refuses its job, the jobs already added are
removed again.

The simulation's collective uses it through
:class:`netreduce.sim.net.spine_leaf.RackCommunicator`. Imports only the driver's own modules
(layering).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .control import ConfigError, EngineControl, FlowConfig, JobConfig, Op, Role

__all__ = ["SpineLeafControl", "rack_flows"]


def rack_flows(flows: Sequence[FlowConfig], rack_of: Sequence[int]) -> list[list[FlowConfig]]:
    """The flow entries of each engine (leaves in rack order, then the spine), ranks renumbered
    0.. per engine, roles set. ``flows[r]`` is rank r's ring flow to rank r+1 (mod N)."""
    n = len(flows)
    if len(rack_of) != n:
        raise ConfigError(f"rack_of has {len(rack_of)} entries for {n} flows")
    racks = sorted(set(rack_of))
    if racks != list(range(len(racks))) or len(racks) < 2:
        raise ConfigError(f"racks {racks} must be 0..R-1 with R >= 2")
    by_rank = sorted(flows, key=lambda f: f.rank)
    if [f.rank for f in by_rank] != list(range(n)):
        raise ConfigError(f"flow ranks {[f.rank for f in by_rank]} are not 0..{n - 1}")
    leaves: list[list[FlowConfig]] = [[] for _ in racks]
    spine: list[FlowConfig] = []
    ups = [0] * len(racks)
    for f in by_rank:
        a, b = rack_of[f.rank], rack_of[(f.rank + 1) % n]
        if a == b:
            leaves[a].append(replace(f, rank=len(leaves[a]), role=Role.MEMBER))
            continue
        ups[a] += 1
        leaves[a].append(replace(f, rank=len(leaves[a]), role=Role.UP))
        leaves[b].append(replace(f, rank=len(leaves[b]), role=Role.DOWN))
        spine.append(replace(f, rank=len(spine), role=Role.RACK))
    for a, u in enumerate(ups):
        if u != 1:
            raise ConfigError(f"rack {a}: {u} ring flows leave it; spine-leaf needs exactly one "
                              "(racks of consecutive ranks)")
    return leaves + [spine]


class SpineLeafControl:
    """Several engines (``leaves`` in rack order, then ``spine``) programmed for one job."""

    def __init__(self, leaves: Sequence[EngineControl], spine: EngineControl):
        if len(leaves) < 2:
            raise ConfigError(f"spine-leaf needs at least 2 leaf engines, got {len(leaves)}")
        self.leaves = list(leaves)
        self.spine = spine
        self.engines = self.leaves + [spine]

    def add_job(self, flows: Sequence[FlowConfig], rack_of: Sequence[int], window: int,
                pmtu: int, op: Op, **job_kw) -> list[int]:
        """Add the job on every engine; returns the job id per engine (:attr:`engines` order)."""
        per = rack_flows(flows, rack_of)
        cfgs = []
        for ctrl, fl in zip(self.engines, per, strict=True):
            used = set(ctrl.enabled_jobs())
            free = [j for j in range(ctrl.info.jobs) if j not in used]
            if not free:
                raise ConfigError(f"all {ctrl.info.jobs} jobs of an engine are in use")
            cfg = JobConfig(job=free[0], world=len(fl), window=window,
                            slot_base=ctrl.alloc_slots(window), pmtu=pmtu, op=op, flows=fl,
                            **job_kw)
            ctrl.validate(cfg)
            cfgs.append(cfg)
        done: list[tuple[EngineControl, int]] = []
        try:
            for ctrl, cfg in zip(self.engines, cfgs, strict=True):
                ctrl.add_job(cfg)
                done.append((ctrl, cfg.job))
        except BaseException:
            for ctrl, j in done:
                ctrl.remove_job(j)
            raise
        return [c.job for c in cfgs]

    def remove_job(self, jobs: Sequence[int]) -> None:
        for ctrl, j in zip(self.engines, jobs, strict=True):
            ctrl.remove_job(j)

    def slots_in_use(self, jobs: Sequence[int] | None = None) -> int:
        if jobs is None:
            return sum(c.slots_in_use() for c in self.engines)
        return sum(c.slots_in_use(j) for c, j in zip(self.engines, jobs, strict=True))

    def counters(self, jobs: Sequence[int]) -> list[dict[str, int]]:
        """Each engine's job counters (:attr:`engines` order)."""
        return [c.counters(j) for c, j in zip(self.engines, jobs, strict=True)]
