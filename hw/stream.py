"""The one stream beat layout of NetReduce, plus small stream helpers.

Every frame-carrying port of the gateware (MAC side, parser, deparser, bypass, aggregator payload)
uses :func:`beat_layout`:

* ``data``  (``data_width`` bits): byte ``i`` of the beat is ``data[8*i : 8*i+8]`` (AXI-Stream byte
  order: the first byte on the wire is the least significant byte).
* ``keep``  (``data_width // 8`` bits): ``keep[i]`` marks byte ``i`` valid. Every beat except a
  frame's last one is full; the last beat has a contiguous run of valid bytes starting at byte 0
  (``keep`` is a thermometer code: ``0b0..01..1``). An empty last beat (``keep == 0``) is allowed
  only where a component documents it (the parser's payload of a zero-length RoCE packet).
* ``first``: the beat is the first of its frame. Producers in ``netreduce.hw`` drive it; consumers
  derive "first" from the previous beat's ``last`` and ignore this flag on input, so a source that
  cannot produce it (an AXI-Stream MAC) may leave it 0 (the Verilog top wrapper derives it).
* ``last``: the beat is the last of its frame (AXI-Stream ``tlast``).
* ``error``: the frame is bad (MAC FCS/PHY error on input, a failed check on output). Meaningful on
  the last beat only; it travels in ``tuser`` on AXI-Stream.

A stream of these beats is :func:`beat_signature` (``amaranth.lib.stream``, ready/valid).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Mux, Signal, Value
from amaranth.lib import data, stream

__all__ = [
    "DEFAULT_DATA_WIDTH", "beat_layout", "beat_signature", "keep_count", "keep_from_count",
    "bytes_of", "check_data_width", "tree_sum", "first_match", "LookAhead",
]

DEFAULT_DATA_WIDTH = 512


def check_data_width(data_width: int) -> int:
    """Validate a stream data width: a power of two, at least 64 bits (8 bytes)."""
    if not isinstance(data_width, int) or data_width < 64 or data_width & (data_width - 1):
        raise ValueError(f"data_width = {data_width!r}: must be a power of two >= 64 bits")
    return data_width


def beat_layout(data_width: int = DEFAULT_DATA_WIDTH) -> data.StructLayout:
    """The beat layout: ``data``, ``keep``, ``first``, ``last``, ``error`` (see module doc)."""
    check_data_width(data_width)
    return data.StructLayout({
        "data": data_width,
        "keep": data_width // 8,
        "first": 1,
        "last": 1,
        "error": 1,
    })


def beat_signature(data_width: int = DEFAULT_DATA_WIDTH) -> stream.Signature:
    """A ready/valid stream of :func:`beat_layout` beats (use ``Out(...)`` for a source port)."""
    return stream.Signature(beat_layout(data_width))


def bytes_of(value: Value, n: int | None = None) -> list[Value]:
    """The bytes of ``value`` as a list, byte 0 = bits 7..0 (``n`` bytes, default all)."""
    value = Value.cast(value)
    n = len(value) // 8 if n is None else n
    return [value[8 * i: 8 * i + 8] for i in range(n)]


def keep_from_count(count: Value, nbytes: int) -> Value:
    """A thermometer ``keep`` with the lowest ``count`` bits set (count >= nbytes: all set)."""
    return Cat(*[count > i for i in range(nbytes)])


def keep_count(keep: Value) -> Value:
    """Number of valid bytes of a thermometer ``keep``: index of the highest set bit + 1.

    A balanced priority encoder rather than a popcount, so a (non-conforming) keep with holes
    still yields the position just past its last valid byte.
    """
    keep = Value.cast(keep)

    def top(lo: int, hi: int) -> Value:  # highest set bit + 1 within keep[lo:hi], else lo
        if hi - lo == 1:
            return Mux(keep[lo], hi, lo)
        mid = (lo + hi) // 2
        return Mux(keep[mid:hi].any(), top(mid, hi), top(lo, mid))

    return top(0, len(keep))


def tree_sum(terms) -> Value:
    """Sum of ``terms`` as a balanced adder tree (log2 depth instead of a chain)."""
    terms = [Value.cast(t) for t in terms]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def first_match(pairs, default) -> Value:
    """The value of the first ``(condition, value)`` pair whose condition holds, else ``default``.

    A balanced priority selector: log2 depth instead of a chain of len(pairs) multiplexers.
    """
    pairs = list(pairs)
    if not pairs:
        return Value.cast(default)
    if len(pairs) == 1:
        cond, val = pairs[0]
        return Mux(cond, val, default)
    half = len(pairs) // 2
    lo, hi = pairs[:half], pairs[half:]
    return Mux(Cat(*[c for c, _ in lo]).any(), first_match(lo, default), first_match(hi, default))


class LookAhead:
    """A shift window over the next ``depth`` beats of the beat stream ``i``, built into ``m``, so
    that a frame can be classified from its first ``depth * width / 8`` bytes before its head
    beat leaves.

    * ``buf[0]`` (``head``) is the oldest beat; ``first`` is set on every beat that starts a frame.
    * ``pop`` (driven by the caller): the head beat leaves this cycle.
    * ``byte(k, off)`` / ``be16(k, off)`` / ``shorter(x, off)``: byte ``k`` of the window that
      starts at ``buf[off]`` (0: the head; 1: the head after a pop) / the big-endian 16-bit field
      there / its frame ended before byte ``x``.
    * ``ended``: a frame's last beat is inside the window; ``n`` its length in bytes then.
    * ``head_ok``: the head is valid and, at a frame's first beat, enough of the frame is in the
      window to decide it (the window is full or the frame ended).
    * :meth:`registered`: a decision on the head frame from registers (computed in the cycle
      before, for both windows), so that the caller's decision logic ends in flip-flops.
    * ``i.ready`` is a function of the beat count register only (no path from ``pop``, i.e. from
      the caller's decision and its outputs' ``ready``): the shift register has two beats more
      than the window (the beat taken while the head waits, and the next frame's window behind a
      leaving head), so one beat per cycle flows while the head leaves every cycle.
    """

    def __init__(self, m, i, width: int, depth: int):
        nb, D = width // 8, depth
        bl = beat_layout(width)
        self.nb, self.depth, self.m = nb, D, m
        E = D + 2   # entries: the window, the window behind the head, one spare
        self.buf = buf = [Signal(bl, name=f"buf{j}") for j in range(E)]
        self.count = count = Signal(range(E + 1))
        in_first = Signal(init=1)  # the next input beat starts a frame
        push, self.pop = Signal(), Signal()
        pop = self.pop
        m.d.comb += [i.ready.eq(count < E), push.eq(i.valid & i.ready)]
        inc = Signal(bl)
        m.d.comb += [inc.eq(i.payload), inc.first.eq(in_first)]
        with m.If(push):
            m.d.sync += in_first.eq(i.payload.last)
        # the input beat is written into the first free entry whether or not it is valid (an
        # entry at or above ``count`` holds nothing): the beats' path does not go through
        # ``valid`` and ``push`` only moves ``count``
        for j in range(E):
            with m.If(pop):
                if j < E - 1:
                    m.d.sync += buf[j].eq(Mux(count == j + 1, inc, buf[j + 1]))
                else:
                    m.d.sync += buf[j].eq(inc)
            with m.Elif(count == j):
                m.d.sync += buf[j].eq(inc)
        # (pop, from the caller's decision, only selects among the three next counts)
        with m.If(push & ~pop):
            m.d.sync += count.eq(count + 1)
        with m.Elif(pop & ~push):
            m.d.sync += count.eq(count - 1)

        self._ends = [[buf[off + j].last & (count > off + j) for j in range(D)] for off in (0, 1)]
        ends = self._ends[0]
        self.ended = Cat(*ends).any()
        self.n = Signal(range(D * nb + 1))
        for j in reversed(range(D)):
            with m.If(ends[j]):
                m.d.comb += self.n.eq(j * nb + keep_count(buf[j].keep))
        self.head = buf[0]
        self.head_ok = (count != 0) & (~self.head.first | (count >= D) | self.ended)
        # the frame starting at buf[1] is decidable (it becomes the head if the head leaves)
        self._ok1 = (count > 1) & buf[1].first & ((count > D) | Cat(*self._ends[1]).any())

    def registered(self, decide):
        """``(fresh, value)``: ``value`` is ``decide(off)`` (a function of the window at ``off``:
        ``byte(k, off)``, ``shorter(x, off)``...) for the head frame, from registers: the
        decision computed in the cycle before on the window the head then started (``off`` 0,
        no pop) or would start after the pop (``off`` 1). ``fresh``: ``value`` holds for the
        head's frame (its first beat at the head, decidable the cycle before). Back-to-back
        frames stay fresh when the input keeps up; otherwise a frame waits one cycle more."""
        m = self.m
        v0, v1 = decide(0), decide(1)
        r0, r1 = Signal.like(v0, name="dec0_r"), Signal.like(v1, name="dec1_r")
        ok0, ok1, pop_r = Signal(name="dec0_ok"), Signal(name="dec1_ok"), Signal(name="pop_r")
        m.d.sync += [r0.eq(v0), r1.eq(v1), pop_r.eq(self.pop),
                     ok0.eq(self.head_ok & self.head.first), ok1.eq(self._ok1)]
        return (Mux(pop_r, ok1, ok0) & self.head.first,
                Mux(pop_r, r1, r0))

    def shorter(self, x: int, off: int = 0):
        """A frame's last beat is in the window and it has fewer than ``x`` bytes (``ended & (n
        < x)``, for ``0 < x <= depth * width / 8``), from the window's registers in two LUT
        levels: byte ``x - 1`` is absent exactly when a beat before its beat ended the frame, or
        its beat did without keeping it (``keep`` counts up from lane 0)."""
        jb, lane = divmod(x - 1, self.nb)
        ends = self._ends[off]
        return Cat(*ends[:jb]).any() | (ends[jb] & ~self.buf[off + jb].keep[lane])

    def byte(self, k: int, off: int = 0):
        return self.buf[off + k // self.nb].data.word_select(k % self.nb, 8)

    def be16(self, k: int, off: int = 0):
        return Cat(self.byte(k + 1, off), self.byte(k, off))
