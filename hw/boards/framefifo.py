"""Store-and-forward frame FIFO between a MAC and the core.

The CMAC's AXI-Stream has two rules the core's streams do not: its RX side cannot be
back-pressured (``rx_axis`` has no ``tready``), and its TX side must receive every frame without
a gap once the first beat is accepted (a gap is a TX underflow: the frame goes out corrupted).
:class:`FrameFifo` covers both:

* RX (``drop_when_full=True``): ``i.ready`` is always 1. A frame is written as it arrives and
  becomes visible on ``o`` only after its last beat is in (store and forward). A frame that finds
  the FIFO full is dropped whole (the partial frame is rolled back), ``drop`` pulses once for it,
  and the rest of the frame is swallowed. Frames already committed are never touched.
* TX (``drop_when_full=False``): ``i.ready`` falls while the FIFO is full and holds complete
  frames (ordinary backpressure). A frame longer than the FIFO (``depth`` beats) can never be
  complete: it is dropped whole the same way, with ``drop``, instead of deadlocking.

Output: ``o`` shows only committed frames, back to back, at one beat per cycle while ``o.ready``
is high; a frame's beats are never separated by a bubble once the frame is committed. Latency:
a frame's first beat is on ``o`` 3 cycles after its last beat is accepted on ``i``. The payload
is :func:`netreduce.hw.stream.beat_layout`; ``first`` is regenerated on ``o`` (1 after reset and
after every ``last``), so an input may leave it 0. ``error`` and ``keep`` pass through unchanged.

``drop_errors=True`` (the shell's RX side): a frame whose last beat has ``error`` (the MAC's
bad FCS, too long, ...) is rolled back like a frame that did not fit, and ``drop_error`` pulses
once for it instead of ``drop``: an errored frame never reaches the core.

Storage: one simple-dual-port memory of ``depth`` entries of ``data + keep + 2`` bits (block RAM;
a 512-bit beat is 578 bits wide), its read port not transparent. Reset: synchronous; empties the
FIFO.

Logic depth: the FIFO runs in the MAC clock domain (322.27 MHz: at most 6 LUT levels per
register-to-register path, docs/engine.md "Clock plan"). ``o.valid``, ``full`` and "holds a
complete frame" are registers, computed a cycle ahead from equalities of the registered pointers;
nothing compares the read address with the write address (a transparent read port would put that
compare and a bypass mux of the whole entry behind ``o.ready``), and ``o.ready`` only selects
between two registered read addresses.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..stream import beat_signature, check_data_width

__all__ = ["FrameFifo"]


class FrameFifo(wiring.Component):
    """Store-and-forward FIFO of whole frames (see the module docstring for the contract).

    Parameters: ``data_width`` (bits per beat), ``depth`` (beats, a power of two >= 4),
    ``drop_when_full`` (RX behaviour: never back-pressure, drop whole frames instead).
    Ports: ``i`` (In beat stream), ``o`` (Out beat stream), ``drop`` (Out, 1-cycle pulse per
    dropped frame), ``level`` (Out: beats held, for watermarks such as PFC's).
    """

    def __init__(self, data_width: int = 512, depth: int = 128, *, drop_when_full: bool,
                 drop_errors: bool = False):
        if not isinstance(depth, int) or depth < 4 or depth & (depth - 1):
            self._MustUse__silence = True
            raise ValueError(f"depth {depth!r} must be a power of two >= 4")
        try:
            check_data_width(data_width)
        except ValueError:
            self._MustUse__silence = True
            raise
        self.data_width = data_width
        self.depth = depth
        self.drop_when_full = drop_when_full
        self.drop_errors = drop_errors
        super().__init__({
            "i": In(beat_signature(data_width)),
            "o": Out(beat_signature(data_width)),
            "drop": Out(1),
            "drop_error": Out(1),
            "level": Out(range(depth + 1)),   # beats held, the partial frame's included
        })

    def elaborate(self, platform):
        m = Module()
        w = self.data_width
        D = self.depth
        aw = (D - 1).bit_length()
        entry = data.StructLayout({"data": w, "keep": w // 8, "last": 1, "error": 1})
        m.submodules.mem = mem = Memory(shape=entry, depth=D, init=[])
        wp = mem.write_port()
        rp = mem.read_port()     # not transparent: ``o`` never shows a same-cycle write

        # pointers carry one extra bit so full (depth entries) and empty differ
        rd = Signal(aw + 1)            # entry shown on ``o``
        rd1 = Signal(aw + 1, init=1)   # rd + 1
        commit = Signal(aw + 1)        # end of the last complete frame
        wr = Signal(aw + 1)            # write position inside the frame being received
        dropping = Signal()            # swallowing the rest of a dropped frame
        level = Signal(aw + 1)
        m.d.comb += [level.eq(wr - rd), self.level.eq(level)]
        # flags kept as registers (next-cycle values from pointer equalities, see below)
        full = Signal()                # level == depth
        complete = Signal()            # commit != rd: a complete frame is held

        if self.drop_when_full:
            m.d.comb += self.i.ready.eq(1)
        else:
            # full of complete frames: wait; full of one partial frame: it can never fit, drop it
            m.d.comb += self.i.ready.eq(~full | ~complete)

        m.d.comb += [
            wp.addr.eq(wr[:aw]),
            wp.data.data.eq(self.i.payload.data),
            wp.data.keep.eq(self.i.payload.keep),
            wp.data.last.eq(self.i.payload.last),
            wp.data.error.eq(self.i.payload.error),
        ]
        we, rollback, close = Signal(), Signal(), Signal()   # write, wr := commit, commit := wr + 1
        m.d.sync += [self.drop.eq(0), self.drop_error.eq(0)]
        with m.If(self.i.valid & self.i.ready):
            with m.If(dropping):
                with m.If(self.i.payload.last):
                    m.d.sync += dropping.eq(0)
            with m.Elif(~full):
                m.d.comb += we.eq(1)
                with m.If(self.i.payload.last):
                    if self.drop_errors:
                        # a frame the MAC flagged (FCS, too long, ...): rolled back, counted
                        with m.If(self.i.payload.error):
                            m.d.comb += rollback.eq(1)
                            m.d.sync += self.drop_error.eq(1)
                        with m.Else():
                            m.d.comb += close.eq(1)
                    else:
                        m.d.comb += close.eq(1)
            with m.Else():
                m.d.comb += rollback.eq(1)
                m.d.sync += self.drop.eq(1)
                with m.If(~self.i.payload.last):
                    m.d.sync += dropping.eq(1)
        m.d.comb += wp.en.eq(we)
        with m.If(rollback):
            m.d.sync += wr.eq(commit)
        with m.Elif(we):
            m.d.sync += wr.eq(wr + 1)
        with m.If(close):
            m.d.sync += commit.eq(wr + 1)

        # read side: the sync read port is addressed with the *next* read pointer (rd or rd1, no
        # adder behind ``o.ready``), so its data output holds entry ``rd``
        pop = Signal()
        shown = Signal()
        out_first = Signal(init=1)
        m.d.comb += [
            self.o.valid.eq(shown),
            pop.eq(self.o.valid & self.o.ready),
            rp.addr.eq(Mux(pop, rd1, rd)[:aw]),
            rp.en.eq(1),
            self.o.payload.data.eq(rp.data.data),
            self.o.payload.keep.eq(rp.data.keep),
            self.o.payload.last.eq(rp.data.last),
            self.o.payload.error.eq(rp.data.error),
            self.o.payload.first.eq(out_first),
        ]
        with m.If(pop):
            m.d.sync += [rd.eq(rd1), rd1.eq(rd1 + 1), out_first.eq(rp.data.last)]

        # the flags of the next cycle, from equalities of the registered pointers (no
        # subtraction in front of a decision):
        # - ``o`` shows next cycle what ``commit`` holds now (so every entry it shows was written
        #   at least one cycle before the read port reads it)
        # - ``complete`` stays true when a frame closes now (the entry just written is unread)
        after_pop = commit != rd1
        m.d.sync += [
            shown.eq(Mux(pop, after_pop, complete)),
            complete.eq(close | Mux(pop, after_pop, complete)),
        ]
        # ``full``: a pop frees an entry, and a write (we => not full) keeps it at most full, so
        # after a pop it is 0; after a write, level == depth - 1 now; after a rollback, full
        # stays only if the FIFO is full of complete frames (no partial frame to roll back)
        partial = Signal()             # wr != commit: beats of an unfinished frame are held
        with m.If(rollback | close):
            m.d.sync += partial.eq(0)
        with m.Elif(we):
            m.d.sync += partial.eq(1)
        with m.If(pop):
            m.d.sync += full.eq(0)
        with m.Elif(rollback):
            m.d.sync += full.eq(full & ~partial)
        with m.Elif(we):
            m.d.sync += full.eq(level == D - 1)
        return m
