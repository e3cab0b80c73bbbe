"""Release scheduler and free-pointer tree of the aggregation control path.

:class:`ReleaseScheduler` releases, in index order, the COMPLETE slots that completed out of
order (model step 5: a slot is released when it and every slot before it are complete). An
in-order completion is released by the decision stage itself; the scheduler only runs the
*chains* that follow it.

:class:`FreeMinTree` computes ``free_j`` = min over the job's flows of ``acked_f`` (model D7) as a
pipelined minimum tree, after each ACK/NAK that advanced some ``acked_f``.
"""

from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .roles import MARK_PARTIAL
from .types import PSN_BITS, SEQ_BITS
from .wide import differs

__all__ = ["ReleaseScheduler", "FreeMinTree", "ReleaseQueue"]


class ReleaseScheduler(wiring.Component):
    """Chained releases, one job at a time.

    Inputs (registered per-job state of :class:`~.control.AggControl`, one entry per job):
    ``chain`` (the job has a chain to run: its decision stage released an index while COMPLETE
    slots were pending beyond it), ``rel`` (release pointer), ``base`` / ``wm`` (slot range:
    first slot, W - 1), ``n`` (world size), ``npend`` (COMPLETE slots beyond ``rel``); the
    slot RAM's second read port (``rd_en`` / ``rd_addr`` -> ``rd_data`` one cycle later);
    ``fifo_ready`` (the release FIFO has room) and ``dec_push`` (the decision stage pushes a
    release command this cycle: it has priority on the FIFO: 0 when the caller gives the
    scheduler priority instead).

    Outputs: ``checking`` (in CHECK: a push may come this cycle; from the state register only),
    ``push`` with ``cmd`` (a release command; ``seq`` is left 0 for the caller), and in
    the same cycle ``rel_job`` (one-hot: advance that job's ``rel`` and decrement its
    ``npend``); ``done`` with ``job``: the chain of ``job`` ended (clear its ``chain`` flag).

    Flow roles (model D17): a leaf job (``leaf``) has two chains. Its release chain releases
    slots holding their total (``total``) to its MEMBER ranks (``mmask``) from the total
    buffer; its partial chain (``chain_up``, ``upptr``, ``npend_up``) sends slots complete with
    every contributor (``cmask``) up, to the UP rank only (``upmask``) with MARK_PARTIAL, and
    answers with ``up_job`` / ``done_up``. Release chains go first. ``full``: the ranks
    0..n-1 of each job (registered by the caller).

    Contract: latency: a chain starts one cycle after ``chain`` is seen (lowest job first),
    loads the job's pointer, pending count, slot range, N and masks into registers (LOAD, one
    cycle), then takes 3 cycles per released index (READ: slot RAM read; COMPARE: the word must
    be valid, hold index ``rel`` and a full bitmap, registered; CHECK: push, ``cmd`` from
    registers and the word read). Throughput: one index per 3 cycles. Backpressure: waits in
    CHECK while ``fifo_ready`` is low or ``dec_push`` is high. Errors: none (a slot that is not
    COMPLETE ends the chain).
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        J = c.jobs
        super().__init__({
            "chain": In(J), "rel": In(data.ArrayLayout(PSN_BITS, J)),
            "base": In(data.ArrayLayout(c.slot_bits, J)), "wm": In(data.ArrayLayout(c.w_bits, J)),
            "n": In(data.ArrayLayout(c.n_bits, J)), "npend": In(data.ArrayLayout(c.w_bits, J)),
            "rd_en": Out(1), "rd_addr": Out(c.slot_bits), "rd_data": In(c.slot_layout),
            "fifo_ready": In(1), "dec_push": In(1),
            "push": Out(1), "cmd": Out(c.rel_layout), "rel_job": Out(J),
            "done": Out(1), "job": Out(c.job_bits),
            "chain_up": In(J), "upptr": In(data.ArrayLayout(PSN_BITS, J)),
            "npend_up": In(data.ArrayLayout(c.w_bits, J)), "leaf": In(J),
            "full": In(data.ArrayLayout(c.max_world, J)),
            "cmask": In(data.ArrayLayout(c.max_world, J)),
            "mmask": In(data.ArrayLayout(c.max_world, J)),
            "upmask": In(data.ArrayLayout(c.max_world, J)),
            "up_job": Out(J), "done_up": Out(1),
            "checking": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        J, WD = c.jobs, c.max_world
        js = self.job
        up_mode = Signal()  # the chain being run is a leaf's partial chain (D17)

        def sel(port):
            # the job's entry as a mux tree (a View indexed by a Value is a shift by job x
            # width: Yosys builds it with a multiplier's carry chain, two levels more)
            return Array(port[j] for j in range(J))[js]

        leaf_js = self.leaf.bit_select(js, 1)
        n_js, full = sel(self.n), sel(self.full)
        # the chain's job state, registered in LOAD (jobs:1 selects off the slot address and the
        # checks): the job's rel / upptr and npend / npend_up move only by this chain's own
        # pushes while it runs (its decisions wait), so the chain steps its copies itself
        rel_q = Signal(PSN_BITS, name="rel_q")  # the index being released
        npend_q = Signal(c.w_bits, name="npend_q")
        base_q = Signal(c.slot_bits, name="base_q")
        wm_q = Signal(c.w_bits, name="wm_q")  # W - 1
        slot_q = Signal(c.slot_bits, name="slot_q")
        n_q = Signal(c.n_bits, name="n_q")
        mask_q = Signal(WD, name="mask_q")  # the ranks the result goes to
        want_q = Signal(WD, name="want_q")  # the bitmap that makes the slot COMPLETE
        by_total_q = Signal(name="by_total_q")  # a leaf's release chain: COMPLETE = total in
        ok_q = Signal()  # the word is COMPLETE with index rel_q
        slot = Signal(c.slot_bits)
        m.d.comb += [slot.eq(base_q + (rel_q & wm_q)), self.rd_addr.eq(slot)]
        cmd, word = self.cmd, self.rd_data
        m.d.comb += [cmd.job.eq(js), cmd.slot.eq(slot_q), cmd.index.eq(rel_q),
                     cmd.n.eq(n_q), cmd.plen.eq(word.plen), cmd.mask.eq(mask_q),
                     cmd.total.eq(by_total_q),
                     cmd.mark.eq(Mux(up_mode, MARK_PARTIAL, 0))]
        if c.ports > 1:
            m.d.comb += cmd.ports.eq(word.ports)
        pick = Const(0, c.job_bits)
        pick_up = Const(0, c.job_bits)
        for j in reversed(range(J)):
            pick = Mux(self.chain[j], j, pick)
            pick_up = Mux(self.chain_up[j], j, pick_up)
        with m.FSM(name="release"):
            with m.State("IDLE"):
                with m.If(self.chain.any()):
                    m.d.sync += [js.eq(pick), up_mode.eq(0)]
                    m.next = "LOAD"
                with m.Elif(self.chain_up.any()):
                    m.d.sync += [js.eq(pick_up), up_mode.eq(1)]
                    m.next = "LOAD"
            with m.State("LOAD"):
                m.d.sync += [rel_q.eq(Mux(up_mode, sel(self.upptr), sel(self.rel))),
                             npend_q.eq(Mux(up_mode, sel(self.npend_up), sel(self.npend))),
                             base_q.eq(sel(self.base)), wm_q.eq(sel(self.wm)), n_q.eq(n_js),
                             mask_q.eq(Mux(up_mode, sel(self.upmask),
                                           Mux(leaf_js, sel(self.mmask), full))),
                             want_q.eq(Mux(up_mode, sel(self.cmask), full)),
                             by_total_q.eq(~up_mode & leaf_js)]
                m.next = "READ"
            with m.State("READ"):
                m.d.comb += self.rd_en.eq(1)
                m.d.sync += slot_q.eq(slot)
                m.next = "COMPARE"
            with m.State("COMPARE"):
                # the word's checks, registered (the read data holds until the next READ)
                # (the equalities on carry chains, see .wide)
                ready = Mux(by_total_q, word.total, ~differs(m, word.bitmap, want_q, "ok_bm"))
                m.d.sync += ok_q.eq(word.valid & ~differs(m, word.index, rel_q, "ok_ix") & ready)
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.checking.eq(1)
                with m.If(~ok_q):
                    m.d.comb += [self.done.eq(~up_mode), self.done_up.eq(up_mode)]
                    m.next = "IDLE"
                with m.Elif(self.fifo_ready & ~self.dec_push):
                    m.d.comb += [self.push.eq(1), self.rel_job.eq(Mux(up_mode, 0, 1 << js)),
                                 self.up_job.eq(Mux(up_mode, 1 << js, 0))]
                    m.d.sync += [rel_q.eq(rel_q + 1), npend_q.eq(npend_q - 1)]
                    with m.If(npend_q == 1):
                        m.d.comb += [self.done.eq(~up_mode), self.done_up.eq(up_mode)]
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"
        return m


class FreeMinTree(wiring.Component):
    """``free_j`` after an ACK/NAK: ``free + min_r (acked[r] - free)`` over the job's ``n`` ranks
    (distances modulo 2**24, cut to ``w_bits``; ranks >= ``n`` do not count).

    Inputs (a snapshot of one job, valid with ``i_valid``): ``i_job``, ``free`` (its free_j),
    ``n``, ``acked`` (acked_f of ranks 0..max_world-1). Outputs: ``o_valid``, ``o_job``,
    ``o_free`` (the new free_j).

    Contract: latency ``ctl.free_latency - 1`` cycles (a register after the distances, one every
    ``free_levels`` levels of the tree and the output register); throughput one snapshot per
    cycle; no backpressure; results of one job only grow (a later snapshot starts from newer
    acked values).
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        super().__init__({
            "i_valid": In(1), "i_job": In(c.job_bits), "free": In(PSN_BITS), "n": In(c.n_bits),
            "acked": In(data.ArrayLayout(PSN_BITS, c.max_world)),
            "o_valid": Out(1), "o_job": Out(c.job_bits), "o_free": Out(PSN_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        wb = c.w_bits
        vals = []
        for r in range(c.max_world):
            dist = Signal(wb, name=f"fdist{r}")  # registered: the inputs are jobs:1 muxes
            m.d.sync += dist.eq(Mux(self.n > r, (self.acked[r] - self.free)[:wb], (1 << wb) - 1))
            vals.append(dist)
        tv, tj, tf = Signal(), Signal(c.job_bits), Signal(PSN_BITS)
        m.d.sync += [tv.eq(self.i_valid), tj.eq(self.i_job), tf.eq(self.free)]
        level = 0
        while len(vals) > 1:
            nxt = [Mux(vals[i] < vals[i + 1], vals[i], vals[i + 1])
                   for i in range(0, len(vals) - 1, 2)]
            if len(vals) % 2:
                nxt.append(vals[-1])
            vals, level = nxt, level + 1
            if level % c.free_levels == 0 and len(vals) > 1:
                regs = [Signal(wb, name=f"fmin{level}_{i}") for i in range(len(vals))]
                nv, nj = Signal(name=f"fv{level}"), Signal(c.job_bits, name=f"fj{level}")
                nf = Signal(PSN_BITS, name=f"ff{level}")
                m.d.sync += [r_.eq(v) for r_, v in zip(regs, vals, strict=True)]
                m.d.sync += [nv.eq(tv), nj.eq(tj), nf.eq(tf)]
                vals, tv, tj, tf = regs, nv, nj, nf
        m.d.sync += [self.o_free.eq(tf + vals[0]), self.o_valid.eq(tv), self.o_job.eq(tj)]
        return m


class ReleaseQueue(wiring.Component):
    """The release command FIFO of :class:`~.control.AggControl`, with its input register and
    the commands' sequence numbers.

    Inputs: ``commit`` (the decision stage commits a frame: the count of decisions output so
    far grows; ``commit2``: and a side frame, pairs), ``dec_push`` with ``dec_cmd`` (the
    decision stage's release command; ``seq`` ignored), ``sch_push`` with ``sch_cmd`` and
    ``sch_sel`` (the release scheduler is in its push state: its command is the one taken).
    Outputs: ``o`` (the commands, in push order),
    ``room`` (a register: the FIFO takes one more command besides the one in its input register,
    from its level a cycle ago: the level grows by at most one a cycle).

    ``seq`` of a command = the decisions committed up to and including the one that caused the
    release (a chained release counts every decision committed so far): the emitter sends a
    release only after the payload of every decision before ``seq`` is written.

    Contract: latency 2 cycles from a push to ``o.valid`` (input register, FIFO); throughput one
    command per cycle; backpressure: ``o.ready`` low fills the FIFO (``rel_depth`` commands) and
    ``room`` falls; the pushers wait for ``room``, never push together (the decision waits in
    the scheduler's push state) and never push into a full FIFO. Errors: none.
    """

    def __init__(self, ctl):
        c = self._ctl = ctl
        super().__init__({
            "commit": In(1), "commit2": In(1), "dec_push": In(1), "dec_cmd": In(c.rel_layout),
            "sch_push": In(1),
            "sch_cmd": In(c.rel_layout), "sch_sel": In(1),
            "o": Out(stream.Signature(c.rel_layout)), "room": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        m.submodules.fifo = relq = fifo.SyncFIFOBuffered(width=c.rel_layout.size,
                                                         depth=c.rel_depth)
        m.d.comb += [self.o.valid.eq(relq.r_rdy), self.o.payload.eq(relq.r_data),
                     relq.r_en.eq(self.o.ready)]
        n_commit = Signal(SEQ_BITS)
        # (a side frame, pairs: never releases; it commits with a main frame)
        m.d.sync += n_commit.eq(n_commit + self.commit + self.commit2)
        dec_cmd, sch_cmd = Signal(c.rel_layout), Signal(c.rel_layout)
        m.d.comb += [dec_cmd.eq(self.dec_cmd), dec_cmd.seq.eq(n_commit + 1),
                     sch_cmd.eq(self.sch_cmd), sch_cmd.seq.eq(n_commit)]
        # the command is written into the FIFO one cycle later, from a register (the pushes are
        # off the FIFO's level logic)
        rq_en, rq_data = Signal(), Signal(c.rel_layout.size)
        m.d.sync += [rq_en.eq(self.dec_push | self.sch_push),
                     rq_data.eq(Mux(self.sch_sel, sch_cmd.as_value(), dec_cmd.as_value()))]
        m.d.comb += [relq.w_en.eq(rq_en), relq.w_data.eq(rq_data)]
        m.d.sync += self.room.eq(relq.level <= c.rel_depth - 3)
        return m
