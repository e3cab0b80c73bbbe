"""Per-port egress of a per-port-lane engine: result rounds broadcast to one deparser per port.

:class:`RoundEmitter` does what :class:`~netreduce.hw.emitter.Emitter` does (frame jobs and
release commands -> deparser headers and payload, in the same order rules) but for P deparsers,
one per output port, so P result frames leave at once. A release of index k is sent in *rounds*:
each round takes, for every port that still has ranks of k, the lowest such rank (so each port
sends its ranks in rank order, model D5/D13) and reads the slot once (through
:class:`~netreduce.hw.lanes.LaneCombine`), the beats going to the round's ports at the same time.
With the ranks spread evenly over the ports every round feeds all P deparsers: P result beats per
cycle from one slot read per cycle. A frame job (re-emit, probe, CNP) is a round of one port.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from netreduce.wire import fields as wf

from .emitter import (
    JOB_PROBE,
    SEQ_BITS,
    _cnp_bytes,
    _probe_bytes,
    attach_payload_reader,
    frame_job_layout,
    header_read_delay,
    is_vlan,
)
from .packet.layout import HDR_CAP, L2_TAGGED, L2_UNTAGGED, deparse_header_layout
from .stream import beat_signature

__all__ = ["RoundEmitter"]


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def _before(a, b):
    """a < b for sequence numbers modulo 2**SEQ_BITS at a distance below 2**15 (as
    :func:`~netreduce.hw.emitter.seq_before`, which it equals there): the sign of a - b, one
    carry chain and no zero test."""
    return (a - b)[SEQ_BITS - 1]


def _encode(onehot, n: int, width: int):
    """The index of the set bit of a one-hot word (n bits): an OR of the bits per index bit."""
    return Cat(*[Cat(*[onehot[i] for i in range(n) if i >> b & 1]).any() if n > 1 << b
                 else Const(0, 1) for b in range(width)])


class RoundEmitter(wiring.Component):
    """Frame jobs and release commands -> one deparser per port, results in rounds.

    Members as :class:`~netreduce.hw.emitter.Emitter` (``jobs``, ``rel``, ``done_seen``,
    ``hs_en`` / ``hs_addr`` / ``hs_data``, ``req`` / ``res``, ``rel_cur`` / ``rel_xtag``), but
    ``dep_hdr<k>`` / ``dep_payload<k>`` per port and no ``port`` stream. Slot reads carry the tag
    ``Cat(bytes, last, xtag, count, mask)`` (``mask``: the round's ports); ``rel_xtag`` (the
    combine tag of the release ``rel_cur``) is read from the second cycle after the release is
    taken, so it may be a register of a function of ``rel_cur`` and ``rel_lanes`` (Out, P bits:
    the arrival ports of ``rel_cur``'s ranks below ``n``, the lanes holding its partials; an OR
    of registers set with ``rel_cur``). ``read_latency`` is the lanes' slot-memory read latency;
    the result port (:class:`~netreduce.hw.lanes.LaneCombine`) adds P - 1 cycles, which the
    payload reader's credits cover.

    Contract:

    * Order: as the Emitter's (a frame job before a release with a later ``seq``; a release only
      once ``done_seen`` reached its ``seq``); per port, frames leave in that order, a release's
      ranks in rank order.
    * Throughput: one header command per cycle (a release: a round's cycle per port, in port
      order, a header for each port with a rank left; a frame job: one cycle, a CNP one more);
      the header store read is issued with the command and pipelined (``hs_latency`` cycles, one
      read per cycle), the entry and its command wait in the port's header queue of
      ``hs_latency + 3`` (its credits count the reads in flight), so every port's deparser can
      take a header every cycle. A round's payload goes one beat per cycle to all its ports at
      once (:class:`~netreduce.hw.emitter.PayloadReader`). A release command takes two cycles
      to start (accept, plan).
    * Backpressure: a round's beat moves only when every port of the round can take it
      (``dep_payload<k>.ready`` must be a register output, e.g. a skid buffer's); one held port
      holds the rounds it is in (the engine bounds that: a port held longer than
      ``PORT.FC_CTRL.tx_hold`` allows drops its frames at its
      :class:`~netreduce.hw.txhold.TxHoldGate`, model D21). Never drops. Errors: none.
    """

    def __init__(self, width: int, *, ports: int, slots: int, max_world: int, rel_layout,
                 hs_layout, req_layout, res_layout, read_latency: int, xtag_width: int,
                 hs_latency: int = 1):
        if not isinstance(hs_latency, int) or hs_latency < 1:
            raise ValueError(f"round emitter hs_latency = {hs_latency!r}: must be >= 1")
        self.hs_latency = hs_latency  # the header store's read latency
        self.req_layout, self.res_layout = req_layout, res_layout
        self.width, self.ports, self.slots, self.max_world = width, ports, slots, max_world
        self.read_latency, self.xtag_width = read_latency, xtag_width
        self.job_layout = frame_job_layout(ports, slots, xtag_width)
        self.rank_bits, self.slot_bits = _bits(max_world), _bits(slots)
        members = {
            "jobs": In(stream.Signature(self.job_layout)),
            "rel": In(stream.Signature(rel_layout)),
            "done_seen": In(SEQ_BITS),
            "hs_en": Out(1), "hs_addr": Out(self.slot_bits + self.rank_bits),
            "hs_data": In(hs_layout),
            "req": Out(stream.Signature(req_layout)),
            "res": In(stream.Signature(res_layout)),
            "rel_cur": Out(rel_layout), "rel_xtag": In(xtag_width), "rel_lanes": Out(ports),
        }
        for k in range(ports):
            members[f"dep_hdr{k}"] = Out(stream.Signature(deparse_header_layout()))
            members[f"dep_payload{k}"] = Out(beat_signature(width))
        self.rel_layout = rel_layout
        super().__init__(members)

    def elaborate(self, platform):  # noqa: C901 (two small FSMs)
        m = Module()
        P, w, X = self.ports, self.width, self.xtag_width
        pb, rank_bits, slot_bits = _bits(P), self.rank_bits, self.slot_bits
        rl, hl = self.read_latency, self.hs_latency
        nw = self.max_world
        raw_layout = data.ArrayLayout(8, HDR_CAP)
        hcmd_layout = data.StructLayout({"store": 1, "addr": slot_bits + rank_bits,
                                         "raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
                                         "plen": 16, "ce": 1, "port": pb})
        xl = data.StructLayout({"xtag": X, "count": 1, "mask": P})
        pcmd_layout = data.StructLayout({"from_slot": 1, "slot": slot_bits, "plen": 16,
                                         "extra": xl})

        def q(name, layout, depth):
            f = fifo.SyncFIFOBuffered(width=layout.size, depth=depth)
            m.submodules[name] = f
            return f, data.View(layout, f.w_data), data.View(layout, f.r_data)

        # per port a header queue: commands whose store entry has been read (its credits cover
        # the reads in flight), the port's deparser header straight from its output register
        hdr_layout = data.StructLayout({"raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
                                        "plen": 16, "ce": 1})
        hdr_depth = hl + 3
        hqs = [q(f"hdrq{k}", hdr_layout, hdr_depth) for k in range(P)]
        credit = [Signal(range(hdr_depth + 1), init=hdr_depth, name=f"hdr_credit{k}")
                  for k in range(P)]
        has_credit = Cat(*[c != 0 for c in credit])
        hq_w = Signal(hcmd_layout, name="hcmd")   # the header command pushed this cycle
        hpush = Signal()
        pcq, pc_w, pc_r = q("pcmdq", pcmd_layout, 4)
        jobs, jq_r = self.jobs, self.jobs.payload
        rel = self.rel.payload
        ejob = Signal(self.job_layout, name="ejob")
        erel = Signal(self.rel_layout, name="erel")
        m.d.comb += self.rel_cur.eq(erel)
        job_first = jobs.valid & (~self.rel.valid | _before(jq_r.seq, rel.seq))
        rel_ok = self.rel.valid & ~job_first & ~_before(self.done_seen, rel.seq)

        def put_raw(dst, byte_list_u, byte_list_t, vlan):
            return [dst[i].eq(Mux(vlan, byte_list_t[i], byte_list_u[i])) for i in range(HDR_CAP)]

        bth_len = {l2: l2 + wf.IPV4.size + wf.UDP.size + wf.BTH.size
                   for l2 in (L2_UNTAGGED, L2_TAGGED)}
        # release planning, per port: ``low`` (its next rank, valid while ``has``) and ``rem``
        # (its ranks after that one), all registers. Loading the next rank takes the lowest bit
        # of rem off through one decrement (rem & (rem - 1) clears it, rem & ~(rem - 1) isolates
        # it: a carry chain of max_world bits, then an OR tree per index bit); ``rem_any`` (rem
        # is not empty after this load) is registered with it, so a round step's decisions read
        # flags only, no search over max_world bits
        rem = [Signal(nw, name=f"rem{k}") for k in range(P)]
        low = [Signal(rank_bits, name=f"low{k}") for k in range(P)]
        has_r = [Signal(name=f"has{k}") for k in range(P)]
        rem_any = [Signal(name=f"rem_any{k}") for k in range(P)]

        rem_dec = [Signal(nw, name=f"rem_dec{k}") for k in range(P)]
        rem_low = [Signal(nw, name=f"rem_low{k}") for k in range(P)]   # lowest bit, one-hot
        rem_next = [Signal(nw, name=f"rem_next{k}") for k in range(P)]
        for k in range(P):
            m.d.comb += [rem_dec[k].eq(rem[k] - 1), rem_low[k].eq(rem[k] & ~rem_dec[k]),
                         rem_next[k].eq(rem[k] & rem_dec[k])]

        def load(k):   # take rem's lowest rank into low
            return [low[k].eq(_encode(rem_low[k], nw, rank_bits)), rem[k].eq(rem_next[k]),
                    rem_any[k].eq(rem_next[k].any())]

        # per port the release head's ranks below n that arrived on it, registered with the
        # release (on_r); rel_lanes is their OR, from registers (no accept decision in front)
        on = [[(r < rel.n) & (rel.ports[r] == k) for r in range(nw)] for k in range(P)]
        on_r = [Signal(nw, name=f"rel_on{k}") for k in range(P)]
        m.d.comb += [self.rel_lanes[k].eq(on_r[k].any()) for k in range(P)]
        pi = Signal(range(P), name="round_port")
        first_round = Signal()
        rmask = Signal(P, name="round_mask")
        # a frame job's header and payload commands go together
        both = has_credit.bit_select(ejob.port, 1) & pcq.w_rdy
        with m.FSM(name="emit"):
            with m.State("IDLE"):
                with m.If(job_first):
                    m.d.comb += jobs.ready.eq(1)
                    m.d.sync += ejob.eq(jq_r)
                    with m.If(jq_r.kind != 0):
                        m.next = "JOB_FRAME"
                    with m.Else():
                        m.next = "JOB_CNP"
                with m.Elif(rel_ok):
                    m.d.comb += self.rel.ready.eq(1)
                    m.d.sync += [erel.eq(rel), pi.eq(0), first_round.eq(1)]
                    for k in range(P):
                        m.d.sync += [rem[k].eq(Cat(*[o & rel.mask[r]
                                                     for r, o in enumerate(on[k])])),
                                     on_r[k].eq(Cat(*on[k]))]
                    m.next = "PLAN"
            with m.State("PLAN"):
                # one cycle to load the first rank of every port
                for k in range(P):
                    m.d.sync += [*load(k), has_r[k].eq(rem[k].any())]
                m.next = "RESULTS"
            with m.State("JOB_FRAME"):
                vl = is_vlan(ejob.raw)
                probe = ejob.kind == JOB_PROBE
                m.d.comb += [
                    hq_w.store.eq(0), hq_w.port.eq(ejob.port),
                    hq_w.plen.eq(Mux(probe, 0, ejob.plen)), hq_w.ce.eq(~probe),
                    hq_w.hdr_len.eq(Mux(probe, Mux(vl, bth_len[L2_TAGGED],
                                                   bth_len[L2_UNTAGGED]), ejob.hdr_len)),
                    pc_w.slot.eq(ejob.slot), pc_w.from_slot.eq(~probe),
                    pc_w.plen.eq(Mux(probe, 0, ejob.plen)), pc_w.extra.xtag.eq(ejob.xtag),
                    pc_w.extra.mask.eq(Const(1, P) << ejob.port),
                ]
                pu = _probe_bytes(ejob.raw, L2_UNTAGGED, ejob.ov, ejob.psn)
                pt = _probe_bytes(ejob.raw, L2_TAGGED, ejob.ov, ejob.psn)
                with m.If(probe):
                    m.d.comb += put_raw(hq_w.raw, pu, pt, vl)
                with m.Else():
                    m.d.comb += hq_w.raw.eq(ejob.raw)
                with m.If(both):
                    m.d.comb += [hpush.eq(1), pcq.w_en.eq(1)]
                    m.next = "JOB_CNP"
                    with m.If(~ejob.cnp):
                        m.next = "IDLE"
            with m.State("JOB_CNP"):
                vl = is_vlan(ejob.raw)
                cu = _cnp_bytes(ejob.raw, L2_UNTAGGED, ejob.rev_qpn)
                ct = _cnp_bytes(ejob.raw, L2_TAGGED, ejob.rev_qpn)
                m.d.comb += [
                    hq_w.store.eq(0), hq_w.port.eq(ejob.port), hq_w.plen.eq(16), hq_w.ce.eq(0),
                    hq_w.hdr_len.eq(Mux(vl, bth_len[L2_TAGGED], bth_len[L2_UNTAGGED])),
                    pc_w.from_slot.eq(0), pc_w.plen.eq(16),
                    pc_w.extra.mask.eq(Const(1, P) << ejob.port),
                    *put_raw(hq_w.raw, cu, ct, vl),
                ]
                with m.If(both):
                    m.d.comb += [hpush.eq(1), pcq.w_en.eq(1)]
                    m.next = "IDLE"
            with m.State("RESULTS"):
                # cycle pi of a round: the round's payload command at pi == 0, then port pi's
                # header command (its lowest remaining rank) if it has one
                has = Cat(*has_r)
                rank = Signal(rank_bits)
                m.d.comb += rank.eq(Cat(*low).word_select(pi, rank_bits))
                mine = has.bit_select(pi, 1)
                m.d.comb += [
                    hq_w.store.eq(1), hq_w.addr.eq(Cat(rank[:rank_bits], erel.slot[:slot_bits])),
                    hq_w.plen.eq(erel.plen), hq_w.ce.eq(1), hq_w.port.eq(pi),
                    pc_w.from_slot.eq(1), pc_w.slot.eq(erel.slot), pc_w.plen.eq(erel.plen),
                    pc_w.extra.xtag.eq(self.rel_xtag), pc_w.extra.count.eq(first_round),
                    pc_w.extra.mask.eq(Mux(pi == 0, has, rmask)),
                ]
                ok = (pcq.w_rdy | (pi != 0)) & (~mine | has_credit.bit_select(pi, 1))
                # a step sends port pi's loaded rank and loads its next (rem's lowest): the
                # step's decisions read registered flags only
                step = [Signal(name=f"step{k}") for k in range(P)]
                left = [Signal(name=f"left{k}") for k in range(P)]
                for k in range(P):
                    m.d.comb += [step[k].eq((pi == k) & mine),
                                 left[k].eq(Mux(step[k], rem_any[k], has_r[k]))]
                with m.If(ok):
                    m.d.comb += [hpush.eq(mine), pcq.w_en.eq(pi == 0)]
                    with m.If(pi == 0):
                        m.d.sync += rmask.eq(has)
                    for k in range(P):
                        with m.If(step[k]):
                            m.d.sync += [*load(k), has_r[k].eq(rem_any[k])]
                    with m.If(pi == P - 1):
                        m.d.sync += [pi.eq(0), first_round.eq(0)]
                        with m.If(~Cat(*left).any()):
                            m.next = "IDLE"
                    with m.Else():
                        m.d.sync += pi.eq(pi + 1)

        # header path: the store read is issued with the command (address from registers), its
        # entry comes back hl cycles later and joins the command in its port's header queue
        # a credit comes back when the port's deparser takes a header (r_en is valid & ready:
        # a ready deparser facing an empty queue returns none)
        for k in range(P):
            m.d.sync += credit[k].eq(credit[k] - (hpush & (hq_w.port == k)) + hqs[k][0].r_en)
        m.d.comb += [self.hs_en.eq(hpush & hq_w.store), self.hs_addr.eq(hq_w.addr)]
        pv, pc = header_read_delay(m, hpush, hq_w.as_value(), hcmd_layout, hl)
        hsc = Signal(hcmd_layout, name="hs_cmd")
        m.d.comb += hsc.eq(pc)
        hs_data = self.hs_data
        for k, (f, f_w, f_r) in enumerate(hqs):
            dh = getattr(self, f"dep_hdr{k}")
            m.d.comb += [
                f.w_en.eq(pv & (hsc.port == k)),
                f_w.raw.eq(Mux(hsc.store, hs_data.raw.as_value(), hsc.raw.as_value())),
                f_w.hdr_len.eq(Mux(hsc.store, hs_data.hdr_len, hsc.hdr_len)),
                f_w.plen.eq(hsc.plen), f_w.ce.eq(hsc.ce),
                dh.valid.eq(f.r_rdy), f.r_en.eq(f.r_rdy & dh.ready),
                dh.payload.raw.eq(f_r.raw), dh.payload.hdr_len.eq(f_r.hdr_len),
                dh.payload.plen.eq(f_r.plen), dh.payload.ce_to_ect0.eq(f_r.ce),
            ]

        # payload path: slot beats through the combine, or zero beats (probe, CNP), to the
        # round's ports at once (a beat moves when every port of its round can take it)
        # the result port is LaneCombine's: the lanes' read latency plus one register per
        # combining step (P - 1); the reader's credits must cover all of it, or it reads
        # below a beat per cycle (rl + 2 credits over rl + P - 1 cycles: 2/3 at P = 4)
        pr = attach_payload_reader(m, self, w, pcmd_layout, pcq, pc_r, rl + P - 1)
        pays = [getattr(self, f"dep_payload{k}") for k in range(P)]
        mask = Signal(P, name="beat_mask")
        m.d.comb += mask.eq(data.View(xl, pr.extra).mask)
        all_ready = Signal()
        m.d.comb += [all_ready.eq(Cat(*[~mask[k] | p.ready for k, p in enumerate(pays)]).all()),
                     pr.o.ready.eq(all_ready)]
        for k, p in enumerate(pays):
            m.d.comb += [p.valid.eq(pr.o.valid & mask[k] & all_ready),
                         p.payload.eq(pr.o.payload)]
        return m
