"""ICRC at full beat width: the CRC-32 datapath, the receive-side checker and the un-shift stage.

CRC arithmetic (all from ``amaranth.lib.crc.catalog.CRC32_ETHERNET``, the algorithm of the ICRC):

* **Init 0 trick.** CRC-32 with init 0xFFFFFFFF over a message equals the same CRC with init 0
  over the message with its first 32 bits complemented. The ICRC message starts with 8 bytes of
  0xFF, so with init 0 it is ``00 00 00 00 FF FF FF FF`` + masked L3; with init 0 leading zero
  bytes do not change the CRC, so the hardware feeds *whole beats from the frame's first byte*,
  with every byte before ``l2 - 4`` forced to 0 and bytes ``l2 - 4 .. l2 - 1`` forced to 0xFF
  (``l2`` = 14, or 18 behind an 802.1Q tag). No byte enables are needed at the start.
* **Unaligned end.** The covered bytes end anywhere in a beat; the rest of that beat is fed as
  zeros. Appending ``k`` zero bytes multiplies the CRC register by x^(8k): the checker compares
  the register against a 64-entry table of the residue times x^(8k) (:func:`residue_table`), the
  deparser multiplies by x^(-8k) in log2(B) constant-matrix stages (:class:`CrcUnshift`).
* One CRC step over a ``W``-bit word is 32 XOR trees (:func:`crc_next`): each output bit is the
  parity of (register AND a constant) XOR (data AND a constant). The constants come from
  ``lib.crc.Parameters.compute`` (the library's reference model). The same function as
  ``lib.crc.Processor``, written as masked parities so that a 512-bit step elaborates in
  milliseconds. The 32 data masks are read from a ROM at constant addresses
  (:func:`crc_rows`): a constant after synthesis like any other, but Amaranth folds an AND with
  a constant into single-bit wiring, which Verilator then assembles bit run by bit run (this
  was over a quarter of the 512-bit engine's simulation time); an AND with a ROM word stays one
  W-bit AND.
"""

from __future__ import annotations

import functools

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import crc, data, stream, wiring
from amaranth.lib.crc import catalog
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from netreduce.wire import fields as wf
from netreduce.wire.frame import MIN_FRAME
from netreduce.wire.icrc import ICRC_MASKED_BYTES

from ..stream import beat_layout, bytes_of, check_data_width, first_match, keep_count
from .layout import L2_TAGGED, L2_UNTAGGED, LEN_BITS, MIN_L3_LEN

__all__ = [
    "ALGO_INIT0", "crc_matrices", "crc_next", "crc_rows", "crc_output", "residue_table",
    "unshift_matrix",
    "BeatIndex", "CRC_CHUNK", "CrcUnshift", "IcrcChecker", "carry_save", "check_layout",
    "crc_input_masks",
    "reflect32",
]

_E = catalog.CRC32_ETHERNET
ALGO_INIT0 = crc.Algorithm(crc_width=32, polynomial=_E.polynomial, initial_crc=0,
                           reflect_input=_E.reflect_input, reflect_output=_E.reflect_output,
                           xor_output=_E.xor_output)
"""CRC32_ETHERNET with init 0 (see the module doc)."""

_RAW = crc.Algorithm(crc_width=32, polynomial=_E.polynomial, initial_crc=0,
                     reflect_input=False, reflect_output=False, xor_output=0)


def reflect32(x: int) -> int:
    return int(f"{x:032b}"[::-1], 2)


@functools.cache
def crc_matrices(data_width: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Masks for one CRC step over a ``data_width``-bit word (byte 0 in bits 7..0, LSB first).

    Returns ``(f, g)``: new register bit ``i`` = parity(reg & f[i]) ^ parity(word & g[i]).
    The register is the unreflected CRC register of :data:`ALGO_INIT0`.
    """
    def step(init, word):
        a = crc.Algorithm(crc_width=32, polynomial=_RAW.polynomial, initial_crc=init,
                          reflect_input=False, reflect_output=False, xor_output=0)
        return a(data_width).compute([word])

    f = [0] * 32
    g = [0] * 32
    for j in range(32):
        col = step(1 << j, 0)
        for i in range(32):
            if col >> i & 1:
                f[i] |= 1 << j
    for j in range(data_width):
        # reflect_input reflects the whole word: word bit j enters as unreflected bit W-1-j
        col = step(0, 1 << (data_width - 1 - j))
        for i in range(32):
            if col >> i & 1:
                g[i] |= 1 << j
    return tuple(f), tuple(g)


def crc_rows(m: Module, width: int, name: str = "crc_rows") -> list[Value]:
    """The 32 data masks of a CRC step over a ``width``-bit word (``g`` of
    :func:`crc_matrices`) as values read from a ROM (submodule ``name`` of ``m``) at constant
    addresses, for :func:`crc_next` (see the module doc: same logic, faster simulation). Call
    it outside ``m.If``/``m.Switch``: inside, each address would be constant only under the
    condition, and synthesis would build a real ROM read."""
    _, g = crc_matrices(width)
    rom = Memory(shape=width, depth=32, init=g)
    m.submodules[name] = rom
    rows = []
    for i in range(32):
        port = rom.read_port(domain="comb")
        m.d.comb += port.addr.eq(i)
        rows.append(port.data)
    return rows


def crc_next(reg: Value, word: Value, rows: list[Value] | None = None) -> Value:
    """The CRC register after one step over ``word`` (its width selects the matrices);
    ``rows``: the data masks from :func:`crc_rows` (default: as constants)."""
    f, g = crc_matrices(len(word))
    if rows is None:
        rows = g
    elif len(rows) != 32 or any(len(r) != len(word) for r in rows):
        raise ValueError(f"rows must be 32 values of {len(word)} bits (crc_rows)")
    return Cat(*[(reg & f[i]).xor() ^ (word & rows[i]).xor() for i in range(32)])


def crc_output(reg: Value) -> Value:
    """CRC value (as zlib.crc32 returns it) of an unreflected register."""
    return reg[::-1] ^ _E.xor_output


def _apply(mat, x: int) -> int:
    return sum(((bin(mat[i] & x).count("1") & 1) << i) for i in range(32))


@functools.cache
def _zero_byte_matrix():
    """Register map of one zero byte: rows as masks (new bit i = parity(row[i] & reg))."""
    f, _ = crc_matrices(8)
    return tuple(f)


def _mat_mul(a, b):
    """(a . b) x = a (b x)."""
    cols = [_apply(a, _apply(b, 1 << j)) for j in range(32)]
    return tuple(sum(((cols[j] >> i) & 1) << j for j in range(32)) for i in range(32))


def _mat_pow(a, n):
    r = tuple(1 << i for i in range(32))
    while n:
        if n & 1:
            r = _mat_mul(r, a)
        a = _mat_mul(a, a)
        n >>= 1
    return r


def _mat_inv(a):
    rows = [(a[i], 1 << i) for i in range(32)]
    for c in range(32):
        p = next(r for r in range(c, 32) if rows[r][0] >> c & 1)
        rows[c], rows[p] = rows[p], rows[c]
        for r in range(32):
            if r != c and rows[r][0] >> c & 1:
                rows[r] = (rows[r][0] ^ rows[c][0], rows[r][1] ^ rows[c][1])
    return tuple(r[1] for r in rows)


@functools.cache
def unshift_matrix(nbytes: int) -> tuple[int, ...]:
    """Rows of x^(-8 nbytes): undoes ``nbytes`` zero bytes appended to the message."""
    return _mat_inv(_mat_pow(_zero_byte_matrix(), nbytes))


@functools.cache
def residue_table(nbytes: int) -> tuple[int, ...]:
    """CRC output (zlib convention) of a valid codeword followed by k zero bytes, k < nbytes."""
    p = ALGO_INIT0(8)
    msg = b"\xff\xff\xff\xff" + b"NetReduce"
    code = msg + p.compute(msg).to_bytes(4, "little")
    return tuple(p.compute(code + bytes(k)) for k in range(nbytes))


class CrcUnshift(wiring.Component):
    """Multiply a CRC register by x^(-8k), k < 2**stages, in ``stages`` constant-matrix stages.

    Stage ``b`` applies x^(-8 * 2**b) when bit ``b`` of ``k`` is set. ``pipeline`` lists the stage
    indices after which a register is inserted; the latency is ``len(pipeline)`` cycles (``en``
    advances every register). ``reg_i`` and ``k`` in, ``reg_o`` out.
    """

    def __init__(self, stages: int, pipeline: tuple[int, ...] = ()):
        self._stages = stages
        self._pipeline = tuple(pipeline)
        super().__init__({
            "reg_i": In(32), "k": In(range(1 << stages)), "en": In(1), "reg_o": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        x, k = self.reg_i, self.k
        for b in range(self._stages):
            mat = unshift_matrix(1 << b)
            y = Signal(32, name=f"unshift_y{b}")
            m.d.comb += y.eq(Mux(k[b], Cat(*[(x & mat[i]).xor() for i in range(32)]), x))
            x = y
            if b in self._pipeline:
                rx = Signal(32, name=f"unshift_x{b}")
                rk = Signal(len(k), name=f"unshift_k{b}")
                with m.If(self.en):
                    m.d.sync += [rx.eq(x), rk.eq(k)]
                x, k = rx, rk
        m.d.comb += self.reg_o.eq(x)
        return m


# ------------------------------------------------------------------------------------ byte masks

def crc_input_masks(beat_bytes: int):
    """Per (beat index, vlan): lanes forced to 0xFF and lanes forced to 0 at the frame's start.

    Returns ``{(beat, vlan): (ff_mask, zero_mask)}`` for the beats that hold any such lane (every
    later beat has neither). Forced to 0xFF: the 4 bytes before the IPv4 header (the second half
    of the 8-byte 0xFF prefix; the first half is the init-0 trick) and the ICRC-masked bytes
    (:data:`~netreduce.wire.icrc.ICRC_MASKED_BYTES`). Forced to 0: everything before.
    """
    out = {}
    for vlan, l2 in ((0, L2_UNTAGGED), (1, L2_TAGGED)):
        ff = set(range(l2 - 4, l2)) | {l2 + o for o in ICRC_MASKED_BYTES}
        zero = set(range(l2 - 4))
        for g in sorted(ff | zero):
            b, lane = divmod(g, beat_bytes)
            f, z = out.get((b, vlan), (0, 0))
            if g in ff:
                f |= 1 << lane
            else:
                z |= 1 << lane
            out[(b, vlan)] = (f, z)
    return out


def check_layout() -> data.StructLayout:
    """The checker's per-frame result (all flags 1 = passed).

    * ``icrc_ok``: the ICRC over the datagram (IPv4 total length) is right.
    * ``ip_csum_ok``: the IPv4 header checksum is right.
    * ``ip_len_min_ok``: total length >= 44 (IPv4 + UDP + BTH + ICRC).
    * ``ip_len_ok``: the datagram fits the frame and nothing follows it, except Ethernet padding
      of a 60-byte frame (the :func:`netreduce.wire.parse` rules).
    * ``udp_len_ok``: UDP length = IPv4 total length - 20.
    * ``mac_error``: the frame's last beat had ``error`` set.
    * ``frame_len``: frame bytes (saturating at 2**16 - 1).
    Meaningless for a frame that is not IPv4 with IHL 5 (the parser ignores them then).
    """
    return data.StructLayout({
        "icrc_ok": 1, "ip_csum_ok": 1, "ip_len_min_ok": 1, "ip_len_ok": 1, "udp_len_ok": 1,
        "mac_error": 1, "frame_len": LEN_BITS,
    })


class _ByteTap:
    """Frame bytes at fixed positions, from the current beat or captured from an earlier one.

    ``get(g)`` is byte ``g`` of the frame: the current beat's lane when the current beat holds it,
    else the value captured when it passed (stale bytes of an earlier frame if it has not arrived;
    callers only use bytes that have). ``here(b)``: the current beat is beat ``b`` of its frame.
    """

    def __init__(self, m: Module, beat_data: Value, here, accept: Value, nbytes: int):
        self._m, self._data, self._here, self._acc, self._b = m, beat_data, here, accept, nbytes
        self._regs: dict[int, Signal] = {}

    def get(self, g: int) -> Value:
        b, lane = divmod(g, self._b)
        here = self._here(b)
        cur = self._data[8 * lane: 8 * lane + 8]
        if g not in self._regs:
            r = Signal(8, name=f"tap{g}")
            with self._m.If(self._acc & here):
                self._m.d.sync += r.eq(cur)
            self._regs[g] = r
        return Mux(here, cur, self._regs[g])

    def word(self, g: int, size: int) -> Value:
        """Big-endian ``size``-byte value at ``g``."""
        return Cat(*[self.get(g + i) for i in reversed(range(size))])


def ones_complement_fold(x: Value, width: int = 16) -> Value:
    """Fold a wide ones'-complement sum to ``width`` bits (two end-around-carry folds)."""
    lo = x[:width] + x[width:]
    return (lo[:width] + lo[width:])[:width]


def carry_save(terms, width: int, until: int = 2) -> list[Value]:
    """Reduce ``terms`` to at most ``until`` (>= 2) with 3:2 carry-save compressors (bitwise, one
    LUT level each), sum modulo 2**width unchanged. Written as gates so that Yosys does not merge
    the adds into one multi-operand ``$macc`` (which ABC maps to a deep chain of wide LUTs)."""
    terms = [Value.cast(t) for t in terms]
    mask = Const((1 << width) - 1, width)
    while len(terms) > until:
        nxt = []
        for i in range(0, len(terms) - 2, 3):
            a, b, c = (t.as_unsigned() for t in terms[i: i + 3])
            nxt.append((a ^ b ^ c) & mask)
            nxt.append((((a & b) | (a & c) | (b & c)) << 1) & mask)
        nxt += terms[len(terms) - len(terms) % 3:] if len(terms) % 3 else []
        terms = [t[:width] for t in nxt]
    return terms


class BeatIndex:
    """One-hot position of the input beat in its frame, for the first beats only: ``at(b)`` is a
    register, high while the beat on the input (if any) is beat ``b`` of its frame. A register
    instead of a comparison of the byte offset keeps the header taps one LUT from a flip-flop.
    Call :meth:`build` after the last ``at``."""

    def __init__(self, m: Module, accept: Value, last: Value):
        self._m, self._acc, self._last = m, accept, last
        self._at: dict[int, Signal] = {}
        self._built = False

    def at(self, b: int) -> Signal:
        if self._built and b not in self._at:
            raise ValueError(f"beat {b}: BeatIndex.at after build()")
        for k in range(b + 1):
            if k not in self._at:
                self._at[k] = Signal(init=int(k == 0), name=f"at{k}")
        return self._at[b]

    def build(self):
        self._built = True
        with self._m.If(self._acc):
            for k, r in self._at.items():
                self._m.d.sync += r.eq(self._last if k == 0 else ~self._last & self._at[k - 1])


CRC_CHUNK = 64   # bits of a beat per partial CRC parity (3 LUT levels of XOR)


class IcrcChecker(wiring.Component):
    """Receive-side checks of RoCEv2 frames at full beat width, no byte enables.

    Ports:

    * ``i``: ``In(stream)`` of :func:`~netreduce.hw.stream.beat_layout` beats, always ready: the
      checker never applies backpressure; it sees a beat whenever ``i.valid`` is high.
    * ``o``: ``Out(stream)`` of :func:`check_layout`, always ready, registered: ``o.valid`` is
      high for one cycle per frame, :attr:`LATENCY` (5) cycles after the frame's last beat
      (``i.valid & i.payload.last``).

    Throughput: one beat per cycle, back-to-back frames of any length, any ``keep`` on the last
    beat. The ICRC covers the IPv4 datagram as given by its total length (not the frame length),
    with the masks of ``netreduce.wire.icrc`` and the 8-byte 0xFF prefix applied on the copy fed
    to the CRC; the CRC runs over whole beats (see the module doc) and is compared against the
    CRC-32 residue shifted by the zero bytes after the datagram's end in its last beat.

    Pipeline (each stage at most 8 LUT levels at 250 MHz, docs/engine.md "Clock plan"): 0 header
    taps (total length, tag) from the input beat; 1 CRC input masking and the IPv4 checksum's
    carry-save terms; 2 the CRC step's data part as one parity per 64-bit chunk, the checksum
    accumulator; 3 the CRC register, the length and checksum checks; 4 the ICRC comparison,
    registered on ``o``.
    """

    LATENCY = 5

    def __init__(self, data_width: int = 512):
        self._w = check_data_width(data_width)
        super().__init__({
            "i": In(stream.Signature(beat_layout(data_width), always_ready=True)),
            "o": Out(stream.Signature(check_layout(), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        w, nb = self._w, self._w // 8
        beat = self.i.payload
        acc = self.i.valid

        # ---- stage 0 (from the input beat): frame position, header taps
        sof = Signal(init=1)              # next beat is a frame's first
        base = Signal(LEN_BITS + 1)       # byte offset of this beat in its frame (saturating)
        base_c = Mux(sof, 0, base)
        with m.If(acc):
            m.d.sync += sof.eq(beat.last)
            with m.If(beat.last):
                m.d.sync += base.eq(0)
            with m.Elif(base_c < (1 << LEN_BITS)):
                m.d.sync += base.eq(base_c + nb)
            with m.Else():
                m.d.sync += base.eq(base_c)
        pos = BeatIndex(m, acc, beat.last)

        tap = _ByteTap(m, beat.data, pos.at, acc, nb)
        tpid = wf.ETH.ethertype
        vlan = tap.word(tpid.offset, tpid.size) == wf.ETHERTYPE_VLAN

        def ip_word(f):   # IPv4 field value, for both tag variants
            return Mux(vlan, tap.word(L2_TAGGED + f.offset, f.size),
                       tap.word(L2_UNTAGGED + f.offset, f.size))

        total = ip_word(wf.IPV4.total_length)
        udp_len = Mux(vlan, tap.word(L2_TAGGED + wf.IPV4.size + wf.UDP.length.offset, 2),
                      tap.word(L2_UNTAGGED + wf.IPV4.size + wf.UDP.length.offset, 2))
        # l2 + total length = end of the ICRC, for both tag variants (selected in stage 1: the
        # adder does not wait for the tag comparison)
        ends = [Signal(LEN_BITS + 1, name=f"dgram_end{v}") for v in (0, 1)]
        m.d.comb += [ends[v].eq(l2v + tap.word(l2v + wf.IPV4.total_length.offset, 2))
                     for v, l2v in ((0, L2_UNTAGGED), (1, L2_TAGGED))]

        # a beat before the one holding the total length is taken as fully covered (the
        # datagram is at least 44 bytes long, and a shorter one fails ip_len_min anyway)
        tl_end = wf.IPV4.total_length.offset + wf.IPV4.total_length.size - 1

        def before(b):   # the input beat is one of beats 0 .. b - 1
            return Cat(*[pos.at(k) for k in range(b)]).any() if b else Const(0)

        knowns = [~before((l2v + tl_end) // nb) for l2v in (L2_UNTAGGED, L2_TAGGED)]

        # where the CRC masks and the IPv4 header words sit: (beat, vlan) -> select bit
        masks = crc_input_masks(nb)
        sel_mask = {bv: pos.at(bv[0]) & (vlan == bv[1]) for bv in masks}
        words = []   # (select, lane offset) of the IPv4 header's 16-bit words
        for v, hl2 in ((0, L2_UNTAGGED), (1, L2_TAGGED)):
            for wo in range(0, wf.IPV4.size, 2):
                b, lane = divmod(hl2 + wo, nb)
                words.append((pos.at(b) & (vlan == v), 8 * lane))
        pos.build()

        p_v = Signal()
        p_first = Signal()
        p_last = Signal()
        p_err = Signal()
        p_data = Signal(w)
        p_base = Signal(LEN_BITS + 1)
        p_vlan = Signal()
        p_ends = [Signal(LEN_BITS + 1, name=f"p_end{v}") for v in (0, 1)]
        p_knowns = Signal(2)
        # bytes in the beat (keep_count) in two steps: per group of 8 lanes here, which group
        # in stage 1 (a 64-lane priority encoder in one stage is 9 levels)
        groups = [beat.keep[g: g + 8] for g in range(0, nb, 8)]
        p_grp = Signal(5 * len(groups))
        p_total = Signal(LEN_BITS)
        p_udp = Signal(LEN_BITS)
        p_mask = Signal(len(masks))
        p_word = Signal(len(words))
        m.d.sync += [p_v.eq(acc), p_first.eq(sof), p_last.eq(beat.last), p_err.eq(beat.error),
                     p_data.eq(beat.data), p_base.eq(base_c), p_vlan.eq(vlan),
                     p_ends[0].eq(ends[0]), p_ends[1].eq(ends[1]), p_knowns.eq(Cat(*knowns)),
                     p_grp.eq(Cat(*[Cat(g.any(), keep_count(g)) for g in groups])),
                     p_total.eq(total), p_udp.eq(udp_len),
                     p_mask.eq(Cat(*sel_mask.values())), p_word.eq(Cat(*[s for s, _ in words]))]

        # ---- stage 1: CRC input masking, IPv4 checksum words of this beat
        grp = [p_grp[5 * j: 5 * j + 5] for j in range(len(groups))]
        p_cnt = first_match([(g[0], 8 * j + g[1:]) for j, g in reversed(list(enumerate(grp)))],
                            0)
        # bytes of the datagram left from this beat's start (>= nb: the whole beat is covered)
        p_end = Mux(p_vlan, p_ends[1], p_ends[0])
        p_known = Mux(p_vlan, p_knowns[1], p_knowns[0])
        left = Signal(LEN_BITS + 2)
        m.d.comb += left.eq(Mux(~p_known, nb, Mux(p_end > p_base, p_end - p_base, 0)))
        feed = left != 0
        covered = Cat(*[left > i for i in range(nb)])

        ff_mask = Signal(nb)
        zero_mask = Signal(nb)
        for j, (f, z) in enumerate(masks.values()):
            with m.If(p_mask[j]):
                m.d.comb += [ff_mask.eq(f), zero_mask.eq(z)]
        masked = Cat(*[
            Mux(ff_mask[i], 0xFF, Mux(zero_mask[i] | ~covered[i], 0, byte))
            for i, byte in enumerate(bytes_of(p_data))
        ])

        # the checksum words of this beat (big-endian; at most one of the two tag variants'
        # word i is selected), reduced to 4 carry-save terms, added in stage 2
        csum_w = LEN_BITS + 6
        half = len(words) // 2

        def hword(j):
            lo = words[j][1]
            return Mux(p_word[j], Cat(p_data[lo + 8: lo + 16], p_data[lo: lo + 8]), 0)

        psum_terms = carry_save([hword(j) | hword(half + j) for j in range(half)], csum_w,
                                until=4)

        s1_v = Signal()
        s1_first = Signal()
        s1_last = Signal()
        s1_feed = Signal()
        s1_data = Signal(w)
        s1_k = Signal(range(nb))
        s1_psum = [Signal(csum_w, name=f"s1_psum{j}") for j in range(len(psum_terms))]
        s1_n = Signal(LEN_BITS + 1)
        s1_total = Signal(LEN_BITS)
        s1_udp = Signal(LEN_BITS)
        s1_end = Signal(LEN_BITS + 1)
        s1_err = Signal()
        m.d.sync += [s1_v.eq(p_v), s1_first.eq(p_first), s1_last.eq(p_last), s1_feed.eq(feed),
                     s1_data.eq(masked), s1_k.eq(Mux(left < nb, nb - left, 0)),
                     *[r.eq(t) for r, t in zip(s1_psum, psum_terms, strict=True)],
                     s1_n.eq(p_base + p_cnt), s1_total.eq(p_total), s1_udp.eq(p_udp),
                     s1_end.eq(p_end), s1_err.eq(p_err)]

        # ---- stage 2: the CRC step's data part in chunks (it is linear: per output bit, the
        # parity of the chunks' parities), checksum accumulator, per-frame capture
        rows = crc_rows(m, w)
        f_reg, _ = crc_matrices(w)
        chunks = range(0, w, CRC_CHUNK)
        s2_part = [Signal(32, name=f"s2_part{c // CRC_CHUNK}") for c in chunks]
        for c, r in zip(chunks, s2_part, strict=True):
            word = s1_data[c: c + CRC_CHUNK]
            m.d.sync += r.eq(Cat(*[(word & rows[i][c: c + CRC_CHUNK]).xor()
                                   for i in range(32)]))
        s2_step = Signal()   # s2_part is a fed beat's
        s2_first = Signal()
        s2_k = Signal(range(nb))
        m.d.sync += [s2_step.eq(s1_v & s1_feed), s2_first.eq(s1_first), s2_k.eq(s1_k)]
        csum = Signal(csum_w)
        with m.If(s1_v):
            acc2 = carry_save([Mux(s1_first, 0, csum), *s1_psum], csum_w)
            m.d.sync += csum.eq(acc2[0] + acc2[1])

        s2_v = Signal()
        s2_n = Signal(LEN_BITS + 1)
        s2_total = Signal(LEN_BITS)
        s2_udp = Signal(LEN_BITS)
        s2_end = Signal(LEN_BITS + 1)
        s2_err = Signal()
        m.d.sync += s2_v.eq(s1_v & s1_last)
        with m.If(s1_v & s1_last):
            m.d.sync += [s2_n.eq(s1_n), s2_total.eq(s1_total), s2_udp.eq(s1_udp),
                         s2_end.eq(s1_end), s2_err.eq(s1_err)]

        # ---- stage 3: CRC register; the checks other than the ICRC
        crc_reg = Signal(32)
        table = Array(Const(v, 32) for v in residue_table(nb))
        expect = Signal(32)   # the residue the register must show: that of the last fed beat
        with m.If(s2_step):
            reg = Mux(s2_first, 0, crc_reg)
            m.d.sync += [
                crc_reg.eq(Cat(*[(reg & f_reg[i]).xor()
                                 ^ Cat(*[p[i] for p in s2_part]).xor() for i in range(32)])),
                expect.eq(table[s2_k])]
        s3_v = Signal()
        s3 = Signal(check_layout())   # all but icrc_ok
        m.d.sync += [
            s3_v.eq(s2_v),
            s3.ip_csum_ok.eq(ones_complement_fold(csum) == 0xFFFF),
            s3.ip_len_min_ok.eq(s2_total >= MIN_L3_LEN),
            s3.ip_len_ok.eq((s2_end <= s2_n) & ~((s2_end < s2_n) & (s2_n > MIN_FRAME))),
            s3.udp_len_ok.eq(s2_udp == s2_total - wf.IPV4.size),
            s3.mac_error.eq(s2_err),
            s3.frame_len.eq(Mux(s2_n >> LEN_BITS, (1 << LEN_BITS) - 1, s2_n)),
        ]

        # ---- stage 4: the ICRC comparison; the result registered on the output
        m.d.sync += [self.o.valid.eq(s3_v), self.o.payload.eq(s3),
                     self.o.payload.icrc_ok.eq(crc_output(crc_reg) == expect)]
        return m
