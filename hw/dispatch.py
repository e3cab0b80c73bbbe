"""The engine's dispatcher: carries out each decision of the control path on its frame's bytes."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from netreduce.wire import fields as wf
from netreduce.wire.marks import BTH_MARK_BYTE

from .agg.roles import remarked
from .agg.types import Action
from .emitter import JOB_NONE, JOB_PROBE, JOB_REEMIT, SEQ_BITS, frame_job_layout, is_vlan
from .hstore import header_entry_layout
from .packet.layout import HDR_CAP, L2_TAGGED, L2_UNTAGGED
from .stream import beat_layout, beat_signature

__all__ = ["Dispatcher", "head_layout", "icrc_delta_columns"]


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def head_layout() -> data.StructLayout:
    """What the dispatcher keeps per frame besides its beats: the header bytes and length (for
    the header store and frame jobs) and whether the parser split off a payload."""
    return data.StructLayout({"raw": data.ArrayLayout(8, HDR_CAP),
                              "hdr_len": range(HDR_CAP + 1), "has_pay": 1})


def icrc_delta_columns() -> list[int]:
    """Column i (i = 0..31) of the linear map from the XOR applied to an ACK's bytes BTH PSN
    (3 bytes) + AETH syndrome (1 byte), bit i = bit i % 8 of byte i // 8 in wire order, to the
    XOR of its ICRC bytes (wire order: bit 8j + b = bit b of ICRC byte j).

    The ICRC is a CRC-32 over a fixed-length message (an ACK's IPv4 .. AETH are 44 bytes), so
    it is affine in the message bits: ``icrc(m ^ x) = icrc(m) ^ L(x)`` with L linear and
    independent of m. A fast-retransmit rewrite (model D16) therefore needs no CRC engine: the
    forward path XORs the new PSN / syndrome bits and L(x) into the passing frame.
    """
    import zlib

    n = 8 + wf.IPV4.size + wf.UDP.size + wf.BTH.size + 4  # ICRC input of an ACK
    psn = 8 + wf.IPV4.size + wf.UDP.size + 9  # BTH PSN (the AETH syndrome follows it)
    zero = zlib.crc32(bytes(n))
    cols = []
    for i in range(32):
        msg = bytearray(n)
        msg[psn + i // 8] = 1 << (i % 8)
        cols.append(zlib.crc32(bytes(msg)) ^ zero)  # little-endian int = ICRC wire bytes
    return cols


def _icrc_delta(x) -> list:
    """The 32 XOR bits of an ACK's ICRC for the rewrite ``x`` (:func:`icrc_delta_columns`)."""
    cols = icrc_delta_columns()
    out = []
    for b in range(32):
        t = Const(0, 1)
        for i in range(32):
            if cols[i] >> b & 1:
                t = t ^ x[i]
        out.append(t)
    return out


class Dispatcher(wiring.Component):
    """One decision at a time, applied to its frame.

    Members: ``dec`` (In: the control path's decisions); per port k ``frame<k>`` (In: the whole
    frame's beats), ``payload<k>`` (In: the payload beats, when the parser split one off),
    ``head<k>`` (In: :func:`head_layout`, one per frame), ``fwd<k>`` (Out: forwarded frames);
    ``contrib`` (Out: contributions to the slot memory), ``jobs`` (Out: frame jobs for the
    :class:`~netreduce.hw.emitter.Emitter`), ``hs_en`` / ``hs_addr`` / ``hs_data`` (header store
    write), ``done`` (Out: decisions fully carried out, a counter modulo 2**16).

    Contract: FORWARD sends the frame on ``fwd<port>`` (an ACK of a ``nak`` decision with its
    PSN / syndrome / ICRC bytes rewritten, model D16), CONTRIBUTE writes its payload beats into
    the slot memory and its header into the store, REEMIT / PROBE / CNP make a frame job (with
    the decision's ordinal ``seq``); every frame's beats and payload are consumed. Throughput: a
    decision is taken in the cycle the previous one finishes (back to back), frame and payload
    one beat per cycle each, in parallel. Latency: 0 (``dec.ready`` is combinational from the
    buffers' state). Backpressure: waits for the frame's head, room for a job, and the forward
    queue. Errors: none of its own.
    """

    def __init__(self, width: int, *, ports: int, slots: int, max_world: int, dec_layout,
                 contrib_layout, roles: bool = False):
        self.roles = roles  # flow roles (D17): marks, totals into the slot's total buffer
        self.width, self.ports, self.slots, self.max_world = width, ports, slots, max_world
        self.dec_layout = dec_layout
        self.job_layout = frame_job_layout(ports, slots)
        self.rank_bits, self.slot_bits = _bits(max_world), _bits(slots)
        members = {"dec": In(stream.Signature(dec_layout))}
        for k in range(ports):
            members[f"frame{k}"] = In(beat_signature(width))
            members[f"payload{k}"] = In(beat_signature(width))
            members[f"head{k}"] = In(stream.Signature(head_layout()))
            members[f"fwd{k}"] = Out(beat_signature(width))
        members.update({
            "contrib": Out(stream.Signature(contrib_layout, always_ready=True)),
            "jobs": Out(stream.Signature(self.job_layout)),
            "hs_en": Out(1), "hs_addr": Out(self.slot_bits + self.rank_bits),
            "hs_data": Out(header_entry_layout()),
            "done": Out(SEQ_BITS),
        })
        super().__init__(members)

    def elaborate(self, platform):  # noqa: C901 (one frame walk)
        m = Module()
        P, w = self.ports, self.width
        nb = w // 8
        beat_l = beat_layout(w)
        frames = [getattr(self, f"frame{k}") for k in range(P)]
        pays = [getattr(self, f"payload{k}") for k in range(P)]
        heads = [getattr(self, f"head{k}") for k in range(P)]
        fwds = [getattr(self, f"fwd{k}") for k in range(P)]
        dec = self.dec.payload
        cur = Signal(self.dec_layout, name="cur")
        active, f_done, p_done = Signal(), Signal(), Signal()
        cbeat = Signal(16)
        n_start = Signal(SEQ_BITS)   # decisions started (the ordinal of the next one)
        n_done = self.done           # decisions whose frame and payload are fully handled

        cport = cur.port if P > 1 else Const(0, 1)
        f_valid = Array(f.valid for f in frames)[cport]
        f_beat = Array(f.payload for f in frames)[cport]
        p_valid = Array(p.valid for p in pays)[cport]
        p_beat = Array(p.payload for p in pays)[cport]
        fwd_rdy = Array(f.ready for f in fwds)[cport]
        is_fwd = cur.action == Action.FORWARD
        # D17: a TOTAL writes its payload over the slot's total buffer
        is_con = (cur.action == Action.CONTRIBUTE) | (cur.action == Action.TOTAL)
        f_take = Signal()
        p_take = Signal()
        m.d.comb += [
            f_take.eq(active & ~f_done & f_valid & (fwd_rdy | ~is_fwd)),
            p_take.eq(active & ~p_done & p_valid),
        ]
        # fast retransmit (model D16): the forwarded ACK of a ``nak`` decision leaves with its
        # BTH PSN and AETH syndrome bytes XORed with cur.nak_x and its ICRC bytes with the
        # matching ICRC delta (:func:`icrc_delta_columns`); every other byte as it came
        fb_max = HDR_CAP // nb + 1
        fbeat = Signal(range(fb_max + 1))   # beat of the frame being taken (saturates)
        cur_vlan = Signal()
        with m.If(f_take & (fbeat != fb_max)):
            m.d.sync += fbeat.eq(fbeat + 1)
        x_bytes = [cur.nak_x[8 * i:8 * i + 8] for i in range(4)]
        d_bits = _icrc_delta(cur.nak_x)
        x_bytes += [Cat(*d_bits[8 * i:8 * i + 8]) for i in range(4)]
        patch = Signal(w)
        for l2, vl in ((L2_UNTAGGED, 0), (L2_TAGGED, 1)):
            at = {l2 + wf.IPV4.size + wf.UDP.size + 9 + i: x_bytes[i] for i in range(4)}
            at.update({l2 + wf.IPV4.size + wf.UDP.size + wf.BTH.size + 4 + i: x_bytes[4 + i]
                       for i in range(4)})
            for b in sorted({o // nb for o in at}):
                with m.If((cur_vlan == vl) & (fbeat == b)):
                    m.d.comb += [patch[8 * i:8 * i + 8].eq(at[b * nb + i])
                                 for i in range(nb) if b * nb + i in at]
        f_out = Signal(beat_l)
        m.d.comb += [f_out.eq(f_beat),
                     f_out.data.eq(f_beat.data ^ Mux(cur.nak, patch, 0))]
        if self.roles:  # D17: a forwarded probe's stage mark (BTH byte 4) set to cur.mark
            for l2, vl in ((L2_UNTAGGED, 0), (L2_TAGGED, 1)):
                o = l2 + wf.IPV4.size + wf.UDP.size + BTH_MARK_BYTE
                with m.If(cur.remark & (cur_vlan == vl) & (fbeat == o // nb)):
                    m.d.comb += f_out.data[8 * (o % nb):8 * (o % nb) + 2].eq(cur.mark)
        for k in range(P):
            sel = cport == k
            m.d.comb += [frames[k].ready.eq(f_take & sel), pays[k].ready.eq(p_take & sel),
                         fwds[k].valid.eq(f_take & sel & is_fwd), fwds[k].payload.eq(f_out)]
        con = self.contrib.payload
        m.d.comb += [
            self.contrib.valid.eq(p_take & is_con),
            con.slot.eq(Cat(cur.slot, cur.total) if self.roles else cur.slot),
            con.beat.eq(cbeat), con.op.eq(cur.op),
            con.overwrite.eq(cur.overwrite | (cur.action == Action.TOTAL)), con.tag.eq(cur.job),
            con.data.eq(p_beat.data), con.keep.eq(p_beat.keep), con.last.eq(p_beat.last),
        ]
        finishing = Signal()
        m.d.comb += finishing.eq(active & (f_done | (f_take & f_beat.last))
                                 & (p_done | (p_take & p_beat.last)))
        with m.If(f_take & f_beat.last):
            m.d.sync += f_done.eq(1)
        with m.If(p_take):
            m.d.sync += cbeat.eq(cbeat + 1)
            with m.If(p_beat.last):
                m.d.sync += p_done.eq(1)

        dport = dec.port if P > 1 else Const(0, 1)
        d_head = Array(h.payload for h in heads)[dport]
        d_rdy = Array(h.valid for h in heads)[dport]
        kind = Signal(2)
        with m.Switch(dec.action):
            with m.Case(Action.REEMIT, Action.TOTAL):
                m.d.comb += kind.eq(JOB_REEMIT)
            with m.Case(Action.PROBE):
                m.d.comb += kind.eq(JOB_PROBE)
            with m.Case(Action.CONTRIBUTE):
                # D16: a contribution past a hole also sends f's receiver an ACK request
                m.d.comb += kind.eq(Mux(dec.solicit, JOB_PROBE, JOB_NONE))
        needs_job = (kind != JOB_NONE) | dec.cnp
        start = Signal()
        jobs, jq_w = self.jobs, self.jobs.payload
        # D17: the stage mark set on the header the frame's job and the header store get
        raw = remarked(m, d_head.raw, dec.remark, dec.mark) if self.roles else d_head.raw
        m.d.comb += start.eq(self.dec.valid & (~active | finishing) & d_rdy
                             & (~needs_job | jobs.ready))
        m.d.comb += self.dec.ready.eq(start)
        for k in range(P):
            m.d.comb += heads[k].ready.eq(start & (dport == k))
        m.d.comb += [
            jobs.valid.eq(start & needs_job),
            jq_w.kind.eq(kind), jq_w.cnp.eq(dec.cnp), jq_w.raw.eq(raw),
            jq_w.hdr_len.eq(d_head.hdr_len), jq_w.rev_qpn.eq(dec.rev_qpn),
            jq_w.slot.eq(dec.slot), jq_w.plen.eq(dec.plen), jq_w.port.eq(dport),
            jq_w.seq.eq(n_start), jq_w.ov.eq(dec.solicit), jq_w.psn.eq(dec.sol_psn),
            jq_w.total.eq(dec.total), jq_w.wait.eq(dec.action == Action.TOTAL),
            self.hs_en.eq(start & (dec.action == Action.CONTRIBUTE)),
            self.hs_addr.eq(Cat(dec.rank[:self.rank_bits], dec.slot[:self.slot_bits])),
            self.hs_data.raw.eq(raw), self.hs_data.hdr_len.eq(d_head.hdr_len),
        ]
        with m.If(start):
            m.d.sync += [cur.eq(dec), active.eq(1), f_done.eq(0), p_done.eq(~d_head.has_pay),
                         cbeat.eq(0), n_start.eq(n_start + 1), fbeat.eq(0),
                         cur_vlan.eq(is_vlan(d_head.raw))]
        with m.Elif(finishing):
            m.d.sync += active.eq(0)
        m.d.sync += n_done.eq(n_done + finishing)
        return m
