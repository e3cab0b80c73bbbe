"""A small reference DUT for the cocotb infrastructure: a registered stream pass-through.

It exercises everything the AXI-Stream top generator maps (data, keep, first, last, user fields,
a plain output port) without depending on the packet path, so the harness is proven on its own.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["beat_layout", "SkidPassThrough"]


def beat_layout(width: int) -> data.StructLayout:
    """data, keep (one bit per byte), first, last, and two user fields (err: 1, tag: 3)."""
    if width % 8 or width <= 0:
        raise ValueError(f"data width {width} is not a positive multiple of 8")
    return data.StructLayout({
        "data": width, "keep": width // 8, "first": 1, "last": 1,
        "user": data.StructLayout({"err": 1, "tag": 3}),
    })


class SkidPassThrough(wiring.Component):
    """Registered pass-through with a skid register: one beat per cycle, registered ready.

    Latency 1 cycle. Backpressure: ``i.ready`` is a register (low only while the skid register
    holds a beat), so the upstream combinational path is cut. ``frames`` counts input beats that
    carry ``first`` (so it checks that the top derives ``first`` from ``tlast``); ``beats`` counts
    output beats.

    ``faulty=True`` builds a broken variant (``i.ready`` stuck high, so a beat that arrives while
    the skid register is full overwrites it) that the harness's own tests must catch.
    """

    def __init__(self, width: int = 64, *, faulty: bool = False):
        self.width = width
        self.faulty = faulty
        layout = beat_layout(width)
        super().__init__({
            "i": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
            "frames": Out(32),
            "beats": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        skid = Signal.like(self.i.payload)
        skid_valid = Signal()
        m.d.comb += self.i.ready.eq(1 if self.faulty else ~skid_valid)
        with m.If(self.i.valid & self.i.ready & self.i.payload.first):
            m.d.sync += self.frames.eq(self.frames + 1)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.beats.eq(self.beats + 1)

        with m.If(~self.o.valid | self.o.ready):
            # output register free (or being emptied): load from skid first, else from input
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & self.i.ready):
            # output stalled: park the accepted beat in the skid register
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
