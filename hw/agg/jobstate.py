"""The per-job state of the aggregation control path and its updates."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import JobError

from .roles import JobRoles
from .types import PSN_BITS

__all__ = ["JobState", "state_shapes", "job_inputs"]


def state_shapes(ctl) -> dict:
    """The shapes of :class:`JobState`'s state outputs (one entry per job)."""
    c = ctl
    J, WD = c.jobs, c.max_world

    def pj(width):
        return data.ArrayLayout(width, J)

    return {
        "enabled": J, "error": pj(8), "n": pj(c.n_bits), "w": pj(c.w_bits),
        "base": pj(c.slot_bits), "pmtu": pj(13), "op": pj(2), "cnp": pj(32),
        "free": pj(PSN_BITS), "rel": pj(PSN_BITS), "npend": pj(c.w_bits), "busy": pj(c.w_bits),
        "chain_busy": J, "free_wait": J,
        "acked": data.ArrayLayout(data.ArrayLayout(PSN_BITS, WD), J),
        "cnp_seen": pj(WD), "rtx_seen": pj(WD),
        "leaf": J, "up_rank": pj(c.rank_bits), "down_rank": pj(c.rank_bits), "rack": pj(WD),
        "upptr": pj(PSN_BITS), "npend_up": pj(c.w_bits), "chain_up": J,
        "wm": pj(c.w_bits), "full": pj(WD), "cmask": pj(WD), "mmask": pj(WD), "upmask": pj(WD),
        "moved": J, "freed": pj(c.w_bits), "idle": J,
    }


def job_inputs(ctl, names) -> dict:
    """Signature members (In) of a block that reads the :class:`JobState` fields ``names``."""
    shapes = state_shapes(ctl)
    return {n: In(shapes[n]) for n in names}


class JobState(wiring.Component):
    """The job state of :class:`~.control.AggControl`: one set of flip-flops per job, read in
    parallel by the decision pipeline, the release scheduler, the free-pointer tree, the enable
    sequencer and the counters, and written here from their strobes.

    State (outputs, one entry per job): the configuration latched at enable (``n``, ``w``,
    ``base``, ``pmtu``, ``op``, ``cnp``: CNP interval), ``enabled`` / ``error`` (JobError);
    the window pointers ``free`` (free_j) and ``rel`` (rel_j), ``npend`` (COMPLETE slots beyond
    rel_j: out-of-order completions), ``busy`` (slots in use), ``chain_busy`` (a chained
    release to run), ``acked`` (acked_f per rank), ``cnp_seen`` /
    ``rtx_seen`` (per rank: a CNP was sent / the fast-retransmit word was written since the
    enable); flow roles (model D17):
    ``leaf``, ``up_rank`` / ``down_rank``, ``rack``, the partial pointer ``upptr`` with
    ``npend_up`` / ``chain_up``. Derived, registered one cycle after what they derive from (the
    sequencer loads a job long before a frame or chain of it uses them): ``wm`` (W - 1),
    ``full`` (the ranks 0..n-1), ``cmask`` / ``mmask`` / ``upmask`` (:meth:`JobRoles.masks`).
    ``moved``: one-hot, registered: the job's rel_j / upptr moved by a chain in the cycle before
    (a frame of the job in the decision stage checks again). ``free_wait``: per job, from
    registers only: a free_j computation is in flight (an ACK/NAK of the job advanced acked_f in
    an earlier cycle and its result is not applied) or a result moved free_j in the cycle before
    (a data frame of the job whose checks it can change waits). ``freed``: indices freed per
    job by the free_j result being applied (combinational). ``idle``: per job, no chain and no
    free_j computation in flight, counting one whose ACK/NAK was committed in the cycle before
    (the sequencer's disable waits for it).

    Inputs, per cycle: the decision stage's commit (``cj``: one-hot job of a registered frame
    committed, with its strobes ``release_now``, ``pend_inc``, ``ack_take`` (acked_f of
    ``rank`` becomes ``cand``), ``first``, ``cnp_send``, ``up_now``, ``up_pend`` and the rank
    one-hot ``onehot``); the release scheduler's steps (``sch_rel_job`` / ``sch_up_job``:
    one-hot, rel_j / upptr + 1 and its pending count - 1; ``sch_done`` / ``sch_done_up`` with
    ``sch_job``: its chain ended); a free_j result (``f_valid``, ``f_job``, ``f_free``); the
    fast-retransmit stage's word write (``rtx_wr`` of ``rtx_job`` / ``rtx_rank``); the enable
    sequencer's strobes for its job ``seq_job`` (``load`` with ``cfg_*``, ``enable`` with
    ``roles_*``, ``disable``, ``set_err`` with ``err``, ``reset``: the dynamic state restarts
    from 0).

    With pairs (:mod:`.sideack`): the side lane's commit (``cj2``: one-hot job of a registered
    side frame, ``take2``: acked_f of ``rank2`` becomes ``cand2``; ``oh2``: the side frame in
    the decision stage, one-hot of its job if registered, a register) and the free_j result of its
    tree (``f2_valid``, ``f2_job``, ``f2_free``; never the job of the first tree's result in the
    same cycle: each job starts at most one free_j computation a cycle).

    Contract: latency: every update is registered once (state visible the cycle after its
    strobe); throughput: one set of strobes per cycle (a job's ``cj`` and scheduler steps never
    coincide: its decisions wait for its chain); no backpressure; errors: none (the strobes
    are the callers' checked decisions).
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        J, WD = c.jobs, c.max_world
        super().__init__({
            # the decision stage's commit
            "cj": In(J), "release_now": In(1), "pend_inc": In(1), "ack_take": In(1),
            "first": In(1), "cnp_send": In(1), "up_now": In(1), "up_pend": In(1),
            "rank": In(c.rank_bits), "cand": In(PSN_BITS), "onehot": In(WD),
            # the release scheduler, the free-pointer tree, the fast-retransmit stage
            "sch_rel_job": In(J), "sch_up_job": In(J), "sch_done": In(1), "sch_done_up": In(1),
            "sch_job": In(c.job_bits), "f_valid": In(1), "f_job": In(c.job_bits),
            "f_free": In(PSN_BITS), "rtx_wr": In(1), "rtx_job": In(c.job_bits),
            "rtx_rank": In(c.rank_bits),
            **({"cj2": In(J), "take2": In(1), "oh2": In(J), "rank2": In(c.rank_bits),
                "cand2": In(PSN_BITS),
                "f2_valid": In(1), "f2_job": In(c.job_bits), "f2_free": In(PSN_BITS)}
               if c.pairs else {}),
            # the enable sequencer
            "seq_job": In(c.job_bits), "load": In(1), "enable": In(1), "disable": In(1),
            "set_err": In(1), "err": In(8), "reset": In(1),
            "cfg_n": In(c.n_bits), "cfg_w": In(c.w_bits), "cfg_base": In(c.slot_bits),
            "cfg_pmtu": In(13), "cfg_op": In(2), "cfg_cnp": In(32),
            "roles_leaf": In(1), "roles_up": In(c.rank_bits), "roles_down": In(c.rank_bits),
            "roles_rack": In(WD),
            # the state
            **{n: Out(sh) for n, sh in state_shapes(c).items()},
        })

    def elaborate(self, platform):  # noqa: C901 (one update rule per field)
        m = Module()
        c = self._ctl
        J, WD = c.jobs, c.max_world

        def per_job(width, name):
            return Array(Signal(width, name=f"{name}{j}") for j in range(J))

        enabled = per_job(1, "enabled")
        error = per_job(8, "error")
        j_n = per_job(c.n_bits, "n")
        j_w = per_job(c.w_bits, "w")
        j_base = per_job(c.slot_bits, "base")
        j_pmtu = per_job(13, "pmtu")
        j_op = per_job(2, "op")
        j_cnp = per_job(32, "cnp_interval")
        free = per_job(PSN_BITS, "free")
        rel = per_job(PSN_BITS, "rel")
        npend = per_job(c.w_bits, "npend")
        busy_slots = per_job(c.w_bits, "slots_busy")
        chain_busy = per_job(1, "chain_busy")
        free_busy = per_job(4, "free_busy")
        fb_nz = per_job(1, "fb_nz")
        # the ACK/NAK strobe of each job, registered before it enters free_busy's adder (the
        # decision's commit is the pipeline's deepest signal: no arithmetic behind it)
        fb_pend = per_job(1, "fb_pend")
        # fb_nz of the cycle, or a result applied in the cycle before
        fb_wait = per_job(1, "fb_wait")
        acked = Array(Array(Signal(PSN_BITS, name=f"acked{j}_{r}") for r in range(WD))
                      for j in range(J))
        cnp_seen = per_job(WD, "cnp_seen")
        rtx_seen = per_job(WD, "rtx_seen")
        jr = JobRoles(J, c.rank_bits, WD, c.w_bits, PSN_BITS)
        for j in range(J):
            m.d.comb += [
                self.enabled[j].eq(enabled[j]), self.error[j].eq(error[j]),
                self.n[j].eq(j_n[j]), self.w[j].eq(j_w[j]), self.base[j].eq(j_base[j]),
                self.pmtu[j].eq(j_pmtu[j]), self.op[j].eq(j_op[j]), self.cnp[j].eq(j_cnp[j]),
                self.free[j].eq(free[j]), self.rel[j].eq(rel[j]), self.npend[j].eq(npend[j]),
                self.busy[j].eq(busy_slots[j]), self.chain_busy[j].eq(chain_busy[j]),
                self.free_wait[j].eq(fb_pend[j] | fb_wait[j]),
                self.cnp_seen[j].eq(cnp_seen[j]), self.rtx_seen[j].eq(rtx_seen[j]),
                self.leaf[j].eq(jr.leaf[j]), self.up_rank[j].eq(jr.up[j]),
                self.down_rank[j].eq(jr.down[j]), self.rack[j].eq(jr.rack[j]),
                self.upptr[j].eq(jr.upptr[j]), self.npend_up[j].eq(jr.npend_up[j]),
                self.chain_up[j].eq(jr.chain_up[j]),
                self.idle[j].eq(~chain_busy[j] & ~jr.chain_up[j] & ~fb_nz[j] & ~fb_pend[j]),
            ]
            m.d.comb += [self.acked[j][r].eq(acked[j][r]) for r in range(WD)]

        # derived, registered: the world mask, the role masks, W - 1
        for j in range(J):
            m.d.sync += self.wm[j].eq(j_w[j] - 1)
            full_j = Cat(*(j_n[j] > i for i in range(WD)))
            m.d.sync += self.full[j].eq(full_j)
            m.d.sync += [a.eq(b) for a, b in zip(
                (self.cmask[j], self.mmask[j], self.upmask[j]),
                jr.masks(full_j, jr.leaf[j], jr.up[j], jr.down[j]), strict=True)]

        # a free_j result: the indices it frees
        def result(j):
            """(applying, new free_j) of job j's free_j result this cycle, if any."""
            a1 = self.f_valid & (self.f_job == j)
            if not c.pairs:
                return a1, self.f_free
            a2 = self.f2_valid & (self.f2_job == j)
            return a1 | a2, Mux(a1, self.f_free, self.f2_free)
        if c.pairs:
            steps = []
            for j in range(J):
                st_j = Signal(c.w_bits, name=f"free_step{j}")
                m.d.comb += st_j.eq(result(j)[1] - free[j])
                steps.append(st_j)
        else:
            step = Signal(c.w_bits)
            m.d.comb += step.eq(self.f_free - free[self.f_job])
            steps = [step] * J
        m.d.comb += [self.freed[j].eq(Mux(result(j)[0], steps[j], 0)) for j in range(J)]
        m.d.sync += self.moved.eq(self.sch_rel_job | self.sch_up_job)

        sq = self.seq_job
        with m.If(self.load):
            # a new attempt: an error of an earlier refused one no longer applies
            m.d.sync += error[sq].eq(JobError.NONE)
            m.d.sync += [j_n[sq].eq(self.cfg_n), j_w[sq].eq(self.cfg_w),
                         j_base[sq].eq(self.cfg_base), j_pmtu[sq].eq(self.cfg_pmtu),
                         j_op[sq].eq(self.cfg_op), j_cnp[sq].eq(self.cfg_cnp)]

        js = self.sch_job
        for j in range(J):
            dj = self.cj[j]  # the decision stage commits a registered frame of job j
            with m.If(dj & self.release_now):
                m.d.sync += rel[j].eq(rel[j] + 1)
                with m.If(npend[j] != 0):
                    m.d.sync += chain_busy[j].eq(1)
            with m.If(dj & self.pend_inc):
                m.d.sync += npend[j].eq(npend[j] + 1)
            with m.If(self.sch_rel_job[j]):
                m.d.sync += [rel[j].eq(rel[j] + 1), npend[j].eq(npend[j] - 1)]
            with m.If(self.sch_done & (js == j)):
                m.d.sync += chain_busy[j].eq(0)
            taken = dj & self.ack_take
            if not c.pairs:
                with m.If(taken):
                    m.d.sync += acked[j][self.rank].eq(self.cand)
            else:
                # the side frame's flow is never the main frame's: the data is the side's where
                # the side frame's job and rank say (registers), the main's elsewhere, so the
                # commit only enables (no select behind it)
                taken2 = self.cj2[j] & self.take2
                for r in range(WD):
                    side_here = self.oh2[j] & (self.rank2 == r)
                    with m.If((taken & (self.rank == r)) | (taken2 & (self.rank2 == r))):
                        m.d.sync += acked[j][r].eq(Mux(side_here, self.cand2, self.cand))
                taken = taken | taken2
            applying, new_free = result(j)
            with m.If(applying):
                m.d.sync += free[j].eq(new_free)
            # free_j computations in flight: + 1 the cycle after an ACK/NAK's strobe (fb_pend),
            # - 1 at its result (free_latency >= 3 cycles after the strobe: free_busy >= 1 then)
            m.d.sync += fb_pend[j].eq(taken)
            fb_next = (free_busy[j] + fb_pend[j] - applying)[:4]
            # (fb_next != 0 without the adder: a result applied implies free_busy >= 1)
            fb_nz_next = fb_pend[j] | (fb_nz[j] & ~((free_busy[j] == 1) & applying))
            m.d.sync += [free_busy[j].eq(fb_next), fb_nz[j].eq(fb_nz_next),
                         fb_wait[j].eq(fb_nz_next | applying)]
            m.d.sync += busy_slots[j].eq(busy_slots[j] + (dj & self.first)
                                         - Mux(applying, steps[j], 0))
            with m.If(dj & self.cnp_send):
                m.d.sync += cnp_seen[j].eq(cnp_seen[j] | self.onehot)
            with m.If(self.rtx_wr & (self.rtx_job == j)):
                m.d.sync += rtx_seen[j].eq(rtx_seen[j] | jr.onehot(self.rtx_rank))
            with m.If((sq == j) & self.enable):
                m.d.sync += [enabled[j].eq(1), error[j].eq(JobError.NONE),
                             jr.leaf[j].eq(self.roles_leaf), jr.up[j].eq(self.roles_up),
                             jr.down[j].eq(self.roles_down), jr.rack[j].eq(self.roles_rack)]
            # D17: the partial pointer and its chain, like rel / npend / chain_busy
            with m.If(dj & self.up_now):
                m.d.sync += jr.upptr[j].eq(jr.upptr[j] + 1)
                with m.If(jr.npend_up[j] != 0):
                    m.d.sync += jr.chain_up[j].eq(1)
            with m.If(dj & self.up_pend):
                m.d.sync += jr.npend_up[j].eq(jr.npend_up[j] + 1)
            with m.If(self.sch_up_job[j]):
                m.d.sync += [jr.upptr[j].eq(jr.upptr[j] + 1),
                             jr.npend_up[j].eq(jr.npend_up[j] - 1)]
            with m.If(self.sch_done_up & (js == j)):
                m.d.sync += jr.chain_up[j].eq(0)
            with m.If((sq == j) & self.disable):
                m.d.sync += [enabled[j].eq(0), error[j].eq(JobError.NONE)]
            with m.If((sq == j) & self.set_err):
                m.d.sync += error[j].eq(self.err)
            with m.If((sq == j) & self.reset):
                m.d.sync += [free[j].eq(0), rel[j].eq(0), npend[j].eq(0), busy_slots[j].eq(0),
                             fb_nz[j].eq(0), fb_pend[j].eq(0), fb_wait[j].eq(applying),
                             chain_busy[j].eq(0), free_busy[j].eq(0),
                             cnp_seen[j].eq(0), rtx_seen[j].eq(0), jr.upptr[j].eq(0),
                             jr.npend_up[j].eq(0), jr.chain_up[j].eq(0)]
                m.d.sync += [acked[j][r].eq(0) for r in range(WD)]
        return m
