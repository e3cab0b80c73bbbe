"""A skid buffer: a registered stream boundary between two blocks."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Two-entry stream register (an output register and a skid register).

    Members: ``i`` (In, stream of ``shape``), ``o`` (Out, stream of ``shape``).

    Contract: ``o.valid`` / ``o.payload`` and ``i.ready`` are flip-flop outputs: no combinational
    path from any input to any output, so a valid/ready chain through it is cut both ways.
    Latency 1 cycle; throughput one item per cycle (sustained with ``o.ready`` high); order kept,
    nothing dropped. When ``o`` stalls, one more item is taken into the skid register, then
    ``i.ready`` drops in the next cycle. Cost: 2 x (width of ``shape`` + 1) flip-flops.
    """

    def __init__(self, shape):
        self.shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        s_valid = Signal()
        s_data = Signal(self.shape)
        m.d.comb += i.ready.eq(~s_valid)
        take = i.valid & ~s_valid
        with m.If(~o.valid | o.ready):
            with m.If(s_valid):
                m.d.sync += [o.valid.eq(1), o.payload.eq(s_data), s_valid.eq(0)]
            with m.Else():
                m.d.sync += [o.valid.eq(take), o.payload.eq(i.payload)]
        with m.Elif(take):
            m.d.sync += [s_valid.eq(1), s_data.eq(i.payload)]
        return m
