"""RoCEv2 deparser at full beat width: header bytes + payload stream -> a complete frame.

Data flow (one output beat per cycle sustained; components :class:`HeaderPrep` (H1, H2),
:class:`Assemble` (A, registered into R1), :class:`IcrcInsert` (R1 .. R4))::

    hdr ─► H1, H2: new header bytes (ECN CE->ECT(0) on request, IPv4 total length, UDP length,
    │         PadCnt; then the IPv4 checksum), frame geometry
    ▼
    A: assemble output beat j: header bytes, payload bytes moved back to their wire offset
    │  (a window over the previous and the current payload beat), pad, zeros for the ICRC
    ▼       ◄── payload
    R1: ICRC masks applied to a copy (init-0 trick, see .icrc)
    C1, C2: CRC-32 step (full width): per 64-bit chunk parities, then the register
    R2: CRC register = CRC through this beat; un-shift by the zero bytes after the covered end
    R4: ICRC inserted (it may straddle into the next beat) ─► o

All registers advance together when the output can move (``~o.valid | o.ready``); the header
stage prefetches the next header so that back-to-back frames leave without a gap.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from netreduce.wire import fields as wf
from netreduce.wire.frame import MIN_FRAME

from ..stream import beat_layout, beat_signature, bytes_of, check_data_width, tree_sum
from .icrc import (
    CRC_CHUNK,
    crc_input_masks,
    crc_matrices,
    crc_output,
    crc_rows,
    unshift_matrix,
)
from .layout import (
    HDR_CAP,
    L2_TAGGED,
    L2_UNTAGGED,
    LEN_BITS,
    deparse_header_layout,
    hdr_lengths,
)

__all__ = ["Assemble", "Deparser", "HeaderPrep", "IcrcInsert", "assembled_layout",
           "prepared_layout"]

_ICRC = 4
_BTH_AT = wf.IPV4.size + wf.UDP.size


def _therm(x, n):
    """Thermometer of a (signed) count: bit i set when i < x."""
    return Cat(*[x > i for i in range(n)])


def prepared_layout(data_width: int) -> data.StructLayout:
    """A header as :class:`HeaderPrep` hands it to :class:`Assemble` (see there)."""
    lb = (data_width // 8 - 1).bit_length()
    return data.StructLayout({
        "bytes": 8 * HDR_CAP, "hl": range(HDR_CAP + 1), "plen": LEN_BITS, "e": LEN_BITS + 1,
        "len": LEN_BITS + 1, "vlan": 1, "lastj": LEN_BITS + 2 - lb, "pend": LEN_BITS + 1,
        "hin": 1, "lin": 1, "hth": data_width // 8})


class HeaderPrep(wiring.Component):
    """Deparser stages H1, H2: the rewritten header bytes and the frame's geometry.

    Ports: ``hdr``: ``In(stream.Signature(deparse_header_layout()))``; ``o``:
    ``Out(stream.Signature(prepared_layout(w)))``: ``bytes`` the header with IPv4 total length,
    UDP length, PadCnt, TOS (ECN CE -> ECT(0) on request) and the IPv4 checksum rewritten;
    ``hl`` / ``plen`` as given; ``e`` the ICRC's offset (end of the bytes it covers), ``len``
    the frame bytes with Ethernet padding, ``vlan`` tagged, ``lastj`` the output beat index of
    the payload's last beat, ``pend`` the payload's end (hl + plen), ``hin`` / ``lin`` the
    header / frame ends in the frame's first beat, ``hth`` the header's lanes in that beat (a
    thermometer of ``hl``: lane i holds a header byte when i < hl).

    Latency 2 cycles (H1: lengths, TOS, PadCnt and the partial checksum of the words that do
    not depend on the length; H2: the checksum and the geometry); one header per cycle; ``o``
    is a register stage with the usual ready/valid backpressure (``hdr.ready`` while H1 is
    empty or moves on); no errors (lengths are taken modulo 2**16 as the wire fields are).
    """

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "hdr": In(stream.Signature(deparse_header_layout())),
            "o": Out(stream.Signature(prepared_layout(data_width))),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self._w // 8
        lb = (nb - 1).bit_length()
        # Two stages (H1: lengths, TOS, PadCnt and the partial checksum of the words that do
        # not depend on the length; H2: the checksum), each taking one header per cycle.
        hin = self.hdr.payload
        raw = [hin.raw[g] for g in range(HDR_CAP)]
        tpid = wf.ETH.ethertype
        vlan_i = Cat(raw[tpid.offset + 1], raw[tpid.offset]) == wf.ETHERTYPE_VLAN
        plen_i = hin.plen
        pad_i = (-plen_i)[:2]
        hl_i = hin.hdr_len
        padded_i = Signal(LEN_BITS)   # payload + pad
        m.d.comb += padded_i.eq(plen_i + pad_i)
        tl_word = wf.IPV4.total_length.offset // 2   # the only checksum word that needs H1's add

        def rebuilt(l2):
            """Header bytes with lengths, PadCnt and TOS rewritten, checksum 0 (tag at l2); the
            sum of the IPv4 words except the total length; the total length."""
            b = list(raw)
            total = Signal(LEN_BITS, name=f"total_{l2}")
            m.d.comb += total.eq(padded_i + (hl_i - l2 + _ICRC))

            def put(f, base, value):
                for i in range(f.size):
                    b[base + f.offset + i] = value.word_select(f.size - 1 - i, 8)

            tos_at = l2 + wf.IPV4.tos.offset
            ecn = wf.IPV4.ecn
            tos = raw[tos_at]
            ce = tos[ecn.shift: ecn.shift + ecn.bits] == wf.ECN_CE
            b[tos_at] = Mux(hin.ce_to_ect0 & ce,
                            Cat(Const(wf.ECN_ECT0, ecn.bits), tos[ecn.bits:]), tos)
            put(wf.IPV4.total_length, l2, total)
            put(wf.UDP.length, l2 + wf.IPV4.size, (total - wf.IPV4.size)[:LEN_BITS])
            pc = wf.BTH.padcnt
            b1 = l2 + _BTH_AT + pc.offset
            old = raw[b1]
            b[b1] = Cat(old[:pc.shift], pad_i, old[pc.shift + pc.bits:])
            put(wf.IPV4.checksum, l2, Const(0, 16))
            words = [Cat(b[l2 + o + 1], b[l2 + o]) for o in range(0, wf.IPV4.size, 2)]
            part = tree_sum(w for i, w in enumerate(words) if i != tl_word)
            return b, part, total

        bu, su, tu = rebuilt(L2_UNTAGGED)
        bt, st, tt = rebuilt(L2_TAGGED)
        flen_i = hl_i + padded_i + _ICRC            # frame bytes without Ethernet padding

        h1_v = Signal()
        h1_bytes = Signal(8 * HDR_CAP)
        h1_sum = Signal(LEN_BITS + 4)
        h1_total = Signal(LEN_BITS)
        h1_hl = Signal(range(HDR_CAP + 1))
        h1_plen = Signal(LEN_BITS)
        h1_e = Signal(LEN_BITS + 1)
        h1_len = Signal(LEN_BITS + 1)
        h1_vlan = Signal()

        hp_v = Signal()
        hp_bytes = Signal(8 * HDR_CAP)
        hp_hl = Signal(range(HDR_CAP + 1))
        hp_plen = Signal(LEN_BITS)
        hp_e = Signal(LEN_BITS + 1)     # ICRC offset (= end of the bytes it covers)
        hp_len = Signal(LEN_BITS + 1)   # output frame bytes (with Ethernet padding)
        hp_vlan = Signal()
        hp_take = Signal()              # stage A takes the prepared header this cycle
        m.d.comb += hp_take.eq(self.o.valid & self.o.ready)
        h1_move = Signal()
        m.d.comb += [h1_move.eq(h1_v & (~hp_v | hp_take)),
                     self.hdr.ready.eq(~h1_v | h1_move)]
        with m.If(self.hdr.valid & self.hdr.ready):
            m.d.sync += [h1_v.eq(1),
                         h1_bytes.eq(Cat(*[Mux(vlan_i, bt[g], bu[g]) for g in range(HDR_CAP)])),
                         h1_sum.eq(Mux(vlan_i, st, su)), h1_total.eq(Mux(vlan_i, tt, tu)),
                         h1_hl.eq(hl_i), h1_plen.eq(plen_i), h1_e.eq(flen_i - _ICRC),
                         h1_len.eq(Mux(flen_i < MIN_FRAME, MIN_FRAME, flen_i)),
                         h1_vlan.eq(vlan_i)]
        with m.Elif(h1_move):
            m.d.sync += h1_v.eq(0)

        s = h1_sum + h1_total
        lo = s[:16] + s[16:]
        csum = Signal(16)
        m.d.comb += csum.eq(~(lo[:16] + lo[16:])[:16])
        hb1 = bytes_of(h1_bytes)
        ck = wf.IPV4.checksum
        for l2, v in ((L2_UNTAGGED, 0), (L2_TAGGED, 1)):
            for i in range(ck.size):
                g = l2 + ck.offset + i
                hb1[g] = Mux(h1_vlan == v, csum.word_select(ck.size - 1 - i, 8), hb1[g])
        # output beat index of the payload's last beat: ceil(plen / nb) - 1 after the header's
        # q = hl // nb beats (computed per header, so stage A only compares)
        hp_lastj = Signal(LEN_BITS + 2 - lb)
        hp_pend = Signal(LEN_BITS + 1)   # end of the payload bytes (hl + plen)
        hp_hin = Signal()                # the header ends in the frame's first beat
        hp_lin = Signal()                # the frame ends in its first beat
        hp_hth = Signal(nb)              # the header's lanes in the first beat
        with m.If(h1_move):
            m.d.sync += [hp_lastj.eq((h1_hl >> lb)
                                     + Mux(h1_plen == 0, 0, (h1_plen - 1) >> lb)),
                         hp_pend.eq(h1_hl + h1_plen),
                         hp_hin.eq(h1_hl < nb), hp_lin.eq(h1_len <= nb),
                         hp_hth.eq(_therm(h1_hl, nb))]
        with m.If(h1_move):
            m.d.sync += [hp_v.eq(1), hp_bytes.eq(Cat(*hb1)), hp_hl.eq(h1_hl),
                         hp_plen.eq(h1_plen), hp_e.eq(h1_e), hp_len.eq(h1_len),
                         hp_vlan.eq(h1_vlan)]
        with m.Elif(hp_take):
            m.d.sync += hp_v.eq(0)

        o = self.o.payload
        m.d.comb += [self.o.valid.eq(hp_v), o.bytes.eq(hp_bytes), o.hl.eq(hp_hl),
                     o.plen.eq(hp_plen), o.e.eq(hp_e), o.len.eq(hp_len), o.vlan.eq(hp_vlan),
                     o.lastj.eq(hp_lastj), o.pend.eq(hp_pend), o.hin.eq(hp_hin),
                     o.lin.eq(hp_lin), o.hth.eq(hp_hth)]
        return m


def assembled_layout(data_width: int) -> data.StructLayout:
    """An output beat as :class:`Assemble` registers it (stage R1), with its ICRC placement."""
    nb = data_width // 8
    lb = (nb - 1).bit_length()
    return data.StructLayout({
        "beat": beat_layout(data_width), "vlan": 1, "j": LEN_BITS + 1 - lb,
        "rel_e": signed(LEN_BITS + 3), "feed": 1, "lastfed": 1, "ins": 1, "k": lb})


class Assemble(wiring.Component):
    """Deparser stage A (registered into R1): one output beat of a frame per advancing cycle.

    Ports (``w`` = ``data_width``): ``hdr``: ``In(stream.Signature(prepared_layout(w)))`` (taken
    at a frame's first beat); ``payload``: ``In(beat_signature(w))``; ``adv``: ``In(1)``, the
    pipeline advances this cycle; ``o``: ``Out`` always-ready stream of
    :func:`assembled_layout`, registered, loaded when ``adv``: output beat ``j`` of the frame
    (header bytes, payload bytes moved back to their wire offset through a window over the
    previous and the current payload beat, pad, zeros for the ICRC, ``keep`` up to the frame's
    length with Ethernet padding), ``rel_e`` the ICRC offset relative to the beat, ``feed`` /
    ``lastfed`` the beat has bytes the ICRC covers / the last of them, ``ins`` an ICRC byte
    lands in it, ``k`` the zero bytes after the covered end in the last fed beat.

    Latency 1 cycle (the frame's first beat the cycle after its header is taken); one beat per
    advancing cycle, frames back to back; backpressure: nothing moves without ``adv``, a
    payload beat is taken only with the output beat it feeds. Errors: ``error`` on the last
    beat when the payload did not end on the beat ``plen`` implies (surplus payload beats are
    dropped, ``draining``; missing bytes read as zeros).
    """

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "hdr": In(stream.Signature(prepared_layout(data_width))),
            "payload": In(beat_signature(data_width)),
            "adv": In(1),
            "o": Out(stream.Signature(assembled_layout(data_width), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        w, nb = self._w, self._w // 8
        lb = (nb - 1).bit_length()
        adv = self.adv
        hp = self.hdr.payload
        hp_v, hp_bytes, hp_hl, hp_vlan = self.hdr.valid, hp.bytes, hp.hl, hp.vlan
        hp_pend, hp_len, hp_e, hp_hin, hp_lin = hp.pend, hp.len, hp.e, hp.hin, hp.lin
        hp_lastj = hp.lastj
        busy = Signal()
        j = Signal(LEN_BITS + 1 - lb)
        # the header bytes after the frame's first beat, shifted down by one beat per output
        # beat, so this beat's header bytes are always the register's first w bits (no select
        # by the beat index)
        rest = max(HDR_CAP - nb, 0)
        ah_bytes = Signal(8 * rest)
        ah_hl = Signal(range(HDR_CAP + 1))
        ah_vlan = Signal()
        prevpay = Signal(w)
        pay_done = Signal()
        pay_err = Signal()
        draining = Signal()   # dropping surplus payload beats of the previous frame

        start = Signal()
        m.d.comb += start.eq(~busy)
        hl = Mux(start, hp_hl, ah_hl)
        vlan = Mux(start, hp_vlan, ah_vlan)
        jj = Mux(start, 0, j)
        # the frame's offsets (header end, payload end, frame end, ICRC start) relative to this
        # beat's first byte: registers stepping down by nb per beat (the header stage's values
        # at a frame's first beat), so no subtraction lies on the assemble stage's paths
        rel_h = Signal(signed(LEN_BITS + 3))
        rel_p = Signal(signed(LEN_BITS + 3))
        rel_len = Signal(signed(LEN_BITS + 3))
        rel_e = Signal(signed(LEN_BITS + 3))
        ah_rel = [Signal(signed(LEN_BITS + 3), name=f"ah_rel_{n}") for n in "hple"]
        for r, first_v, a_r in zip((rel_h, rel_p, rel_len, rel_e),
                                   (hp_hl, hp_pend, hp_len, hp_e), ah_rel, strict=True):
            m.d.comb += r.eq(Mux(start, first_v, a_r))
        # rel_h < nb (this beat index >= hl // nb) and rel_len <= nb (the frame's last beat),
        # also kept as registers one beat ahead
        ah_hin, ah_lin = Signal(), Signal()
        h_in = Mux(start, hp_hin, ah_hin)
        s = hl[:lb]
        pdone = pay_done & ~start

        have_frame = busy | hp_v
        need_pay = h_in & ~pdone
        can = Signal()
        m.d.comb += can.eq(have_frame & ~draining & (~need_pay | self.payload.valid))
        go = Signal()
        m.d.comb += go.eq(adv & can)
        m.d.comb += self.hdr.ready.eq(go & start)
        pay_take = go & need_pay
        m.d.comb += self.payload.ready.eq(pay_take | draining)

        curpay = Signal(w)
        m.d.comb += curpay.eq(Mux(need_pay, self.payload.payload.data, 0))
        window = Signal(w)
        with m.Switch(s):
            for sh in sorted({h % nb for h in hdr_lengths()}):
                with m.Case(sh):
                    m.d.comb += window.eq(Cat(prevpay, curpay)[8 * (nb - sh): 8 * (nb - sh) + w])
        hdr_lanes = Signal(nb)
        pay_lanes = Signal(nb)
        # the header's lanes from registers: the header stage's thermometer at a frame's first
        # beat, then one registered a beat ahead (lane i of the next beat: rel_h > nb + i), so
        # no compare of the selected offset lies in front of the byte select
        ah_hth = Signal(nb)
        m.d.comb += [hdr_lanes.eq(Mux(start, hp.hth, ah_hth)), pay_lanes.eq(_therm(rel_p, nb))]
        hdr_beat = Signal(w)
        m.d.comb += hdr_beat.eq(Mux(start, hp_bytes[:w], ah_bytes[:w]))
        wb = bytes_of(window)
        hbb = bytes_of(hdr_beat)
        a_data = Cat(*[Mux(hdr_lanes[i], hbb[i], Mux(pay_lanes[i], wb[i], 0))
                       for i in range(nb)])
        a_keep = _therm(rel_len, nb)
        a_last = Mux(start, hp_lin, ah_lin)

        # payload accounting: the payload's last beat must come at index ceil(plen/nb) - 1
        # (output beat q + that: hp_lastj)
        ah_lastj = Signal(len(hp_lastj))
        lastj = Mux(start, hp_lastj, ah_lastj)
        # "this is beat lastj" for a continuing frame registered at the beat before (j + 1 ==
        # lastj then), so no equality of two selected counts lies in front of pay_err
        ah_atlast = Signal()
        at_last = Mux(start, hp_lastj == 0, ah_atlast)
        pin = self.payload.payload
        bad_end = pay_take & (pin.last != at_last)
        pay_done_n = pdone | (pay_take & pin.last)
        a_err = pay_err & ~start | bad_end | (a_last & ~pay_done_n)

        with m.If(go):
            m.d.sync += [busy.eq(~a_last), j.eq(jj + 1), ah_atlast.eq(jj + 1 == lastj)]
            m.d.sync += [a_r.eq(r - nb) for r, a_r in zip((rel_h, rel_p, rel_len, rel_e), ah_rel,
                                                           strict=True)]
            m.d.sync += [ah_hin.eq(rel_h < 2 * nb), ah_lin.eq(rel_len <= 2 * nb),
                         ah_hth.eq(Cat(*[rel_h > nb + i for i in range(nb)]))]
            m.d.sync += ah_bytes.eq(Mux(start, hp_bytes[w:], ah_bytes[w:]))
            with m.If(start):
                m.d.sync += [ah_hl.eq(hp_hl), ah_lastj.eq(hp_lastj), ah_vlan.eq(hp_vlan)]
            with m.If(pay_take):
                m.d.sync += prevpay.eq(pin.data)
            m.d.sync += [pay_done.eq(pay_done_n), pay_err.eq(a_err)]
            with m.If(a_last & ~pay_done_n):
                m.d.sync += draining.eq(1)
        with m.If(draining & self.payload.valid & pin.last):
            m.d.sync += draining.eq(0)

        # ICRC placement info for this beat
        a_feed = rel_e > 0
        a_lastfed = (rel_e > 0) & (rel_e <= nb)
        a_k = Mux(a_lastfed, nb - rel_e, 0)[:lb]
        a_ins = (rel_e > -_ICRC) & (rel_e < nb)   # some ICRC byte lands in this beat

        # ------------------------------------------------------------ R1 registers
        r1_v = self.o.valid
        o = self.o.payload
        r1, r1_vlan, r1_j, r1_rel_e = o.beat, o.vlan, o.j, o.rel_e
        r1_feed, r1_lastfed, r1_ins, r1_k = o.feed, o.lastfed, o.ins, o.k
        with m.If(adv):
            m.d.sync += r1_v.eq(go)
            with m.If(go):
                m.d.sync += [r1.data.eq(a_data), r1.keep.eq(a_keep), r1.first.eq(start),
                             r1.last.eq(a_last), r1.error.eq(a_err & a_last),
                             r1_vlan.eq(vlan), r1_j.eq(jj), r1_rel_e.eq(rel_e),
                             r1_feed.eq(a_feed), r1_lastfed.eq(a_lastfed), r1_ins.eq(a_ins),
                             r1_k.eq(a_k)]
        return m


class IcrcInsert(wiring.Component):
    """Deparser stages R1 (masks), C1, C2 (the CRC step), R2 (un-shift) and R4 (insertion).

    Ports (``w`` = ``data_width``): ``i``: ``In`` always-ready stream of
    :func:`assembled_layout` (from :class:`Assemble`); ``o``: ``Out(beat_signature(w))``, the
    frame with its ICRC in place (it may straddle into the next beat); ``adv``: ``Out(1)``,
    ``~o.valid | o.ready``: the whole deparser pipeline advances this cycle.

    Latency 4 advancing cycles from ``i`` to ``o`` (C1, C2, R2, R4); one beat per cycle; ``o``
    low-ready freezes every stage (through ``adv``). The CRC runs over whole beats with the
    ICRC masks applied to a copy (the init-0 trick, see .icrc) and is un-shifted by the zero
    bytes after the covered end. No errors of its own (``error`` passes through).
    """

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "i": In(stream.Signature(assembled_layout(data_width), always_ready=True)),
            "o": Out(beat_signature(data_width)),
            "adv": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, nb = self._w, self._w // 8
        lb = (nb - 1).bit_length()
        adv = self.adv
        m.d.comb += adv.eq(~self.o.valid | self.o.ready)
        r1_v, r1p = self.i.valid, self.i.payload
        r1, r1_vlan, r1_j, r1_rel_e = r1p.beat, r1p.vlan, r1p.j, r1p.rel_e
        r1_feed, r1_lastfed, r1_ins, r1_k = r1p.feed, r1p.lastfed, r1p.ins, r1p.k
        ff_mask = Signal(nb)
        zero_mask = Signal(nb)
        for (b, v), (f, z) in crc_input_masks(nb).items():
            with m.If((r1_j == b) & (r1_vlan == v)):
                m.d.comb += [ff_mask.eq(f), zero_mask.eq(z)]
        covered = Signal(nb)
        m.d.comb += covered.eq(_therm(r1_rel_e, nb))
        masked = Signal(w)
        m.d.comb += masked.eq(Cat(*[Mux(ff_mask[i], 0xFF, Mux(zero_mask[i] | ~covered[i], 0, byte))
                       for i, byte in enumerate(bytes_of(r1.data))]))
        # ------------------------------------------------------------ C1, C2: the CRC step
        # C1: the masked beat, registered; C2: the step's data part as one parity per 64-bit
        # chunk (the step is linear); end of C2: the CRC register. The beat and its metadata
        # wait alongside (ca, cb), so the register is ready for R2 as before.
        rows = crc_rows(m, w)  # outside the If: the ROM's addresses are constants
        f_reg, _ = crc_matrices(w)
        r1_meta = Cat(r1_lastfed, r1_ins, r1_feed, r1_rel_e, r1_k)
        ca_v, cb_v = Signal(), Signal()
        ca, cb = Signal(beat_layout(w)), Signal(beat_layout(w))
        ca_meta, cb_meta = Signal(len(r1_meta)), Signal(len(r1_meta))
        ca_masked = Signal(w)
        chunks = range(0, w, CRC_CHUNK)
        cb_part = [Signal(32, name=f"cb_part{c // CRC_CHUNK}") for c in chunks]
        with m.If(adv):
            m.d.sync += [ca_v.eq(r1_v), ca.eq(r1), ca_meta.eq(r1_meta), ca_masked.eq(masked),
                         cb_v.eq(ca_v), cb.eq(ca), cb_meta.eq(ca_meta)]
            for c, r in zip(chunks, cb_part, strict=True):
                word = ca_masked[c: c + CRC_CHUNK]
                m.d.sync += r.eq(Cat(*[(word & rows[i][c: c + CRC_CHUNK]).xor()
                                       for i in range(32)]))
        crc_reg = Signal(32)
        cb_feed = cb_meta[2]
        with m.If(adv & cb_v & cb_feed):
            reg = Mux(cb.first, 0, crc_reg)
            m.d.sync += crc_reg.eq(Cat(*[(reg & f_reg[i]).xor()
                                         ^ Cat(*[p[i] for p in cb_part]).xor()
                                         for i in range(32)]))

        # ------------------------------------------------------------ R2: un-shift
        r2_v = Signal()
        r2 = Signal(beat_layout(w))
        r2_meta = Signal(3 + LEN_BITS + 3 + lb)
        # the un-shift x^(-8k) as one matrix chosen by k: its rows (constants selected by k, a
        # nb:1 select per bit) are registered with R2, from cb's k, so R2's path is an AND and
        # a 32-input parity per output bit (the select in front of it made 9 LUT levels at 512)
        cb_k = cb_meta[-lb:]
        r2_rows = [Signal(32, name=f"r2_row{i}") for i in range(32)]
        with m.If(adv):
            m.d.sync += [r2_v.eq(cb_v), r2.eq(cb), r2_meta.eq(cb_meta)]
            m.d.sync += [r.eq(Array(Const(unshift_matrix(k)[i], 32) for k in range(nb))[cb_k])
                         for i, r in enumerate(r2_rows)]
        # A Signal, not an expression: crc_output() bit-reverses it, and Amaranth's lowering
        # would rebuild an expression once per bit slice (32 copies of the 32 selects)
        unshifted = Signal(32)
        m.d.comb += unshifted.eq(Cat(*[(crc_reg & r2_rows[i]).xor() for i in range(32)]))

        # ------------------------------------------------------------ R4: ICRC insertion
        r4_v = Signal()
        r4 = Signal(beat_layout(w))
        r4_meta = Signal(len(r2_meta))
        r4_icrc = Signal(32)
        icrc_hold = Signal(32)
        # where the ICRC lands, decoded from R2's offset into a one-hot register with R4
        # (r4_at[off + 3]: its first byte at lane off, -3 <= off < nb), so the insertion is an
        # AND-OR of at most 4 candidates per lane (a select by the offset there made 9 LUT
        # levels into the next block's input register in a flattened 2-port build)
        offs = range(-_ICRC + 1, nb)
        r2_ins, r2_rel_e = r2_meta[1], r2_meta[3:3 + LEN_BITS + 3].as_signed()
        r4_at = Signal(len(offs))
        with m.If(adv):
            m.d.sync += [r4_v.eq(r2_v), r4.eq(r2), r4_meta.eq(r2_meta),
                         r4_icrc.eq(crc_output(unshifted)),
                         r4_at.eq(Cat(*[r2_ins & (r2_rel_e == off) for off in offs]))]
        r4_lastfed = r4_meta[0]
        icrc = Signal(32)
        m.d.comb += icrc.eq(Mux(r4_lastfed, r4_icrc, icrc_hold))
        with m.If(adv & r4_v & r4_lastfed):
            m.d.sync += icrc_hold.eq(r4_icrc)
        ib = bytes_of(icrc)
        ins = Cat(*[reduce(operator.or_, [Mux(r4_at[lane - k + _ICRC - 1], ib[k], 0)
                                          for k in range(_ICRC) if lane - k in offs])
                    for lane in range(nb)])
        out = self.o.payload
        m.d.comb += [self.o.valid.eq(r4_v), out.eq(r4), out.data.eq(r4.data | ins)]
        return m


class Deparser(wiring.Component):
    """Build RoCEv2 frames from header bytes and a payload stream.

    Ports (``w`` = ``data_width``):

    * ``hdr``: ``In(stream.Signature(deparse_header_layout()))``: one per frame. ``raw`` holds
      the frame's header bytes (Ethernet, optional 802.1Q tag, IPv4, UDP, BTH, extension headers;
      only the first ``hdr_len`` bytes are used), ``plen`` the payload bytes, ``ce_to_ect0`` the
      ECN rewrite request. The parser's header record carries ``raw``/``hdr_len``/``plen``.
    * ``payload``: ``In(beat_signature(w))``: the frame's payload, byte 0 in lane 0, exactly
      ``plen`` bytes; a zero-length payload is one beat with ``keep == 0`` (as the parser emits).
      A frame with ``plen == 0`` still consumes that one beat.
    * ``o``: ``Out(beat_signature(w))``: the frame: header with IPv4 total length, UDP length,
      BTH PadCnt and IPv4 checksum recomputed (TOS rewritten if requested; every other byte as in
      ``raw``), payload, zero pad to 4 bytes, the freshly computed ICRC, and zero Ethernet padding
      up to 60 bytes. Output ``error`` on the last beat: the payload stream did not end on the
      beat ``plen`` implies (the frame is still emitted with ``plen`` bytes; excess payload beats
      are dropped, missing ones read as zeros).

    Throughput: one output beat per cycle with back-to-back frames, as long as the inputs keep up
    (the output has more beats than the payload: header, pad and ICRC). Latency: the first beat
    of a frame leaves 7 cycles after its header is accepted (2 header stages, A, R1, C1, C2, R2;
    components :class:`HeaderPrep`, :class:`Assemble`, :class:`IcrcInsert`).
    Backpressure: ``o.ready`` low freezes the whole pipeline; ``hdr``/``payload`` are taken only
    when their data can move on.
    """

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "hdr": In(stream.Signature(deparse_header_layout())),
            "payload": In(beat_signature(data_width)),
            "o": Out(beat_signature(data_width)),
        })

    @property
    def data_width(self) -> int:
        return self._w

    def elaborate(self, platform):
        m = Module()
        w = self._w
        m.submodules.prep = prep = HeaderPrep(w)
        m.submodules.assemble = asm = Assemble(w)
        m.submodules.icrc_insert = ins = IcrcInsert(w)
        wiring.connect(m, wiring.flipped(self.hdr), prep.hdr)
        wiring.connect(m, prep.o, asm.hdr)
        wiring.connect(m, wiring.flipped(self.payload), asm.payload)
        wiring.connect(m, asm.o, ins.i)
        wiring.connect(m, ins.o, wiring.flipped(self.o))
        m.d.comb += asm.adv.eq(ins.adv)
        return m
