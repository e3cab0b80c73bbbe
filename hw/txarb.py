"""The engine's per-port TX arbiter: forwarded frames and deparser frames onto one output."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .stream import beat_signature

__all__ = ["TxArbiter"]


class TxArbiter(wiring.Component):
    """Frame-by-frame arbiter of one output port.

    Members: ``fwd`` (In: forwarded frames), ``dep`` (In: deparser frames for this port), ``o``
    (Out: the port), ``last`` (Out: a frame's last beat left this cycle, for ``tx_frames``).

    Contract: whole frames, alternating between the two sources when both have one waiting;
    ``o.payload.first`` is rebuilt. A beat on offer stays on offer until taken (AXI-Stream):
    the source is locked from the first beat offered to the last beat taken. Latency 0
    (combinational from the sources to ``o``; the ready of a source is ``o.ready`` while it
    holds the port). Throughput one beat per cycle. No errors.
    """

    def __init__(self, width: int):
        self.width = width
        super().__init__({"fwd": In(beat_signature(width)), "dep": In(beat_signature(width)),
                          "o": Out(beat_signature(width)), "last": Out(1)})

    def elaborate(self, platform):
        m = Module()
        o, fwd, dep = self.o, self.fwd, self.dep
        lock = Signal(2)        # 0 free, 1 forward, 2 deparser
        prefer_dep = Signal()
        in_frame = Signal()
        use_dep = Signal()
        with m.Switch(lock):
            with m.Case(1):
                m.d.comb += use_dep.eq(0)
            with m.Case(2):
                m.d.comb += use_dep.eq(1)
            with m.Default():
                m.d.comb += use_dep.eq(dep.valid & (prefer_dep | ~fwd.valid))
        with m.If(use_dep):
            m.d.comb += [o.valid.eq(dep.valid), o.payload.eq(dep.payload)]
        with m.Else():
            m.d.comb += [o.valid.eq(fwd.valid), o.payload.eq(fwd.payload)]
        m.d.comb += o.payload.first.eq(~in_frame)
        hs = o.valid & o.ready
        m.d.comb += [fwd.ready.eq(o.ready & ~use_dep), dep.ready.eq(use_dep & o.ready)]
        with m.If(hs):
            m.d.sync += in_frame.eq(~o.payload.last)
            with m.If(o.payload.last):
                m.d.sync += [lock.eq(0), prefer_dep.eq(~use_dep)]
            with m.Else():
                m.d.sync += lock.eq(Mux(use_dep, 2, 1))
        with m.Elif(o.valid):
            # a beat on offer stays on offer (AXI-Stream): keep its source until taken
            m.d.sync += lock.eq(Mux(use_dep, 2, 1))
        m.d.comb += self.last.eq(hs & o.payload.last)
        return m
