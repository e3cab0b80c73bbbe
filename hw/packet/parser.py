"""RoCEv2 frame parser at full beat width: header record, realigned payload, bypass copy, verdict.

Data flow (one beat per cycle sustained, all outputs buffered by small FIFOs)::

    i ─► S0: frame position, header byte capture, payload realign (window of 2 beats)
         │   IcrcChecker (ICRC, IPv4 checksum, lengths; result 5 cycles after the last beat)
         ▼
         S1: header fields + header check conditions (from the captured header bytes)
         ▼
         T:  header check reasons (first failing check, in wire.parse order)
         ▼
         S2: push ─► hdr FIFO ─► hdr        (one record per frame)
         ▼
         S3, S4: wait for the checker's result
         ▼
         S4: push ─► payload FIFO ─► payload (DATA frames only, payload byte 0 in lane 0)
                 ─► frame FIFO ─► frame     (every frame, unchanged: the bypass copy)
                 ─► verdict FIFO ─► verdict (one per frame, final classification)

Ordering contract (what a consumer may rely on):

* Each of the four outputs carries the frames in arrival order; every frame has exactly one
  ``hdr`` record and one ``verdict``; a frame whose ``hdr.kind`` is ``DATA`` has a payload of at
  least one beat (a zero-length payload is one beat with ``keep == 0``), other frames none.
* ``hdr`` of a frame is pushed when its header has arrived (``hdr_len`` bytes, or the frame's
  end), so it is available no later than the frame's first ``payload`` beat. On ``frame`` it may
  trail the frame's first beat by up to ceil(78 / bytes per beat) beats; the frame FIFO holds
  enough beats that a consumer may wait for ``hdr`` before taking ``frame`` beats without
  deadlock or throughput loss.
* ``verdict`` is pushed in the same cycle as the frame's last ``frame`` beat and its last
  ``payload`` beat. A consumer must not wait for the verdict before taking the beats of the same
  frame (the parser buffers a few beats, not frames).
* ``payload`` last beat: ``error`` = the final verdict is not clean (any reason). ``frame``
  beats are the input beats unchanged, except ``first`` (recomputed). ``hdr.kind``/``reason``
  are the header-time classification; the verdict adds the frame-length, ICRC and MAC checks.

Backpressure: every output may stall at any time; ``i.ready`` drops when an output FIFO could not
take what the beats in flight may push (it depends on registered state only). Latency: a beat
accepted in cycle t is visible on ``frame``/``payload`` in cycle t+6 at the earliest; a frame's
``hdr`` 4 cycles after its header-completing beat; ``verdict`` 6 cycles after its last beat.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from netreduce.wire import fields as wf
from netreduce.wire.opcodes import OPCODES

from ..stream import (
    beat_layout,
    beat_signature,
    bytes_of,
    check_data_width,
    first_match,
)
from .icrc import BeatIndex, IcrcChecker, carry_save, ones_complement_fold
from .layout import (
    BTH_END,
    HDR_CAP,
    L2_TAGGED,
    L2_UNTAGGED,
    LEN_BITS,
    MIN_L3_LEN,
    NOT_ROCE,
    Kind,
    Reason,
    extract,
    field_value,
    header_record_layout,
    payload_offsets,
    verdict_layout,
)

__all__ = ["HeaderCapture", "Parser", "capture_layout"]

_ICRC = 4
_BTH_AT = wf.IPV4.size + wf.UDP.size   # BTH offset from the IPv4 header


def _opcode_kind(info) -> Kind:
    if info.rc_data:
        return Kind.DATA
    return {"ACK": Kind.ACK, "CNP": Kind.CNP}.get(info.kind, Kind.OTHER)


def capture_layout(data_width: int) -> data.StructLayout:
    """What :class:`HeaderCapture` passes on with each beat (see there)."""
    nb = data_width // 8
    lb = (nb - 1).bit_length()
    hdr_beats = -(-HDR_CAP // nb)
    return data.StructLayout({
        "beat": beat_layout(data_width),
        "sof": 1,
        "idx": LEN_BITS + 1 - lb,
        "at": hdr_beats,
        "hl": range(HDR_CAP + 1),
        "fit": max(1, hdr_beats - 1),
        "plen": signed(LEN_BITS + 3),
    })


class HeaderCapture(wiring.Component):
    """Parser stage P: header byte capture and the header geometry, one beat per cycle.

    Ports (``w`` = ``data_width``):

    * ``i``: ``In`` always-ready stream of beats: ``i.valid`` = a beat the parser accepts.
    * ``o``: ``Out`` always-ready stream of :func:`capture_layout`, registered: each beat one
      cycle later (``o.valid`` the cycle after ``i.valid``), with ``sof`` (first beat of its
      frame), ``idx`` (its beat index, saturating with the byte offset at 2**16), ``at`` (one
      hot: ``at[b]`` = it is beat ``b``, for the beats a header can reach), and the geometry
      decoded from the header bytes up to and including it: ``hl`` (header length by opcode and
      tag; the longest header for an unknown opcode), ``fit`` (``fit[b]``: a header of that
      length is complete by the end of beat ``b``) and ``plen`` (IPv4 total length - BTH..ext
      headers - ICRC - PadCnt: the payload bytes; may be negative for a malformed frame).
    * ``hdr_bytes``: ``Out(8 * HDR_CAP)``: the frame's first HDR_CAP bytes as captured up to and
      including the beat on ``o`` (bytes beyond it: stale), valid while ``o`` shows that beat.

    Latency 1 cycle; throughput one beat per cycle; no backpressure (the parser's ``room``
    decides what enters); no error outputs (the checks are in later stages). Why a stage: the
    opcode table and the length arithmetic behind it end in flip-flops here, so the payload
    realignment and the header event of S0 start from registers (the 512-bit parser was 9-12
    LUT levels from the captured opcode byte through the table into S0's paths).
    """

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "i": In(stream.Signature(beat_layout(data_width), always_ready=True)),
            "o": Out(stream.Signature(capture_layout(data_width), always_ready=True)),
            "hdr_bytes": Out(8 * HDR_CAP),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self._w // 8
        lb = (nb - 1).bit_length()
        acc, beat = self.i.valid, self.i.payload
        o = self.o.payload
        hdr_beats = -(-HDR_CAP // nb)
        fit_beats = hdr_beats - 1   # beats that may end before the longest header

        sof = Signal(init=1)
        base = Signal(LEN_BITS + 1)
        base_c = Mux(sof, 0, base)
        with m.If(acc):
            m.d.sync += sof.eq(beat.last)
            with m.If(beat.last):
                m.d.sync += base.eq(0)
            with m.Elif(base_c < (1 << LEN_BITS)):
                m.d.sync += base.eq(base_c + nb)
            with m.Else():
                m.d.sync += base.eq(base_c)
        in_bytes = bytes_of(beat.data)

        hbuf = [Signal(8, name=f"hbuf{g}") for g in range(HDR_CAP)]
        hcur = []
        pos = BeatIndex(m, acc, beat.last)   # one-hot beat position: header bytes 1 LUT from FFs
        for g in range(HDR_CAP):
            b, lane = divmod(g, nb)
            here = pos.at(b)
            with m.If(acc & here):
                m.d.sync += hbuf[g].eq(in_bytes[lane])
            cur = Signal(8, name=f"hcur{g}")
            m.d.comb += cur.eq(Mux(here, in_bytes[lane], hbuf[g]))
            hcur.append(cur)
        at = Cat(*[pos.at(b) for b in range(hdr_beats)])
        pos.build()
        # the bytes through the beat on `o`: hbuf holds them until the next beat is accepted
        m.d.comb += self.hdr_bytes.eq(Cat(*hbuf))

        def cur_word(g, size):
            return Cat(*[hcur[g + i] for i in reversed(range(size))])

        tpid = wf.ETH.ethertype
        vlan_c = cur_word(tpid.offset, tpid.size) == wf.ETHERTYPE_VLAN

        # The header geometry as a one-hot select: per tag variant, the opcode's extension-header
        # class (its extension length, or unknown) decoded from the opcode byte, and the payload
        # length for every class computed beside it (constants subtracted, no table in front of
        # the adders); both selected by the tag, then one AND-OR over the classes. An unknown
        # opcode captures the longest header.
        exts = sorted({info.ext_len for info in OPCODES.values()})
        ncls = len(exts) + 1
        flags = [[], []]    # [variant][class]
        plens = [[], []]
        for v, l2v in ((0, L2_UNTAGGED), (1, L2_TAGGED)):
            op = cur_word(l2v + _BTH_AT + wf.BTH.opcode.offset, wf.BTH.opcode.size)
            pc = cur_word(l2v + _BTH_AT + wf.BTH.padcnt.offset, wf.BTH.padcnt.size)
            pc = pc[wf.BTH.padcnt.shift: wf.BTH.padcnt.shift + wf.BTH.padcnt.bits]
            total_v = cur_word(l2v + wf.IPV4.total_length.offset, wf.IPV4.total_length.size)
            for e in exts:
                f = Signal(name=f"ext{e}_v{v}")
                m.d.comb += f.eq(Cat(*[op == code for code, info in OPCODES.items()
                                       if info.ext_len == e]).any())
                flags[v].append(f)
            flags[v].append(~Cat(*flags[v]).any())
            # bytes after the IPv4 header's start that are not payload, per class
            for k, kk in enumerate([BTH_END + e + _ICRC for e in exts] + [BTH_END + _ICRC]):
                p_k = Signal(signed(LEN_BITS + 3), name=f"plen_v{v}_{k}")
                m.d.comb += p_k.eq(total_v - pc - kk)
                plens[v].append(p_k)
        sel = [Signal(name=f"cls{k}") for k in range(ncls)]
        cand = [Signal(signed(LEN_BITS + 3), name=f"plen_cls{k}") for k in range(ncls)]
        m.d.comb += [dst[k].eq(Mux(vlan_c, t1[k], t0[k]))
                     for dst, t0, t1 in ((sel, *flags), (cand, *plens)) for k in range(ncls)]
        hl_max = HDR_CAP - wf.DOT1Q.size
        # header lengths per class and tag (the tag adds DOT1Q.size to each)
        hls = [[l2 + BTH_END + e for e in exts] + [hl_max - L2_TAGGED + l2]
               for l2 in (L2_UNTAGGED, L2_TAGGED)]

        def one_hot(values, width):
            pairs = list(zip(sel, values, strict=True))
            return Cat(*[Cat(*[s_k & Value.cast(val)[i] for s_k, val in pairs]).any()
                         for i in range(width)])

        def fits(hl):
            return Cat(*[Const(hl <= (b + 1) * nb) for b in range(max(1, fit_beats))])

        hl_f = Signal(range(HDR_CAP + 1))
        fit_f = Signal(max(1, fit_beats))
        plen_f = Signal(signed(LEN_BITS + 3))
        m.d.comb += [
            hl_f.eq(Mux(vlan_c, one_hot([Const(h, len(hl_f)) for h in hls[1]], len(hl_f)),
                        one_hot([Const(h, len(hl_f)) for h in hls[0]], len(hl_f)))),
            fit_f.eq(Mux(vlan_c, one_hot([fits(h) for h in hls[1]], len(fit_f)),
                         one_hot([fits(h) for h in hls[0]], len(fit_f)))),
            plen_f.eq(one_hot(cand, len(plen_f)))]

        m.d.sync += self.o.valid.eq(acc)
        with m.If(acc):
            m.d.sync += [o.beat.eq(beat), o.sof.eq(sof), o.idx.eq(base_c >> lb), o.at.eq(at),
                         o.hl.eq(hl_f), o.fit.eq(fit_f), o.plen.eq(plen_f)]
        return m


class Parser(wiring.Component):
    """Parse Ethernet / 802.1Q / IPv4 / UDP 4791 / BTH / RETH / ImmDt / AETH frames.

    Ports (``w`` = ``data_width``; all ``amaranth.lib.stream`` ready/valid):

    * ``i``: ``In(beat_signature(w))`` frames (Ethernet header first, no FCS).
    * ``hdr``: ``Out(stream.Signature(header_record_layout()))``: one record per frame.
    * ``payload``: ``Out(beat_signature(w))``: payload of ``DATA`` frames, realigned so payload
      byte 0 is lane byte 0; pad and ICRC removed; last beat ``error`` = verdict not clean.
    * ``frame``: ``Out(beat_signature(w))``: every input frame, unchanged (the bypass copy).
    * ``verdict``: ``Out(stream.Signature(verdict_layout()))``: one per frame.

    See the module documentation for ordering, latency and backpressure. Classification follows
    :func:`netreduce.wire.parse` (the same checks in the same order, reason names equal), with a
    MAC-flagged frame (``error`` on its last input beat) reported as ``MAC_ERROR`` first.
    """

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "i": In(beat_signature(data_width)),
            "hdr": Out(stream.Signature(header_record_layout())),
            "payload": Out(beat_signature(data_width)),
            "frame": Out(beat_signature(data_width)),
            "verdict": Out(stream.Signature(verdict_layout())),
        })

    @property
    def data_width(self) -> int:
        return self._w

    def elaborate(self, platform):
        m = Module()
        w, nb = self._w, self._w // 8
        lb = (nb - 1).bit_length()   # log2(bytes per beat)
        tpid = wf.ETH.ethertype
        beat = self.i.payload
        acc = Signal()
        m.d.comb += acc.eq(self.i.valid & self.i.ready)

        m.submodules.checker = checker = IcrcChecker(w)
        # ------------------------------------------------------------ P: capture and decode
        m.submodules.capture = cap = HeaderCapture(w)
        m.d.comb += [cap.i.valid.eq(acc), cap.i.payload.eq(beat)]
        cp = cap.o.payload
        acc0 = cap.o.valid          # S0 has a beat (accepted the cycle before)
        beat0 = cp.beat
        sof = cp.sof
        idx_c = cp.idx
        hl_c, fit_c, plen_c = cp.hl, cp.fit, cp.plen
        at0 = cp.at
        fit_beats = len(fit_c) if -(-HDR_CAP // nb) > 1 else 0
        m.d.comb += [checker.i.valid.eq(acc0), checker.i.payload.eq(beat0)]

        # S2 + extra: the stage where the checker's result for a frame's last beat is ready
        extra = IcrcChecker.LATENCY - 3

        # ------------------------------------------------------------ output FIFOs and room
        beat_w = len(Cat(beat.as_value()))
        hdr_w = header_record_layout().size
        ver_w = verdict_layout().size
        hdr_beats = -(-HDR_CAP // nb)
        # (+1 each: `room` is registered, so it counts the beat accepted in the cycle before)
        frame_depth = hdr_beats + 7 + extra
        m.submodules.frame_fifo = frame_fifo = fifo.SyncFIFO(width=beat_w, depth=frame_depth)
        # the payload FIFOs also absorb the header-length lag of a downstream consumer that waits
        # for `hdr` (e.g. the deparser in a loopback) before it takes payload beats
        # (+1 more for payload and header: their in-flight counts below over-count the beat
        # accepted in the cycle before, see `room`)
        pay_depth = max(4, (hdr_beats + 8) // 2) + 4 + extra
        m.submodules.pay_fifo0 = pay0 = fifo.SyncFIFO(width=beat_w, depth=pay_depth)
        m.submodules.pay_fifo1 = pay1 = fifo.SyncFIFO(width=beat_w, depth=pay_depth)
        hdr_depth, ver_depth = 8, 7 + extra
        m.submodules.hdr_fifo = hdr_fifo = fifo.SyncFIFO(width=hdr_w, depth=hdr_depth)
        m.submodules.ver_fifo = ver_fifo = fifo.SyncFIFO(width=ver_w, depth=ver_depth)

        # pipeline valid bits (declared here for the room computation)
        s1_v, s2_v = Signal(), Signal()
        s1_hv, s2_hv = Signal(), Signal()      # header event
        s1_ev, s2_ev = Signal(), Signal()      # end-of-frame event
        s1_pn, s2_pn = Signal(range(3)), Signal(range(3))   # payload beats (0..2)
        # stage T (between S1 and S2, see there)
        x_t = [Signal(name="t_v"), Signal(name="t_hv"), Signal(name="t_ev"),
               Signal(range(3), name="t_pn")]
        x_v = [Signal(name=f"s{3 + k}_v") for k in range(extra)]
        x_ev = [Signal(name=f"s{3 + k}_ev") for k in range(extra)]
        x_pn = [Signal(range(3), name=f"s{3 + k}_pn") for k in range(extra)]
        # registered: room for one more beat in the next cycle, counting what is in the FIFOs
        # and in flight now and the most the beat accepted now may push (reads ignored)
        # What is in flight (stages S0 .. S<3 + extra>) is itself a register, loaded with the
        # stages' next contents (they shift every cycle): the sums end in flip-flops. The
        # payload beats and the header event of the beats in P and S0 are over-counted there
        # (2 * acc, acc: their exact values come from S0's deep logic) until they reach S1.
        n_stages = 4 + extra
        infl_f = Signal(range(n_stages + 1))
        infl_p = Signal(range(2 * n_stages + 1))
        infl_h = Signal(range(5))
        infl_e = Signal(range(n_stages + 1))
        last_acc, last_acc0 = Signal(), Signal()
        m.d.comb += [last_acc.eq(acc & beat.last), last_acc0.eq(acc0 & beat0.last)]
        chains = ((infl_f, [acc, acc0, s1_v, x_t[0], s2_v, *x_v]),
                  (infl_p, [2 * acc, 2 * acc0, s1_pn, x_t[3], s2_pn, *x_pn]),
                  (infl_h, [acc, acc0, s1_hv, x_t[1], s2_hv]),
                  (infl_e, [last_acc, last_acc0, s1_ev, x_t[2], s2_ev, *x_ev]))
        # (each chain: the stages in order; the last one's content leaves into its FIFO)
        m.d.sync += [r.eq(sum(c[:-1])) for r, c in chains]
        room = Signal()
        m.d.sync += room.eq(
            (frame_fifo.level + infl_f + acc + 1 <= frame_depth)
            & (pay0.level + pay1.level + infl_p + 2 * acc + 2 <= 2 * pay_depth - 1)
            & (hdr_fifo.level + infl_h + acc + 1 <= hdr_depth)
            & (ver_fifo.level + infl_e + acc + 1 <= ver_depth))
        m.d.comb += self.i.ready.eq(room)

        # For S1's truncation checks: "the frame has fewer than e bytes up to the end of this
        # beat", for each byte count e they compare with, from the one-hot beat position and the
        # thermometer keep (a frame's byte count would need a keep_count, a 64-way priority
        # encoder at 512 bits, and an adder)
        trunc_ends = sorted({wf.ETH.size, L2_TAGGED}
                            | {l2 + d for l2 in (L2_UNTAGGED, L2_TAGGED)
                               for d in (1, wf.IPV4.size, wf.IPV4.size + wf.UDP.size)})
        short_c = {}
        for e in trunc_ends:
            be, lane = divmod(e - 1, nb)   # byte e - 1 is in beat be
            before = at0[:be].any() if be else Const(0)
            short_c[e] = before | (at0[be] & beat0.last & ~beat0.keep[lane])

        # header event: the beat that completes hdr_len bytes, or the frame's last beat
        hdr_sent = Signal()
        hdr_ev = Signal()
        early = at0[:fit_beats].any() if fit_beats else Const(0)
        complete = (at0[:fit_beats] & fit_c).any() | ~early if fit_beats else Const(1)
        m.d.comb += hdr_ev.eq(acc0 & ~(hdr_sent & ~sof) & (complete | beat0.last))
        with m.If(acc0):
            m.d.sync += hdr_sent.eq(Mux(beat0.last, 0, hdr_ev | (hdr_sent & ~sof)))

        # ------------------------------------------------------------ S0: payload realign
        # Payload geometry from the header bytes seen so far. The normal path (payload beat k
        # leaves with input beat k + q + 1 >= 1) uses the values registered at the previous
        # beat, complete by then (every byte they need precedes the payload's first beat); the
        # frame-end path (the last payload beat taken from the last input beat alone) is
        # finished in S1 from registered values. Both keep the header decode out of S0's paths.
        hl_r = Signal(range(HDR_CAP + 1))
        with m.If(acc0):
            m.d.sync += hl_r.eq(hl_c)
        q_r = hl_r >> lb
        s_r = hl_r[:lb]
        prev = Signal(w)
        with m.If(acc0):
            m.d.sync += prev.eq(beat0.data)
        nemit = Signal(LEN_BITS - lb + 2)   # payload beats generated so far in this frame
        done = Signal()                      # the last payload beat has been generated
        hold_v = Signal()
        hold_data = Signal(w)
        hold_keep = Signal(nb)
        nemit_c = Mux(sof, 0, nemit)
        done_c = done & ~sof
        hold_c = hold_v & ~sof

        shifts = sorted({ps % nb for ps in payload_offsets()})

        def window(lo, hi, sel):
            out = Signal(w)
            with m.Switch(sel):
                for sh in shifts:
                    with m.Case(sh):
                        m.d.comb += out.eq(Cat(lo, hi)[8 * sh: 8 * sh + w])
            return out

        def therm(x):
            return Cat(*[x > i for i in range(nb)])

        def window_keep(lo, hi, sel):   # the byte-valid mask of window(): keep shifted alike
            out = Signal(nb)
            with m.Switch(sel):
                for sh in shifts:
                    with m.Case(sh):
                        m.d.comb += out.eq(Cat(lo, hi)[sh: sh + nb])
            return out

        # normal_left = plen - (nemit_c << lb): both are loaded at the previous beat, so it is
        # a register loaded there too (the subtraction ends in flip-flops, not in the beat mux)
        normal_left = Signal(signed(LEN_BITS + 4))
        # bytes present: the previous beat is full, the current one has `keep` (a thermometer,
        # so shifting it like the data clips at the frame's end without arithmetic)
        normal_keep = Signal(nb)
        m.d.comb += normal_keep.eq(therm(normal_left)
                                   & window_keep(Const((1 << nb) - 1, nb), beat0.keep, s_r))
        normal = Signal()
        m.d.comb += normal.eq(acc0 & ~done_c & (idx_c > q_r) & (normal_left > 0))
        normal_final = normal_left <= nb
        with m.If(acc0):
            m.d.sync += normal_left.eq(
                plen_c - (((nemit_c + normal)[:len(nemit)] << lb)[:LEN_BITS + 2]))
        normal_data = window(prev, beat0.data, s_r)
        last_in = acc0 & beat0.last

        slot0_v, slot0_last, slot0_extra = Signal(), Signal(), Signal()
        slot0_data, slot0_keep = Signal(w), Signal(nb)
        slot1_v = Signal()
        with m.If(last_in & hold_c):
            m.d.comb += [slot0_v.eq(1), slot0_last.eq(1),
                         slot0_data.eq(hold_data), slot0_keep.eq(hold_keep)]
        with m.Elif(normal & (~normal_final | beat0.last)):
            m.d.comb += [slot0_v.eq(1), slot0_last.eq(normal_final),
                         slot0_data.eq(normal_data), slot0_keep.eq(normal_keep)]
            m.d.comb += slot1_v.eq(beat0.last & ~normal_final)
        with m.Elif(last_in & ~normal & ~done_c):
            m.d.comb += [slot0_v.eq(1), slot0_last.eq(1), slot0_extra.eq(1)]
        pstarted = Signal()   # a payload beat of this frame has been emitted
        pstarted_c = pstarted & ~sof
        with m.If(acc0):
            m.d.sync += pstarted.eq(~beat0.last & (pstarted_c | slot0_v))
        with m.If(acc0):
            m.d.sync += [nemit.eq(nemit_c + normal),
                         done.eq(~beat0.last & (done_c | (normal & normal_final))),
                         hold_v.eq(~beat0.last & (hold_c | (normal & normal_final)))]
            with m.If(normal & normal_final & ~beat0.last):
                m.d.sync += [hold_data.eq(normal_data), hold_keep.eq(normal_keep)]

        # ------------------------------------------------------------ S0 -> S1 registers
        s1_beat = Signal(beat_layout(w))
        s1_p0 = Signal(beat_layout(w))
        s1_p0_extra = Signal()
        s1_x_hl = Signal(range(HDR_CAP + 1))    # frame-end beat: its geometry
        s1_x_plen = Signal(signed(LEN_BITS + 3))
        s1_x_off = Signal(LEN_BITS + 2)
        s1_x_idx = Signal(len(idx_c))
        s1_hbuf = Signal(8 * HDR_CAP)
        s1_short = {e: Signal(name=f"s1_short{e}") for e in trunc_ends}
        s1_ended = Signal()
        m.d.sync += [s1_v.eq(acc0), s1_hv.eq(hdr_ev), s1_ev.eq(last_in),
                     s1_pn.eq(slot0_v + slot1_v)]
        with m.If(acc0):
            m.d.sync += [s1_beat.data.eq(beat0.data), s1_beat.keep.eq(beat0.keep),
                         s1_beat.first.eq(sof), s1_beat.last.eq(beat0.last),
                         s1_beat.error.eq(beat0.error)]
            m.d.sync += [s1_p0.data.eq(slot0_data), s1_p0.keep.eq(slot0_keep),
                         s1_p0.first.eq(~pstarted_c), s1_p0.last.eq(slot0_last),
                         s1_p0_extra.eq(slot0_extra),
                         s1_x_hl.eq(hl_c), s1_x_plen.eq(plen_c),
                         s1_x_off.eq((nemit_c + normal) << lb), s1_x_idx.eq(idx_c),
                         ]
        with m.If(hdr_ev):
            m.d.sync += [s1_hbuf.eq(cap.hdr_bytes), s1_ended.eq(beat0.last),
                         *[s1_short[e].eq(short_c[e]) for e in trunc_ends]]

        # ------------------------------------------------------------ S1: frame-end payload beat
        # the payload bytes of the frame's last input beat beyond the normal window
        x_left = Signal(signed(LEN_BITS + 4))
        m.d.comb += x_left.eq(s1_x_plen - s1_x_off)
        x_here = s1_x_idx >= (s1_x_hl >> lb)   # the payload has started in this beat or before
        s1_extra = Signal(beat_layout(w))
        m.d.comb += [
            s1_extra.data.eq(Mux(x_here, window(s1_beat.data, Const(0, w), s1_x_hl[:lb]), 0)),
            s1_extra.keep.eq(Mux(x_here, therm(x_left)
                                 & window_keep(s1_beat.keep, Const(0, nb), s1_x_hl[:lb]), 0)),
            s1_extra.last.eq(1),
        ]
        s1_p0_full = Signal(beat_layout(w))
        m.d.comb += [s1_p0_full.eq(Mux(s1_p0_extra, s1_extra, s1_p0)),
                     s1_p0_full.first.eq(s1_p0.first)]

        # ------------------------------------------------------------ S1: header checks
        hb = bytes_of(s1_hbuf)
        vlan1 = field_value(tpid, lambda g: hb[g], 0) == wf.ETHERTYPE_VLAN

        def fields_of(h, rel):
            return extract(h, lambda g: hb[g], L2_UNTAGGED + rel, L2_TAGGED + rel, vlan1)

        eth = extract(wf.ETH, lambda g: hb[g], 0)
        # behind a tag, the EtherType sits DOT1Q.size bytes later
        eth["ethertype"] = Mux(vlan1, field_value(tpid, lambda g: hb[g], wf.DOT1Q.size),
                               eth["ethertype"])
        ip = fields_of(wf.IPV4, 0)
        udp = fields_of(wf.UDP, wf.IPV4.size)
        bth = fields_of(wf.BTH, _BTH_AT)
        ended1 = s1_ended

        # IPv4 header checksum over the captured bytes
        # (per tag variant from fixed bytes, selected after the carry-save steps)
        csum_v = [carry_save([Cat(hb[l2 + o + 1], hb[l2 + o]) for o in range(0, wf.IPV4.size, 2)],
                             LEN_BITS + 5, until=5)   # reduced and added in T, folded in S2
                  for l2 in (L2_UNTAGGED, L2_TAGGED)]
        csum_terms = [Mux(vlan1, t, u) for u, t in zip(*csum_v, strict=True)]

        # the opcode table, once per tag variant (opcode at a fixed byte), then selected: the
        # table lookup does not wait for the tag comparison
        ext_len = Signal(range(HDR_CAP))
        has_pay = Signal()
        known = Signal()
        okind = Signal(Kind)
        hl1 = Signal(range(HDR_CAP + 1))
        variants = []
        for l2 in (L2_UNTAGGED, L2_TAGGED):
            v_ext, v_pay, v_known = Signal(range(HDR_CAP)), Signal(), Signal()
            v_kind, v_hl = Signal(Kind), Signal(range(HDR_CAP + 1))
            m.d.comb += [v_kind.eq(Kind.OTHER), v_hl.eq(l2 + BTH_END)]
            with m.Switch(field_value(wf.BTH.opcode, lambda g: hb[g], l2 + _BTH_AT)):
                for code, info in OPCODES.items():
                    with m.Case(code):
                        m.d.comb += [v_ext.eq(info.ext_len), v_pay.eq(info.has_payload),
                                     v_known.eq(1), v_kind.eq(_opcode_kind(info)),
                                     v_hl.eq(l2 + BTH_END + info.ext_len)]
            variants.append((v_ext, v_pay, v_known, v_kind, v_hl))
        for dst, (u, t) in zip((ext_len, has_pay, known, okind, hl1),
                               zip(*variants, strict=True), strict=True):
            m.d.comb += dst.eq(Mux(vlan1, t, u))

        def trunc(end):   # the frame ended before byte `end`
            return ended1 & s1_short[end]

        def trunc_l2(rel):   # ... before byte `rel` after the L2 header
            return ended1 & Mux(vlan1, s1_short[L2_TAGGED + rel], s1_short[L2_UNTAGGED + rel])

        total = ip["total_length"]
        # group A: checks up to the IPv4 total-length minimum (wire.parse order)
        chain_a = [
            (trunc(wf.ETH.size), Reason.TRUNCATED),
            (vlan1 & trunc(L2_TAGGED), Reason.TRUNCATED),
            (eth["ethertype"] != wf.ETHERTYPE_IPV4, Reason.ETHERTYPE),
            (trunc_l2(1), Reason.TRUNCATED),
            (ip["version"] != 4, Reason.IP_VERSION),
            (ip["ihl"] != 5, Reason.IHL),
            (trunc_l2(wf.IPV4.size), Reason.TRUNCATED),
            ((ip["frag_offset"] != 0) | ip["flags"][0], Reason.FRAGMENT),
            (ip["protocol"] != wf.IP_PROTO_UDP, Reason.PROTOCOL),
            (trunc_l2(wf.IPV4.size + wf.UDP.size), Reason.TRUNCATED),
            (udp["dport"] != wf.ROCEV2_UDP_PORT, Reason.UDP_PORT),
            (total < MIN_L3_LEN, Reason.IP_LENGTH),
        ]
        # (UDP length, then the IPv4 checksum come first in group B: resolved in S2, see below)
        # per tag variant from fixed bytes, then selected: the subtraction does not wait for
        # the tag comparison
        udp_bad_v = [field_value(wf.UDP.length, lambda g: hb[g], l2 + wf.IPV4.size)
                     != field_value(wf.IPV4.total_length, lambda g: hb[g], l2) - wf.IPV4.size
                     for l2 in (L2_UNTAGGED, L2_TAGGED)]
        udp_bad = Mux(vlan1, udp_bad_v[1], udp_bad_v[0])

        # ------------------------------------------------------------ S1 -> T registers
        # T: the check conditions are registered before the priority selection (keeps S1 and
        # T within the depth budget); the beats follow in step
        t_v, t_hv, t_ev, t_pn = x_t
        t_beat = Signal(beat_layout(w))
        t_p0 = Signal(beat_layout(w))
        t_p1 = Signal(beat_layout(w))
        t_hbuf = Signal(8 * HDR_CAP)
        t_ca = Signal(len(chain_a))
        t_tver_bad = Signal()
        t_known = Signal()
        t_has_pay = Signal()
        t_okind = Signal(Kind)
        t_total = Signal(LEN_BITS)
        t_ext_len = Signal(range(HDR_CAP))
        t_padcnt = Signal(len(bth["padcnt"]))
        t_udp_bad = Signal()
        t_hl = Signal(range(HDR_CAP + 1))
        # the record's tag flag and "ImmDt follows a RETH" registered here, not decoded from
        # S2's header bytes in front of the header FIFO (tag compare -> opcode -> table ->
        # ImmDt select was 10 LUT levels at 64 bits)
        t_vlan, t_reth = Signal(), Signal()
        reth_v = []
        for l2 in (L2_UNTAGGED, L2_TAGGED):
            v_reth = Signal(name=f"reth_v{l2}")
            with m.Switch(field_value(wf.BTH.opcode, lambda g: hb[g], l2 + _BTH_AT)):
                for code, info in OPCODES.items():
                    if info.reth:
                        with m.Case(code):
                            m.d.comb += v_reth.eq(1)
            reth_v.append(v_reth)
        t_cs = [Signal(LEN_BITS + 5, name=f"t_cs{j}") for j in range(len(csum_terms))]
        m.d.sync += [t_v.eq(s1_v), t_hv.eq(s1_hv), t_ev.eq(s1_ev), t_pn.eq(s1_pn),
                     t_beat.eq(s1_beat), t_p0.eq(s1_p0_full), t_p1.eq(s1_extra)]
        with m.If(s1_hv):
            m.d.sync += [t_hbuf.eq(s1_hbuf), t_ca.eq(Cat(*[c for c, _ in chain_a])),
                         t_tver_bad.eq(bth["tver"] != 0), t_known.eq(known),
                         t_has_pay.eq(has_pay), t_okind.eq(okind), t_total.eq(total),
                         t_ext_len.eq(ext_len), t_padcnt.eq(bth["padcnt"]),
                         t_udp_bad.eq(udp_bad), t_hl.eq(hl1), t_vlan.eq(vlan1),
                         t_reth.eq(Mux(vlan1, reth_v[1], reth_v[0])),
                         *[r.eq(v) for r, v in zip(t_cs, csum_terms, strict=True)]]

        # ------------------------------------------------------------ T: reasons
        padded = Signal(signed(LEN_BITS + 2))
        m.d.comb += padded.eq(t_total - BTH_END - _ICRC - t_ext_len)
        # group B: after the frame-length checks, up to PadCnt
        chain_b = [
            (t_tver_bad, Reason.TVER),
            (~t_known, Reason.OPCODE),
            (padded < 0, Reason.TRUNCATED),
            (~t_has_pay & ((padded != 0) | (t_padcnt != 0)), Reason.IP_LENGTH),
            (t_has_pay & (t_padcnt > padded), Reason.PADCNT),
        ]

        def first_of(chain):
            return first_match([(c, r.value) for c, r in chain], Reason.NONE.value)

        reason_a = Signal(Reason)
        reason_b_rest = Signal(Reason)
        m.d.comb += [reason_a.eq(first_of([(t_ca[j], r) for j, (_, r) in enumerate(chain_a)])),
                     reason_b_rest.eq(first_of(chain_b))]
        not_roce = Cat(*[reason_a == r for r in sorted(NOT_ROCE, key=lambda r: r.value)]).any()
        cs2 = carry_save(t_cs, LEN_BITS + 5)
        csum_sum = cs2[0] + cs2[1] if len(cs2) > 1 else cs2[0]

        # ------------------------------------------------------------ S1 -> S2 registers
        s2_beat = Signal(beat_layout(w))
        s2_p0 = Signal(beat_layout(w))
        s2_p1 = Signal(beat_layout(w))
        s2_hbuf = Signal(8 * HDR_CAP)
        s2_ra = Signal(Reason)
        s2_rb_rest = Signal(Reason)
        s2_udp_bad = Signal()
        s2_not_roce = Signal()
        s2_okind = Signal(Kind)
        s2_csum = Signal(LEN_BITS + 5)
        s2_bad_rest = Signal()   # a reason other than the IPv4 checksum's (not NOT_ROCE's)
        s2_data = Signal()       # the opcode kind is DATA
        s2_hl = Signal(range(HDR_CAP + 1))
        s2_vlan, s2_reth = Signal(), Signal()
        s2_plen_raw = Signal(LEN_BITS)
        m.d.sync += [s2_v.eq(t_v), s2_hv.eq(t_hv), s2_ev.eq(t_ev), s2_pn.eq(t_pn),
                     s2_beat.eq(t_beat), s2_p0.eq(t_p0), s2_p1.eq(t_p1)]
        with m.If(t_hv):
            m.d.sync += [s2_hbuf.eq(t_hbuf), s2_ra.eq(reason_a), s2_rb_rest.eq(reason_b_rest),
                         s2_udp_bad.eq(t_udp_bad), s2_not_roce.eq(not_roce),
                         s2_okind.eq(t_okind), s2_csum.eq(csum_sum), s2_hl.eq(t_hl),
                         s2_vlan.eq(t_vlan), s2_reth.eq(t_reth),
                         s2_bad_rest.eq((reason_a != Reason.NONE) | t_udp_bad
                                        | (reason_b_rest != Reason.NONE)),
                         s2_data.eq(~not_roce & (t_okind == Kind.DATA)),
                         s2_plen_raw.eq(padded - t_padcnt)]

        # ------------------------------------------------------------ S2: header classification
        s2_rb = Signal(Reason)
        csum_ok = ones_complement_fold(s2_csum) == 0xFFFF
        m.d.comb += s2_rb.eq(first_match([(s2_udp_bad, Reason.UDP_LENGTH.value),
                                          (~csum_ok, Reason.IP_CHECKSUM.value)], s2_rb_rest))
        s2_kind = Signal(Kind)
        with m.If(s2_not_roce):
            m.d.comb += s2_kind.eq(Kind.NOT_ROCE)
        with m.Elif((s2_ra != Reason.NONE) | (s2_rb != Reason.NONE)):
            m.d.comb += s2_kind.eq(Kind.MALFORMED)
        with m.Else():
            m.d.comb += s2_kind.eq(s2_okind)
        s2_plen = Signal(LEN_BITS)
        m.d.comb += s2_plen.eq(Mux(s2_kind == Kind.DATA, s2_plen_raw, 0))

        # ------------------------------------------------------------ S2: verdict and pushes
        cur_kind = Signal(Kind)
        cur_ra = Signal(Reason)
        cur_rb = Signal(Reason)
        kind2 = Mux(s2_hv, s2_kind, cur_kind)
        ra2 = Mux(s2_hv, s2_ra, cur_ra)
        rb2 = Mux(s2_hv, s2_rb, cur_rb)
        with m.If(s2_hv):
            m.d.sync += [cur_kind.eq(s2_kind), cur_ra.eq(s2_ra), cur_rb.eq(s2_rb)]

        # ------------------------------------------------------------ S3..: wait for the checker
        # frame beats, payload beats and the header-time classification travel `extra` more
        # stages, to where the checker's result of a last beat is (IcrcChecker.LATENCY)
        # (kind2 == DATA, spelt out so that the checksum test is the only late input)
        is_data = Mux(s2_hv, s2_data & ~s2_bad_rest & csum_ok, cur_kind == Kind.DATA)
        push0 = is_data & (s2_pn != 0)
        push1 = is_data & (s2_pn == 2)
        st = dict(v=s2_v, ev=s2_ev, pn=s2_pn, beat=s2_beat, p0=s2_p0, p1=s2_p1, push0=push0,
                  push1=push1, ra=ra2, rb=rb2, kind=kind2)
        for k in range(extra):
            nxt = {n: Signal.like(v, name=f"s{3 + k}_{n}") for n, v in st.items()}
            nxt["v"], nxt["ev"], nxt["pn"] = x_v[k], x_ev[k], x_pn[k]
            m.d.sync += [nxt[n].eq(v) for n, v in st.items()]
            st = nxt
        ra2, rb2, kind2 = st["ra"], st["rb"], st["kind"]

        res = checker.o.payload
        final_reason = Signal(Reason)
        with m.If(res.mac_error):
            m.d.comb += final_reason.eq(Reason.MAC_ERROR)
        with m.Elif(ra2 != Reason.NONE):
            m.d.comb += final_reason.eq(ra2)
        with m.Elif(~res.ip_len_ok):
            m.d.comb += final_reason.eq(Reason.IP_LENGTH)
        with m.Elif(rb2 != Reason.NONE):
            m.d.comb += final_reason.eq(rb2)
        with m.Elif(~res.icrc_ok):
            m.d.comb += final_reason.eq(Reason.ICRC)
        final_kind = Signal(Kind)
        with m.If(final_reason == Reason.NONE):
            m.d.comb += final_kind.eq(kind2)
        with m.Elif((kind2 == Kind.NOT_ROCE) & ~res.mac_error):
            m.d.comb += final_kind.eq(Kind.NOT_ROCE)
        with m.Else():
            m.d.comb += final_kind.eq(Kind.MALFORMED)
        bad = final_reason != Reason.NONE

        # header record (combinational view of the S2 registers)
        rec = Signal(header_record_layout())
        hb2 = bytes_of(s2_hbuf)
        vlan2 = s2_vlan

        def fields2(h, rel):
            return extract(h, lambda g: hb2[g], L2_UNTAGGED + rel, L2_TAGGED + rel, vlan2)

        m.d.comb += [rec.kind.eq(s2_kind), rec.reason.eq(Mux(s2_ra != Reason.NONE, s2_ra, s2_rb)),
                     rec.vlan.eq(vlan2), rec.hdr_len.eq(s2_hl), rec.plen.eq(s2_plen),
                     rec.raw.eq(s2_hbuf)]
        eth2 = extract(wf.ETH, lambda g: hb2[g], 0)
        eth2["ethertype"] = Mux(vlan2, field_value(tpid, lambda g: hb2[g], wf.DOT1Q.size),
                                eth2["ethertype"])
        ext_at = _BTH_AT + wf.BTH.size
        groups = {
            "eth": eth2,
            "dot1q": extract(wf.DOT1Q, lambda g: hb2[g], wf.ETH.ethertype.offset),
            "ipv4": fields2(wf.IPV4, 0),
            "udp": fields2(wf.UDP, wf.IPV4.size),
            "bth": fields2(wf.BTH, _BTH_AT),
            "reth": fields2(wf.RETH, ext_at),
            "aeth": fields2(wf.AETH, ext_at),
        }
        # ImmDt follows a RETH when the opcode carries both
        imm_plain = fields2(wf.IMMDT, ext_at)
        imm_after = fields2(wf.IMMDT, ext_at + wf.RETH.size)
        groups["immdt"] = {k: Mux(s2_reth, imm_after[k], imm_plain[k]) for k in imm_plain}
        for hname, vals in groups.items():
            for fname, v in vals.items():
                m.d.comb += rec[hname][fname].eq(v)

        m.d.comb += [hdr_fifo.w_en.eq(s2_hv), hdr_fifo.w_data.eq(rec)]

        ver = Signal(verdict_layout())
        m.d.comb += [ver.kind.eq(final_kind), ver.reason.eq(final_reason),
                     ver.frame_len.eq(res.frame_len),
                     ver_fifo.w_en.eq(st["ev"]), ver_fifo.w_data.eq(ver)]

        m.d.comb += [frame_fifo.w_en.eq(st["v"]), frame_fifo.w_data.eq(st["beat"])]

        # payload: two interleaved FIFOs so that two beats can be pushed in one cycle
        p0 = Signal(beat_layout(w))
        p1 = Signal(beat_layout(w))
        m.d.comb += [p0.eq(st["p0"]), p1.eq(st["p1"]),
                     p0.error.eq(st["p0"].last & bad), p1.error.eq(bad)]
        push0, push1 = st["push0"], st["push1"]
        wsel = Signal()
        with m.If(wsel):
            m.d.comb += [pay1.w_en.eq(push0), pay1.w_data.eq(p0),
                         pay0.w_en.eq(push1), pay0.w_data.eq(p1)]
        with m.Else():
            m.d.comb += [pay0.w_en.eq(push0), pay0.w_data.eq(p0),
                         pay1.w_en.eq(push1), pay1.w_data.eq(p1)]
        with m.If(push0 & ~push1):
            m.d.sync += wsel.eq(~wsel)

        # ------------------------------------------------------------ outputs
        rsel = Signal()
        pay_out = Signal(beat_layout(w))
        m.d.comb += pay_out.eq(Mux(rsel, pay1.r_data, pay0.r_data))
        m.d.comb += [
            self.payload.valid.eq(Mux(rsel, pay1.r_rdy, pay0.r_rdy)),
            self.payload.payload.eq(pay_out),
            pay0.r_en.eq(~rsel & self.payload.ready),
            pay1.r_en.eq(rsel & self.payload.ready),
        ]
        with m.If(self.payload.valid & self.payload.ready):
            m.d.sync += rsel.eq(~rsel)
        for port, f in ((self.frame, frame_fifo), (self.hdr, hdr_fifo), (self.verdict, ver_fifo)):
            m.d.comb += [port.valid.eq(f.r_rdy), port.payload.eq(f.r_data), f.r_en.eq(port.ready)]
        return m
