"""The enable sequencer of the aggregation control path (model decision D9).

:class:`EnableSequencer` watches ``JOB.CTRL.enable`` of every job. On 0 -> 1 it checks the job's
registers, scans the flow table configuration for the job's entries (checking ranks and keys and
binding each entry into the :class:`~.flowtable.FlowTable`), clears the job's W slots and commits
the job; on 1 -> 0 it waits for the job's work in flight and discards it.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import PMTU_VALUES, JobError, Role

from ..csr.bank import cfg_read_signature
from .flowtable import KEY_BITS
from .wide import all_of, any_of

__all__ = ["EnableSequencer", "FlowScan", "flow_bind_signature"]


def flow_bind_signature(ft) -> wiring.Signature:
    """The flow table's check / bind / commit / drop ports, as the sequencer drives them."""
    return wiring.Signature({
        "chk_fwd": Out(KEY_BITS), "chk_rev": Out(KEY_BITS), "chk_fwd_hit": In(1),
        "chk_rev_hit": In(1), "bind_en": Out(1), "bind_entry": Out(ft.entry_bits),
        "bind_job": Out(ft.job_bits), "bind_fwd": Out(KEY_BITS), "bind_rev": Out(KEY_BITS),
        "bind_data": Out(ft.data_layout), "commit_en": Out(1), "commit_job": Out(ft.job_bits),
        "drop_en": Out(1), "drop_job": Out(ft.job_bits), "live": In(ft.flows),
    })


class EnableSequencer(wiring.Component):
    """Validate and latch a job on enable, discard it on disable (one job at a time).

    Inputs: ``job_cfg`` (the bank's RW job fields), ``flow_rd`` (the bank's flow RAM read port:
    data one cycle after the address), ``enabled`` (per job), ``base`` / ``w`` (latched slot
    ranges of the jobs, for the overlap check), ``pipe_empty`` (no header in the decision
    pipeline), ``job_idle`` (per job: no chained release and no free_j computation in flight),
    ``scrub_go`` (the slot write port took the scrub's write this cycle).

    Outputs: ``job`` (the job being processed) and single-cycle strobes for it: ``load`` (latch
    the job configuration ``cfg_*`` and clear its error), ``enable`` (+ ``reset``: the job's
    dynamic state starts from zero), ``disable``, ``set_err`` with ``err`` (refused: JobError);
    ``busy``; ``quiesce`` (stop taking headers: the sequencer waits for ``pipe_empty``);
    ``scrub_want`` / ``scrub_addr`` (clear this slot word); ``ft`` (the flow table's bind side).

    Contract: latency: a change of ``enable`` is seen one cycle after the bank's write; CHECK
    takes 4 cycles (the job's registers, each check and the verdict are registered), SCAN one
    per flow entry (+1; an entry of the job 1 + ``ft.chk_latency``: the key check is
    pipelined), VERDICT 1, SCRUB one per slot of the window (on the scrub's turn, every other
    cycle, or while no frame is in the decision stage),
    COMMIT waits for an empty pipeline; DISABLE acts one cycle after it sees the pipeline empty
    and the job idle while quiescing. Disables go
    before enables (a 1 -> 0 -> 1 bounce discards and restarts the job). Errors: a refused job
    gets ``set_err`` with the model's JobError, in the model's check order; nothing else changes.
    Flow roles (model D17): with ``ctl.roles`` a job whose roles fit neither a leaf (one UP, one
    DOWN, no RACK) nor a plain / spine job is refused (``JobError.ROLES``); ``roles_*`` give the
    scanned job's roles at ``enable`` (``roles_leaf``, the UP / DOWN ranks, the RACK ranks).
    Without ``ctl.roles`` any role but MEMBER refuses the job.
    """

    def __init__(self, ctl, ft):
        c = self._ctl = ctl
        self._ft = ft
        J = c.jobs
        super().__init__({
            "job_cfg": In(data.ArrayLayout(c.job_cfg_layout, J)),
            "flow_rd": Out(cfg_read_signature(c.entry_bits, c.flow_cfg_layout)),
            "enabled": In(J), "base": In(data.ArrayLayout(c.slot_bits, J)),
            "w": In(data.ArrayLayout(c.w_bits, J)), "pipe_empty": In(1), "job_idle": In(J),
            "scrub_go": In(1),
            "job": Out(c.job_bits), "load": Out(1), "enable": Out(1), "reset": Out(1),
            "disable": Out(1), "set_err": Out(1), "err": Out(8), "busy": Out(1),
            "quiesce": Out(1), "scrub_want": Out(1), "scrub_addr": Out(c.slot_bits),
            "cfg_n": Out(c.n_bits), "cfg_w": Out(c.w_bits), "cfg_base": Out(c.slot_bits),
            "cfg_pmtu": Out(13), "cfg_op": Out(2), "cfg_cnp": Out(32),
            "roles_leaf": Out(1), "roles_up": Out(c.rank_bits), "roles_down": Out(c.rank_bits),
            "roles_rack": Out(c.max_world),
            "ft": Out(flow_bind_signature(ft)),
        })

    def elaborate(self, platform):  # noqa: C901 (one FSM, the model's checks in order)
        m = Module()
        c = self._ctl
        J, WD = c.jobs, c.max_world
        cfg = self.job_cfg
        ft = self.ft
        level_en = Cat(*(cfg[j].ctrl.enable for j in range(J)))
        prev_en = Signal(J)
        req_en, req_dis = Signal(J), Signal(J)
        m.d.sync += prev_en.eq(level_en)
        rise, fall = level_en & ~prev_en, ~level_en & prev_en
        clr_en, clr_dis = Signal(J), Signal(J)
        m.d.sync += [req_en.eq((req_en & ~clr_en) | rise), req_dis.eq((req_dis & ~clr_dis) | fall)]

        sq = self.job
        # the job's registers, registered (a jobs:1 mux off the checks' paths); the checks'
        # verdict is registered too: CHECK acts in its third cycle
        qcfg = Signal(c.job_cfg_layout)
        m.d.sync += qcfg.eq(Array(cfg[j] for j in range(J))[sq])
        enabled = self.enabled
        # job-level checks, in the model's order
        c_n, c_w, c_base = qcfg.world.n, qcfg.window.w, qcfg.slot_base.base
        c_pmtu, c_op = qcfg.pmtu.pmtu, qcfg.op.op
        m.d.comb += [self.cfg_n.eq(c_n), self.cfg_w.eq(c_w), self.cfg_base.eq(c_base),
                     self.cfg_pmtu.eq(c_pmtu), self.cfg_op.eq(c_op),
                     self.cfg_cnp.eq(qcfg.cnp_interval.cycles)]
        overlap = Cat(*(enabled[o] & (c_base < self.base[o] + self.w[o])
                        & (self.base[o] < c_base + c_w) for o in range(J))).any()
        pmtu_ok = Cat(*((c_pmtu == v) for v in PMTU_VALUES if v <= c.pmtu_max)).any()
        # each check registered, then the verdict in the model's order, registered
        bad = Signal(6)
        m.d.sync += bad.eq(Cat((c_n < 1) | (c_n > WD), (c_w == 0) | ((c_w & (c_w - 1)) != 0),
                               c_base + c_w > c.slots, overlap, ~pmtu_ok, c_op > 2))
        job_err = Const(JobError.NONE, 8)
        for i, err in reversed(list(enumerate((JobError.WORLD, JobError.WINDOW,
                                               JobError.SLOT_RANGE, JobError.SLOT_OVERLAP,
                                               JobError.PMTU, JobError.OP)))):
            job_err = Mux(bad[i], err, job_err)
        job_err_q = Signal(8)
        m.d.sync += job_err_q.eq(job_err)
        chk_cnt = Signal(2)

        # the latched n / base / W of the job being enabled (the values loaded into the job)
        l_n, l_w, l_base = Signal(c.n_bits), Signal(c.w_bits), Signal(c.slot_bits)
        l_full = Signal(WD)  # the ranks 0..n-1 (a register: off VERDICT's compare)
        with m.If(self.load):
            m.d.sync += [l_n.eq(c_n), l_w.eq(c_w), l_base.eq(c_base),
                         l_full.eq(Cat(*(c_n > i for i in range(WD))))]

        # the flow scan (stage A reads an entry of the bank's flow RAM, stage B checks and binds)
        m.submodules.scan = scan = FlowScan(c, self._ft)
        wiring.connect(m, wiring.flipped(self.flow_rd), scan.flow_rd)
        m.d.comb += [scan.job.eq(sq), scan.l_n.eq(l_n), scan.l_full.eq(l_full),
                     scan.chk_fwd_hit.eq(ft.chk_fwd_hit), scan.chk_rev_hit.eq(ft.chk_rev_hit),
                     scan.live.eq(ft.live),
                     ft.chk_fwd.eq(scan.chk_fwd), ft.chk_rev.eq(scan.chk_rev),
                     ft.bind_en.eq(scan.bind_en), ft.bind_entry.eq(scan.bind_entry),
                     ft.bind_job.eq(sq), ft.bind_fwd.eq(scan.bind_fwd),
                     ft.bind_rev.eq(scan.bind_rev), ft.bind_data.eq(scan.bind_data),
                     ft.commit_job.eq(sq), ft.drop_job.eq(sq),
                     self.roles_leaf.eq(scan.roles_leaf), self.roles_up.eq(scan.roles_up),
                     self.roles_down.eq(scan.roles_down), self.roles_rack.eq(scan.roles_rack)]
        scrub_cnt = Signal(c.w_bits)
        scrub_addr = self.scrub_addr
        # the disable's wait, registered (no jobs:1 select of the job's idle bit in front of the
        # disable strobes): quiescing, the pipeline empty and the job idle in the cycle before.
        # They still hold: no header entered then (quiesce), no frame was decided then (the
        # pipeline was empty) and only a decision makes a job busy
        settled = Signal()
        m.d.sync += settled.eq(self.quiesce & self.pipe_empty & self.job_idle.bit_select(sq, 1))

        with m.FSM(name="sequencer"):
            with m.State("IDLE"):
                dis_pick = Const(0, c.job_bits)
                en_pick = Const(0, c.job_bits)
                for j in reversed(range(J)):
                    dis_pick = Mux(req_dis[j], j, dis_pick)
                    en_pick = Mux(req_en[j], j, en_pick)
                with m.If(req_dis.any()):
                    m.d.sync += sq.eq(dis_pick)
                    m.next = "DISABLE"
                with m.Elif(req_en.any()):
                    m.d.sync += sq.eq(en_pick)
                    m.next = "CHECK"
            with m.State("DISABLE"):
                m.d.comb += self.busy.eq(1)
                with m.If(~enabled.bit_select(sq, 1)):
                    m.d.comb += clr_dis.eq(1 << sq)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.quiesce.eq(1)
                    with m.If(settled):
                        m.d.comb += [clr_dis.eq(1 << sq), ft.drop_en.eq(1), self.disable.eq(1)]
                        m.next = "IDLE"
            with m.State("CHECK"):
                m.d.comb += [self.busy.eq(1), scan.check.eq(1)]
                m.d.sync += chk_cnt.eq(chk_cnt + 1)
                with m.If(chk_cnt != 3):
                    pass
                with m.Elif(~level_en.bit_select(sq, 1) | enabled.bit_select(sq, 1)):
                    m.d.comb += clr_en.eq(1 << sq)
                    m.next = "IDLE"
                with m.Elif(job_err_q != 0):
                    m.d.comb += [clr_en.eq(1 << sq), self.set_err.eq(1), self.err.eq(job_err_q)]
                    m.next = "IDLE"
                with m.Else():
                    # a new attempt: an error of an earlier refused one no longer applies
                    m.d.comb += [self.load.eq(1), scan.start.eq(1)]
                    m.next = "SCAN"
            with m.State("SCAN"):
                m.d.comb += [self.busy.eq(1), scan.run.eq(1)]
                with m.If(scan.done):
                    m.next = "VERDICT"
            with m.State("VERDICT"):
                m.d.comb += self.busy.eq(1)
                with m.If(scan.bad_flows):
                    m.d.comb += [clr_en.eq(1 << sq), self.set_err.eq(1),
                                 self.err.eq(JobError.FLOWS), ft.drop_en.eq(1)]
                    m.next = "IDLE"
                with m.Elif(scan.bad_roles):
                    m.d.comb += [clr_en.eq(1 << sq), self.set_err.eq(1),
                                 self.err.eq(JobError.ROLES), ft.drop_en.eq(1)]
                    m.next = "IDLE"
                with m.Elif(scan.conflict):
                    m.d.comb += [clr_en.eq(1 << sq), self.set_err.eq(1),
                                 self.err.eq(JobError.KEY_CONFLICT), ft.drop_en.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [scrub_addr.eq(l_base), scrub_cnt.eq(l_w)]
                    m.next = "SCRUB"
            with m.State("SCRUB"):
                m.d.comb += [self.busy.eq(1), self.scrub_want.eq(1)]
                with m.If(self.scrub_go):
                    m.d.sync += [scrub_addr.eq(scrub_addr + 1), scrub_cnt.eq(scrub_cnt - 1)]
                    with m.If(scrub_cnt == 1):
                        m.next = "COMMIT"
            with m.State("COMMIT"):
                m.d.comb += [self.busy.eq(1), self.quiesce.eq(1)]
                with m.If(self.pipe_empty):
                    m.d.comb += [clr_en.eq(1 << sq), ft.commit_en.eq(1), self.enable.eq(1),
                                 self.reset.eq(1)]
                    m.next = "IDLE"
        return m


class FlowScan(wiring.Component):
    """The enable sequencer's scan of the flow table configuration for one job (model D9's flow
    checks) and the binding of its entries into the :class:`~.flowtable.FlowTable`.

    Stage A reads entry e of the bank's flow RAM (``flow_rd``: data one cycle after the address;
    the address runs one entry ahead, entry 0 addressed while ``check``), stage B checks the
    entry if it belongs to ``job``: its rank (< ``l_n``, not seen before: all of ``l_full`` must
    be seen), its role (with ``ctl.roles``: at most a leaf's one UP and one DOWN, or RACK ranks;
    without: MEMBER only), its keys against the live table (``chk_*`` -> ``chk_*_hit``, ``live``)
    and binds it (``bind_*``) if its entry is free. ``start`` clears the scan (the cycle before
    ``run``); ``run``: scan one entry a cycle. Outputs: ``done`` (the last entry is through:
    the verdicts are final in the next cycle), ``bad_flows`` / ``bad_roles`` / ``conflict``
    (JobError FLOWS / ROLES / KEY_CONFLICT), the job's roles ``roles_*`` (D17).

    Contract: latency: one cycle per entry, ``flows`` + 1 cycles, and an entry of the job
    holds the scan ``ft.chk_latency`` more cycles (the table's key check is pipelined: its keys
    are held, and the bank's RAM is addressed at the same entry again meanwhile); no
    backpressure; errors: the verdicts above (a refused job's bound entries are dropped by the
    caller).
    """

    def __init__(self, ctl, ft):
        c = self._ctl = ctl
        self._ft = ft
        super().__init__({
            "start": In(1), "check": In(1), "run": In(1), "job": In(c.job_bits),
            "l_n": In(c.n_bits), "l_full": In(c.max_world),
            "flow_rd": Out(cfg_read_signature(c.entry_bits, c.flow_cfg_layout)),
            "chk_fwd": Out(KEY_BITS), "chk_rev": Out(KEY_BITS), "chk_fwd_hit": In(1),
            "chk_rev_hit": In(1), "live": In(ft.flows), "bind_en": Out(1),
            "bind_entry": Out(ft.entry_bits), "bind_fwd": Out(KEY_BITS),
            "bind_rev": Out(KEY_BITS), "bind_data": Out(ft.data_layout),
            "done": Out(1), "bad_flows": Out(1), "bad_roles": Out(1), "conflict": Out(1),
            "roles_leaf": Out(1), "roles_up": Out(c.rank_bits), "roles_down": Out(c.rank_bits),
            "roles_rack": Out(c.max_world),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        F, WD = c.flows, c.max_world
        sq, l_n, l_full = self.job, self.l_n, self.l_full
        scan_e = Signal(range(F + 1))
        sa_valid = Signal()
        sa_e = Signal(c.entry_bits)
        sa_cfg = Signal(c.flow_cfg_layout)
        rank_seen = Signal(WD)
        flows_bad = Signal()
        roles_bad = Signal()  # a flow role other than MEMBER (a build without flow roles)
        n_up, n_down = Signal(2), Signal(2)  # UP / DOWN flows seen (saturating)
        rack = self.roles_rack
        m.d.comb += self.roles_leaf.eq(n_up != 0)
        conflict = self.conflict
        ecfg = self.flow_rd.data
        # the table's key check answers ft.chk_latency cycles after the keys: an entry of the
        # job stays in stage B that long (its keys held), and the scan waits, re-addressing the
        # bank's RAM at scan_e so that stage A sees entry scan_e again when it resumes
        L = self._ft.chk_latency
        chk_wait = Signal(range(L + 1))
        hold = Signal()
        m.d.comb += self.flow_rd.addr.eq(Mux(self.check, 0,
                                             Mux(hold, scan_e, scan_e + 1)[:c.entry_bits]))
        fwd_key = Cat(sa_cfg.fwd_qpn.qpn, sa_cfg.fwd_ip.ip)
        rev_key = Cat(sa_cfg.rev_qpn.qpn, sa_cfg.rev_ip.ip)
        sa_rank = sa_cfg.cfg.rank
        m.d.comb += [self.chk_fwd.eq(fwd_key), self.chk_rev.eq(rev_key),
                     self.bind_entry.eq(sa_e), self.bind_fwd.eq(fwd_key),
                     self.bind_rev.eq(rev_key), self.bind_data.job.eq(sq),
                     self.bind_data.rank.eq(sa_rank),
                     self.bind_data.start.eq(sa_cfg.start_psn.psn),
                     self.bind_data.rev_qpn.eq(sa_cfg.rev_qpn.qpn)]
        mine = ecfg.cfg.valid & (ecfg.cfg.job == sq)
        # the scan's verdicts, registered every cycle: the scan's last cycle changes none of
        # their inputs (no entry in stage B), so they are final after ``done``
        ranks_ok, roles_ok = Signal(), Signal()
        m.d.sync += [ranks_ok.eq(all_of(m, ~(rank_seen ^ l_full), "ranks_ok", 3)),
                     roles_ok.eq(~(((n_up != 0) | (n_down != 0))
                                   & ((n_up != 1) | (n_down != 1)
                                      | any_of(m, rack, "rack_any", 6))))]
        m.d.comb += [self.bad_flows.eq(flows_bad | ~ranks_ok),
                     self.bad_roles.eq(roles_bad | ~roles_ok)]
        sa_rbit = Signal(WD)  # stage B's rank one-hot, registered with its entry
        # stage B's entry is live: a flows:1 select in two registered steps (16 entries, then
        # one of them) from stage B's entry, ready 2 cycles after it is loaded (its verdicts
        # wait ft.chk_latency >= 3); live does not change during a scan (only this sequencer
        # commits or drops)
        sa_live, live_grp = Signal(), Signal(16)
        if F > 16:
            live_pad = Cat(self.live, Const(0, (-F) % 16))
            m.d.sync += [live_grp.eq(live_pad.word_select(sa_e[4:], 16)),
                         sa_live.eq(live_grp.bit_select(sa_e[:4], 1))]
        else:
            m.d.sync += sa_live.eq(self.live.bit_select(sa_e, 1))

        with m.If(self.start):
            m.d.sync += [scan_e.eq(0), sa_valid.eq(0), rank_seen.eq(0), flows_bad.eq(0),
                         roles_bad.eq(0), conflict.eq(0), n_up.eq(0), n_down.eq(0), rack.eq(0)]
        with m.If(self.run):
            m.d.comb += hold.eq(sa_valid & (chk_wait != L))
            with m.If(hold):
                m.d.sync += chk_wait.eq(chk_wait + 1)
            with m.Else():
                e_rank = ecfg.cfg.rank
                m.d.sync += [sa_valid.eq((scan_e < F) & mine), sa_e.eq(scan_e),
                             sa_cfg.eq(ecfg), chk_wait.eq(0),
                             sa_rbit.eq(Mux(e_rank < WD,
                                            (Const(1, WD) << e_rank[:c.rank_bits])[:WD], 0))]
                with m.If(scan_e < F):
                    m.d.sync += scan_e.eq(scan_e + 1)
                with m.Elif(~sa_valid):
                    m.d.comb += self.done.eq(1)
            with m.If(sa_valid & ~hold):
                # ranks >= max_world are >= n as well: no bit to set, flows_bad anyway
                rbit = sa_rbit
                with m.If((sa_rank >= l_n) | any_of(m, rank_seen & rbit, "rank_dup", 3)):
                    m.d.sync += flows_bad.eq(1)
                m.d.sync += rank_seen.eq(rank_seen | rbit)
                role = sa_cfg.cfg.role
                if c.roles:
                    with m.If(role == Role.UP):
                        m.d.sync += [n_up.eq(n_up | (n_up + 1)), self.roles_up.eq(sa_rank)]
                    with m.If(role == Role.DOWN):
                        m.d.sync += [n_down.eq(n_down | (n_down + 1)),
                                     self.roles_down.eq(sa_rank)]
                    with m.If(role == Role.RACK):
                        m.d.sync += rack.eq(rack | rbit)
                else:
                    with m.If(role != Role.MEMBER):
                        m.d.sync += roles_bad.eq(1)
                is_live = sa_live
                with m.If(self.chk_fwd_hit | self.chk_rev_hit | is_live):
                    m.d.sync += conflict.eq(1)
                with m.If(~is_live):
                    m.d.comb += self.bind_en.eq(1)
        return m
