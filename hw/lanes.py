"""Per-port contribution lanes (build parameter ``lanes = ports``; model decision D20).

Every port gets its own contribution path: its own :class:`~netreduce.hw.dispatch.Dispatcher`
and its own :class:`~netreduce.hw.agg.slotmem.SlotMemory` (lane ``k``), so P ports aggregate at
one beat per cycle each at the same time (docs/engine.md, "Every port at line rate"). This module
holds what the lanes share:

* :class:`LaneSplit`: the control path's decisions (one stream, decision order) into one stream
  per lane (the decision's arrival port), each with its global ordinal ``seq`` and, per slot, the
  lanes that hold a partial of the slot's current generation (``lmask``, a P-bit word per slot,
  in LUT RAM banks of up to 256 slots):
  a contribution's ``overwrite`` becomes "first contribution of this generation *in this lane*".
* :class:`LaneCombine`: the emitter's slot reads, issued to every lane's result port in lock
  step; the lanes in the read's ``lmask`` are combined in port order 0..P-1 (D20), and SUM_SAT
  clipping in the combination is reported once per released index.
* :func:`xtag_layout`: what a slot read carries for the combination (lane mask, op, job).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .agg.lanes import LaneALU, Op
from .agg.types import Action
from .emitter import SEQ_BITS

__all__ = ["LaneSplit", "LaneCombine", "xtag_layout", "lane_layout", "min_seq", "pair_layout"]


# deepest LUT-RAM bank of LaneSplit's lane bits (see LaneSplit.elaborate)
LUTRAM_BANK = 256


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def xtag_layout(lanes: int, jobs: int) -> data.StructLayout:
    """The combine tag of a slot read: lanes holding a partial, the job's op and the job."""
    return data.StructLayout({"lmask": lanes, "op": 2, "job": _bits(jobs)})


def lane_layout(dec_layout, lanes: int) -> data.StructLayout:
    """A decision as a lane's dispatcher gets it: the decision (``overwrite`` = first in this
    lane), its global ordinal ``seq`` and the slot's lane mask after it (``lmask``)."""
    return data.StructLayout({"dec": dec_layout, "seq": SEQ_BITS, "lmask": lanes})


def min_seq(values):
    """The oldest of sequence numbers (modulo 2**SEQ_BITS, distances below 2**15): every pair
    compared at once (the sign of their difference; the lower index wins a tie), each value's
    "older than or equal to all others" flag, and an AND-OR of the values so flagged (equal
    values when several are). One subtraction and two LUT levels deep, not log2(n) chained
    comparisons."""
    values = list(values)
    n = len(values)
    if n == 1:
        return values[0]
    le = {}
    for i in range(n):
        for j in range(i + 1, n):
            d = (values[j] - values[i])[:SEQ_BITS]
            le[i, j] = ~d[SEQ_BITS - 1]          # values[i] is not newer than values[j]
            le[j, i] = d[SEQ_BITS - 1]           # values[j] strictly older than values[i]
    out = 0
    for i in range(n):
        win = Cat(*[le[i, j] for j in range(n) if j != i]).all()
        out = out | Mux(win, values[i], 0)
    return out[:SEQ_BITS]


def pair_layout(dec_layout) -> data.StructLayout:
    """The control path's second decision of a cycle (``AggControl.dec2`` with ``pairs``):
    valid flag ``v`` and the decision ``d``."""
    return data.StructLayout({"v": 1, "d": dec_layout})


class LaneSplit(wiring.Component):
    """Decisions -> one stream per lane (the decision's ``port``), in decision order.

    Members: ``dec`` (In: the control path's decisions), ``dec2`` (In, with ``pairs`` only:
    :func:`pair_layout`, the control path's second decision, sampled and consumed with ``dec``),
    ``lane<k>`` (Out, :func:`lane_layout`), ``n_split`` (Out: decisions passed on so far, modulo
    2**SEQ_BITS: the ordinal of the next), ``ops`` (Out: per job the op of its latest
    contribution or re-emit, which is the job's latched op for every release command it has
    made).

    Contract: a decision goes to its port's lane in the cycle it is offered if that lane is ready
    (``dec.ready`` is the lane's ready: latency 0, no storage). Lane bits (``slots`` x P, LUT
    RAM read combinationally, written at the decision): a CONTRIBUTE with the control's
    ``overwrite`` (first of the slot's generation) sets only its lane's bit and overwrites its
    lane; any other CONTRIBUTE overwrites its lane if the lane's bit is clear and sets it. So
    disable/re-enable and freeing need no clearing of their own. No errors.

    Pairs (``pairs=True``): while ``dec.valid`` and ``dec2.v``, the pair's two decisions (order:
    ``dec``, then ``dec2.d``) go to their lanes in the same cycle, with ordinals ``n_split`` and
    ``n_split + 1``; ``n_split`` advances by 2; ``dec.ready`` = both lanes ready (each lane
    still takes at most one decision per cycle). The second decision is a FORWARD of an ACK/NAK
    (the control's contract): it reads and writes no lane bits, its ``overwrite`` and ``lmask``
    are 0 (the dispatcher reads ``lmask`` only for a frame job, which a FORWARD without ``cnp``
    does not make) and it leaves ``ops`` alone. The control pairs decisions of different ports
    only; should both name one port, the pair is passed on in two cycles (the first decision,
    then, with ``dec.ready``, the second), so order and ordinals stay right.
    """

    def __init__(self, dec_layout, *, lanes: int, slots: int, jobs: int, pairs: bool = False):
        self.lanes, self.slots, self.jobs, self.pairs = lanes, slots, jobs, bool(pairs)
        self.dec_layout = dec_layout
        self.lane_layout = lane_layout(dec_layout, lanes)
        members = {"dec": In(stream.Signature(dec_layout)), "n_split": Out(SEQ_BITS),
                   "ops": Out(data.ArrayLayout(2, jobs))}
        if self.pairs:
            members["dec2"] = In(pair_layout(dec_layout))
        for k in range(lanes):
            members[f"lane{k}"] = Out(stream.Signature(self.lane_layout))
        super().__init__(members)

    def elaborate(self, platform):  # noqa: C901 (the lane bits, then the pair's routing)
        m = Module()
        P = self.lanes
        lanes = [getattr(self, f"lane{k}") for k in range(P)]
        dec = self.dec.payload
        # LUT RAM banks of at most LUTRAM_BANK entries, the bank picked by the slot's high bits
        # (one 2:1 mux per bank doubling): Yosys 0.23's UltraScale LUT-RAM library has no
        # mappable single-port shape deeper than 256 (its 512-deep option, OPTION_ABITS 16,
        # has no case in lutrams_xc5v_map.v: "invalid OPTION_ABITS/WIDTH combination")
        bank_depth = min(self.slots, LUTRAM_BANK)
        n_banks = -(-self.slots // bank_depth)
        lo_bits = ceil_log2(bank_depth)
        slot_lo, slot_hi = dec.slot[:lo_bits], dec.slot[lo_bits:]
        wrs, rds = [], []
        for b in range(n_banks):
            mem = Memory(shape=P, depth=bank_depth, init=[])
            m.submodules[f"bits{b}" if n_banks > 1 else "bits"] = mem
            rd, wr = mem.read_port(domain="comb"), mem.write_port()
            m.d.comb += [rd.addr.eq(slot_lo), wr.addr.eq(slot_lo)]
            rds.append(rd)
            wrs.append(wr)
        port = dec.port
        onehot = Signal(P)
        m.d.comb += onehot.eq(Const(1, P) << port)
        bits = Signal(P, name="lane_bits")
        m.d.comb += bits.eq(rds[0].data if n_banks == 1
                            else Array(rd.data for rd in rds)[slot_hi])
        is_con = dec.action == Action.CONTRIBUTE
        first = Signal()
        m.d.comb += first.eq(dec.overwrite | ~(bits & onehot).any())
        new = Signal(P)
        m.d.comb += new.eq(Mux(dec.overwrite, onehot, bits | onehot))
        rdy = Array(ln.ready for ln in lanes)
        main_go, side_go = Signal(), Signal()  # the decision / the pair's second one goes now
        main = Signal(self.lane_layout, name="main_item")
        m.d.comb += [main.dec.eq(dec), main.dec.overwrite.eq(is_con & first),
                     main.seq.eq(self.n_split), main.lmask.eq(Mux(is_con, new, bits))]
        if self.pairs:
            pair, side_d = self.dec2.v, self.dec2.d
            port2 = side_d.port
            same = Signal()
            m.d.comb += same.eq(port == port2)
            # half: the first decision of a one-port pair has gone, the second is due
            half = Signal(name="pair_half")
            r1, r2 = rdy[port], rdy[port2]
            m.d.comb += [
                main_go.eq(self.dec.valid & ~half & r1 & (~pair | same | r2)),
                side_go.eq(self.dec.valid & pair & Mux(half, r2, ~same & r1 & r2)),
                self.dec.ready.eq(Mux(half, r2, r1 & (~pair | (~same & r2)))),
            ]
            with m.If(main_go & pair & same):
                m.d.sync += half.eq(1)
            with m.Elif(side_go):
                m.d.sync += half.eq(0)
            side = Signal(self.lane_layout, name="side_item")
            m.d.comb += [side.dec.eq(side_d), side.dec.overwrite.eq(0), side.lmask.eq(0),
                         side.seq.eq(Mux(half, self.n_split, self.n_split + 1))]
            for k, ln in enumerate(lanes):
                # the item offered to lane k does not depend on the lanes' ready
                here = pair & (port2 == k) & (half | ~same)
                m.d.comb += [ln.valid.eq((main_go & (port == k)) | (side_go & (port2 == k))),
                             ln.payload.eq(Mux(here, side, main))]
            m.d.sync += self.n_split.eq(self.n_split + main_go + side_go)
        else:
            m.d.comb += [main_go.eq(self.dec.valid & rdy[port]), self.dec.ready.eq(rdy[port])]
            for k, ln in enumerate(lanes):
                m.d.comb += [ln.valid.eq(self.dec.valid & (port == k)), ln.payload.eq(main)]
            with m.If(main_go):
                m.d.sync += self.n_split.eq(self.n_split + 1)
        for b, wr in enumerate(wrs):
            hit = (slot_hi == b) if n_banks > 1 else Const(1, 1)
            m.d.comb += [wr.data.eq(new), wr.en.eq(main_go & is_con & hit)]
        with m.If(main_go & (is_con | (dec.action == Action.REEMIT))):
            m.d.sync += self.ops[dec.job].eq(dec.op)
        return m


class LaneCombine(wiring.Component):
    """The emitter's slot reads over P lanes, combined in port order (model D20).

    Members: ``req`` (In) / ``res`` (Out): the emitter's side, the slot memory's result-port
    layouts, with tag ``Cat(bytes, last, xtag, count)`` (``bytes``: ``nb_bits`` bits, ``xtag``:
    :func:`xtag_layout`, ``count``: this read belongs to a release's first result frame);
    ``lane_req<k>`` (Out) / ``lane_res<k>`` (In): lane k's result port. ``sat_inc`` (Out, per
    job): SUM_SAT combining additions that clipped, counted at the last beat of a ``count``
    frame (once per released index).

    Contract: requests go to every lane at once; the lanes' result pipelines are identical and
    get identical valid / ready, so they stay in lock step (``req.ready`` is lane 0's). Lanes
    outside ``lmask`` are skipped, the first lane inside it is copied, each further one is added
    with ``op`` (:class:`~netreduce.hw.agg.lanes.LaneALU`), in port order. Latency: the lanes'
    plus P - 1, a register after each combining addition (the last one the output register:
    ``res`` and its payload are flip-flop outputs); one beat per cycle;
    the whole pipeline stalls on ``res.ready`` (``lane_res<k>.ready`` is combinational from
    it). Only lanes whose 4 bytes are all payload count as clipped; ``sat_inc`` comes two
    cycles after the frame's last beat leaves (its flags registered, then reduced and
    counted). No errors.
    """

    def __init__(self, width: int, *, lanes: int, jobs: int, req_layout, res_layout,
                 nb_bits: int, cnt_width: int):
        self.width, self.lanes, self.jobs = width, lanes, jobs
        self.nb_bits, self.cnt_width = nb_bits, cnt_width
        self.xl = xtag_layout(lanes, jobs)
        members = {"req": In(stream.Signature(req_layout)),
                   "res": Out(stream.Signature(res_layout)),
                   "sat_inc": Out(data.ArrayLayout(cnt_width, jobs))}
        for k in range(lanes):
            members[f"lane_req{k}"] = Out(stream.Signature(req_layout))
            members[f"lane_res{k}"] = In(stream.Signature(res_layout))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        P, w, nbb = self.lanes, self.width, self.nb_bits
        reqs = [getattr(self, f"lane_req{k}") for k in range(P)]
        ress = [getattr(self, f"lane_res{k}") for k in range(P)]
        for r in reqs:
            m.d.comb += [r.valid.eq(self.req.valid), r.payload.eq(self.req.payload)]
        m.d.comb += self.req.ready.eq(reqs[0].ready)
        # A register after each combining addition (one lane ALU per stage keeps the path
        # within the logic-depth budget; lane 0's copy shares the first stage), the last one the
        # output register; the stages and the lanes' result pipelines advance together
        # (``advance``), as one pipeline.
        advance = Signal()
        r0 = ress[0].payload
        head = Signal.like(r0, name="comb_head")   # slot, beat, tag of the beat in this stage
        m.d.comb += head.eq(r0)
        valid = ress[0].valid
        datas = [r.payload.data for r in ress]
        clips = Const(0, P)   # lanes whose combining addition clipped (reduced, all stages)
        last_sat = []         # the last lane's per-32-bit clip flags, not yet reduced
        # a middle lane's per-32-bit clip flags go into its stage register unreduced and are
        # reduced in the next stage: the reduction after the adder's carry chain would put 9 LUT
        # levels into the stage (4 lanes)
        pend = None
        # lane 0 is copied when inside lmask (an ALU with ``first`` set: the beat for a defined
        # op, 0 for an undefined one), so one LUT level, not an ALU, is in front of lane 1's adder
        xt0 = data.View(self.xl, head.tag[nbb + 1:nbb + 1 + self.xl.size])
        op_ok = (xt0.op == Op.SUM_WRAP) | (xt0.op == Op.SUM_SAT) | (xt0.op == Op.MAX)
        acc = Mux(xt0.lmask[0] & op_ok, datas[0], 0)
        seen = xt0.lmask[0]
        for k in range(1, P):
            tag = head.tag
            xt = data.View(self.xl, tag[nbb + 1:nbb + 1 + self.xl.size])
            kept = Cat(*[tag[:nbb] > 4 * i + 3 for i in range(w // 32)])
            alu = LaneALU(w)
            m.submodules[f"alu{k}"] = alu
            m.d.comb += [alu.op.eq(xt.op), alu.first.eq(~seen), alu.acc.eq(acc),
                         alu.contrib.eq(datas[k])]
            inside = xt.lmask[k]
            flags = (alu.sat & kept) & Cat(*[inside & seen] * (w // 32))
            if pend is not None:
                clips = clips | (pend.any() << (k - 1))
            if k == P - 1:
                last_sat = flags
            else:
                pend = flags
            acc = Mux(inside, alu.result, acc)
            seen = seen | inside
            if 1 <= k < P - 1:
                st_head = Signal.like(r0, name=f"comb_head{k}", reset_less=True)
                st_acc = Signal(w, name=f"comb_acc{k}", reset_less=True)
                st_seen = Signal(name=f"comb_seen{k}", reset_less=True)
                st_clips = Signal(P, name=f"comb_clips{k}", reset_less=True)
                st_pend = Signal(w // 32, name=f"comb_pend{k}", reset_less=True)
                st_valid = Signal(name=f"comb_valid{k}")
                st_datas = [Signal(w, name=f"comb_d{k}_{j}", reset_less=True)
                            for j in range(k + 1, P)]
                with m.If(advance):
                    m.d.sync += [st_head.eq(head), st_acc.eq(acc), st_seen.eq(seen),
                                 st_clips.eq(clips), st_pend.eq(pend), st_valid.eq(valid)]
                    m.d.sync += [d.eq(datas[j]) for d, j in zip(st_datas, range(k + 1, P),
                                                                  strict=True)]
                head, acc, seen, clips, valid = st_head, st_acc, st_seen, st_clips, st_valid
                pend = st_pend
                datas = [None] * (k + 1) + st_datas
        # the output register: the last combining addition ends in flip-flops, not in the
        # emitter's payload select and the deparsers' payload FIFOs behind it
        o_head = Signal.like(r0, name="comb_out_head", reset_less=True)
        o_acc = Signal(w, name="comb_out_acc", reset_less=True)
        o_clips = Signal(P, name="comb_out_clips", reset_less=True)
        o_sat = Signal(w // 32, name="comb_out_sat", reset_less=True)
        o_valid = Signal(name="comb_out_valid")
        with m.If(advance):
            m.d.sync += [o_head.eq(head), o_acc.eq(acc), o_clips.eq(clips),
                         o_sat.eq(last_sat), o_valid.eq(valid)]
        m.d.comb += advance.eq(~o_valid | self.res.ready)
        out = self.res.payload
        m.d.comb += [self.res.valid.eq(o_valid), out.eq(o_head), out.data.eq(o_acc)]
        for r in ress:
            m.d.comb += r.ready.eq(advance)
        # clipping of one frame's combining additions, counted at its last beat. The beat's
        # flags are registered with it (the last lane's per 32 bits, unreduced: its adders'
        # carry chains end there), then as it leaves, and reduced and counted a cycle later
        tag = o_head.tag
        xt = data.View(self.xl, tag[nbb + 1:nbb + 1 + self.xl.size])
        hs = self.res.valid & self.res.ready
        c_hs = Signal(name="clip_hs")
        c_last, c_count = Signal(name="clip_last"), Signal(name="clip_count")
        c_job = Signal.like(xt.job, name="clip_job")
        c_clips = Signal(P, name="clip_lanes")
        c_sat = Signal(w // 32, name="clip_sat")
        m.d.sync += [c_hs.eq(hs), c_last.eq(tag[nbb]), c_count.eq(tag[nbb + 1 + self.xl.size]),
                     c_job.eq(xt.job), c_clips.eq(o_clips), c_sat.eq(o_sat)]
        held = Signal(P, name="clip_held")
        now = Signal(P)
        m.d.comb += now.eq(held | c_clips | (c_sat.any() << (P - 1)))
        with m.If(c_hs):
            m.d.sync += held.eq(Mux(c_last, 0, now))
        n_clip = sum(now[k] for k in range(P))
        for j in range(self.jobs):
            m.d.sync += self.sat_inc[j].eq(Mux(c_hs & c_last & c_count & (c_job == j), n_clip,
                                               0))
        return m


class LanePath:
    """What :func:`attach_lanes` hands back to the engine top."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def attach_lanes(m, *, width: int, slots: int, pmtu_max: int, max_world: int, rl: int, ctl,
                 fq, pq, dq, fwd, hstore, nb_bits: int) -> LanePath:
    """Build the per-port contribution lanes between the control path (``ctl.dec``), the ports'
    frame / payload / head buffers (``fq``, ``pq``, ``dq``: (fifo, read view) per port), their
    forward queues (``fwd``: (fifo, write view)) and the header store (``hstore``, write port).

    Per lane k: decision FIFO (first-word fall-through) -> Dispatcher -> SlotMemory k; its frame
    jobs into a FIFO; its header-store writes into a 2-entry FIFO, drained round robin into the
    store's one write port (a lane stalls a contribution's start only when its entry is still
    waiting). Returns the merged frame-job stream (``jobs_valid`` / ``jobs_payload`` /
    ``jobs_ready``, oldest ``seq`` first), ``done_seen`` (every decision before it has its
    payload visible to the result ports and its header in the store), the :class:`LaneCombine`
    (``comb``: its ``req`` / ``res`` are the emitter's slot reads), ``req_layout`` /
    ``res_layout``, ``xtag_width`` and ``sat_inc`` (per job, saturating contributions and
    combining additions this cycle) and ``split`` (its ``ops`` give a release's op).

    A control path with pairs (``ctl.dec2``) hands LaneSplit two decisions in a cycle, to two
    lanes; each lane's FIFO still takes at most one per cycle, its ``issued`` count and the
    bounds below are per lane, and ``n_split`` (the bound of an idle lane) is the ordinal of
    the next decision, after both of a pair.
    """
    from amaranth.lib import fifo

    from .agg.slotmem import SlotMemory
    from .dispatch import Dispatcher
    from .emitter import frame_job_layout

    P = len(fq)
    jobs, job_bits = ctl.jobs, ctl.job_bits
    xl = xtag_layout(P, jobs)
    tag_width = max(job_bits, nb_bits + 1 + xl.size + 1 + P)  # + the round's ports
    # a control path with pairs (AggControl ``pairs``) makes a second decision per cycle
    pairs = "dec2" in ctl.signature.members
    m.submodules.lane_split = split = LaneSplit(ctl.dec_layout, lanes=P, slots=slots, jobs=jobs,
                                                pairs=pairs)
    wiring.connect(m, ctl.dec, split.dec)
    if pairs:
        m.d.comb += split.dec2.eq(ctl.dec2)
    job_l = frame_job_layout(P, slots, xl.size)
    hs_l = data.StructLayout({"addr": len(hstore.w_addr), "data": hstore.layout})
    bounds, heads, hs_qs, mems = [], [], [], []
    sat_parts = [[] for _ in range(jobs)]
    for k in range(P):
        sm = SlotMemory(width, slots=slots, pmtu_max=pmtu_max, read_latency=rl,
                        tag_width=tag_width)
        m.submodules[f"slotmem{k}"] = sm
        mems.append(sm)
        d = Dispatcher(width, ports=1, slots=slots, max_world=max_world,
                       dec_layout=ctl.dec_layout, contrib_layout=sm.contrib_layout, lane=k,
                       lane_layout=split.lane_layout, job_ports=P, xtag_width=xl.size)
        m.submodules[f"dispatch{k}"] = d
        # 16 decisions: a lane whose forwarded frame waits for its port's TX must not hold
        # the decisions of the other lanes behind it (LaneSplit stops at a full lane)
        dfq = fifo.SyncFIFO(width=split.lane_layout.size, depth=16)
        m.submodules[f"lane_dq{k}"] = dfq
        lo = getattr(split, f"lane{k}")
        head = data.View(split.lane_layout, dfq.r_data)
        m.d.comb += [dfq.w_en.eq(lo.valid), dfq.w_data.eq(lo.payload), lo.ready.eq(dfq.w_rdy),
                     d.dec.valid.eq(dfq.r_rdy), d.dec.payload.eq(head), dfq.r_en.eq(d.dec.ready)]
        wiring.connect(m, d.contrib, sm.contrib)
        for port, (q, r) in ((d.frame0, fq[k]), (d.payload0, pq[k]), (d.head0, dq[k])):
            m.d.comb += [port.valid.eq(q.r_rdy), port.payload.eq(r), q.r_en.eq(port.ready)]
        m.d.comb += [fwd[k][0].w_en.eq(d.fwd0.valid), fwd[k][1].eq(d.fwd0.payload),
                     d.fwd0.ready.eq(fwd[k][0].w_rdy)]
        jq = fifo.SyncFIFOBuffered(width=job_l.size, depth=4)
        m.submodules[f"lane_jq{k}"] = jq
        m.d.comb += [jq.w_en.eq(d.jobs.valid), jq.w_data.eq(d.jobs.payload),
                     d.jobs.ready.eq(jq.w_rdy)]
        heads.append((jq, data.View(job_l, jq.r_data)))
        hq = fifo.SyncFIFO(width=hs_l.size, depth=2)
        m.submodules[f"lane_hq{k}"] = hq
        hq_w = data.View(hs_l, hq.w_data)
        m.d.comb += [hq.w_en.eq(d.hs_en), hq_w.addr.eq(d.hs_addr), hq_w.data.eq(d.hs_data),
                     d.hs_ready.eq(hq.w_rdy)]
        hs_qs.append((hq, data.View(hs_l, hq.r_data)))
        # oldest decision of this lane not finished (n_split when none is pending)
        issued = Signal(SEQ_BITS, name=f"lane_issued{k}")
        m.d.sync += issued.eq(issued + (lo.valid & lo.ready))
        bounds.append(Mux(issued == d.done, split.n_split,
                          Mux(d.active, d.cur_seq, head.seq)))
        # saturation of a lane contribution: any of its beats clipped
        ev = sm.events.payload
        acc = Signal(name=f"lane_sat{k}")
        with m.If(sm.events.valid):
            m.d.sync += acc.eq(Mux(ev.last, 0, acc | ev.saturated))
        for j in range(jobs):
            sat_parts[j].append(sm.events.valid & ev.last & (ev.tag[:job_bits] == j)
                                & (acc | ev.saturated))

    # header-store writes, one per cycle, round robin over the lanes' FIFOs
    rr = Signal(range(P))
    pick = Const(0, range(P))
    for k in reversed(range(P)):
        pick = Mux(hs_qs[k][0].r_rdy, k, pick)
    pick_rr = pick
    for k in reversed(range(P)):
        pick_rr = Mux(hs_qs[k][0].r_rdy & (k >= rr), k, pick_rr)
    sel = Signal(range(P))
    m.d.comb += sel.eq(pick_rr)
    any_hs = Cat(*[q.r_rdy for q, _ in hs_qs]).any()
    m.d.comb += [hstore.w_en.eq(any_hs),
                 hstore.w_addr.eq(Array(r.addr for _, r in hs_qs)[sel]),
                 hstore.w_data.eq(Array(r.data for _, r in hs_qs)[sel])]
    for k, (q, _) in enumerate(hs_qs):
        m.d.comb += q.r_en.eq(any_hs & (sel == k))
    with m.If(any_hs):
        m.d.sync += rr.eq(Mux(sel == P - 1, 0, sel + 1))

    # decisions done: the oldest lane bound, taken only while no header write is waiting,
    # then delayed until the slot memories' writes are visible to their result ports. The
    # lanes' bounds are registered first (a snapshot of one cycle, with its header-write flag),
    # the oldest of them taken a cycle later; the delay after it is one cycle shorter, so
    # done_seen moves as before
    snap = [Signal(SEQ_BITS, name=f"lane_bound{k}") for k in range(P)]
    snap_hs = Signal(name="lane_bound_hs")
    m.d.sync += [s.eq(b) for s, b in zip(snap, bounds, strict=True)]
    m.d.sync += snap_hs.eq(any_hs)
    bound = Signal(SEQ_BITS, name="lane_bound")
    with m.If(~snap_hs):
        m.d.sync += bound.eq(min_seq(snap))
    delay = [bound]
    for i in range(rl):
        s = Signal(SEQ_BITS, name=f"lane_done_d{i}")
        m.d.sync += s.eq(delay[-1])
        delay.append(s)

    # frame jobs of all lanes, oldest decision first: every pair of lane heads compared at
    # once (a decision makes at most one frame job, so two heads never have the same seq and
    # the sign of their difference orders them), the winner one-hot, its payload AND-OR
    # selected; no chain of comparisons. The merged stream leaves through a skid buffer: the
    # choice ends in its registers, not in the emitter's; the cycle it adds is within
    # done_seen's delay (a release after the job waits for the job's decision to finish)
    hv = [q.r_rdy for q, _ in heads]
    before = {}
    for i in range(P):
        for j in range(i + 1, P):
            b = Signal(name=f"lane_job_lt{i}_{j}")   # lane i's head is older than lane j's
            m.d.comb += b.eq(~(heads[j][1].seq - heads[i][1].seq)[SEQ_BITS - 1])
            before[i, j], before[j, i] = b, ~b
    win = Signal(P, name="lane_job_win")
    for k in range(P):
        m.d.comb += win[k].eq(hv[k] & Cat(*[~hv[j] | before[k, j]
                                            for j in range(P) if j != k]).all())
    from .skid import SkidBuffer
    m.submodules.lane_jobs_skid = jskid = SkidBuffer(job_l)
    sel_payload = 0
    for k, (_, r) in enumerate(heads):
        sel_payload = sel_payload | Mux(win[k], r.as_value(), 0)
    m.d.comb += [jskid.i.valid.eq(Cat(*hv).any()), jskid.i.payload.eq(sel_payload)]
    for k, (q, _) in enumerate(heads):
        m.d.comb += q.r_en.eq(jskid.i.ready & win[k])
    jobs_valid, jobs_ready = jskid.o.valid, jskid.o.ready
    jobs_payload = jskid.o.payload

    cnt_width = max(1, ceil_log2(2 * P + 1))
    comb = LaneCombine(width, lanes=P, jobs=jobs, req_layout=mems[0].result_req_layout,
                       res_layout=mems[0].result_layout, nb_bits=nb_bits, cnt_width=cnt_width)
    m.submodules.lane_combine = comb
    for k, sm in enumerate(mems):
        wiring.connect(m, getattr(comb, f"lane_req{k}"), sm.result_req)
        wiring.connect(m, sm.result, getattr(comb, f"lane_res{k}"))
    sat_inc = [sum(sat_parts[j]) + comb.sat_inc[j] for j in range(jobs)]
    return LanePath(jobs_valid=jobs_valid, jobs_payload=jobs_payload, jobs_ready=jobs_ready,
                    done_seen=delay[-1], comb=comb, req_layout=mems[0].result_req_layout,
                    res_layout=mems[0].result_layout, xtag_width=xl.size, xtag=xl,
                    sat_inc=sat_inc, split=split, job_layout=job_l)
