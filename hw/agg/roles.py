"""Flow roles of the aggregation control path (model decision D17, docs/spine-leaf.md).

The gateware side of :mod:`netreduce.sim.model.roles`: per-job role state latched at enable (a
leaf's UP and DOWN ranks, a spine's RACK ranks), the role of a looked-up flow, the stage mark
each role accepts, and the rank masks of a leaf's release commands (the partial to UP, the
total to the MEMBER ranks). :class:`~.decide.Decide` makes the per-frame role decisions and
:class:`~.release.ReleaseScheduler` runs a leaf's two in-order chains (partials, totals).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Mux, Signal
from amaranth.lib import data

from netreduce.regmap import Role
from netreduce.wire import ETHERTYPE_VLAN
from netreduce.wire import fields as wf
from netreduce.wire.marks import BTH_MARK_BYTE, MARK_PARTIAL, MARK_TOTAL

from ..packet.layout import HDR_CAP, L2_TAGGED, L2_UNTAGGED

__all__ = ["MARK_PARTIAL", "MARK_TOTAL", "stage_mark", "JobRoles", "remarked"]


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


def remarked(m, raw, en, mark, name: str = "remarked"):
    """``raw`` (header bytes, :data:`~netreduce.hw.packet.layout.HDR_CAP` of them) with its
    stage mark (the low bits of BTH byte 4, after an untagged or 802.1Q-tagged Ethernet header)
    set to ``mark`` when ``en``: a new signal, driven combinationally in ``m``."""
    out = Signal(data.ArrayLayout(8, HDR_CAP), name=name)
    m.d.comb += out.eq(raw)
    et = wf.ETH.ethertype.offset  # an 802.1Q frame has its TPID where the EtherType would be
    vlan = (raw[et] == ETHERTYPE_VLAN >> 8) & (raw[et + 1] == ETHERTYPE_VLAN & 0xFF)
    for l2, vl in ((L2_UNTAGGED, 0), (L2_TAGGED, 1)):
        b = l2 + wf.IPV4.size + wf.UDP.size + BTH_MARK_BYTE
        with m.If(en & (vlan == vl)):
            m.d.comb += out[b].eq(Cat(mark[:2], raw[b][2:]))
    return out
