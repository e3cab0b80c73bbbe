"""Per-port link gate between a MAC's FIFOs and the core: the core's state survives a link flap.

The core has its own reset (the board reset), not a MAC's user reset, so a MAC reset or a link
flap on any port leaves jobs, flows and slots intact. What the core must never see is a frame
broken by the flap, and it must never stall because one port is down. :class:`LinkGate`, in the
core's clock domain, guarantees both:

* RX (``rx_i`` from the port's RX FIFO or clock crossing -> ``rx_o`` to the core): frames pass
  unchanged while ``up``. A frame the core has started that cannot finish (``up`` falls, or a
  beat with ``first`` arrives inside it because the FIFO was reset under it) is ended with one
  beat ``keep = 0, last = 1, error = 1``: a MAC-errored frame, which the engine never
  aggregates. While down, ``rx_i`` is drained and discarded; after a cut, beats are discarded
  until the next one with ``first``. ``rx_cut`` pulses per ended frame.
* TX (``tx_i`` from the core -> ``tx_o`` to the port's TX FIFO or crossing): a frame that starts
  while ``up`` passes; one that starts while down is taken and discarded whole at one beat per
  cycle (``tx_drop`` pulses once for it), so a down port never backpressures the core. A
  frame passing when ``up`` falls is ended towards the MAC with one beat ``keep = 1, last = 1,
  error = 1`` (the MAC sends it with a bad FCS, or the reset FIFO discards it) and its rest is
  discarded.
* No latency (combinational paths); the gate's own registers are a few bits per direction.
* Reset: the core domain's (synchronous); ``up`` must be synchronised into that domain.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import beat_signature, check_data_width

__all__ = ["LinkGate"]


class LinkGate(wiring.Component):
    """See the module docstring. Ports: ``up`` (In), ``rx_i``/``tx_i`` (In), ``rx_o``/``tx_o``
    (Out) beat streams of ``width`` bits, ``rx_cut``/``tx_drop`` (Out, one-cycle pulses)."""

    def __init__(self, width: int = 512):
        self.width = check_data_width(width)
        super().__init__({
            "up": In(1),
            "rx_i": In(beat_signature(width)), "rx_o": Out(beat_signature(width)),
            "tx_i": In(beat_signature(width)), "tx_o": Out(beat_signature(width)),
            "rx_cut": Out(1), "tx_drop": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        up = self.up

        # ---- RX
        ri, ro = self.rx_i, self.rx_o
        in_frame = Signal()      # the core has taken beats of a frame without its last
        resync = Signal()        # discard until a beat with first
        broken = in_frame & (~up | (ri.valid & ri.payload.first))
        m.d.sync += self.rx_cut.eq(0)
        with m.If(broken):
            m.d.comb += [ro.valid.eq(1), ro.payload.keep.eq(0), ro.payload.last.eq(1),
                         ro.payload.error.eq(1), ro.payload.first.eq(0), ri.ready.eq(0)]
            with m.If(ro.ready):
                m.d.sync += [in_frame.eq(0), resync.eq(~up | ~ri.payload.first),
                             self.rx_cut.eq(1)]
        with m.Elif(~up | (resync & ~(ri.valid & ri.payload.first))):
            m.d.comb += [ro.valid.eq(0), ri.ready.eq(1)]         # drain
            with m.If(~up):
                m.d.sync += resync.eq(1)
        with m.Else():
            m.d.comb += [ro.valid.eq(ri.valid), ro.payload.eq(ri.payload), ri.ready.eq(ro.ready)]
            with m.If(ro.valid & ro.ready):
                m.d.sync += [in_frame.eq(~ri.payload.last), resync.eq(0)]

        # ---- TX
        ti, to = self.tx_i, self.tx_o
        t_in = Signal()          # tx_i is inside a frame
        dropping = Signal()      # the current frame is discarded
        passing = t_in & ~dropping
        m.d.sync += self.tx_drop.eq(0)
        with m.If(passing & ~up):
            # end the frame towards the MAC as a bad one, discard the rest
            m.d.comb += [to.valid.eq(1), to.payload.keep.eq(1), to.payload.last.eq(1),
                         to.payload.error.eq(1), to.payload.first.eq(0), ti.ready.eq(0)]
            with m.If(to.ready):
                m.d.sync += [dropping.eq(1), self.tx_drop.eq(1)]
        with m.Elif(dropping | (~t_in & ~up)):
            m.d.comb += [to.valid.eq(0), ti.ready.eq(1)]
            with m.If(ti.valid):
                m.d.sync += [t_in.eq(~ti.payload.last), dropping.eq(~ti.payload.last)]
                with m.If(~t_in):   # a frame started while down: counted once, at its start
                    m.d.sync += self.tx_drop.eq(1)
        with m.Else():
            m.d.comb += [to.valid.eq(ti.valid), to.payload.eq(ti.payload), ti.ready.eq(to.ready)]
            with m.If(ti.valid & ti.ready):
                m.d.sync += t_in.eq(~ti.payload.last)
        return m

