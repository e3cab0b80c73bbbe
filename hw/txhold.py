"""Per-port TX hold gate of a multi-port engine: a held port drops its frames, the others go on.

A port whose transmitter is held (PAUSE/PFC honoured by the MAC, a shell FIFO that stays full) or
whose link is down without a link gate stops taking beats. Everything that leaves the engine on
that port (forwarded frames, results, re-emits, probes, CNPs) backs up behind it, and with one
emitter or one round of results for several ports at once the other ports would wait too.
:class:`TxHoldGate`, the last stage before ``o_p<k>``, bounds that wait (model D21):

* The port's output queue (``depth`` beats) absorbs ordinary backpressure; nothing is dropped
  while the port takes beats.
* The port is *held* once a beat has been on offer at ``o`` for ``2**hold - 1`` cycles without
  being taken (``hold`` = ``PORT.FC_CTRL.tx_hold``; 0: never held, the port stalls the engine
  as long as it is stuck). It stays held until ``o`` takes a beat.
* While held, every frame that starts at ``i`` is taken at one beat per cycle and discarded
  whole; ``drop`` pulses once for it. A frame already passing into the queue when the hold
  begins keeps passing while the queue has room; if the queue fills under it, it is ended with
  one beat ``keep = 1, last = 1, error = 1`` (the MAC sends it with a bad FCS; one queue entry
  is kept free for that beat), its rest is discarded, and ``drop`` pulses for it.
* So ``i`` never waits more than about ``2**hold`` cycles for a held port, and the frames
  queued before the hold leave when it ends.

Latency: the queue's (2 cycles from ``i`` to ``o``); throughput one beat per cycle; ``i.ready``
and ``o.valid`` / ``o.payload`` are register outputs or functions of registers and ``i.valid``.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from .stream import beat_layout, beat_signature, check_data_width

__all__ = ["TxHoldGate", "HOLD_BITS"]

HOLD_BITS = 5  # width of PORT.FC_CTRL.tx_hold (log2 of the hold bound in cycles)


class TxHoldGate(wiring.Component):
    """See the module docstring. Members: ``i`` (In, beats from the port's TX arbiter), ``o``
    (Out, the port), ``hold`` (In, log2 of the bound; 0 disables dropping), ``held`` (Out, level),
    ``drop`` (Out, one pulse per dropped or cut frame)."""

    def __init__(self, width: int, depth: int = 4):
        self.width = check_data_width(width)
        if depth < 3:
            raise ValueError(f"depth = {depth}: the queue needs at least 3 entries")
        self.depth = depth
        super().__init__({"i": In(beat_signature(width)), "o": Out(beat_signature(width)),
                          "hold": In(HOLD_BITS), "held": Out(1), "drop": Out(1)})

    def elaborate(self, platform):
        m = Module()
        lay = beat_layout(self.width)
        m.submodules.q = q = fifo.SyncFIFOBuffered(width=lay.size, depth=self.depth)
        q_w, q_r = data.View(lay, q.w_data), data.View(lay, q.r_data)
        i, o = self.i, self.o
        m.d.comb += [o.valid.eq(q.r_rdy), o.payload.eq(q_r), q.r_en.eq(o.ready)]

        # hold detection: cycles with a beat on offer and not taken, against 2**hold - 1
        bound_bits = (1 << HOLD_BITS) - 1
        lim = Signal(bound_bits, name="hold_lim")
        enabled = Signal()
        m.d.sync += [lim.eq((Const(1, bound_bits + 1) << self.hold) - 1),
                     enabled.eq(self.hold != 0)]
        stuck = Signal(bound_bits)
        held = self.held
        with m.If(o.valid & o.ready):
            m.d.sync += [stuck.eq(0), held.eq(0)]
        with m.Elif(o.valid):
            with m.If(stuck != lim):
                m.d.sync += stuck.eq(stuck + 1)
            m.d.sync += held.eq(enabled & (stuck == lim))
        with m.If(~enabled):
            m.d.sync += held.eq(0)

        # frames into the queue, or discarded while held
        t_in = Signal()      # i is inside a frame
        dropping = Signal()  # the current frame is discarded
        room = q.level < self.depth - 1   # one entry stays free for a cut's error beat
        m.d.sync += self.drop.eq(0)
        with m.If(t_in & ~dropping & held & ~room):
            m.d.comb += [q.w_en.eq(1), q_w.keep.eq(1), q_w.last.eq(1), q_w.error.eq(1)]
            m.d.sync += [dropping.eq(1), self.drop.eq(1)]
        with m.Elif(dropping | (~t_in & held)):
            m.d.comb += i.ready.eq(1)
            with m.If(i.valid):
                m.d.sync += [t_in.eq(~i.payload.last), dropping.eq(~i.payload.last)]
                with m.If(~t_in):   # a frame started while held: counted once, at its start
                    m.d.sync += self.drop.eq(1)
        with m.Else():
            m.d.comb += [q.w_en.eq(i.valid & room), q_w.eq(i.payload), i.ready.eq(room)]
            with m.If(i.valid & room):
                m.d.sync += t_in.eq(~i.payload.last)
        return m
