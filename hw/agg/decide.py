"""The decision function of the aggregation control path (in :class:`~.stages.DecideStage`).

:class:`Decide` is the combinational heart of model steps 2-6 (:mod:`netreduce.sim.model.engine`,
decisions D5-D8, D14-D16) for one frame: given the frame's header record, the looked-up flow
(job, rank, index ``k``), the job's registered state and the per-slot / per-flow RAM words read
for it (already forwarded from the write in front), it returns the disposition, the action, the
new slot word, the new fast-retransmit word, the CNP verdict and the per-job state strobes.

Contract: combinational (latency 0), one frame per cycle, no state, no backpressure; the caller
(:class:`~.stages.DecideStage`) gives it registers (the check stage's, corrected by one select)
and registers its outputs (the decision register, the RAM writes, the per-job state updates),
committing them only in a cycle its pipeline advances. Errors: a frame-level error or a check
failing gives the model's drop / forward disposition and changes nothing (``slot_write``,
``ack_take``, ``rtx_write``, ``cnp_send`` low).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import Role
from netreduce.wire import ECN_CE, NAK_PSN_SEQ, Opcode

from .roles import MARK_PARTIAL, MARK_TOTAL, stage_mark
from .types import _ERR_DISP, PSN_BITS, Action, Disp, FrameError, HdrClass

__all__ = ["Decide", "FastRetx", "is_ctrl", "job_flags_layout", "nak_xor", "pre_layout", "precheck",
           "retx_checks", "retx_checks_layout", "slot_flags_layout"]

OP_ACK, OP_CNP = int(Opcode.ACK), int(Opcode.CNP)


def is_ctrl(h):
    """An ACK/NAK or CNP header (looked up by its reverse key)."""
    return (h.opcode == OP_ACK) | (h.opcode == OP_CNP)


def pre_layout(ctl) -> data.StructLayout:
    """What :func:`precheck` computes one stage before the decision (registered with it)."""
    return data.StructLayout({"kind": 2, "early": 1, "early_disp": ctl.disp_bits, "probe": 1,
                              "ce": 1, "mask": ctl.max_world, "ack": 1})


KIND_NOT_ROCE, KIND_UNREG, KIND_CTRL, KIND_DATA = range(4)


def precheck(m, ctl, pre, h, hit, enabled, pmtu, roles, role, full_mask):
    """Drive ``pre`` (:func:`pre_layout`) from what is known before the slot, CNP and
    fast-retransmit words are read: the header ``h``, the flow lookup (``hit``), the job's
    configuration (``enabled``, ``pmtu``) and the flow's role; ``full_mask``: the ranks whose
    contributions complete a slot. ``kind``: NOT_ROCE / unregistered / ACK-NAK-CNP / data (the
    first branches of the model's checks); ``early`` / ``early_disp``: a data frame fails a
    header check (frame error, opcode, PMTU, alignment, D17 probe or stage mark), in the model's
    order; ``probe``: that check is D17's forwarded probe; ``ce``: CE-marked; ``ack``: the
    header is a valid ACK/NAK (no frame error, opcode ACK, AETH syndrome not the reserved 0b10:
    a registered one moves acked_f or is stale, by the job checks alone)."""
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
    m.d.comb += [pre.ce.eq(h.ecn == ECN_CE), pre.mask.eq(full_mask),
                 pre.ack.eq((h.err == FrameError.NONE) & (h.opcode == OP_ACK)
                            & (h.syndrome[5:7] != 0b10))]


def slot_flags_layout() -> data.StructLayout:
    """The slot word's checks, made one stage before the decision (the check stage of
    :class:`~.control.AggControl`) and corrected for the decision in front: ``empty`` (not valid
    or another index: EMPTY), ``sigmis``
    (opcode / length signature differs from the frame's), ``tot`` (a leaf's total is in, D17),
    ``pres`` (the frame's rank is in the bitmap), ``cc`` (the bitmap with the frame's rank is
    complete), ``cf`` (the frame's rank alone is)."""
    return data.StructLayout({"empty": 1, "sigmis": 1, "tot": 1, "pres": 1, "cc": 1, "cf": 1})


def job_flags_layout() -> data.StructLayout:
    """The checks against the job's and the flow's state (window, release and partial
    pointers, acked_f, the CNP limiter), made one stage before the decision: ``behind``
    (index k before free_j), ``ahead`` (k at or beyond free_j + W), ``released`` (k in
    [free_j, rel_j)), ``keq_rel`` (k = rel_j), ``up_lt`` (k in [free_j, upptr), D17),
    ``keq_up`` (k = upptr); for an ACK/NAK ``ack_nz`` (it moves acked_f) and ``ack_le`` (not
    beyond what was released: rel_j, or upptr on a leaf's UP flow); ``supp`` (a CNP to the
    flow now would be suppressed, D8)."""
    return data.StructLayout({"behind": 1, "ahead": 1, "released": 1, "keq_rel": 1, "up_lt": 1,
                              "keq_up": 1, "ack_nz": 1, "ack_le": 1, "supp": 1})


class Decide(wiring.Component):
    """One frame's decision (see the module docstring); ``ctl`` is the owning
    :class:`~.control.AggControl` (layouts and widths).

    Inputs: ``h`` (header record), ``k`` (index = PSN - start), ``rank`` / ``onehot_r``,
    ``cand`` (an ACK/NAK's new acked_f: k + 1 for an ACK, k for a NAK); ``slot``: the slot word
    (for the new word; its checks are in ``sf``, :func:`slot_flags_layout`); ``jf``: the job
    and flow checks (:func:`job_flags_layout`); ``pre``: the frame's :func:`precheck` (class,
    header checks, CE mark, completion mask). All are registers of the caller, made one or two
    stages earlier: this block has no wide compare or subtraction.

    Outputs: ``disp`` / ``action``; strobes ``rx_data``, ``ack_stale``, ``ack_take``,
    ``ack_cur`` (an ACK within the released range: D16's ACK input), ``present`` (the slot
    holds the frame's contribution after it: D16's data input), ``slot_write``
    (``slot_new``), ``first``, ``release_now``, ``pend_inc``, ``mismatch``, ``cnp_send`` /
    ``cnp_supp``; ``ctrl``: the header is an ACK/NAK/CNP.
    """

    def __init__(self, ctl):
        self._ctl = ctl
        c = ctl
        super().__init__({
            "h": In(c.hdr_pipe_layout), "k": In(PSN_BITS), "rank": In(c.rank_bits),
            "onehot_r": In(c.max_world), "cand": In(PSN_BITS), "slot": In(c.slot_layout),
            "sf": In(slot_flags_layout()), "jf": In(job_flags_layout()),
            # precheck() of this frame, computed one stage earlier
            "pre": In(pre_layout(c)),
            # flow roles (model D17, :mod:`.roles`): the job has roles (leaf or spine), is a leaf;
            # this flow's role
            "roles": In(1), "leaf": In(1), "role": In(2),
            "up_now": Out(1), "up_pend": Out(1), "remark": Out(1), "mark": Out(2),
            "total": Out(1),
            "disp": Out(c.disp_bits), "action": Out(Action), "rx_data": Out(1),
            "ack_stale": Out(1), "ack_take": Out(1), "ack_cur": Out(1), "present": Out(1),
            "slot_write": Out(1), "slot_new": Out(c.slot_layout), "first": Out(1),
            "release_now": Out(1), "pend_inc": Out(1), "mismatch": Out(1), "cnp_send": Out(1),
            "cnp_supp": Out(1), "ctrl": Out(1), "tot_done": Out(1),
        })

    def elaborate(self, platform):  # noqa: C901 (the model's checks, in its order)
        m = Module()
        c = self._ctl
        h, k4, r4, onehot_r = self.h, self.k, self.rank, self.onehot_r
        slot_cur, sf, jf = self.slot, self.sf, self.jf
        disp, action, slot_new = self.disp, self.action, self.slot_new
        present, ack_cur, is_data_ok = self.present, self.ack_cur, Signal()
        is_up, is_down, is_rack = (self.role == Role.UP), (self.role == Role.DOWN), \
            (self.role == Role.RACK)
        tot_done = self.tot_done  # D17: a DOWN frame took the slot's total
        m.d.comb += self.ctrl.eq(is_ctrl(h))

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
                             ack_cur.eq((kind == 0) & jf.ack_le)]
                # (ack_take / ack_stale: below, from this branch's condition registered)
        with m.Else():
            # ---- data frame on a forward key (model steps 3-5)
            m.d.comb += [self.rx_data.eq(1), action.eq(Action.DROP)]
            with m.If(pre.early):  # a header check (precheck), in the model's order
                m.d.comb += disp.eq(pre.early_disp)
                with m.If(pre.probe):
                    # D17: another engine's duplicate probe, forwarded (DOWN: without the mark)
                    m.d.comb += [action.eq(Action.FORWARD), self.remark.eq(is_down),
                                 self.mark.eq(0)]
            with m.Elif(jf.behind):
                m.d.comb += [disp.eq(Disp.BEHIND_WINDOW), action.eq(Action.PROBE)]
            with m.Else():
                m.d.comb += is_data_ok.eq(1)
                with m.If(jf.ahead):
                    m.d.comb += disp.eq(Disp.DROP_AHEAD)
                with m.Elif(self.leaf & is_down):
                    # D17: the total of index k, only if this leaf's partial of k went up
                    with m.If(sf.empty | ~jf.up_lt | sf.sigmis):
                        m.d.comb += disp.eq(Disp.DROP_ROLE)
                    with m.Elif(~sf.tot):
                        m.d.comb += [disp.eq(Disp.TOTALS), action.eq(Action.TOTAL),
                                     self.total.eq(1), tot_done.eq(1), self.slot_write.eq(1),
                                     slot_new.eq(slot_cur), slot_new.total.eq(1)]
                    with m.Else():
                        m.d.comb += [disp.eq(Disp.REEMITS), action.eq(Action.REEMIT),
                                     self.total.eq(1)]
                with m.Elif(sf.empty):
                    # EMPTY: the first contribution of this generation overwrites
                    m.d.comb += [disp.eq(Disp.CONTRIBUTIONS), action.eq(Action.CONTRIBUTE),
                                 self.first.eq(1), self.slot_write.eq(1), present.eq(1),
                                 slot_new.valid.eq(1), slot_new.index.eq(k4),
                                 slot_new.bitmap.eq(onehot_r), slot_new.opcode.eq(h.opcode),
                                 slot_new.plen.eq(h.plen)]
                    if c.ports > 1:
                        m.d.comb += slot_new.ports[r4].eq(h.port)
                with m.Elif(sf.sigmis):
                    m.d.comb += [disp.eq(Disp.DROP_MISMATCH), self.mismatch.eq(1)]
                with m.Elif(sf.pres):
                    m.d.comb += present.eq(1)
                    with m.If(self.leaf & is_up & jf.up_lt):
                        # D17: UP's resent packet re-sends the partial
                        m.d.comb += [disp.eq(Disp.REEMITS), action.eq(Action.REEMIT)]
                    with m.Elif(self.leaf & is_up):
                        m.d.comb += disp.eq(Disp.DUPLICATES)
                    with m.Elif(jf.released):  # RELEASED: index in [free, rel)
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
        # the ACK/NAK branch above, its condition registered in ``pre.ack``: the commit strobes
        # of an ACK are few levels after the pipeline enable
        acking = (pre.kind == KIND_CTRL) & pre.ack
        m.d.comb += [self.ack_take.eq(acking & jf.ack_nz & jf.ack_le),
                     self.ack_stale.eq(acking & ~(jf.ack_nz & jf.ack_le))]
        # a leaf's slot is complete with every contributor (not DOWN): it goes up (D17)
        complete = self.slot_write & ~tot_done & Mux(self.first, sf.cf, sf.cc)
        cnp_check = is_data_ok & pre.ce  # CE-marked data that passed the checks
        done = Mux(self.leaf, tot_done, complete)
        m.d.comb += [
            self.release_now.eq(done & jf.keq_rel),
            self.pend_inc.eq(done & ~jf.keq_rel),
            self.up_now.eq(self.leaf & complete & jf.keq_up),
            self.up_pend.eq(self.leaf & complete & ~jf.keq_up),
        ]
        # D17: outputs of a RACK frame carry MARK_TOTAL, of a DOWN frame no mark; UP's re-sent
        # partial MARK_PARTIAL (the probe branch above sets its own)
        with m.If(self.roles & (action != Action.FORWARD)):
            with m.If(self.leaf & is_up & (action == Action.REEMIT)):
                m.d.comb += [self.remark.eq(1), self.mark.eq(MARK_PARTIAL)]
            with m.Elif(is_rack | is_down):
                m.d.comb += [self.remark.eq(1), self.mark.eq(Mux(is_rack, MARK_TOTAL, 0))]
        # CNP limiter (D8): suppressed if a CNP went to this flow less than the interval ago
        m.d.comb += [self.cnp_send.eq(cnp_check & ~jf.supp),
                     self.cnp_supp.eq(cnp_check & jf.supp)]
        return m


_POS = ("hole_n", "hole_r", "ahead_n", "ahead_r", "upgt")  # distances that must be > 0
_EQ = ("atm_n", "atm_r", "kat_n", "kat_r")  # equalities


def retx_checks_layout() -> data.StructLayout:
    """D16's compares on the flow's word (:func:`retx_checks`), registered between its two
    stages, each in two halves (the second stage combines them): ``use_rel`` (rel_j is ahead of
    nxt_f: nxt_eff = rel_j); for each candidate of nxt_eff (``_n``: nxt_f, ``_r``: rel_j) the
    distances ``hole`` (top_f - it), ``ahead`` (k - it) and ``upgt`` (k + 1 - top_f) as their
    halves' "not zero" and the sign, ``atm`` (the hole last handled is there) and ``kat`` (k is
    it) as their halves' equalities."""
    f = {"use_rel": 1}
    for n in _POS:
        f |= {f"{n}_lo": 1, f"{n}_hi": 1, f"{n}_s": 1}
    for n in _EQ:
        f |= {f"{n}_lo": 1, f"{n}_hi": 1}
    return data.StructLayout(f)


def retx_checks(m, rtx, k, rel):
    """The first half of D16 (its compares, no decision): a :func:`retx_checks_layout` value of
    the flow's word ``rtx``, index ``k`` and ``rel`` (rel_j as the decision saw it). Every check
    against nxt_eff = max(nxt_f, rel_j) is made against both candidates (no compare behind the
    subtraction that chooses)."""
    P, H = PSN_BITS, PSN_BITS // 2
    out = Signal(retx_checks_layout())

    def sub(a, b, name):
        d = Signal(P, name=name)
        m.d.comb += d.eq(a - b)
        return d

    def dist(name, d):
        m.d.comb += [out[f"{name}_lo"].eq(d[:H] != 0), out[f"{name}_hi"].eq(d[H:] != 0),
                     out[f"{name}_s"].eq(d[P - 1])]

    def eq(name, a, b):
        m.d.comb += [out[f"{name}_lo"].eq(a[:H] == b[:H]), out[f"{name}_hi"].eq(a[H:] == b[H:])]

    nxt_d = sub(rtx.nxt, rel, "rtx_nxt_d")
    m.d.comb += out.use_rel.eq(nxt_d[P - 1])
    dist("upgt", sub(k + 1, rtx.top, "rtx_up"))
    for c, x in ((rtx.nxt, "n"), (rel, "r")):
        dist(f"hole_{x}", sub(rtx.top, c, f"rtx_top_d_{x}"))
        dist(f"ahead_{x}", sub(k, c, f"rtx_ahead_d_{x}"))
        eq(f"atm_{x}", rtx.mark, c)
        eq(f"kat_{x}", k, c)
    return out


class FastRetx(wiring.Component):
    """Fast retransmit (model D16), the decision half: per-flow tracking on data, the ACK
    request (a probe to the receiver) and the ACK rewrite decisions, from the compares of
    :func:`retx_checks` made one stage earlier.

    Inputs (registers of the caller): ``k`` (index), ``rel`` (rel_j as the decision saw it),
    ``present`` / ``contrib`` (a data frame whose contribution is in the slot after it / that
    contributed), ``ack_cur`` (an ACK within the released range), ``fast_en`` (the job's D16
    bit), ``rtx`` (the flow's word, 0 if never written) and ``chk`` (its compares). Outputs:
    ``solicit``, ``nak_fire``, ``rtx_write`` with ``rtx_new``. Combinational, no state.
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        super().__init__({
            "k": In(PSN_BITS), "rel": In(PSN_BITS), "present": In(1), "contrib": In(1),
            "ack_cur": In(1), "fast_en": In(1), "rtx": In(c.rtx_layout),
            "chk": In(retx_checks_layout()),
            "solicit": Out(1), "nak_fire": Out(1), "rtx_write": Out(1),
            "rtx_new": Out(c.rtx_layout),
        })

    def elaborate(self, platform):
        m = Module()
        k4, rel_cur, rtx_cur, rtx_new, chk = self.k, self.rel, self.rtx, self.rtx_new, self.chk
        present, ack_cur, fast_en = self.present, self.ack_cur, self.fast_en
        k4p1 = Signal(PSN_BITS)
        m.d.comb += k4p1.eq(k4 + 1)
        m.d.comb += rtx_new.eq(rtx_cur)
        use_rel = chk.use_rel
        nxt_eff = Mux(use_rel, rel_cur, rtx_cur.nxt)  # nxt_f, or rel_j if that is ahead

        def pos(n):  # a distance modulo 2**24 that is > 0
            return (chk[f"{n}_lo"] | chk[f"{n}_hi"]) & ~chk[f"{n}_s"]

        def eq(n):
            return chk[f"{n}_lo"] & chk[f"{n}_hi"]

        hole = Mux(use_rel, pos("hole_r"), pos("hole_n"))
        ahead = Mux(use_rel, pos("ahead_r"), pos("ahead_n"))
        at_mark = rtx_cur.mark_v & Mux(use_rel, eq("atm_r"), eq("atm_n"))
        k_at = Mux(use_rel, eq("kat_r"), eq("kat_n"))
        top_new = Mux(pos("upgt"), k4p1, rtx_cur.top)
        with m.If(present):
            # the contribution at nxt_f moves it to top_f (model _present)
            m.d.comb += [rtx_new.top.eq(top_new),
                         rtx_new.nxt.eq(Mux(k_at, top_new, nxt_eff))]
            with m.If(fast_en & self.contrib & ahead & ~at_mark):
                m.d.comb += [self.solicit.eq(1), rtx_new.mark_v.eq(1), rtx_new.naked.eq(0),
                             rtx_new.mark.eq(nxt_eff)]
        with m.Elif(ack_cur):
            m.d.comb += rtx_new.nxt.eq(nxt_eff)
            with m.If(fast_en & hole & ~(at_mark & rtx_cur.naked)):
                m.d.comb += [self.nak_fire.eq(1), rtx_new.mark_v.eq(1), rtx_new.naked.eq(1),
                             rtx_new.mark.eq(nxt_eff)]
        m.d.comb += self.rtx_write.eq(present | ack_cur)
        return m


def nak_xor(h):
    """The forwarded ACK's rewrite as XOR bytes in wire order: PSN p -> p + 1, syndrome -> NAK
    (model D16)."""
    psn_x = h.psn ^ (h.psn + 1)[:PSN_BITS]
    return Cat(psn_x[16:24], psn_x[8:16], psn_x[0:8], h.syndrome ^ Const(NAK_PSN_SEQ, 8))
