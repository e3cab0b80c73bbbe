"""Flow roles of the aggregation control path (model decision D17, docs/spine-leaf.md).

The gateware side of :mod:`netreduce.sim.model.roles`: per-job role state latched at enable (a
leaf's UP and DOWN ranks, a spine's RACK ranks), the role of a looked-up flow, the stage mark
each role accepts, and the rank masks of a leaf's release commands (the partial to UP, the
total to the MEMBER ranks). :class:`~.decide.Decide` makes the per-frame role decisions and
:class:`~.release.ReleaseScheduler` runs a leaf's two in-order chains (partials, totals).
"""

from __future__ import annotations

from amaranth.hdl import Const, Mux, Signal

from netreduce.regmap import Role
from netreduce.wire.marks import MARK_PARTIAL, MARK_TOTAL

__all__ = ["MARK_PARTIAL", "MARK_TOTAL", "stage_mark", "JobRoles"]


def stage_mark(role):
    """The stage mark a data frame on a flow of ``role`` must carry: MARK_PARTIAL on RACK (a
    leaf's partial), MARK_TOTAL on DOWN (the spine's total), none on MEMBER / UP."""
    return Mux(role == Role.RACK, MARK_PARTIAL, Mux(role == Role.DOWN, MARK_TOTAL, 0))


class JobRoles:
    """Per-job role registers (flip-flops, one set per job) and what is derived from them.

    ``leaf`` (one UP and one DOWN flow), ``up`` / ``down`` (their ranks), ``rack`` (mask of the
    RACK ranks: a spine), ``upptr`` (the partial pointer, ``JOB.PARTIAL_PTR``), ``npend_up``
    (complete slots beyond it, out of order), ``chain_up`` (a chain of partials to send).
    """

    def __init__(self, jobs: int, rank_bits: int, max_world: int, w_bits: int, psn_bits: int):
        self.max_world = max_world

        def per_job(width, name):
            return [Signal(width, name=f"{name}{j}") for j in range(jobs)]

        self.leaf = per_job(1, "leaf")
        self.up = per_job(rank_bits, "up_rank")
        self.down = per_job(rank_bits, "down_rank")
        self.rack = per_job(max_world, "rack")
        self.upptr = per_job(psn_bits, "upptr")
        self.npend_up = per_job(w_bits, "npend_up")
        self.chain_up = per_job(1, "chain_up")

    def onehot(self, rank):
        return (Const(1, self.max_world) << rank)[:self.max_world]

    def any_roles(self, j):
        """Job ``j`` is a leaf or a spine (its data frames go through the stage mark check)."""
        return self.leaf[j] | self.rack[j].any()

    @staticmethod
    def role(rank, leaf, up, down, rack):
        """The role of ``rank`` of a job whose (selected) registers are given."""
        return Mux(leaf & (rank == up), Role.UP,
                   Mux(leaf & (rank == down), Role.DOWN,
                       Mux(rack.bit_select(rank, 1), Role.RACK, Role.MEMBER)))

    def masks(self, full, leaf, up, down):
        """(contributors, MEMBER ranks, UP) masks of a job with world mask ``full``: a leaf's
        contributors are every rank but DOWN, its members every rank but UP and DOWN."""
        down_b = Mux(leaf, self.onehot(down), 0)
        up_b = Mux(leaf, self.onehot(up), 0)
        cmask = full & ~down_b
        return cmask, cmask & ~up_b, up_b

    @staticmethod
    def results(n, leaf):
        """Results per released index: N, or a leaf's N - 2 MEMBER ranks."""
        return Mux(leaf, n - 2, n)
