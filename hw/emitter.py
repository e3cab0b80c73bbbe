"""The engine's emitter: frames built from frame jobs and release commands, into the deparser.

:class:`Emitter` turns the dispatcher's *frame jobs* (re-emit, duplicate probe, CNP; model D8,
D15, D16) and the control path's *release commands* (one result frame per rank) into deparser
headers and payload beats. Frame bytes come from the job (the stored header of the frame that
caused it) or from the :class:`~netreduce.hw.hstore.HeaderStore`; payload from the slot memory's
result port or zeros.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from netreduce.wire import ETHERTYPE_VLAN, ROCEV2_UDP_PORT, Opcode
from netreduce.wire import fields as wf

from .agg.roles import remarked
from .packet.layout import HDR_CAP, L2_TAGGED, L2_UNTAGGED, deparse_header_layout
from .stream import beat_signature

__all__ = ["Emitter", "PayloadReader", "frame_job_layout", "seq_before", "SEQ_BITS", "JOB_NONE",
           "JOB_REEMIT", "JOB_PROBE", "is_vlan"]

SEQ_BITS = 16
JOB_NONE, JOB_REEMIT, JOB_PROBE = 0, 1, 2
_BECN = 0x40   # BTH byte 4 of a CNP: the BECN bit


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def seq_before(a, b):
    """a < b for sequence numbers modulo 2**SEQ_BITS (distances below 2**15)."""
    d = (b - a)[:SEQ_BITS]
    return (d != 0) & ~d[SEQ_BITS - 1]


def is_vlan(raw):
    """The stored header bytes carry an 802.1Q tag."""
    et = wf.ETH.ethertype.offset
    return (raw[et] == ETHERTYPE_VLAN >> 8) & (raw[et + 1] == ETHERTYPE_VLAN & 0xFF)


def frame_job_layout(ports: int, slots: int, xtag_width: int = 0) -> data.StructLayout:
    """A frame job: ``kind`` (JOB_NONE / JOB_REEMIT / JOB_PROBE), ``cnp`` (also send a CNP), the
    frame's stored header ``raw`` / ``hdr_len``, ``rev_qpn`` (the CNP's DestQP), the slot and
    payload length (re-emit), output ``port``, ``seq`` (the decision's ordinal) and the probe's
    PSN override ``ov`` / ``psn`` (D16's ACK request); D17: ``total`` (the re-emit's payload is
    the slot's total buffer), ``wait`` (its own decision writes that payload: the job waits for
    it)."""
    fields = {
        "kind": 2, "cnp": 1, "raw": data.ArrayLayout(8, HDR_CAP), "hdr_len": range(HDR_CAP + 1),
        "rev_qpn": 24, "slot": _bits(slots), "plen": 16, "port": _bits(ports), "seq": SEQ_BITS,
        "ov": 1, "psn": 24, "total": 1, "wait": 1}
    if xtag_width:  # per-port lanes: how the lanes combine (netreduce.hw.lanes.xtag_layout)
        fields["xtag"] = xtag_width
    return data.StructLayout(fields)


def _probe_bytes(raw, l2: int, ov=None, psn=None) -> list:
    """Header bytes of the duplicate probe of a data frame (model ``_probe``, D15): opcode
    WRITE MIDDLE, PadCnt 0 (the deparser rewrites lengths, checksum, PadCnt and ICRC); with
    ``ov`` set, BTH PSN ``psn`` (D16's ACK request)."""
    b = l2 + wf.IPV4.size + wf.UDP.size
    out = [raw[i] for i in range(HDR_CAP)]
    out[b] = Const(int(Opcode.WRITE_MIDDLE), 8)
    out[b + 1] = raw[b + 1] & 0xCF
    if ov is not None:
        for i in range(3):
            out[b + 9 + i] = Mux(ov, psn[8 * (2 - i):8 * (3 - i)], raw[b + 9 + i])
    return out


def _cnp_bytes(raw, l2: int, dqpn) -> list:
    """Header bytes (Ethernet .. BTH) of the CNP answering a CE-marked data frame (model
    ``_cnp_frame``, D8); the 16 zero bytes after the BTH are the deparser's payload."""
    out = [Const(0, 8)] * HDR_CAP
    for i in range(6):
        out[i], out[6 + i] = raw[6 + i], raw[i]
    for i in range(12, l2):
        out[i] = raw[i]
    ip = l2
    for i in range(wf.IPV4.size):
        out[ip + i] = raw[ip + i]
    out[ip + 1] = raw[ip + 1] & 0xFC            # DSCP kept, not-ECT
    out[ip + 4], out[ip + 5] = Const(0, 8), Const(0, 8)         # id 0
    out[ip + 6], out[ip + 7] = Const(0x40, 8), Const(0, 8)      # DF
    out[ip + 8] = Const(64, 8)                                  # TTL
    for i in range(4):                                          # receiver -> sender
        out[ip + 12 + i], out[ip + 16 + i] = raw[ip + 16 + i], raw[ip + 12 + i]
    u = ip + wf.IPV4.size
    out[u], out[u + 1] = raw[u], raw[u + 1]                     # UDP source port kept
    out[u + 2], out[u + 3] = Const(ROCEV2_UDP_PORT >> 8, 8), Const(ROCEV2_UDP_PORT & 0xFF, 8)
    out[u + 6], out[u + 7] = Const(0, 8), Const(0, 8)           # UDP checksum 0
    b = u + wf.UDP.size
    out[b], out[b + 1] = Const(int(Opcode.CNP), 8), Const(0, 8)
    out[b + 2], out[b + 3] = raw[b + 2], raw[b + 3]             # P_Key
    out[b + 4] = Const(_BECN, 8)
    out[b + 5], out[b + 6], out[b + 7] = dqpn[16:24], dqpn[8:16], dqpn[0:8]
    return out


def header_read_delay(m, valid, cmd, layout, n):
    """``valid`` and ``cmd`` (of ``layout``) delayed by ``n`` registers, so that a header command
    meets its header store entry, read in the cycle it was made (``n`` = the store's latency)."""
    for i in range(n):
        v_i, c_i = Signal(name=f"hs_v{i}"), Signal(layout, name=f"hs_c{i}")
        m.d.sync += [v_i.eq(valid), c_i.eq(cmd)]
        valid, cmd = v_i, c_i
    return valid, cmd


def attach_payload_reader(m, owner, width, cmd_layout, cmdq, cmd_r, read_latency):
    """A :class:`PayloadReader` as ``m.submodules.payload``, fed from the command FIFO ``cmdq``
    (its read data ``cmd_r``) and wired to ``owner``'s slot-memory ``req`` / ``res`` ports."""
    m.submodules.payload = pr = PayloadReader(width, cmd_layout=cmd_layout,
                                              req_layout=owner.req_layout,
                                              res_layout=owner.res_layout,
                                              read_latency=read_latency)
    m.d.comb += [pr.cmd.valid.eq(cmdq.r_rdy), pr.cmd.payload.eq(cmd_r),
                 cmdq.r_en.eq(pr.cmd.ready)]
    wiring.connect(m, pr.req, wiring.flipped(owner.req))
    wiring.connect(m, wiring.flipped(owner.res), pr.res)
    return pr


class PayloadReader(wiring.Component):
    """Payload commands -> payload beats: a slot's beats through the slot memory's result port,
    or zero beats (the emitters' shared payload path).

    Members: ``cmd`` (In, stream of ``cmd_layout``: ``from_slot``, ``slot``, ``plen`` and an
    optional ``extra`` field), ``req`` (Out) / ``res`` (In): the result port (``req_layout`` /
    ``res_layout``; a request's tag is ``Cat(bytes, last, extra)``, ``bytes`` of
    ``ceil(log2(width / 8 + 1))`` bits), ``o`` (Out: the beats) and ``extra`` (Out, with ``o``:
    the beat's command's ``extra``; from the tag for slot beats).

    Contract: a command is taken when the previous one's requests are all issued; a slot
    command issues one read per cycle (``max(1, ceil(plen / bytes per beat))`` reads) while it
    has a credit: ``depth`` = ``read_latency + 2`` credits, one per read in flight or beat
    waiting in the result FIFO (``depth`` beats), so ``res.ready`` is always high and the result
    port's pipeline never waits for ``o.ready`` (a request is answered ``read_latency`` cycles
    after it is taken, the FIFO takes it). A returning beat goes straight to ``o`` when the FIFO
    is empty and ``o.ready`` (no added latency: beat out in the cycle the result port returns
    it), else through the FIFO (out from the next cycle on). Throughput: one beat per cycle
    with ``o.ready`` high (a credit comes back the cycle after its beat leaves: ``read_latency +
    2`` covers the round trip); after ``o.ready`` low, one beat per cycle from the FIFO. A zero
    command (``from_slot`` clear) sends its beats once every earlier beat has left (all credits
    back), one per cycle while ``o.ready``. ``o.ready`` may depend on ``extra``; it reaches no
    output but ``o`` (only the FIFO's enables and the credit register). Never drops; no errors.
    """

    def __init__(self, width: int, *, cmd_layout, req_layout, res_layout, read_latency: int):
        self.width, self.read_latency = width, read_latency
        self.depth = read_latency + 2
        self.cmd_layout = cmd_layout
        extra = dict(cmd_layout.members).get("extra")
        self.extra_width = 0 if extra is None else data.Layout.cast(extra).size
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "req": Out(stream.Signature(req_layout)),
            "res": In(stream.Signature(res_layout)),
            "o": Out(beat_signature(width)),
            "extra": Out(max(1, self.extra_width)),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self.width // 8
        nb_bits = ceil_log2(nb + 1)
        beat_shift = exact_log2(nb)
        E = self.extra_width
        D = self.depth
        cmd, req, res, o = self.cmd, self.req, self.res, self.o
        pc_r = cmd.payload
        pcur = Signal(self.cmd_layout, name="pcur")
        pbeat = Signal(16)
        nbeats = Signal(16)
        plen_beats = (pc_r.plen + nb - 1) >> beat_shift
        p_last = pbeat + 1 >= nbeats
        p_bytes = Mux(p_last, pcur.plen - (pbeat << beat_shift), nb)
        # credits: reads in flight plus beats in the result FIFO never exceed its depth
        credit = Signal(range(D + 1), init=D)
        cur_extra = pcur.extra if E else Const(0, 0)
        m.d.comb += [req.payload.slot.eq(pcur.slot), req.payload.beat.eq(pbeat),
                     req.payload.tag.eq(Cat(p_bytes[:nb_bits], p_last, cur_extra))]
        zero_drive = Signal()
        with m.FSM(name="payload"):
            with m.State("IDLE"):
                m.d.comb += cmd.ready.eq(1)
                with m.If(cmd.valid):
                    m.d.sync += [pcur.eq(pc_r), pbeat.eq(0),
                                 nbeats.eq(Mux(pc_r.plen == 0, 1, plen_beats))]
                    with m.If(pc_r.from_slot):
                        m.next = "SLOT"
                    with m.Else():
                        m.next = "ZERO"
            with m.State("SLOT"):
                m.d.comb += req.valid.eq(credit != 0)
                with m.If(req.valid & req.ready):
                    m.d.sync += pbeat.eq(pbeat + 1)
                    with m.If(p_last):
                        m.next = "IDLE"
            with m.State("ZERO"):
                m.d.comb += zero_drive.eq(credit == D)
                with m.If(zero_drive & o.ready):
                    m.d.sync += pbeat.eq(pbeat + 1)
                    with m.If(p_last):
                        m.next = "IDLE"

        # result FIFO: the beat's data, tag and first flag; bypassed while empty
        tag_w = len(res.payload.tag)
        rq = fifo.SyncFIFO(width=self.width + tag_w + 1, depth=D)
        m.submodules.resq = rq
        res_first = res.payload.beat == 0
        res_word = Cat(res.payload.data, res.payload.tag, res_first)
        head = Signal(self.width + tag_w + 1, name="res_head")
        bypass = ~rq.r_rdy & res.valid & o.ready
        m.d.comb += [res.ready.eq(1),
                     head.eq(Mux(rq.r_rdy, rq.r_data, res_word)),
                     rq.w_data.eq(res_word), rq.w_en.eq(res.valid & ~bypass),
                     rq.r_en.eq(o.ready & ~zero_drive)]
        pop = (rq.r_rdy | res.valid) & o.ready & ~zero_drive
        m.d.sync += credit.eq(credit - (req.valid & req.ready) + pop)
        h_data = head[:self.width]
        tag = head[self.width:self.width + tag_w]
        h_first = head[-1]
        rtag_bytes = tag[:nb_bits]
        rtag_last = tag[nb_bits]

        def therm(n):
            return Cat(*[n > i for i in range(nb)])

        op = o.payload
        with m.If(zero_drive):
            m.d.comb += [o.valid.eq(1), op.data.eq(0), op.keep.eq(therm(p_bytes)),
                         op.last.eq(p_last), op.first.eq(pbeat == 0)]
            if E:
                m.d.comb += self.extra.eq(cur_extra)
        with m.Else():
            m.d.comb += [o.valid.eq(rq.r_rdy | res.valid), op.data.eq(h_data),
                         op.keep.eq(therm(rtag_bytes)), op.last.eq(rtag_last),
                         op.first.eq(h_first)]
            if E:
                m.d.comb += self.extra.eq(tag[nb_bits + 1:nb_bits + 1 + E])
        return m


class Emitter(wiring.Component):
    """Frame jobs and release commands -> deparser headers and payload beats.

    Members: ``jobs`` (In, stream of :func:`frame_job_layout`), ``rel`` (In, stream of the
    control path's release layout), ``done_seen`` (In: decisions whose payload writes are visible
    to the slot memory's result port), ``hs_en`` / ``hs_addr`` -> ``hs_data`` (the header store's
    read port, data ``hs_latency`` cycles after), ``dep_hdr`` / ``dep_payload`` (Out: the
    deparser's inputs),
    ``port`` (Out, stream: the output port of each deparser frame, in order; offered with the
    frame's header command, from registers only, and the command waits for ``port.ready``: the
    port FIFO holds an entry from the command to the frame's last beat, so it wants room for
    the header queue and reads in flight plus the frames in the deparser), ``req`` / ``res``
    (the slot memory's result port; ``res.ready`` is always high, :class:`PayloadReader`).

    Contract:

    * Order: a frame job goes before a release command with a later ``seq``; a release command
      goes only once ``done_seen`` has reached its ``seq`` (every decision before it has its
      payload in the slot memory). Frames leave in that order. A frame job with ``wait`` (a
      leaf's total, D17) also waits until ``done_seen`` is past its own ``seq``.
    * Throughput: one header command per cycle into a 4-deep queue (a release command makes
      one per rank of its ``mask``, a cycle per rank outside it; D17: ``total`` reads the slot's
      total buffer, ``mark`` sets that stage mark on the stored header); the header store read
      is issued with the command and pipelined (``hs_latency`` cycles, one read per cycle), the
      entry and its command wait in a header queue of ``hs_latency + 3`` (its credits count the
      reads in flight), so the deparser can take a header every cycle;
      payload one beat per cycle (slot reads pipelined through the result port, issued on the
      payload reader's ``read_latency + 2`` credits).
    * Latency: a command is taken at the earliest the cycle after it (and ``done_seen`` for
      it) is offered; release command accepted in cycle t -> first header command and store read
      t + 1, deparser header t + 3 + ``hs_latency`` (store read, queue).
    * Backpressure: from the deparser (``dep_hdr.ready`` reaches only the header queue's read;
      ``dep_payload.ready`` only the payload reader's result FIFO and credits) and the port FIFO
      (``port.ready`` takes the header command); never drops. Errors: none.
    """

    def __init__(self, width: int, *, ports: int, slots: int, max_world: int, rel_layout,
                 hs_layout, req_layout, res_layout, read_latency: int, roles: bool = False,
                 hs_latency: int = 1):
        self.roles = roles  # flow roles (D17): slot addresses have a total-buffer bit
        if not isinstance(hs_latency, int) or hs_latency < 1:
            raise ValueError(f"emitter hs_latency = {hs_latency!r}: must be >= 1")
        self.hs_latency = hs_latency  # the header store's read latency
        self.width, self.ports, self.slots, self.max_world = width, ports, slots, max_world
        self.read_latency = read_latency
        self.job_layout = frame_job_layout(ports, slots)
        self.hs_layout, self.rel_layout = hs_layout, rel_layout
        self.req_layout, self.res_layout = req_layout, res_layout
        self.rank_bits = _bits(max_world)
        self.slot_bits = _bits(slots)
        super().__init__({
            "jobs": In(stream.Signature(self.job_layout)),
            "rel": In(stream.Signature(rel_layout)),
            "done_seen": In(SEQ_BITS),
            "hs_en": Out(1), "hs_addr": Out(self.slot_bits + self.rank_bits),
            "hs_data": In(hs_layout),
            "dep_hdr": Out(stream.Signature(deparse_header_layout())),
            "dep_payload": Out(beat_signature(width)),
            "port": Out(stream.Signature(_bits(ports))),
            "req": Out(stream.Signature(req_layout)),
            "res": In(stream.Signature(res_layout)),
        })

    def elaborate(self, platform):  # noqa: C901 (three small FSMs)
        m = Module()
        P, w = self.ports, self.width
        pb, rank_bits, slot_bits = _bits(P), self.rank_bits, self.slot_bits
        rl = self.read_latency
        raw_layout = data.ArrayLayout(8, HDR_CAP)
        hcmd_layout = data.StructLayout({"store": 1, "addr": slot_bits + rank_bits,
                                         "raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
                                         "plen": 16, "ce": 1, "port": pb, "mark": 2})
        tb = int(self.roles)  # the slot's total buffer: one more slot address bit
        pcmd_layout = data.StructLayout({"from_slot": 1, "slot": slot_bits + tb, "plen": 16})

        def slot_addr(slot, total):
            return Cat(slot[:slot_bits], total) if tb else slot

        def q(name, layout, depth):
            f = fifo.SyncFIFOBuffered(width=layout.size, depth=depth)
            m.submodules[name] = f
            return f, data.View(layout, f.w_data), data.View(layout, f.r_data)

        hl = self.hs_latency
        # header queue: commands whose store entry has been read (hdr_depth credits cover the
        # reads in flight), the deparser's header straight from its output register
        hdr_layout = data.StructLayout({"raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
                                        "plen": 16, "ce": 1})
        hdr_depth = hl + 3
        hq, hq_w, hq_r = q("hdrq", hdr_layout, hdr_depth)
        hcmd = Signal(hcmd_layout, name="hcmd")   # the command pushed this cycle
        pcq, pc_w, pc_r = q("pcmdq", pcmd_layout, 4)
        jobs, jq_r = self.jobs, self.jobs.payload
        rel = self.rel.payload
        ejob = Signal(self.job_layout, name="ejob")
        erel = Signal(self.rel_layout, name="erel")
        rank = Signal(rank_bits + 1)
        # the command's per-rank fields as shift registers (rank r's bit / port at position 0)
        # and "rank is the last one" as a register: no max_world:1 select, no compare, between
        # the rank counter and the next state
        mask_sr = Signal(self.max_world, name="mask_sr")
        ports_sr = Signal(self.max_world * pb, name="ports_sr")
        last_rank = Signal(name="last_rank")
        credit = Signal(range(hdr_depth + 1), init=hdr_depth)
        # a header command also puts its frame's output port into the port FIFO (same order as
        # the frames leave the deparser); room is offered from registers only (credit, FIFO
        # flags), the push is that offer taken: the deparser's hdr.ready does not reach port
        can_push = Signal()
        push = Signal()
        m.d.comb += [can_push.eq((credit != 0) & pcq.w_rdy), pcq.w_en.eq(push)]
        m.d.sync += credit.eq(credit - push + hq.r_en)
        # The choice between the heads of jobs and rel uses their sequence comparisons
        # registered from the cycle before (the carry chains end in flip-flops); they count
        # while both heads are the same as then (same valid, nothing taken: a stream's payload
        # holds while valid). done_seen only grows, so a cycle-old comparison with it only waits.
        c_jw, c_jb, c_rd = Signal(), Signal(), Signal()
        c_jv, c_rv, c_took = Signal(), Signal(), Signal()
        m.d.sync += [
            # D17: a total's re-emit waits for its own decision's payload (done_seen past its seq)
            c_jw.eq(seq_before(self.done_seen, (jq_r.seq + 1)[:SEQ_BITS])),
            c_jb.eq(seq_before(jq_r.seq, rel.seq)),
            c_rd.eq(~seq_before(self.done_seen, rel.seq)),
            c_jv.eq(jobs.valid), c_rv.eq(self.rel.valid),
            c_took.eq(jobs.ready | self.rel.ready)]
        fresh = (c_jv == jobs.valid) & (c_rv == self.rel.valid) & ~c_took
        job_wait = jq_r.wait & c_jw
        job_first = fresh & jobs.valid & ~job_wait & (~self.rel.valid | c_jb)
        rel_ok = fresh & self.rel.valid & ~job_first & c_rd

        def put_raw(dst, byte_list_u, byte_list_t, vlan):
            return [dst[i].eq(Mux(vlan, byte_list_t[i], byte_list_u[i])) for i in range(HDR_CAP)]

        bth_len = {l2: l2 + wf.IPV4.size + wf.UDP.size + wf.BTH.size
                   for l2 in (L2_UNTAGGED, L2_TAGGED)}
        with m.FSM(name="emit"):
            with m.State("IDLE"):
                with m.If(job_first):
                    m.d.comb += jobs.ready.eq(1)
                    m.d.sync += ejob.eq(jq_r)
                    with m.If(jq_r.kind != JOB_NONE):
                        m.next = "JOB_FRAME"
                    with m.Else():
                        m.next = "JOB_CNP"
                with m.Elif(rel_ok):
                    m.d.comb += self.rel.ready.eq(1)
                    m.d.sync += [erel.eq(rel), rank.eq(0), mask_sr.eq(rel.mask),
                                 last_rank.eq(rel.n <= 1)]
                    if P > 1:
                        m.d.sync += ports_sr.eq(rel.ports.as_value())
                    m.next = "RESULTS"
            with m.State("JOB_FRAME"):
                vl = is_vlan(ejob.raw)
                probe = ejob.kind == JOB_PROBE
                m.d.comb += [
                    hcmd.store.eq(0), hcmd.port.eq(ejob.port),
                    pc_w.slot.eq(slot_addr(ejob.slot, ejob.total)),
                    hcmd.plen.eq(Mux(probe, 0, ejob.plen)), hcmd.ce.eq(~probe),
                    hcmd.hdr_len.eq(Mux(probe, Mux(vl, bth_len[L2_TAGGED],
                                                   bth_len[L2_UNTAGGED]), ejob.hdr_len)),
                    pc_w.from_slot.eq(~probe), pc_w.plen.eq(Mux(probe, 0, ejob.plen)),
                ]
                pu = _probe_bytes(ejob.raw, L2_UNTAGGED, ejob.ov, ejob.psn)
                pt = _probe_bytes(ejob.raw, L2_TAGGED, ejob.ov, ejob.psn)
                with m.If(probe):
                    m.d.comb += put_raw(hcmd.raw, pu, pt, vl)
                with m.Else():
                    m.d.comb += hcmd.raw.eq(ejob.raw)
                m.d.comb += self.port.valid.eq(can_push)
                with m.If(push):
                    m.next = "JOB_CNP"
                    with m.If(~ejob.cnp):
                        m.next = "IDLE"
            with m.State("JOB_CNP"):
                vl = is_vlan(ejob.raw)
                cu = _cnp_bytes(ejob.raw, L2_UNTAGGED, ejob.rev_qpn)
                ct = _cnp_bytes(ejob.raw, L2_TAGGED, ejob.rev_qpn)
                m.d.comb += [
                    hcmd.store.eq(0), hcmd.port.eq(ejob.port), hcmd.plen.eq(16), hcmd.ce.eq(0),
                    hcmd.hdr_len.eq(Mux(vl, bth_len[L2_TAGGED], bth_len[L2_UNTAGGED])),
                    pc_w.from_slot.eq(0), pc_w.plen.eq(16),
                    *put_raw(hcmd.raw, cu, ct, vl),
                ]
                m.d.comb += self.port.valid.eq(can_push)
                with m.If(push):
                    m.next = "IDLE"
            with m.State("RESULTS"):
                ports_r = ports_sr[:pb] if P > 1 else Const(0, 1)
                m.d.comb += [
                    hcmd.store.eq(1), hcmd.addr.eq(Cat(rank[:rank_bits], erel.slot[:slot_bits])),
                    hcmd.plen.eq(erel.plen), hcmd.ce.eq(1), hcmd.port.eq(ports_r),
                    hcmd.mark.eq(erel.mark), pc_w.from_slot.eq(1),
                    pc_w.slot.eq(slot_addr(erel.slot, erel.total)), pc_w.plen.eq(erel.plen),
                ]
                # D17: only the ranks of the command's mask get a result (a cycle per other)
                in_mask = mask_sr[0]
                m.d.comb += self.port.valid.eq(in_mask & can_push)
                with m.If(~in_mask | push):
                    m.d.sync += [rank.eq(rank + 1), mask_sr.eq(mask_sr >> 1),
                                 ports_sr.eq(ports_sr >> pb), last_rank.eq(rank + 2 >= erel.n)]
                    with m.If(last_rank):
                        m.next = "IDLE"

        # header path: the store read is issued with the command (address from registers), its
        # entry comes back hl cycles later and joins the command in the header queue; the
        # deparser's header and port come from the queue's output register
        hsc = Signal(hcmd_layout, name="hs_cmd")
        m.d.comb += [self.hs_en.eq(push & hcmd.store), self.hs_addr.eq(hcmd.addr)]
        pv, pc = header_read_delay(m, push, hcmd.as_value(), hcmd_layout, hl)
        m.d.comb += hsc.eq(pc)
        hs_data = self.hs_data
        hraw = Signal(raw_layout)
        m.d.comb += hraw.eq(Mux(hsc.store, hs_data.raw.as_value(), hsc.raw.as_value()))
        if self.roles:  # D17: a partial's stored UP header gets MARK_PARTIAL
            hraw = remarked(m, hraw, hsc.mark != 0, hsc.mark, name="hraw_marked")
        m.d.comb += [hq.w_en.eq(pv), hq_w.raw.eq(hraw),
                     hq_w.hdr_len.eq(Mux(hsc.store, hs_data.hdr_len, hsc.hdr_len)),
                     hq_w.plen.eq(hsc.plen), hq_w.ce.eq(hsc.ce)]
        dh = self.dep_hdr.payload
        m.d.comb += [
            push.eq(self.port.valid & self.port.ready), self.port.payload.eq(hcmd.port),
            self.dep_hdr.valid.eq(hq.r_rdy),
            dh.raw.eq(hq_r.raw), dh.hdr_len.eq(hq_r.hdr_len),
            dh.plen.eq(hq_r.plen), dh.ce_to_ect0.eq(hq_r.ce),
            hq.r_en.eq(self.dep_hdr.valid & self.dep_hdr.ready),
        ]

        # payload path: slot beats through the result port, or zero beats (probe, CNP)
        pr = attach_payload_reader(m, self, w, pcmd_layout, pcq, pc_r, rl)
        wiring.connect(m, pr.o, wiring.flipped(self.dep_payload))
        return m
