"""The decision function of the aggregation control path (stage 4 of :class:`~.control.AggControl`).

:class:`Decide` is the combinational heart of model steps 2-6 (:mod:`netreduce.sim.model.engine`,
decisions D5-D8, D14-D16) for one frame: given the frame's header record, the looked-up flow
(job, rank, index ``k``), the job's registered state and the per-slot / per-flow RAM words read
for it (already forwarded from the write in front), it returns the disposition, the action, the
new slot word, the new fast-retransmit word, the CNP verdict and the per-job state strobes.

Contract: combinational (latency 0), one frame per cycle, no state, no backpressure; the caller
(:class:`~.control.AggControl`) registers the inputs (its stage 3 -> 4 registers) and the outputs
(its decision register, the RAM writes, the per-job state updates), and commits them only in a
cycle its pipeline advances. Errors: a frame-level error or a check failing gives the model's
drop / forward disposition and changes nothing (``slot_write``, ``ack_take``, ``rtx_write``,
``cnp_send`` low).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import Role
from netreduce.wire import ECN_CE, NAK_PSN_SEQ, Opcode

from .roles import MARK_PARTIAL, MARK_TOTAL, stage_mark
from .types import _ERR_DISP, PSN_BITS, Action, Disp, FrameError, HdrClass

__all__ = ["Decide", "is_ctrl", "pre_layout", "precheck"]

OP_ACK, OP_CNP = int(Opcode.ACK), int(Opcode.CNP)


def is_ctrl(h):
    """An ACK/NAK or CNP header (looked up by its reverse key)."""
    return (h.opcode == OP_ACK) | (h.opcode == OP_CNP)


def pre_layout(ctl) -> data.StructLayout:
    """What :func:`precheck` computes one stage before the decision (registered with it)."""
    return data.StructLayout({"kind": 2, "early": 1, "early_disp": ctl.disp_bits, "probe": 1,
                              "ce": 1, "mask": ctl.max_world})


KIND_NOT_ROCE, KIND_UNREG, KIND_CTRL, KIND_DATA = range(4)


def precheck(m, ctl, pre, h, hit, enabled, pmtu, roles, role, full_mask):
    """Drive ``pre`` (:func:`pre_layout`) from what is known before the slot, CNP and
    fast-retransmit words are read: the header ``h``, the flow lookup (``hit``), the job's
    configuration (``enabled``, ``pmtu``) and the flow's role; ``full_mask``: the ranks whose
    contributions complete a slot. ``kind``: NOT_ROCE / unregistered / ACK-NAK-CNP / data (the
    first branches of the model's checks); ``early`` / ``early_disp``: a data frame fails a
    header check (frame error, opcode, PMTU, alignment, D17 probe or stage mark), in the model's
    order; ``probe``: that check is D17's forwarded probe; ``ce``: CE-marked."""
    is_down, is_rack = role == Role.DOWN, role == Role.RACK
    with m.If(h.cls == HdrClass.NOT_ROCE):
        m.d.comb += pre.kind.eq(KIND_NOT_ROCE)
    with m.Elif(~((h.cls == HdrClass.ROCE) & hit & enabled)):
        m.d.comb += pre.kind.eq(KIND_UNREG)
    with m.Elif(is_ctrl(h)):
        m.d.comb += pre.kind.eq(KIND_CTRL)
    with m.Else():
        m.d.comb += pre.kind.eq(KIND_DATA)
    m.d.comb += pre.early.eq(1)
    with m.If(h.err != FrameError.NONE):
        with m.Switch(h.err):
            for err, dsp in _ERR_DISP.items():
                with m.Case(err):
                    m.d.comb += pre.early_disp.eq(dsp)
    with m.Elif(~(h.opcode <= Opcode.WRITE_ONLY_IMM)):  # RC SEND/WRITE opcodes 0x00..0x0B
        m.d.comb += pre.early_disp.eq(Disp.DROP_OPCODE)
    with m.Elif(h.plen > pmtu):
        m.d.comb += pre.early_disp.eq(Disp.DROP_PMTU)
    with m.Elif(h.plen[:2] != 0):
        m.d.comb += pre.early_disp.eq(Disp.DROP_ALIGN)
    with m.Elif(roles & (is_down | is_rack) & (h.plen == 0)
                & (h.opcode == Opcode.WRITE_MIDDLE)):
        # D17: another engine's duplicate probe, forwarded (DOWN: without the mark)
        m.d.comb += [pre.early_disp.eq(Disp.BEHIND_WINDOW), pre.probe.eq(1)]
    with m.Elif(roles & (h.mark != stage_mark(role))):
        m.d.comb += pre.early_disp.eq(Disp.DROP_ROLE)  # a frame of another stage (D17)
    with m.Else():
        m.d.comb += pre.early.eq(0)
    m.d.comb += [pre.ce.eq(h.ecn == ECN_CE), pre.mask.eq(full_mask)]


class Decide(wiring.Component):
    """One frame's decision (see the module docstring); ``ctl`` is the owning
    :class:`~.control.AggControl` (layouts and widths).

    Inputs: ``h`` (header record), ``registered`` (ROCE, flow hit, job enabled), ``k`` (index =
    PSN - start), ``st`` (the flow's start PSN), ``rank`` / ``onehot_r``, job state ``n``, ``w``,
    ``free``, ``rel``, ``pmtu``, ``cnp_interval``, ``fast_en``; RAM words ``slot`` (slot state),
    ``rtx`` (fast-retransmit word, 0 if never written), ``acked`` (acked_f), ``cnp_last`` (time
    of the flow's last CNP) and ``cnp_seen`` (one was sent since the enable); ``pre``: the
    frame's :func:`precheck` (class, header checks, CE mark, completion mask), computed by the
    caller one stage earlier and registered with the frame (``registered`` and ``n`` are
    already in it).

    Outputs: ``disp`` / ``action``; strobes ``rx_data``, ``ack_stale``, ``ack_take`` (with
    ``cand``: the new acked_f), ``slot_write`` (``slot_new``), ``first``, ``release_now``,
    ``pend_inc``, ``mismatch``, ``cnp_send`` / ``cnp_supp``, ``nak_fire`` / ``solicit``,
    ``rtx_write`` (``rtx_new``); ``nak_x``, ``sol_psn`` for the decision record; ``ctrl``: the
    header is an ACK/NAK/CNP.
    """

    def __init__(self, ctl):
        self._ctl = ctl
        c = ctl
        super().__init__({
            "h": In(c.hdr_layout), "registered": In(1), "k": In(PSN_BITS), "st": In(PSN_BITS),
            "rank": In(c.rank_bits), "onehot_r": In(c.max_world), "n": In(c.n_bits),
            "w": In(c.w_bits), "free": In(PSN_BITS), "rel": In(PSN_BITS), "pmtu": In(13),
            "cnp_interval": In(32), "fast_en": In(1), "slot": In(c.slot_layout),
            "rtx": In(c.rtx_layout), "acked": In(PSN_BITS), "cnp_last": In(c.time_bits),
            "cnp_seen": In(1),
            # precheck() of this frame, computed one stage earlier
            "pre": In(pre_layout(c)),
            # flow roles (model D17, :mod:`.roles`): the job has roles (leaf or spine), is a leaf;
            # this flow's role; the partial pointer; the contributors (all ranks but DOWN)
            "roles": In(1), "leaf": In(1), "role": In(2), "upptr": In(PSN_BITS),
            "cmask": In(c.max_world),
            "up_now": Out(1), "up_pend": Out(1), "remark": Out(1), "mark": Out(2),
            "total": Out(1),
            "disp": Out(c.disp_bits), "action": Out(Action), "rx_data": Out(1),
            "ack_stale": Out(1), "ack_take": Out(1), "cand": Out(PSN_BITS),
            "slot_write": Out(1), "slot_new": Out(c.slot_layout), "first": Out(1),
            "release_now": Out(1), "pend_inc": Out(1), "mismatch": Out(1), "cnp_send": Out(1),
            "cnp_supp": Out(1), "nak_fire": Out(1), "solicit": Out(1), "rtx_write": Out(1),
            "rtx_new": Out(c.rtx_layout), "nak_x": Out(32), "sol_psn": Out(PSN_BITS),
            "ctrl": Out(1),
        })

    def elaborate(self, platform):  # noqa: C901 (the model's checks, in its order)
        m = Module()
        c, TB = self._ctl, self._ctl.time_bits
        h, k4, r4, onehot_r = self.h, self.k, self.rank, self.onehot_r
        slot_cur, rtx_cur, acked_cur = self.slot, self.rtx, self.acked
        free_cur, rel_cur, w_cur = self.free, self.rel, self.w
        disp, action, slot_new, rtx_new = self.disp, self.action, self.slot_new, self.rtx_new
        cand, present, ack_cur, is_data_ok = self.cand, Signal(), Signal(), Signal()
        is_up, is_down, is_rack = (self.role == Role.UP), (self.role == Role.DOWN), \
            (self.role == Role.RACK)
        tot_done = Signal()  # D17: a DOWN frame took the slot's total
        up_d = Signal(PSN_BITS)  # D17: partials sent up: indices [free, upptr)
        m.d.comb += up_d.eq(self.upptr - self.free)
        m.d.comb += self.ctrl.eq(is_ctrl(h))

        d_win = Signal(PSN_BITS)
        rel_d = Signal(PSN_BITS)
        m.d.comb += [d_win.eq(k4 - free_cur), rel_d.eq(rel_cur - free_cur)]

        pre = self.pre
        m.d.comb += [action.eq(Action.FORWARD), disp.eq(Disp.FWD_UNREGISTERED)]
        with m.If(pre.kind == KIND_NOT_ROCE):
            m.d.comb += disp.eq(Disp.FWD_NOT_ROCE)
        with m.Elif(pre.kind == KIND_UNREG):
            m.d.comb += disp.eq(Disp.FWD_UNREGISTERED)
        with m.Elif(pre.kind == KIND_CTRL):
            # ---- ACK monitor (model step 2 / 6, D7)
            kind = h.syndrome[5:7]
            with m.If(h.err != FrameError.NONE):
                m.d.comb += disp.eq(Disp.FWD_CTRL_INVALID)
            with m.Elif(h.opcode == OP_CNP):
                m.d.comb += disp.eq(Disp.FWD_CNP)
            with m.Elif(kind == 0b10):
                m.d.comb += disp.eq(Disp.FWD_CTRL_INVALID)
            with m.Else():
                m.d.comb += [disp.eq(Mux(kind == 0, Disp.FWD_ACK, Disp.FWD_NAK)),
                             cand.eq(k4 + (kind == 0))]
                adv_ = (cand - acked_cur)[:PSN_BITS]
                # D17: a leaf's UP flow is acknowledged for what went up
                lim = (Mux(self.leaf & is_up, self.upptr, rel_cur) - acked_cur)[:PSN_BITS]
                m.d.comb += ack_cur.eq((kind == 0) & (adv_ <= lim))
                with m.If((adv_ != 0) & (adv_ <= lim)):
                    m.d.comb += self.ack_take.eq(1)
                with m.Else():
                    m.d.comb += self.ack_stale.eq(1)
        with m.Else():
            # ---- data frame on a forward key (model steps 3-5)
            m.d.comb += [self.rx_data.eq(1), action.eq(Action.DROP)]
            with m.If(pre.early):  # a header check (precheck), in the model's order
                m.d.comb += disp.eq(pre.early_disp)
                with m.If(pre.probe):
                    # D17: another engine's duplicate probe, forwarded (DOWN: without the mark)
                    m.d.comb += [action.eq(Action.FORWARD), self.remark.eq(is_down),
                                 self.mark.eq(0)]
            with m.Elif(d_win[PSN_BITS - 1]):
                m.d.comb += [disp.eq(Disp.BEHIND_WINDOW), action.eq(Action.PROBE)]
            with m.Else():
                m.d.comb += is_data_ok.eq(1)
                with m.If(d_win >= w_cur):
                    m.d.comb += disp.eq(Disp.DROP_AHEAD)
                with m.Elif(self.leaf & is_down):
                    # D17: the total of index k, only if this leaf's partial of k went up
                    with m.If(~slot_cur.valid | (slot_cur.index != k4) | (d_win >= up_d)
                              | (slot_cur.opcode != h.opcode[:4]) | (slot_cur.plen != h.plen)):
                        m.d.comb += disp.eq(Disp.DROP_ROLE)
                    with m.Elif(~slot_cur.total):
                        m.d.comb += [disp.eq(Disp.TOTALS), action.eq(Action.TOTAL),
                                     self.total.eq(1), tot_done.eq(1), self.slot_write.eq(1),
                                     slot_new.eq(slot_cur), slot_new.total.eq(1)]
                    with m.Else():
                        m.d.comb += [disp.eq(Disp.REEMITS), action.eq(Action.REEMIT),
                                     self.total.eq(1)]
                with m.Elif(~slot_cur.valid | (slot_cur.index != k4)):
                    # EMPTY: the first contribution of this generation overwrites
                    m.d.comb += [disp.eq(Disp.CONTRIBUTIONS), action.eq(Action.CONTRIBUTE),
                                 self.first.eq(1), self.slot_write.eq(1), present.eq(1),
                                 slot_new.valid.eq(1), slot_new.index.eq(k4),
                                 slot_new.bitmap.eq(onehot_r), slot_new.opcode.eq(h.opcode),
                                 slot_new.plen.eq(h.plen)]
                    if c.ports > 1:
                        m.d.comb += slot_new.ports[r4].eq(h.port)
                with m.Elif((slot_cur.opcode != h.opcode[:4]) | (slot_cur.plen != h.plen)):
                    m.d.comb += [disp.eq(Disp.DROP_MISMATCH), self.mismatch.eq(1)]
                with m.Elif((slot_cur.bitmap & onehot_r).any()):
                    m.d.comb += present.eq(1)
                    with m.If(self.leaf & is_up & (d_win < up_d)):
                        # D17: UP's resent packet re-sends the partial
                        m.d.comb += [disp.eq(Disp.REEMITS), action.eq(Action.REEMIT)]
                    with m.Elif(self.leaf & is_up):
                        m.d.comb += disp.eq(Disp.DUPLICATES)
                    with m.Elif(d_win < rel_d):  # RELEASED: index in [free, rel)
                        m.d.comb += [disp.eq(Disp.REEMITS), action.eq(Action.REEMIT),
                                     self.total.eq(self.leaf)]
                    with m.Else():
                        m.d.comb += disp.eq(Disp.DUPLICATES)
                with m.Else():
                    m.d.comb += [disp.eq(Disp.CONTRIBUTIONS), action.eq(Action.CONTRIBUTE),
                                 self.slot_write.eq(1), present.eq(1), slot_new.eq(slot_cur),
                                 slot_new.bitmap.eq(slot_cur.bitmap | onehot_r)]
                    if c.ports > 1:
                        m.d.comb += slot_new.ports[r4].eq(h.port)
        # a leaf's slot is complete with every contributor (not DOWN): it goes up (D17)
        complete = self.slot_write & ~tot_done & (slot_new.bitmap == pre.mask)
        cnp_check = is_data_ok & pre.ce  # CE-marked data that passed the checks
        done = Mux(self.leaf, tot_done, complete)
        m.d.comb += [
            self.release_now.eq(done & (k4 == rel_cur)),
            self.pend_inc.eq(done & (k4 != rel_cur)),
            self.up_now.eq(self.leaf & complete & (k4 == self.upptr)),
            self.up_pend.eq(self.leaf & complete & (k4 != self.upptr)),
        ]
        # D17: outputs of a RACK frame carry MARK_TOTAL, of a DOWN frame no mark; UP's re-sent
        # partial MARK_PARTIAL (the probe branch above sets its own)
        with m.If(self.roles & (action != Action.FORWARD)):
            with m.If(self.leaf & is_up & (action == Action.REEMIT)):
                m.d.comb += [self.remark.eq(1), self.mark.eq(MARK_PARTIAL)]
            with m.Elif(is_rack | is_down):
                m.d.comb += [self.remark.eq(1), self.mark.eq(Mux(is_rack, MARK_TOTAL, 0))]
        # CNP limiter (D8): suppressed if a CNP went to this flow less than the interval ago
        # (a negative time difference counts as inside)
        tdiff = Signal(TB)
        m.d.comb += tdiff.eq(h.time - self.cnp_last)
        suppressed = self.cnp_seen & (tdiff[TB - 1] | (tdiff < self.cnp_interval))
        m.d.comb += [self.cnp_send.eq(cnp_check & ~suppressed),
                     self.cnp_supp.eq(cnp_check & suppressed)]

        # fast retransmit (model D16): per-flow tracking on data, the ACK request (a probe to the
        # receiver) and the ACK rewrite decisions
        k4p1 = Signal(PSN_BITS)
        m.d.comb += k4p1.eq(k4 + 1)
        m.d.comb += rtx_new.eq(rtx_cur)
        nxt_d = Signal(PSN_BITS)
        nxt_eff = Signal(PSN_BITS)  # nxt_f, or rel_j if that is ahead
        m.d.comb += [nxt_d.eq(rtx_cur.nxt - rel_cur),
                     nxt_eff.eq(Mux(nxt_d[PSN_BITS - 1], rel_cur, rtx_cur.nxt))]
        top_d = Signal(PSN_BITS)
        ahead_d = Signal(PSN_BITS)
        up = Signal(PSN_BITS)
        m.d.comb += [top_d.eq(rtx_cur.top - nxt_eff), ahead_d.eq(k4 - nxt_eff),
                     up.eq(k4p1 - rtx_cur.top)]
        hole = (top_d != 0) & ~top_d[PSN_BITS - 1]
        at_mark = rtx_cur.mark_v & (rtx_cur.mark == nxt_eff)
        fast_en = self.fast_en
        top_new = Mux((up != 0) & ~up[PSN_BITS - 1], k4p1, rtx_cur.top)
        with m.If(present):
            # the contribution at nxt_f moves it to top_f (model _present)
            m.d.comb += [rtx_new.top.eq(top_new),
                         rtx_new.nxt.eq(Mux(k4 == nxt_eff, top_new, nxt_eff))]
            with m.If(fast_en & (action == Action.CONTRIBUTE) & (ahead_d != 0)
                      & ~ahead_d[PSN_BITS - 1] & ~at_mark):
                m.d.comb += [self.solicit.eq(1), rtx_new.mark_v.eq(1), rtx_new.naked.eq(0),
                             rtx_new.mark.eq(nxt_eff)]
        with m.Elif(ack_cur):
            m.d.comb += rtx_new.nxt.eq(nxt_eff)
            with m.If(fast_en & hole & ~(at_mark & rtx_cur.naked)):
                m.d.comb += [self.nak_fire.eq(1), rtx_new.mark_v.eq(1), rtx_new.naked.eq(1),
                             rtx_new.mark.eq(nxt_eff)]
        m.d.comb += self.rtx_write.eq(present | ack_cur)
        # the forwarded ACK's rewrite as XOR bytes in wire order: PSN p -> p + 1, syndrome -> NAK
        psn_x = Signal(PSN_BITS)
        m.d.comb += psn_x.eq(h.psn ^ (h.psn + 1)[:PSN_BITS])
        # the ACK request's PSN: one acknowledged by f's receiver (a duplicate for it)
        m.d.comb += self.sol_psn.eq(self.st + acked_cur - 1)
        m.d.comb += self.nak_x.eq(Cat(psn_x[16:24], psn_x[8:16], psn_x[0:8],
                                      h.syndrome ^ Const(NAK_PSN_SEQ, 8)))
        return m
