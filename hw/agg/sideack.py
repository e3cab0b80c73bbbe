"""The side lane of the aggregation control path: a second ACK/NAK decided in the same cycle.

With ``pairs=True`` (:class:`~.control.AggControl`), a header record may carry a *side* record:
a second ACK/NAK, from another port, taken in the same cycle as the main record and decided in
the same cycle, right after it (the decision order is main, then side). The engine's header
arbiter pairs two records only when both are ACK/NAKs (class ROCE, no frame error, opcode ACK,
AETH syndrome not reserved) from different ports with different reverse keys, and only while no
job has ``JOB.CTRL.fast_retx`` set. So the side frame and the main frame of its pair never
share a flow, and an ACK/NAK moves nothing but its flow's acked_f: the two decisions of a pair
are independent, and the side lane needs only the ACK monitor (model step 2 / 6, D7):

* lookup: the flow table's second (reverse-key) lookup port gives the entry, job, rank and
  start PSN; k = PSN - start, ``cand`` = k + 1 for an ACK, k for a NAK; acked_f of the rank in
  every job (registered; the job is selected a stage later, as the main lane does);
* check: acked_f forwarded from the writes committed in the cycle of the read (the main and
  side frames two ahead), the checks ``ack_nz`` (it moves acked_f) and ``ack_le`` (not beyond
  rel_j) on it, and their variants for what the pair directly ahead changes: its main frame
  moved the flow's acked_f (``_a``) or released the job's next index (``p``: rel_j + 1), its
  side frame moved the flow's acked_f (``_b``);
* decide: the variant that applies (selects of registers), FWD_ACK / FWD_NAK with acked_f
  moved (``take``) or counted stale, or FWD_UNREGISTERED (no live flow, or its job is not
  enabled); the frame waits (``block``) while its job's rel_j is moved by a chained release,
  as every frame does; the decision record travels through three registers that move with the
  main lane's fast-retransmit stages and output register, so both leave together.

Fast retransmit (D16) is not part of the side lane: with ``fast_retx`` off, an in-range ACK's
write of its flow's D16 word only restates the word's in-order prefix as the model's
``_nxt`` reads it anyway (the prefix stays within the window of rel_j: rel_j cannot pass a
flow's missing contribution), so the word is not written and nothing observable changes. The
engine pairs no records while any job has ``fast_retx`` set; a bus write setting it while
paired ACKs are in flight is outside the register-write contract (writes with no frame in
flight). Flow roles (D17) are not supported with pairs (the control refuses the combination).

Contract: latency: stage 3 (lookup result) to the decision, 2 cycles, as the main lane; the
decision record three cycles later with the main lane's (``o``). Throughput: one side frame per
cycle. Backpressure: the caller's ``advance`` (stages 3-5) and ``adv_out`` (the output
registers). Errors: none (an unregistered ACK is forwarded and counted as the model does).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .jobstate import job_inputs
from .types import PSN_BITS, Action, Disp
from .wide import differs

__all__ = ["SideAck", "side_layout"]


def side_layout(ctl) -> data.StructLayout:
    """The side record of a header (:attr:`~.control.AggControl.hdr_layout` ``side``): valid,
    reverse key, BTH PSN, AETH syndrome, payload length, arrival port."""
    return data.StructLayout({"v": 1, "src_ip": 32, "dqpn": 24, "psn": PSN_BITS,
                              "syndrome": 8, "plen": ctl.plen_bits, "port": ctl.port_bits})


def _per_job(port, jobs):
    return Array(port[j] for j in range(jobs))


class SideAck(wiring.Component):
    """The side lane (see the module docstring).

    Inputs: ``advance`` (the decision pipeline moves), ``adv_out`` (its output stages move);
    stage 3: ``v3`` / ``h3`` (the side record, :func:`side_layout`) with the flow table's second
    lookup ``hit`` / ``entry`` / ``fd``; the main lane's frames at stages 4 and 5 (``j4m`` /
    ``r4m``, ``j5m`` / ``r5m``), its decision's commit strobes (``m_take``: an ACK/NAK moved
    acked_f, ``m_rel``: an index released, both with the commit), its cand at stage 5
    (``cand5m``) and its registered acked_f write (``maw_en`` / ``maw_data``); the job state.

    Outputs: the side lane's frames at stages 4 and 5 (``j4``, ``r4``, ``j5``, ``r5``, ``cand5``)
    for the main lane's relations; ``reg_oh`` (per job: the frame at stage 5 is a registered
    frame of the job, to be ANDed with the job's chain state by the caller's stall) and ``reg``
    (it is registered: valid, flow hit, job enabled);
    the commit (``commit``: a side frame decided, ``cj``: one-hot job of a registered one,
    ``take`` / ``stale`` / ``disp``, ``e`` / ``r`` / ``cand``); ``aw_en`` / ``aw_data`` (its
    acked_f write, registered); ``o_valid`` / ``o`` (the decision record, with the main lane's
    output register).
    """

    def __init__(self, ctl, fd_layout):
        c = self._ctl = ctl
        J = c.jobs
        sl = side_layout(c)
        super().__init__({
            "advance": In(1), "adv_out": In(1),
            "v3": In(1), "h3": In(sl), "hit": In(1), "entry": In(c.entry_bits),
            "fd": In(fd_layout),
            "j4m": In(c.job_bits), "r4m": In(c.rank_bits), "j5m": In(c.job_bits),
            "r5m": In(c.rank_bits), "m_take": In(1), "m_rel": In(1), "cand5m": In(PSN_BITS),
            "maw_en": In(1), "maw_data": In(PSN_BITS),
            **job_inputs(c, ("enabled", "acked", "rel", "op")),
            "j4": Out(c.job_bits), "r4": Out(c.rank_bits), "j5": Out(c.job_bits),
            "r5": Out(c.rank_bits), "cand5": Out(PSN_BITS), "reg_oh": Out(J),
            "reg": Out(1),
            "commit": Out(1), "cj": Out(J), "take": Out(1), "stale": Out(1),
            "disp": Out(c.disp_bits), "e": Out(c.entry_bits), "r": Out(c.rank_bits),
            "cand": Out(PSN_BITS), "aw_en": Out(1), "aw_data": Out(PSN_BITS),
            "o_valid": Out(1), "o": Out(c.dec_layout),
        })

    def elaborate(self, platform):  # noqa: C901 (three stages of one lane)
        m = Module()
        c = self._ctl
        J, WD = c.jobs, c.max_world
        adv, fd, h3 = self.advance, self.fd, self.h3

        # ---- stage 3: the lookup's answer -> index, acked_f of the rank in every job, the
        # frame's relation to the frames ahead (registered with it)
        flow3 = Cat(fd.rank, fd.job)
        v4, hit4 = Signal(name="s_v4"), Signal(name="s_hit4")
        h4 = Signal(side_layout(c), name="s_h4")
        e4, j4, r4 = (Signal(c.entry_bits, name="s_e4"), Signal(c.job_bits, name="s_j4"),
                      Signal(c.rank_bits, name="s_r4"))
        k4 = Signal(PSN_BITS, name="s_k4")
        acked_rk = [Signal(PSN_BITS, name=f"s_acked_rk{j}") for j in range(J)]
        # the frames two ahead (stage 5 now: their writes are committed in this cycle, when the
        # read is made) and directly ahead (stage 4 now: decided when this one is checked)
        sz_m, sz_s, sa_m, sa_s, saj_m = (Signal(name=f"s_{n}4") for n in
                                         ("sz_m", "sz_s", "sa_m", "sa_s", "saj_m"))
        j5, r5 = Signal(c.job_bits, name="s_j5"), Signal(c.rank_bits, name="s_r5")
        with m.If(adv):
            m.d.sync += [v4.eq(self.v3), hit4.eq(self.hit), h4.eq(h3), e4.eq(self.entry),
                         j4.eq(fd.job), r4.eq(fd.rank), k4.eq(h3.psn - fd.start),
                         sz_m.eq(flow3 == Cat(self.r5m, self.j5m)),
                         sz_s.eq(flow3 == Cat(r5, j5)),
                         sa_m.eq(flow3 == Cat(self.r4m, self.j4m)),
                         sa_s.eq(flow3 == Cat(r4, j4)),
                         saj_m.eq(fd.job == self.j4m)]
            m.d.sync += [acked_rk[j].eq(Array(self.acked[j][r] for r in range(WD))[fd.rank])
                         for j in range(J)]

        # ---- stage 4: acked_f forwarded from the writes of the cycle of the read, checks and
        # variants
        loaded4 = Signal(name="s_loaded4")
        m.d.sync += loaded4.eq(adv)
        aw_en, aw_data = self.aw_en, self.aw_data
        acked_rd = Signal(PSN_BITS, name="s_acked_rd")
        m.d.comb += acked_rd.eq(_per_job(acked_rk, J)[j4])
        raw = Mux(self.maw_en & sz_m, self.maw_data, Mux(aw_en & sz_s, aw_data, acked_rd))
        acked_hold4, acked4 = Signal(PSN_BITS, name="s_acked_h4"), Signal(PSN_BITS,
                                                                          name="s_acked4")
        m.d.comb += acked4.eq(Mux(loaded4, raw, acked_hold4))
        m.d.sync += acked_hold4.eq(acked4)
        is_ack4 = h4.syndrome[5:7] == 0
        cand4 = Signal(PSN_BITS, name="s_cand4")
        m.d.comb += cand4.eq(k4 + is_ack4)
        rel4 = Signal(PSN_BITS, name="s_rel4")
        m.d.comb += rel4.eq(_per_job(self.rel, J)[j4])
        rel4p1 = Signal(PSN_BITS, name="s_rel4p1")
        m.d.comb += rel4p1.eq(rel4 + 1)
        cand5m = self.cand5m
        cand5 = Signal(PSN_BITS, name="s_cand5")

        def le(a, p, n):
            adv_, lim = Signal(PSN_BITS, name=f"s_adv_{n}"), Signal(PSN_BITS, name=f"s_lim_{n}")
            m.d.comb += [adv_.eq(cand4 - a), lim.eq(p - a)]
            return adv_ <= lim

        chk_l = data.StructLayout({"nz": 1, "le": 1, "le_0p": 1, "nz_a": 1, "le_a0": 1,
                                   "le_ap": 1, "nz_b": 1, "le_b0": 1, "le_bp": 1})
        chk4 = Signal(chk_l, name="s_chk4")
        m.d.comb += [
            chk4.nz.eq(differs(m, cand4, acked4, "s_nz")), chk4.le.eq(le(acked4, rel4, "00")),
            chk4.le_0p.eq(le(acked4, rel4p1, "0p")),
            chk4.nz_a.eq(differs(m, cand4, cand5m, "s_nz_a")),
            chk4.le_a0.eq(le(cand5m, rel4, "a0")), chk4.le_ap.eq(le(cand5m, rel4p1, "ap")),
            chk4.nz_b.eq(differs(m, cand4, cand5, "s_nz_b")),
            chk4.le_b0.eq(le(cand5, rel4, "b0")), chk4.le_bp.eq(le(cand5, rel4p1, "bp")),
        ]
        reg4 = Signal(name="s_reg4")
        m.d.comb += reg4.eq(v4 & hit4 & _per_job(self.enabled, J)[j4])

        # ---- stage 5 registers
        v5, reg5 = Signal(name="s_v5"), Signal(name="s_reg5")
        reg_oh5 = Signal(J, name="s_reg_oh5")
        h5 = Signal(side_layout(c), name="s_h5")
        e5, k5 = Signal(c.entry_bits, name="s_e5"), Signal(PSN_BITS, name="s_k5")
        chk5 = Signal(chk_l, name="s_chk5")
        acked5 = Signal(PSN_BITS, name="s_acked5")
        with m.If(adv):
            m.d.sync += [v5.eq(v4), reg5.eq(reg4),
                         reg_oh5.eq(Cat(*(reg4 & (j4 == j) for j in range(J)))),
                         h5.eq(h4), e5.eq(e4), j5.eq(j4), r5.eq(r4), k5.eq(k4),
                         cand5.eq(cand4), chk5.eq(chk4), acked5.eq(acked4)]
        # which variant applies, registered at the commit of the pair directly ahead: its main
        # frame moved this flow's acked_f (``ack_a``) or released the job's next index
        # (``ptr_a``), its side frame moved this flow's acked_f (``ack_b``)
        ack_a, ptr_a, ack_b = (Signal(name=f"s_{n}") for n in ("ack_a", "ptr_a", "ack_b"))
        m.d.sync += [ack_a.eq(sa_m & self.m_take), ptr_a.eq(saj_m & self.m_rel),
                     ack_b.eq(sa_s & self.take)]
        if "acked" in c._no_forwarding:
            ack_a, ack_b = Const(0), Const(0)

        # ---- stage 5: decide. A frame held in the stage (the pipeline did not move in the cycle
        # before) uses its checks made again on the state of the cycle before (rel_j moved by a
        # chain while it waits: the caller's stall holds it until then) and its acked_f as
        # corrected (nothing commits while it waits)
        held5 = Signal(name="s_held5")
        m.d.sync += held5.eq(~adv)
        acked_h = Signal(PSN_BITS, name="s_acked_h")
        acked_cur = Signal(PSN_BITS, name="s_acked_cur")
        m.d.comb += acked_cur.eq(Mux(held5, acked_h,
                                     Mux(ack_a, self.maw_data, Mux(ack_b, aw_data, acked5))))
        nz_h, le_h = Signal(name="s_nz_h"), Signal(name="s_le_h")
        nz, lev = Signal(name="s_nz5"), Signal(name="s_le5")
        m.d.comb += [
            nz.eq(Mux(held5, nz_h, Mux(ack_a, chk5.nz_a, Mux(ack_b, chk5.nz_b, chk5.nz)))),
            lev.eq(Mux(held5, le_h,
                       Mux(ack_a, Mux(ptr_a, chk5.le_ap, chk5.le_a0),
                           Mux(ack_b, Mux(ptr_a, chk5.le_bp, chk5.le_b0),
                               Mux(ptr_a, chk5.le_0p, chk5.le))))),
        ]
        rel5 = _per_job(self.rel, J)[j5]
        adv_h, lim_h = Signal(PSN_BITS, name="s_adv_h"), Signal(PSN_BITS, name="s_lim_h")
        m.d.comb += [adv_h.eq(cand5 - acked_cur), lim_h.eq(rel5 - acked_cur)]
        with m.If(~adv):
            m.d.sync += [acked_h.eq(acked_cur), nz_h.eq(cand5 != acked_cur),
                         le_h.eq(adv_h <= lim_h)]
        take = Signal(name="s_take5")
        m.d.comb += take.eq(reg5 & nz & lev)
        commit = Signal(name="s_commit")
        m.d.comb += commit.eq(v5 & adv)
        is_ack5 = h5.syndrome[5:7] == 0
        disp = Signal(c.disp_bits, name="s_disp5")
        m.d.comb += disp.eq(Mux(reg5, Mux(is_ack5, Disp.FWD_ACK, Disp.FWD_NAK),
                                Disp.FWD_UNREGISTERED))
        m.d.comb += [self.commit.eq(commit), self.cj.eq(Mux(adv, reg_oh5, 0)),
                     self.take.eq(adv & take), self.stale.eq(adv & reg5 & ~(nz & lev)),
                     self.disp.eq(disp), self.e.eq(e5), self.r.eq(r5), self.cand.eq(cand5),
                     self.j4.eq(j4), self.r4.eq(r4), self.j5.eq(j5), self.r5.eq(r5),
                     self.cand5.eq(cand5), self.reg_oh.eq(reg_oh5), self.reg.eq(reg5)]
        m.d.sync += [aw_en.eq(adv & take), aw_data.eq(cand5)]

        # ---- the decision record, through the main lane's stages 6, 7 and output register
        dec = Signal(c.dec_layout, name="s_dec5")
        beats = (h5.plen + c.beat_bytes - 1) >> c.beat_shift
        m.d.comb += [dec.action.eq(Action.FORWARD), dec.disp.eq(disp), dec.job.eq(j5),
                     dec.rank.eq(r5), dec.entry.eq(e5), dec.index.eq(k5),
                     dec.op.eq(_per_job(self.op, J)[j5]), dec.plen.eq(h5.plen),
                     dec.beats.eq(beats), dec.port.eq(h5.port)]
        v6, v7 = Signal(name="s_v6"), Signal(name="s_v7")
        d6, d7 = Signal(c.dec_layout, name="s_dec6"), Signal(c.dec_layout, name="s_dec7")
        with m.If(self.adv_out):
            m.d.sync += [v6.eq(commit), d6.eq(dec), v7.eq(v6), d7.eq(d6),
                         self.o_valid.eq(v7), self.o.eq(d7)]
        return m
