"""Status registers and counter increments of the aggregation control path."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import DISPOSITIONS

from .roles import JobRoles
from .types import PSN_BITS, Disp

__all__ = ["CtlCounters"]


class CtlCounters(wiring.Component):
    """The register bank's view of :class:`~.control.AggControl`: RO status fields, W1C set
    strobes and counter increments, and the per-flow-entry copy of acked_f (``FLOW.ACKED``).

    Inputs: the decision stage's strobes of the cycle (``cj``: one-hot job of a committed
    registered frame, ``commit``, ``disp``, ``mismatch``, ``rx_data``, ``ack_stale``,
    ``cnp_send`` / ``cnp_supp``, ``release_now``, ``up_now``, ``n_cur`` / ``leaf_cur``: the
    frame's job's N and leaf flag), ``ack_e`` with ``entry`` / ``cand`` (the frame moved its
    flow's acked_f to ``cand``), the fast-retransmit stage's (``cj7``, ``nak_fire``,
    ``solicit``), the release scheduler's (``sch_rel_job``, ``sch_up_job``), the free_j result
    being applied (``freed``: indices freed per job), the flow table's ``bind_en`` /
    ``bind_entry`` (an entry bound: its copy restarts at 0) and ``live``, and the per-job state
    (``enabled``, ``error``, ``free``, ``rel``, ``busy``, ``n``, ``leaf``, ``upptr``).

    With pairs (:mod:`.sideack`), the side lane's strobes of the cycle: ``commit2``, ``cj2``,
    ``disp2``, ``stale2`` and ``ack_e2`` with ``entry2`` / ``cand2`` (``reg2``: the side frame
    in the decision stage is registered, a register); a side frame counts with
    the main frame of its cycle (its dispositions are FWD_ACK, FWD_NAK and FWD_UNREGISTERED).

    Outputs (as :class:`~.control.AggControl` documents them): ``job_status``, ``flow_status``
    (combinational from the state registers), ``job_set``, ``job_cnt_inc`` and ``cnt_inc``.

    Contract: latency: the strobes are registered here and the increments / set strobes
    registered again, so an event counts two clock edges after the cycle it happens in; the
    FLOW.ACKED copy is written one edge after its strobe. Throughput: one event set per cycle,
    no backpressure (the bank adds every increment in its cycle). Errors: none.
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        J, F = c.jobs, c.flows

        def per_job(w):
            return data.ArrayLayout(w, J)

        super().__init__({
            "cj": In(J), "commit": In(1), "disp": In(c.disp_bits), "mismatch": In(1),
            "rx_data": In(1), "ack_stale": In(1), "cnp_send": In(1), "cnp_supp": In(1),
            "release_now": In(1), "up_now": In(1), "n_cur": In(c.n_bits), "leaf_cur": In(1),
            "ack_e": In(1), "entry": In(c.entry_bits), "cand": In(PSN_BITS),
            "cj7": In(J), "nak_fire": In(1), "solicit": In(1),
            "sch_rel_job": In(J), "sch_up_job": In(J), "freed": In(per_job(c.w_bits)),
            "bind_en": In(1), "bind_entry": In(c.entry_bits), "live": In(F),
            "enabled": In(J), "error": In(per_job(8)), "free": In(per_job(PSN_BITS)),
            "rel": In(per_job(PSN_BITS)), "busy": In(per_job(c.w_bits)),
            "n": In(per_job(c.n_bits)), "leaf": In(J), "upptr": In(per_job(PSN_BITS)),
            "job_status": Out(data.ArrayLayout(c.job_status_layout, J)),
            "flow_status": Out(data.ArrayLayout(c.flow_status_layout, F)),
            "job_set": Out(data.ArrayLayout(c.job_set_layout, J)),
            "job_cnt_inc": Out(data.ArrayLayout(c.job_inc_layout, J)),
            "cnt_inc": Out(c.cnt_inc_layout),
            **({"commit2": In(1), "cj2": In(J), "disp2": In(c.disp_bits), "stale2": In(1),
                "ack_e2": In(1), "entry2": In(c.entry_bits), "cand2": In(PSN_BITS),
                "reg2": In(1)}
               if c.pairs else {}),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        J, F = c.jobs, c.flows
        for j in range(J):
            st, en = self.job_status[j], self.enabled[j]
            m.d.comb += [
                st.status.enabled.eq(en), st.status.error.eq(self.error[j]),
                st.free_ptr.index.eq(Mux(en, self.free[j], 0)),
                st.release_ptr.index.eq(Mux(en, self.rel[j], 0)),
                st.slots_busy.count.eq(Mux(en, self.busy[j], 0)),
                st.partial_ptr.index.eq(Mux(en & self.leaf[j], self.upptr[j], 0)),
            ]
        # per-entry copy of acked_f for FLOW.ACKED. A bind restarts it a cycle after the bind
        # (registered: off the sequencer's paths): the entry is not live then (it becomes live
        # at the job's commit, after the scan), so FLOW.ACKED reads 0 and no ACK is taken for it
        bind_q, bind_entry_q = Signal(), Signal(c.entry_bits)
        m.d.sync += [bind_q.eq(self.bind_en), bind_entry_q.eq(self.bind_entry)]
        for e in range(F):
            acked_e = Signal(PSN_BITS, name=f"acked_e{e}")
            if not c.pairs:
                with m.If(self.ack_e & (self.entry == e)):
                    m.d.sync += acked_e.eq(self.cand)
            else:
                # (the side frame's entry is never the main frame's: the data select is from
                # registers, the strobes only enable)
                with m.If((self.ack_e & (self.entry == e)) | (self.ack_e2 & (self.entry2 == e))):
                    m.d.sync += acked_e.eq(Mux(self.reg2 & (self.entry2 == e), self.cand2,
                                               self.cand))
            with m.If(bind_q & (bind_entry_q == e)):
                m.d.sync += acked_e.eq(0)
            bound = self.live[e]
            m.d.comb += [self.flow_status[e].status.bound.eq(bound),
                         self.flow_status[e].acked.index.eq(Mux(bound, acked_e, 0))]

        # the strobes, registered (off the decision stage's paths)
        def q(v, name):
            r = Signal.like(v, name=f"{name}_q")
            m.d.sync += r.eq(v)
            return r

        cj_q, disp_q = q(self.cj, "cj"), q(self.disp, "disp")
        mismatch_q, rx_data_q = q(self.mismatch, "mismatch"), q(self.rx_data, "rx_data")
        ack_stale_q = q(self.ack_stale, "ack_stale")
        cnp_send_q, cnp_supp_q = q(self.cnp_send, "cnp_send"), q(self.cnp_supp, "cnp_supp")
        release_q, up_q = q(self.release_now, "release_now"), q(self.up_now, "up_now")
        nak_q, solicit_q = q(self.nak_fire, "nak_fire"), q(self.solicit, "solicit")
        cj7_q = q(self.cj7, "cj7")
        nres_q = q(JobRoles.results(self.n_cur, self.leaf_cur), "nres")
        commit_q = q(self.commit, "commit")
        sch_rel_q, sch_up_q = q(self.sch_rel_job, "sch_rel_job"), q(self.sch_up_job,
                                                                    "sch_up_job")
        freed_q = q(self.freed, "freed")
        if c.pairs:
            cj2_q, disp2_q = q(self.cj2, "cj2"), q(self.disp2, "disp2")
            stale2_q, commit2_q = q(self.stale2, "stale2"), q(self.commit2, "commit2")
        for j in range(J):
            m.d.sync += self.job_set[j].status.mismatch.eq(cj_q[j] & mismatch_q)

        disp_names = {d.value: name for d, name in zip(Disp, DISPOSITIONS, strict=True)}
        job_disp = [d for d in Disp if disp_names[d.value] in c.job_inc_layout.members]
        for j in range(J):
            inc = self.job_cnt_inc[j]
            dj = cj_q[j]
            side = {Disp.FWD_ACK, Disp.FWD_NAK}
            for d in job_disp:
                v = dj & (disp_q == d.value)
                if c.pairs and d in side:
                    v = v + (cj2_q[j] & (disp2_q == d.value))
                m.d.sync += inc[disp_names[d.value]].eq(v)
            stale = dj & ack_stale_q
            if c.pairs:
                stale = stale + (cj2_q[j] & stale2_q)
            m.d.sync += [
                inc.rx_data.eq(dj & rx_data_q),
                inc.ack_stale.eq(stale),
                inc.cnp_sent.eq(dj & cnp_send_q),
                inc.cnp_suppressed.eq(dj & cnp_supp_q),
                inc.released.eq((dj & release_q) + sch_rel_q[j]),
                inc.results_sent.eq(Mux(dj & release_q, nres_q, 0)
                                    + Mux(sch_rel_q[j],
                                          JobRoles.results(self.n[j], self.leaf[j]), 0)),
                inc.partials_up.eq((dj & up_q) + sch_up_q[j]),
                inc.freed.eq(freed_q[j]),
                inc.saturations.eq(0),
                inc.fast_retx.eq(cj7_q[j] & nak_q),
                inc.fast_retx_probes.eq(cj7_q[j] & solicit_q),
            ]
        g = self.cnt_inc
        rx, unreg = commit_q, commit_q & (disp_q == Disp.FWD_UNREGISTERED)
        if c.pairs:
            rx = rx + commit2_q
            unreg = unreg + (commit2_q & (disp2_q == Disp.FWD_UNREGISTERED))
        m.d.sync += [
            g.rx_frames.eq(rx),
            g.fwd_not_roce.eq(commit_q & (disp_q == Disp.FWD_NOT_ROCE)),
            g.fwd_unregistered.eq(unreg),
        ]
        return m
