"""The assembled packet path for RTL tests: parser -> (payload XOR) -> deparser, plus bypass.

:class:`PacketLoopback` is test scaffolding (not the engine's core): it routes every frame the
:class:`~netreduce.hw.packet.parser.Parser` classifies as ``DATA`` through the
:class:`~netreduce.hw.packet.deparser.Deparser` and every other frame through the parser's bypass
copy, back into one output stream in arrival order. An input ``payload_xor`` XORs every payload
byte on the way (0: a pure loopback), ``ce_to_ect0`` asks the deparser for the ECN rewrite, so the
testbench can check the recomputed ICRC and IPv4 checksum against netreduce.wire.

Taps ``hdr_tap``/``verdict_tap`` (``m_axis_hdr_tap``/``m_axis_verdict_tap``, no tready) show
each parser header record and verdict as it is taken, for header-field and classification checks.

Output ``error`` on a frame's last beat: the parser's verdict is ``MALFORMED`` (or the deparser
flagged a payload length mismatch). Every frame comes out (nothing is dropped here), in order.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from netreduce.hw.packet.deparser import Deparser
from netreduce.hw.packet.layout import Kind, header_record_layout, verdict_layout
from netreduce.hw.packet.parser import Parser
from netreduce.hw.stream import beat_signature
from netreduce.hw.verilog import AxisTop, generate

__all__ = ["PacketLoopback", "packet_loopback_top"]


class PacketLoopback(wiring.Component):
    """Parser -> deparser loopback with bypass (see module doc). One beat per cycle sustained
    as far as the parser and deparser allow; latency = the deparser's plus the parser's."""

    def __init__(self, data_width: int = 512):
        self.data_width = data_width
        super().__init__({
            "i": In(beat_signature(data_width)),
            "o": Out(beat_signature(data_width)),
            "payload_xor": In(8),
            "ce_to_ect0": In(1),
            # taps (no backpressure): every parser header record and verdict as it is taken
            "hdr_tap": Out(stream.Signature(header_record_layout(), always_ready=True)),
            "verdict_tap": Out(stream.Signature(verdict_layout(), always_ready=True)),
            "data_frames": Out(32),
            "bypass_frames": Out(32),
            "error_frames": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self.data_width // 8
        m.submodules.parser = p = Parser(self.data_width)
        m.submodules.deparser = d = Deparser(self.data_width)
        wiring.connect(m, wiring.flipped(self.i), p.i)

        # one routing decision per frame (1 = DATA: deparser), read by the copy consumer and
        # by the output mux independently
        m.submodules.route_copy = rc = fifo.SyncFIFO(width=1, depth=8)
        m.submodules.route_out = ro = fifo.SyncFIFO(width=1, depth=8)
        hdr = p.hdr.payload
        is_data = hdr.kind == Kind.DATA
        room = rc.w_rdy & ro.w_rdy
        take_hdr = p.hdr.valid & room & (~is_data | d.hdr.ready)
        m.d.comb += [
            p.hdr.ready.eq(room & (~is_data | d.hdr.ready)),
            d.hdr.valid.eq(p.hdr.valid & is_data & room),
            d.hdr.payload.raw.eq(hdr.raw),
            d.hdr.payload.hdr_len.eq(hdr.hdr_len),
            d.hdr.payload.plen.eq(hdr.plen),
            d.hdr.payload.ce_to_ect0.eq(self.ce_to_ect0),
            rc.w_en.eq(take_hdr), rc.w_data.eq(is_data),
            ro.w_en.eq(take_hdr), ro.w_data.eq(is_data),
        ]

        # payload: XOR every valid byte
        pay = p.payload.payload
        mask = Cat(*[Mux(pay.keep[i], self.payload_xor, 0) for i in range(nb)])
        m.d.comb += [
            d.payload.payload.eq(pay),
            d.payload.payload.data.eq(pay.data ^ mask),
            d.payload.valid.eq(p.payload.valid),
            p.payload.ready.eq(d.payload.ready),
        ]

        # bypass copy: drop the copies of DATA frames, pass the rest on
        fr = p.frame
        b_valid, b_ready = Signal(), Signal()
        drop = rc.r_data
        m.d.comb += [
            fr.ready.eq(rc.r_rdy & (drop | b_ready)),
            b_valid.eq(fr.valid & rc.r_rdy & ~drop),
            rc.r_en.eq(fr.valid & fr.ready & fr.payload.last),
        ]

        # output mux, frame by frame in arrival order; a last beat waits for its verdict
        sel = ro.r_data
        src = Mux(sel, d.o.payload.as_value(), fr.payload.as_value())
        src_valid = Mux(sel, d.o.valid, b_valid)
        beat = Signal.like(self.o.payload)
        m.d.comb += beat.eq(src)
        last = beat.last
        can = ro.r_rdy & (~last | p.verdict.valid)
        bad = p.verdict.payload.kind == Kind.MALFORMED
        fire = self.o.valid & self.o.ready
        m.d.comb += [
            self.o.valid.eq(can & src_valid),
            self.o.payload.eq(beat),
            self.o.payload.error.eq(last & (beat.error | bad)),
            d.o.ready.eq(can & sel & self.o.ready),
            b_ready.eq(can & ~sel & self.o.ready),
            p.verdict.ready.eq(fire & last),
            ro.r_en.eq(fire & last),
        ]
        m.d.comb += [
            self.hdr_tap.valid.eq(p.hdr.valid & p.hdr.ready),
            self.hdr_tap.payload.eq(p.hdr.payload),
            self.verdict_tap.valid.eq(p.verdict.valid & p.verdict.ready),
            self.verdict_tap.payload.eq(p.verdict.payload),
        ]
        with m.If(fire & last):
            with m.If(sel):
                m.d.sync += self.data_frames.eq(self.data_frames + 1)
            with m.Else():
                m.d.sync += self.bypass_frames.eq(self.bypass_frames + 1)
            with m.If(self.o.payload.error):
                m.d.sync += self.error_frames.eq(self.error_frames + 1)
        return m


def packet_loopback_top(data_width: int = 512, cached: bool = True) -> AxisTop:
    """The generated AXI-Stream top of :class:`PacketLoopback` (module ``packet<width>``).

    ``cached``: reuse the Verilog generated from the same sources (see ``generate_cached``).
    """
    if cached:
        from .runner import generate_cached
        return generate_cached(PacketLoopback, data_width, name=f"packet{data_width}",
                               sources=("netreduce.hw.packet", "netreduce.hw.stream",
                                        "netreduce.hw.verilog", "netreduce.wire"))
    return generate(PacketLoopback(data_width), f"packet{data_width}")
