"""The lookup, check and decide stages of the aggregation control path's decision pipeline.

:class:`LookupStage` (stage 3 of :class:`~.control.AggControl`) turns the flow table's answer into
the frame's index, slot and RAM read addresses and makes the header checks; :class:`CheckStage`
(stage 4) makes every check of the slot word and of the job and flow state that the decision
needs, on the words read and in variants for what the decision in front of the frame changes;
both register their results with the frame. :class:`DecideStage` (stage 5) selects the checks'
variants, decides (:class:`~.decide.Decide`), stalls and commits.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import Role

from .decide import Decide, is_ctrl, job_flags_layout, pre_layout, precheck, slot_flags_layout
from .jobstate import job_inputs
from .roles import JobRoles
from .types import PSN_BITS, HdrClass
from .wide import all_of, any_of, differs, or_chain

__all__ = ["LookupStage", "CheckStage", "DecideStage", "stage_layout", "variants_layout",
           "rmw_read", "job_checks"]


def stage_layout(ctl) -> data.StructLayout:
    """A frame's lookup result as the stages carry it: flow hit, entry, job, rank, index ``k``,
    slot, reverse QPN ``rq``, start PSN ``st`` and its :func:`~.decide.precheck`."""
    return data.StructLayout({"hit": 1, "e": ctl.entry_bits, "j": ctl.job_bits,
                              "r": ctl.rank_bits, "k": PSN_BITS, "slot": ctl.slot_bits,
                              "rq": 24, "st": PSN_BITS, "pre": pre_layout(ctl)})


def variants_layout(pairs: bool = False) -> data.StructLayout:
    """The job and flow checks as the decision directly in front leaves them: ``released`` /
    ``keq_rel`` with rel_j + 1, ``up_lt`` / ``keq_up`` with upptr + 1 (same job); ``nz_a`` and
    ``le_*`` for an ACK behind an ACK of its flow (acked_f = that one's cand; ``_0p``: acked_f
    as read, pointer + 1; ``_a0`` / ``_ap``: acked_f moved, pointer as read / + 1); ``supp_a``
    (a CNP sent by it to the flow); with ``pairs``, ``nz_b`` / ``le_b0`` / ``le_bp`` for an ACK
    behind a side ACK of its flow (acked_f = that one's cand, pointer as read / + 1)."""
    fields = {"released": 1, "keq_rel": 1, "up_lt": 1, "keq_up": 1, "nz_a": 1, "le_0p": 1,
              "le_a0": 1, "le_ap": 1, "supp_a": 1}
    if pairs:
        fields.update({"nz_b": 1, "le_b0": 1, "le_bp": 1})
    return data.StructLayout(fields)


def rmw_read(m, rd_data, same, advance, last_wr, name, forward=True):
    """Resolve a synchronous RAM read for the decision stage: data of the read issued in the
    cycle the header entered the stage, forwarded from the write committed in that same
    cycle (by the decision in front: ``last_wr`` = its registered enable and data; ``same``:
    registered when the header entered, its address is that decision's), and held while the
    stage is stalled. The select is three flip-flops: one LUT per data bit."""
    loaded = Signal(name=f"{name}_loaded")
    m.d.sync += loaded.eq(advance)
    wr_en, wr_data = last_wr
    raw = Mux(wr_en & same, wr_data, rd_data) if forward else rd_data
    hold = Signal.like(rd_data, name=f"{name}_hold")
    eff = Signal.like(rd_data, name=f"{name}_eff")
    m.d.comb += eff.eq(Mux(loaded, raw, hold))
    m.d.sync += hold.eq(eff)
    return eff


def job_checks(m, sfx, k, cand, acked, upsel, free, rel, upptr, w):
    """The job and flow checks (:func:`~.decide.job_flags_layout`, ``supp`` left to the
    caller) of a frame with index ``k`` (``cand``: its new acked_f if an ACK, ``upsel``: its
    ACKs are checked against ``upptr``, D17) on the state given.

    ``released`` and ``up_lt`` are k < rel_j / k < upptr (the sign of the difference): the same
    as k in [free_j, rel_j) / [free_j, upptr) for a frame neither behind nor ahead (free_j <=
    upptr, rel_j <= free_j + W, W <= 2^23), the only frames the decision reads them for
    (``fwait`` takes them ORed with ``behind`` / ``ahead``). The equalities are on carry chains
    (:func:`~.wide.differs`)."""
    f = Signal(job_flags_layout(), name=f"jf{sfx}")
    d_win, rel_d, up_d = (Signal(PSN_BITS, name=f"{n}{sfx}") for n in ("d_win", "rel_d",
                                                                       "up_d"))
    adv, lim = Signal(PSN_BITS, name=f"adv{sfx}"), Signal(PSN_BITS, name=f"lim{sfx}")
    m.d.comb += [d_win.eq(k - free), rel_d.eq(k - rel), up_d.eq(k - upptr),
                 adv.eq(cand - acked), lim.eq(Mux(upsel, upptr, rel) - acked)]
    m.d.comb += [f.behind.eq(d_win[PSN_BITS - 1]), f.ahead.eq(d_win >= w),
                 f.released.eq(rel_d[PSN_BITS - 1]),
                 f.keq_rel.eq(~differs(m, k, rel, f"keq_rel{sfx}")),
                 f.up_lt.eq(up_d[PSN_BITS - 1]),
                 f.keq_up.eq(~differs(m, k, upptr, f"keq_up{sfx}")),
                 f.ack_nz.eq(differs(m, cand, acked, f"ack_nz{sfx}")), f.ack_le.eq(adv <= lim)]
    return f


def _per_job(port, jobs):
    return Array(port[j] for j in range(jobs))


def _role_of(s, r, j, jobs):
    """The role of rank ``r`` of job ``j`` from the job state ports of ``s`` (D17)."""
    return JobRoles.role(r, _per_job(s.leaf, jobs)[j], _per_job(s.up_rank, jobs)[j],
                         _per_job(s.down_rank, jobs)[j], _per_job(s.rack, jobs)[j])


def _any_roles(s, jobs):
    """Per job: a leaf or a spine (its data frames go through the stage mark check)."""
    return Cat(*(s.leaf[j] | s.rack[j].any() for j in range(jobs)))


class LookupStage(wiring.Component):
    """Stage 3 of :class:`~.control.AggControl`: the flow table's answer (``hit``, ``entry``,
    ``fd``) for the header ``h`` -> index k = PSN - start, slot = base + (k mod W), the slot and
    CNP RAM read addresses (``slot_addr``, ``cnp_addr``: the caller enables the reads with
    ``advance``), the header checks (:func:`~.decide.precheck`) and the frame's relation to the
    frames ahead: ``sa_*`` to the frame directly ahead (in the check stage now; it will be
    decided in the cycle this one is checked), ``sz_*`` to the one two ahead (``slot5`` /
    ``r5`` / ``j5``: its RAM writes are committed in the cycle this one's reads are issued);
    ``acked_rk`` / ``seen_rk``: acked_f and the CNP-seen bit of the frame's rank in every job
    (the job is selected by the check stage: a jobs x max_world select in one stage is too
    deep); ``onehot``: the rank one-hot, ``onehot45``: OR the one-hot of the frame directly
    ahead (the check stage's bitmap checks for the case where that frame contributes to the same
    slot); ``km1``: k - 1; ``w4``: W of the frame's job (it changes only while the job is
    disabled, and a job is enabled only with the pipeline empty); ``free4``: free_j of the
    frame's job as it is in this cycle (combinational from registers: its next value, from
    ``free`` and the free-tree result being applied ``f_valid`` / ``f_job`` / ``f_free``,
    registered with the frame, or in the cycle before while it is held): the check stage's
    window compares take no job select.

    Inputs from the job state (:class:`~.jobstate.JobState`): ``enabled``, ``pmtu``, ``base``,
    ``w``, the roles, ``full`` / ``cmask``, ``acked``, ``cnp_seen``, ``free`` (and the
    result applied to it).

    With pairs (:mod:`.sideack`): ``sa_flow_s`` / ``sz_flow_s``, the frame's flow against the
    side frames directly ahead / two ahead (``j4s`` / ``r4s``, ``j5s`` / ``r5s``); the free_j
    result of the side lane's tree (``f2_*``) like the first one's.

    Contract: latency 1 (``o``, ``sa_*``, ``sz_*``, ``onehot``, ``acked_rk``, ``seen_rk``,
    ``w4``, ``km1`` are registers loaded when ``advance``, ``free4`` a select of registers; the
    read addresses are combinational); throughput one frame per cycle; backpressure: holds
    while ``advance`` is low; errors: none (an unregistered or bad frame is classified by
    ``o.pre``).
    """

    def __init__(self, ctl, fd_layout):
        c = self._ctl = ctl
        super().__init__({
            "advance": In(1), "h": In(c.hdr_pipe_layout), "hit": In(1),
            "entry": In(c.entry_bits), "fd": In(fd_layout),
            "slot5": In(c.slot_bits), "r5": In(c.rank_bits), "j5": In(c.job_bits),
            **job_inputs(c, ("enabled", "pmtu", "base", "w", "leaf", "up_rank", "down_rank",
                             "rack", "full", "cmask", "acked", "cnp_seen", "free")),
            "f_valid": In(1), "f_job": In(c.job_bits), "f_free": In(PSN_BITS),
            "slot_addr": Out(c.slot_bits), "cnp_addr": Out(c.rank_bits + c.job_bits),
            "o": Out(stage_layout(c)), "sa_slot": Out(1), "sa_flow": Out(1), "sa_job": Out(1),
            "sz_slot": Out(1), "sz_flow": Out(1), "onehot": Out(c.max_world),
            "onehot45": Out(c.max_world), "acked_rk": Out(data.ArrayLayout(PSN_BITS, c.jobs)),
            "seen_rk": Out(c.jobs), "free4": Out(PSN_BITS), "w4": Out(c.w_bits),
            "km1": Out(PSN_BITS),
            **({"j4s": In(c.job_bits), "r4s": In(c.rank_bits), "j5s": In(c.job_bits),
                "r5s": In(c.rank_bits), "sa_flow_s": Out(1), "sz_flow_s": Out(1),
                "f2_valid": In(1), "f2_job": In(c.job_bits), "f2_free": In(PSN_BITS)}
               if c.pairs else {}),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        J, WD = c.jobs, c.max_world
        fd, h3, advance = self.fd, self.h, self.advance
        k3 = Signal(PSN_BITS)
        slot3 = Signal(c.slot_bits)
        m.d.comb += [
            k3.eq(h3.psn - fd.start),
            slot3.eq(_per_job(self.base, J)[fd.job] + (k3 & (_per_job(self.w, J)[fd.job] - 1))),
            self.slot_addr.eq(slot3), self.cnp_addr.eq(Cat(fd.rank, fd.job)),
        ]
        # the decision's header checks, registered with the frame (off the slot word's path)
        pre3 = Signal(pre_layout(c))
        precheck(m, c, pre3, h3, self.hit, _per_job(self.enabled, J)[fd.job],
                 _per_job(self.pmtu, J)[fd.job], _any_roles(self, J).bit_select(fd.job, 1),
                 _role_of(self, fd.rank, fd.job, J),
                 Array(self.full[j] & self.cmask[j] for j in range(J))[fd.job])
        p4 = {n: Signal(sh.shape, name=f"{n}4") for n, sh in stage_layout(c)}
        sa_slot, sa_flow, sa_job = Signal(), Signal(), Signal()
        sz_slot, sz_flow = Signal(), Signal()
        flow3 = Cat(fd.rank, fd.job)
        acked_rk = [Signal(PSN_BITS, name=f"acked_rk{j}") for j in range(J)]
        seen_rk = Signal(J, name="seen_rk")
        o4 = Signal(WD, name="onehot4")
        o45 = Signal(WD, name="onehot45")
        o3 = (Const(1, WD) << fd.rank)[:WD]
        free_ld = Signal(PSN_BITS)

        def free_nx(j):
            # free_j of job ``j`` in the next cycle: the free-tree result being applied, if
            # it is that job's (the reset at an enable comes with the pipeline empty)
            cur = _per_job(self.free, J)[j]
            if c.pairs:
                cur = Mux(self.f2_valid & (self.f2_job == j), self.f2_free, cur)
            return Mux(self.f_valid & (self.f_job == j), self.f_free, cur)
        with m.If(advance):
            m.d.sync += [p4["hit"].eq(self.hit), p4["e"].eq(self.entry), p4["j"].eq(fd.job),
                         p4["r"].eq(fd.rank), p4["k"].eq(k3), p4["slot"].eq(slot3),
                         p4["rq"].eq(fd.rev_qpn), p4["st"].eq(fd.start), p4["pre"].eq(pre3),
                         sa_slot.eq(slot3 == p4["slot"]),
                         sa_flow.eq(flow3 == Cat(p4["r"], p4["j"])), sa_job.eq(fd.job == p4["j"]),
                         sz_slot.eq(slot3 == self.slot5),
                         sz_flow.eq(flow3 == Cat(self.r5, self.j5)),
                         o4.eq(o3), o45.eq(o3 | o4)]
            if c.pairs:
                m.d.sync += [self.sa_flow_s.eq(flow3 == Cat(self.r4s, self.j4s)),
                             self.sz_flow_s.eq(flow3 == Cat(self.r5s, self.j5s))]
            m.d.sync += [acked_rk[j].eq(Array(self.acked[j][r] for r in range(WD))[fd.rank])
                         for j in range(J)]
            m.d.sync += [seen_rk[j].eq(Array(self.cnp_seen[j][r] for r in range(WD))[fd.rank])
                         for j in range(J)]
            m.d.sync += [self.w4.eq(_per_job(self.w, J)[fd.job]),
                         free_ld.eq(free_nx(fd.job)), self.km1.eq(h3.psn + ~fd.start)]
        # free_j of the frame's job: as loaded with it, or (held) as kept every cycle
        loaded, free_hold = Signal(), Signal(PSN_BITS)
        m.d.sync += [loaded.eq(advance), free_hold.eq(free_nx(p4["j"]))]
        m.d.comb += self.free4.eq(Mux(loaded, free_ld, free_hold))
        m.d.comb += [self.o[n].eq(v) for n, v in p4.items()]
        m.d.comb += [self.sa_slot.eq(sa_slot), self.sa_flow.eq(sa_flow), self.sa_job.eq(sa_job),
                     self.sz_slot.eq(sz_slot), self.sz_flow.eq(sz_flow), self.onehot.eq(o4),
                     self.onehot45.eq(o45)]
        m.d.comb += [self.acked_rk[j].eq(acked_rk[j]) for j in range(J)]
        m.d.comb += self.seen_rk.eq(seen_rk)
        return m


def _check_outputs(ctl) -> dict:
    """The shapes of :class:`CheckStage`'s outputs."""
    c = ctl
    return {"o": stage_layout(c), "onehot": c.max_world, "sf_b": slot_flags_layout(),
            "sf_f": slot_flags_layout(), "sf_c": slot_flags_layout(), "jf": job_flags_layout(),
            "jv": variants_layout(c.pairs), "slot_w": c.slot_layout, "acked": PSN_BITS,
            "cand": PSN_BITS, "sa_flow5": 1, "upsel": 1, "upsel4": 1, "rh": 1,
            "en": 1, "leaf5": 1, "roles": 1, "role": 2, "fwait": 1, "reg": 1, "reg_oh": c.jobs,
            "reg_ohd": c.jobs}


class CheckStage(wiring.Component):
    """Stage 4 of :class:`~.control.AggControl`: the checks of a frame (``h4``, ``i``: the
    lookup stage's registers) on the slot word, the CNP time and acked_f read for it (``slot_rd``,
    ``cnp_rd``: the RAM data of the reads issued when it entered; ``acked_rk``, ``seen_rk``),
    forwarded from the decision stage's writes of the cycle before (``sw_*``, ``cw_*``,
    ``aw_*``: the frame two ahead), and on the job's state.

    Outputs (registers, loaded with the frame when ``advance``: the decision stage's inputs):
    the lookup record ``o`` and ``onehot``; slot checks ``sf_b`` on the word as read, ``sf_f`` /
    ``sf_c`` as the decision in front leaves it if it writes the same slot (its first / another
    contribution); job and flow checks ``jf`` on the state now and their variants ``jv``
    (:func:`variants_layout`) for what the decision in front changes; the word read
    ``slot_w``, ``acked`` (acked_f) and ``cand`` (an ACK/NAK's new acked_f); ``sa_flow5`` (the
    lookup stage's relation, one stage on), ``upsel`` (a leaf's UP flow: ACKs checked against
    upptr, D17; ``upsel4``: the same of the frame in this stage, combinational), ``rh`` (a ROCE
    header with a flow hit), ``en`` / ``leaf`` / ``roles`` / ``role`` (the job's enabled bit and
    roles, the flow's role: they change only while the pipeline is empty), ``fwait`` (a data
    header whose checks a free_j still in flight can change); ``reg`` (the frame is registered:
    valid, ROCE, flow hit, job enabled; ``v4`` is the stage's valid) and ``reg_oh`` /
    ``reg_ohd`` (that as a one-hot of its job, alone and with ``fwait``).
    ``h5`` is the header of the frame in the decision stage (the frame directly ahead).

    Contract: latency 1; throughput one frame per cycle (the variants make a frame right
    behind another of its slot, job or flow exact without a bubble); backpressure: holds while
    ``advance`` is low (the words read are held with it); errors: none. Forwarding of the slot,
    CNP and acked_f words is off for the names in ``ctl._no_forwarding`` (tests).
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        J, WD, TB = c.jobs, c.max_world, c.time_bits
        super().__init__({
            "advance": In(1), "v4": In(1), "h4": In(c.hdr_pipe_layout),
            "h5": In(c.hdr_pipe_layout),
            "i": In(stage_layout(c)), "sa_slot": In(1), "sa_flow": In(1), "sa_job": In(1),
            "sz_slot": In(1), "sz_flow": In(1), "onehot4": In(WD), "onehot45": In(WD),
            "acked_rk": In(data.ArrayLayout(PSN_BITS, J)), "seen_rk": In(J),
            "free4": In(PSN_BITS), "w4": In(c.w_bits), "km1": In(PSN_BITS),
            "slot_rd": In(c.slot_layout), "cnp_rd": In(TB),
            "sw_en": In(1), "sw_data": In(c.slot_layout), "cw_en": In(1), "cw_data": In(TB),
            "aw_en": In(1), "aw_data": In(PSN_BITS),
            **job_inputs(c, ("enabled", "cnp", "rel", "upptr", "leaf", "up_rank", "down_rank",
                             "rack")),
            **{n: Out(sh) for n, sh in _check_outputs(c).items()},
            # the side lane (pairs): its write of the cycle before and the frame's relation to
            # it, the cand of the side frame in the decision stage
            **({"sz_flow_s": In(1), "aw2_en": In(1), "aw2_data": In(PSN_BITS),
                "cand5s": In(PSN_BITS)} if c.pairs else {}),
        })

    def elaborate(self, platform):  # noqa: C901 (the checks of the decision, and variants)
        m = Module()
        c = self._ctl
        J, TB = c.jobs, c.time_bits
        nofwd = c._no_forwarding
        advance, h4, h5, p4 = self.advance, self.h4, self.h5, self.i
        k4, r4, j4, o4, mask4 = p4.k, p4.r, p4.j, self.onehot4, p4.pre.mask
        sz_slot, sz_flow = self.sz_slot, self.sz_flow
        sw_en, sw_data = self.sw_en, self.sw_data
        # the stage-5 registers this stage loads (read back: the frame directly ahead)
        p5 = {n: Signal(sh.shape, name=f"{n}5") for n, sh in stage_layout(c)}
        k5, r5 = p5["k"], p5["r"]
        o5 = Signal(c.max_world, name="onehot5")
        cand4, cand5 = Signal(PSN_BITS), Signal(PSN_BITS)

        slot_w = data.View(c.slot_layout, rmw_read(m, self.slot_rd, sz_slot, advance,
                                                   (sw_en, sw_data), "slot", "slot" not in nofwd))
        # the slot word's checks are made on its two new sources (the RAM data, the write
        # forwarded) and selected after the compares; a frame held in the stage keeps its checks
        # in a register (while it is held, the word and the frame's fields are those of the cycle
        # before: so are the checks), no compare on the held word
        slot_loaded = Signal()
        m.d.sync += slot_loaded.eq(advance)
        slot_fwd = sw_en & sz_slot
        if "slot" in nofwd:
            slot_fwd = Const(0)
        slot_srcs = (self.slot_rd, sw_data)

        def on_slot(fn):
            # (kept nets: the synthesis maps each compare on its own, the select after it)
            ram_v, sw_v = (Signal(name=f"slot_chk_{x}", attrs={"keep": 1}) for x in ("ram", "fwd"))
            hold_v, cur = Signal(name="slot_chk_hold"), Signal(name="slot_chk")
            m.d.comb += [v.eq(fn(w, x)) for v, w, x in zip((ram_v, sw_v), slot_srcs,
                                                           ("ram", "fwd"), strict=True)]
            m.d.comb += cur.eq(Mux(slot_loaded, Mux(slot_fwd, sw_v, ram_v), hold_v))
            m.d.sync += hold_v.eq(cur)
            return cur
        cnp_w = rmw_read(m, self.cnp_rd, sz_flow, advance, (self.cw_en, self.cw_data), "cnp",
                         "cnp" not in nofwd)
        acked_rd = Signal(PSN_BITS)
        m.d.comb += acked_rd.eq(_per_job(self.acked_rk, J)[j4])
        if c.pairs and "acked" not in nofwd:  # or from the side frame two ahead
            acked_rd2 = Signal(PSN_BITS)
            m.d.comb += acked_rd2.eq(Mux(self.aw2_en & self.sz_flow_s, self.aw2_data, acked_rd))
            acked_rd = acked_rd2
        acked_w = rmw_read(m, acked_rd, sz_flow, advance, (self.aw_en, self.aw_data), "acked",
                           "acked" not in nofwd)
        sig4, sig5 = Cat(h4.opcode[:4], h4.plen), Cat(h5.opcode[:4], h5.plen)
        # slot checks on the word as read (``_b``), and as the decision in front leaves it when it
        # writes the same slot: its first contribution (``_f``), another contribution (``_c``)
        sf_b, sf_f, sf_c = (Signal(slot_flags_layout(), name=f"sf{x}4") for x in "bfc")
        m.d.comb += [
            # (EMPTY = not valid or another index; the compares on carry chains, see .wide)
            sf_b.empty.eq(on_slot(lambda w, x: ~w.valid | differs(m, w.index, k4, f"idx_{x}"))),
            sf_b.sigmis.eq(on_slot(lambda w, x: differs(m, Cat(w.opcode, w.plen), sig4,
                                                        f"sig_{x}"))),
            sf_b.tot.eq(slot_w.total),
            # (the bitmap checks as trees of kept 6-input LUTs: see .wide)
            sf_b.pres.eq(on_slot(lambda w, x: any_of(m, w.bitmap & o4, f"pres_{x}", 3))),
            sf_b.cc.eq(on_slot(lambda w, x: all_of(m, ~((w.bitmap | o4) ^ mask4), f"cc_{x}",
                                                   2))),
            sf_b.cf.eq(all_of(m, ~(o4 ^ mask4), "cf", 3)),
            sf_f.empty.eq(k5 != k4), sf_f.sigmis.eq(sig5 != sig4), sf_f.pres.eq(r5 == r4),
            # (``onehot45`` = o5 | o4, registered by the lookup stage: one input less per bit)
            sf_f.cc.eq(all_of(m, ~(self.onehot45 ^ mask4), "ccf", 3)),
            sf_c.pres.eq(sf_b.pres | (r5 == r4)),
            sf_c.cc.eq(on_slot(lambda w, x: all_of(m, ~((w.bitmap | self.onehot45) ^ mask4),
                                                   f"ccc_{x}", 2))),
        ]
        # job and flow checks on the state now (``_b``), and variants for what the decision in
        # front changes: rel_j / upptr + 1 (same job), acked_f = its cand, a CNP sent (same flow)
        leaf4 = _per_job(self.leaf, J)[j4]
        role4 = _role_of(self, r4, j4, J)
        upsel4 = leaf4 & (role4 == Role.UP)  # D17: a leaf's UP flow is acked for upptr
        m.d.comb += cand4.eq(k4 + (h4.syndrome[5:7] == 0))
        rel4, up4 = _per_job(self.rel, J)[j4], _per_job(self.upptr, J)[j4]
        jf_b = job_checks(m, "4", k4, cand4, acked_w, upsel4, self.free4, rel4, up4, self.w4)
        ptr4 = Signal(PSN_BITS)
        m.d.comb += ptr4.eq(Mux(upsel4, up4, rel4))
        ptr4p1 = Signal(PSN_BITS)
        m.d.comb += ptr4p1.eq(ptr4 + 1)
        jv = Signal(variants_layout(c.pairs))

        def ack_le(cand, a, p):
            adv, lim = Signal(PSN_BITS), Signal(PSN_BITS)
            m.d.comb += [adv.eq(cand - a), lim.eq(p - a)]
            return adv <= lim

        tdb, tda = Signal(TB), Signal(TB)
        cnp_iv = _per_job(self.cnp, J)[j4]
        m.d.comb += [tdb.eq(h4.time - cnp_w), tda.eq(h4.time - h5.time)]
        # the CNP-seen bit of the flow: the lookup stage's registered bit of its rank in every
        # job, forwarded like the CNP time (a CNP commit sets both): a 4:1 select, not the
        # jobs x max_world one
        seen_rd = Signal()
        m.d.comb += seen_rd.eq(self.seen_rk.bit_select(j4, 1))
        seen4 = rmw_read(m, seen_rd, sz_flow, advance, (self.cw_en, Const(1)), "seen",
                         "cnp" not in nofwd)
        m.d.comb += [
            jf_b.supp.eq(seen4 & (tdb[TB - 1] | (tdb < cnp_iv))),
            # (k = rel_j + 1 as k - 1 = rel_j)
            jv.released.eq(jf_b.released | jf_b.keq_rel),
            jv.keq_rel.eq(~differs(m, self.km1, rel4, "keq_rel_p")),
            jv.up_lt.eq(jf_b.up_lt | jf_b.keq_up),
            jv.keq_up.eq(~differs(m, self.km1, up4, "keq_up_p")),
            jv.nz_a.eq(differs(m, cand4, cand5, "nz_a")),
            jv.le_0p.eq(ack_le(cand4, acked_w, ptr4p1)),
            jv.le_a0.eq(ack_le(cand4, cand5, ptr4)),
            jv.le_ap.eq(ack_le(cand4, cand5, ptr4p1)),
            jv.supp_a.eq(tda[TB - 1] | (tda < cnp_iv)),
        ]
        if c.pairs:
            m.d.comb += [jv.nz_b.eq(differs(m, cand4, self.cand5s, "nz_b")),
                         jv.le_b0.eq(ack_le(cand4, self.cand5s, ptr4)),
                         jv.le_bp.eq(ack_le(cand4, self.cand5s, ptr4p1))]

        # the registers into the decision stage
        sf5_b, sf5_f, sf5_c = (Signal(slot_flags_layout(), name=f"sf{x}5") for x in "bfc")
        jf5, jv5 = Signal(job_flags_layout()), Signal(variants_layout(c.pairs), name="jv5")
        slot5_w = Signal(c.slot_layout)
        acked5 = Signal(PSN_BITS)
        sa_flow5, upsel5 = Signal(), Signal()
        rh5, fwait5 = Signal(), Signal()
        en5, leaf5, roles5, role5 = Signal(), Signal(), Signal(), Signal(2)
        # the frame is registered (valid, ROCE, flow hit, job enabled), as a register and as a
        # one-hot of its job (alone, and with ``fwait``): the decision stage's stall and commit
        # take no decoder or job select
        reg5, reg_oh5, reg_ohd5 = Signal(), Signal(J), Signal(J)
        en4 = _per_job(self.enabled, J)[j4]
        rh4 = (h4.cls == HdrClass.ROCE) & p4.hit
        reg4 = self.v4 & rh4 & en4
        fwait4 = ~is_ctrl(h4) & (jf_b.behind | jf_b.ahead | jf_b.released)
        with m.If(advance):
            m.d.sync += [en5.eq(en4), leaf5.eq(leaf4), role5.eq(role4),
                         roles5.eq(_any_roles(self, J).bit_select(j4, 1))]
            m.d.sync += [rh5.eq(rh4), fwait5.eq(fwait4), reg5.eq(reg4),
                         reg_oh5.eq(Cat(*(reg4 & (j4 == j) for j in range(J)))),
                         reg_ohd5.eq(Cat(*(reg4 & fwait4 & (j4 == j) for j in range(J))))]
            m.d.sync += [v.eq(p4[n]) for n, v in p5.items()]
            m.d.sync += o5.eq(o4)
            m.d.sync += [sf5_b.eq(sf_b), sf5_f.eq(sf_f), sf5_c.eq(sf_c), jf5.eq(jf_b),
                         jv5.eq(jv), slot5_w.eq(slot_w), acked5.eq(acked_w), cand5.eq(cand4),
                         sa_flow5.eq(self.sa_flow), upsel5.eq(upsel4)]
        m.d.comb += [self.o[n].eq(v) for n, v in p5.items()]
        m.d.comb += [self.onehot.eq(o5), self.sf_b.eq(sf5_b), self.sf_f.eq(sf5_f),
                     self.sf_c.eq(sf5_c), self.jf.eq(jf5), self.jv.eq(jv5),
                     self.slot_w.eq(slot5_w), self.acked.eq(acked5), self.cand.eq(cand5),
                     self.sa_flow5.eq(sa_flow5), self.upsel.eq(upsel5),
                     self.upsel4.eq(upsel4), self.rh.eq(rh5),
                     self.en.eq(en5), self.leaf5.eq(leaf5), self.roles.eq(roles5),
                     self.role.eq(role5), self.fwait.eq(fwait5), self.reg.eq(reg5),
                     self.reg_oh.eq(reg_oh5), self.reg_ohd.eq(reg_ohd5)]
        return m


class DecideStage(wiring.Component):
    """Stage 5 of :class:`~.control.AggControl`: the decision (:class:`~.decide.Decide`) of the
    frame in the stage (``v``, ``h``, ``i`` and the check stage's registers, connected by name),
    its stall and its commit.

    The check stage's flags are corrected for the decision directly in front (committed in the
    cycle this frame entered the stage): which correction applies is registered at that commit
    (from the frame's relation to it, ``sa_*4``, and its strobes), so the corrected flags are
    selects of registers with at most 7 inputs (one or two LUT levels). A
    frame held in the stage (the pipeline did not move in the cycle before) uses copies made
    while it waits (registers loaded only then, so that no register's input depends on
    ``advance``): its corrected slot checks and words, and its job checks made again on the
    state of that cycle (a chain or a free_j result may move it while it waits: the stall keeps
    it from deciding on checks older than one cycle).

    ``block`` (from registers): the frame must wait: ``hold`` (the caller's reasons: release
    FIFO room, the scheduler's push, the scrub's turn), D16's ``haz`` (the frame ahead writes
    the flow's fast-retransmit word), or its job's state is moving (``chain_busy`` /
    ``chain_up`` / ``moved``: a chain or its last step; ``free_wait``: a free_j in flight or
    just applied, only for a data frame whose checks it can change, ``fwait``).

    Outputs with ``advance`` (the caller's pipeline enable: no ``block`` and the stages behind
    move): ``commit`` (a frame leaves the stage), ``registered`` (it is a ROCE frame of an
    enabled job with a flow hit), ``cj`` (one-hot job of a committed registered frame), the
    decision's outputs (``disp``, ``action``, strobes, ``slot_new``...: see
    :class:`~.decide.Decide`), ``acked_cur`` (acked_f as decided on), ``slot_wr`` (write
    ``slot_new`` to the frame's slot), ``cnp_wr`` (write the frame's time to its flow's CNP
    time); registered for the next frame: ``sw_*`` (the slot write, unless the scrub took the
    port: ``scrub_go``), ``cw_*``, ``aw_*`` (acked_f moved).

    Contract: latency 0 to the decision (combinational from registers), 1 to the forwarded
    writes; throughput one decision per cycle; backpressure: ``block``, and ``advance`` low
    holds the frame; errors: none of its own (the decision's dispositions).
    """

    _CHECKS = ("onehot", "sf_b", "sf_f", "sf_c", "jf", "jv", "slot_w", "acked", "cand",
               "upsel", "upsel4", "rh", "en", "leaf5", "roles", "role",
               "fwait", "reg", "reg_oh", "reg_ohd")
    _DECIDE = ("disp", "action", "rx_data", "ack_stale", "ack_take", "ack_cur", "present",
               "slot_write", "slot_new", "first", "release_now", "pend_inc", "mismatch",
               "cnp_send", "cnp_supp", "up_now", "up_pend", "remark", "mark", "total")

    def __init__(self, ctl):
        c = self._ctl = ctl
        J = c.jobs
        self._fn = Decide(c)
        checks = {n: In(_check_outputs(c)[n]) for n in self._CHECKS}
        fn = {n: Out(self._fn.signature.members[n].shape) for n in self._DECIDE}
        super().__init__({
            "advance": In(1), "v": In(1), "h": In(c.hdr_pipe_layout), "i": In(stage_layout(c)),
            **checks,
            **job_inputs(c, ("free", "rel", "upptr", "w", "chain_busy", "chain_up", "moved",
                             "free_wait")),
            "hold": In(1), "haz": In(1), "scrub_go": In(1),
            # the frame in the check stage: its relation to this stage's frame, its UP flag
            "sa_slot4": In(1), "sa_flow4": In(1), "sa_job4": In(1), "upsel4": In(1),
            "block": Out(1), "commit": Out(1), "registered": Out(1), "cj": Out(J), **fn,
            "acked_cur": Out(PSN_BITS), "slot_wr": Out(1), "cnp_wr": Out(1),
            "sw_en": Out(1), "sw_data": Out(c.slot_layout), "cw_en": Out(1),
            "cw_data": Out(c.time_bits), "aw_en": Out(1), "aw_data": Out(PSN_BITS),
            # the side lane (pairs): the frame's flow is the side frame's directly ahead
            # (``sa_flow4s``, of the frame in the check stage), that frame's commit moving its
            # acked_f (``s_take``) and its write registered (``aw2_*``); ``xblock``: the side
            # frame in this stage, one-hot of its job if registered (it waits for the job's
            # chained release as this frame does)
            **({"sa_flow4s": In(1), "s_take": In(1), "aw2_en": In(1),
                "aw2_data": In(PSN_BITS), "xblock": In(J)} if c.pairs else {}),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        J = c.jobs
        nofwd = c._no_forwarding
        m.submodules.fn = dk = self._fn
        advance, v5, h5, p5 = self.advance, self.v, self.h, self.i
        k5, j5, r5 = p5.k, p5.j, p5.r
        sf5_b, sf5_f, sf5_c, jf5, jv5 = self.sf_b, self.sf_f, self.sf_c, self.jf, self.jv
        upsel5, cand5 = self.upsel, self.cand
        # the decision in front's writes, registered (forwarded into this and the check stage)
        sw_en, sw_data = Signal(), Signal(c.slot_layout)
        aw_en, aw_data = Signal(), Signal(PSN_BITS)
        # which of the check stage's variants applies (registered when the frame entered the
        # stage, from the decision committed then): it wrote the frame's slot (``slot_a``: its
        # word is the one to use), as the slot's first (``first_a``) or another contribution
        # (``contrib_a``) or a leaf's total (``tot_a``); it moved the job's rel_j / upptr
        # (``rel_a`` / ``up_a``; ``ptr_a``: the one this frame's ACKs are checked against);
        # it moved the flow's acked_f (``ack_a``) or sent it a CNP (``cnp_a``)
        slot_a, first_a, tot_a, contrib_a = (Signal(name=f"{n}_a") for n in ("slot", "first",
                                                                           "tot", "contrib"))
        rel_a, up_a, ptr_a, ack_a, cnp_a = (Signal(name=f"{n}_a") for n in ("rel", "up", "ptr",
                                                                           "ack", "cnp"))
        slot_w_en = self.slot_wr & ~self.scrub_go
        reg_c = advance & self.reg  # a registered frame commits
        m.d.sync += [slot_a.eq(self.sa_slot4 & slot_w_en),
                     first_a.eq(self.sa_slot4 & slot_w_en & dk.first),
                     tot_a.eq(self.sa_slot4 & slot_w_en & dk.tot_done),
                     contrib_a.eq(self.sa_slot4 & slot_w_en & ~dk.first & ~dk.tot_done),
                     rel_a.eq(self.sa_job4 & reg_c & dk.release_now),
                     up_a.eq(self.sa_job4 & reg_c & dk.up_now),
                     ptr_a.eq(self.sa_job4 & reg_c & Mux(self.upsel4, dk.up_now, dk.release_now)),
                     ack_a.eq(self.sa_flow4 & reg_c & dk.ack_take),
                     cnp_a.eq(self.sa_flow4 & self.cnp_wr)]
        if "slot" in nofwd:
            slot_a = first_a = tot_a = contrib_a = Const(0)
        ack_b = Const(0)
        if c.pairs:  # the side frame in front moved the flow's acked_f
            ack_b = Signal(name="ack_b")
            m.d.sync += ack_b.eq(self.sa_flow4s & self.s_take)
        if "acked" in nofwd:
            ack_a = ack_b = Const(0)
        if "cnp" in nofwd:
            cnp_a = Const(0)
        # a frame held in the stage: the copies made while it waits
        held5 = Signal()
        m.d.sync += held5.eq(~advance)
        sf_h, jf_hq = Signal(slot_flags_layout()), Signal(job_flags_layout())
        slot_h, acked_h = Signal(c.slot_layout), Signal(PSN_BITS)
        sf = Signal(slot_flags_layout(), attrs={"keep": 1})
        jf = Signal(job_flags_layout(), attrs={"keep": 1})
        slot_cur = Signal(c.slot_layout)
        acked_cur = self.acked_cur

        def pick(h, v):
            return Mux(held5, h, v)
        # without the main frame in front moving the flow's acked_f: the side frame's (pairs)
        nz_b, le_b = jf5.ack_nz, Mux(ptr_a, jv5.le_0p, jf5.ack_le)
        acked_b = self.acked
        if c.pairs:
            nz_b = Mux(ack_b, jv5.nz_b, nz_b)
            le_b = Mux(ack_b, Mux(ptr_a, jv5.le_bp, jv5.le_b0), le_b)
            acked_b = Mux(ack_b, self.aw2_data, acked_b)
        m.d.comb += [
            sf.empty.eq(pick(sf_h.empty, Mux(first_a, sf5_f.empty, sf5_b.empty))),
            sf.sigmis.eq(pick(sf_h.sigmis, Mux(first_a, sf5_f.sigmis, sf5_b.sigmis))),
            sf.tot.eq(pick(sf_h.tot, Mux(first_a, 0, tot_a | sf5_b.tot))),
            # (with another contribution in front: present if in the bitmap or its rank)
            sf.pres.eq(pick(sf_h.pres, Mux(first_a, sf5_f.pres,
                                           sf5_b.pres | (contrib_a & sf5_f.pres)))),
            sf.cc.eq(pick(sf_h.cc, Mux(first_a, sf5_f.cc, Mux(contrib_a, sf5_c.cc, sf5_b.cc)))),
            sf.cf.eq(pick(sf_h.cf, sf5_b.cf)),
            jf.behind.eq(pick(jf_hq.behind, jf5.behind)),
            jf.ahead.eq(pick(jf_hq.ahead, jf5.ahead)),
            jf.released.eq(pick(jf_hq.released, Mux(rel_a, jv5.released, jf5.released))),
            jf.keq_rel.eq(pick(jf_hq.keq_rel, Mux(rel_a, jv5.keq_rel, jf5.keq_rel))),
            jf.up_lt.eq(pick(jf_hq.up_lt, Mux(up_a, jv5.up_lt, jf5.up_lt))),
            jf.keq_up.eq(pick(jf_hq.keq_up, Mux(up_a, jv5.keq_up, jf5.keq_up))),
            jf.ack_nz.eq(pick(jf_hq.ack_nz, Mux(ack_a, jv5.nz_a, nz_b))),
            jf.ack_le.eq(pick(jf_hq.ack_le, Mux(ack_a, Mux(ptr_a, jv5.le_ap, jv5.le_a0),
                                                le_b))),
            jf.supp.eq(pick(jf_hq.supp, Mux(cnp_a, jv5.supp_a, jf5.supp))),
            slot_cur.eq(pick(slot_h, Mux(slot_a, sw_data, self.slot_w))),
            acked_cur.eq(pick(acked_h, Mux(ack_a, aw_data, acked_b))),
        ]
        # the held copies: the slot checks as corrected, the job checks made again on the state
        # of the cycle (``supp`` as corrected: the CNP time does not move while it waits)
        jf_h = job_checks(m, "5", k5, cand5, acked_cur, upsel5, _per_job(self.free, J)[j5],
                          _per_job(self.rel, J)[j5], _per_job(self.upptr, J)[j5],
                          _per_job(self.w, J)[j5])
        m.d.comb += jf_h.supp.eq(jf.supp)
        with m.If(~advance):
            m.d.sync += [sf_h.eq(sf), slot_h.eq(slot_cur), acked_h.eq(acked_cur), jf_hq.eq(jf_h)]

        registered = self.registered
        m.d.comb += registered.eq(self.reg)  # = v & rh & en, a register
        m.d.comb += [dk.roles.eq(self.roles), dk.leaf.eq(self.leaf5), dk.role.eq(self.role),
                     dk.h.eq(h5), dk.k.eq(k5), dk.rank.eq(r5), dk.onehot_r.eq(self.onehot),
                     dk.cand.eq(cand5), dk.slot.eq(slot_cur), dk.sf.eq(sf), dk.jf.eq(jf),
                     dk.pre.eq(p5.pre)]
        m.d.comb += [getattr(self, n).eq(getattr(dk, n)) for n in self._DECIDE]

        # the stall (all from registers). ACK/NAK acceptance reads rel_j and acked_f (never
        # free_j): only data waits for free_j (``fwait``); everything waits for a chained
        # release (it moves rel_j)
        jb_all = Cat(*(self.chain_busy[j] | self.chain_up[j] | self.moved[j] for j in range(J)))
        jb_data = self.free_wait
        # (a registered frame's job as a one-hot register: an AND-OR, no job select)
        # ... and only data whose checks a newer free_j can change. A free_j in flight comes from
        # ACKs/NAKs decided before the frame, each taken only up to rel_j (upptr on a leaf's UP
        # flow, so free_j <= upptr too): it is at most rel_j as the frame's checks read it. A
        # frame checked neither behind, nor ahead, nor released (free <= rel <= k < free + W)
        # gets the same behind / ahead / released / up_lt for any such free_j and need not wait
        # (data right after an ACK burst: the all-reduce's steady state)
        # (the OR of the jobs' terms and the other reasons on a carry chain, see .wide: the
        # pipeline enable, one LUT after it, stays a shallow input of every commit strobe)
        jterm = Cat(*((self.reg_oh[j] & jb_all[j]) | (self.reg_ohd[j] & jb_data[j])
                      for j in range(J)))
        if c.pairs:  # the side frame's: its job's rel_j moving (it checks against rel_j)
            jterm = Cat(jterm, Cat(*(self.xblock[j] & jb_all[j] for j in range(J))))
        terms = Cat(jterm, self.hold,
                    # D16: the frame directly ahead writes the flow's word (read it after the
                    # write)
                    self.rh & self.haz)
        m.d.comb += self.block.eq(or_chain(m, terms, "jblock"))
        commit = self.commit
        m.d.comb += commit.eq(v5 & advance)
        # (= commit & registered: one-hot)
        m.d.comb += self.cj.eq(Mux(advance, self.reg_oh, 0))
        m.d.comb += [self.slot_wr.eq(commit & dk.slot_write), self.cnp_wr.eq(commit & dk.cnp_send)]
        m.d.sync += [aw_en.eq(advance & registered & dk.ack_take), aw_data.eq(cand5),
                     sw_en.eq(slot_w_en),
                     # (the data is used only with ``sw_en``: no commit on its path)
                     sw_data.eq(dk.slot_new),
                     self.cw_en.eq(self.cnp_wr), self.cw_data.eq(h5.time)]
        m.d.comb += [self.sw_en.eq(sw_en), self.sw_data.eq(sw_data), self.aw_en.eq(aw_en),
                     self.aw_data.eq(aw_data)]
        return m

