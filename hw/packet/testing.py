"""Simulation helpers for the packet path: frames <-> beats and stream drivers/monitors.

Used by the Amaranth simulator tests (tests/hw/test_packet_*.py) and bench/packet_path.py. The
drivers follow the verilog-ethernet test style: a source may insert random idle cycles, a sink may
drop ``ready`` at random (``idle`` / ``stall`` probabilities, seeded).
"""

from __future__ import annotations

import random

from amaranth.lib import data

__all__ = ["frame_to_beats", "beats_to_frames", "beat_bytes", "StreamSource", "StreamSink",
           "to_python"]


def frame_to_beats(frame: bytes, nbytes: int, error: bool = False) -> list[dict]:
    """Beats (dicts of the beat layout's fields) of one frame; ``error`` on the last beat."""
    beats = []
    for off in range(0, max(len(frame), 1), nbytes):
        chunk = frame[off:off + nbytes]
        last = off + nbytes >= len(frame)
        beats.append({"data": int.from_bytes(chunk, "little"), "keep": (1 << len(chunk)) - 1,
                      "first": int(off == 0), "last": int(last), "error": int(error and last)})
    return beats


def beat_bytes(beat: dict, nbytes: int) -> bytes:
    """The valid bytes of one beat (``keep`` taken as a thermometer code)."""
    n = bin(beat["keep"]).count("1")
    return beat["data"].to_bytes(nbytes, "little")[:n]


def beats_to_frames(beats: list[dict], nbytes: int) -> list[tuple[bytes, dict]]:
    """Group beats into frames: ``[(bytes, last_beat)]``."""
    out, cur = [], b""
    for b in beats:
        cur += beat_bytes(b, nbytes)
        if b["last"]:
            out.append((cur, b))
            cur = b""
    return out


def to_python(value):
    """A sampled struct/array/enum value as plain Python: dicts, lists, ints, enum members."""
    if isinstance(value, data.Const):
        layout = value.shape()
        if isinstance(layout, data.ArrayLayout):
            return [to_python(value[i]) for i in range(layout.length)]
        return {name: to_python(value[name]) for name, _ in layout}
    return value


class StreamSource:
    """Drive ``items`` into an ``amaranth.lib.stream`` port, with random idle cycles."""

    def __init__(self, port, items, *, idle: float = 0.0, seed: int = 0):
        self.port, self.items, self.idle = port, list(items), idle
        self.rng = random.Random(seed)
        self.done = False
        self.cycles: list[int] = []   # cycle of each transfer (this source's clock count)

    async def run(self, ctx):
        port = self.port
        cycle = 0
        valid = False
        for item in self.items:
            while self.idle and self.rng.random() < self.idle:
                ctx.set(port.valid, 0)
                valid = False
                await ctx.tick()
                cycle += 1
            ctx.set(port.payload, item)
            if not valid:
                ctx.set(port.valid, 1)
                valid = True
            while True:
                _, _, ready = await ctx.tick().sample(port.ready)
                cycle += 1
                if ready:
                    self.cycles.append(cycle - 1)
                    break
        ctx.set(port.valid, 0)
        self.done = True


class StreamSink:
    """Collect payloads (as :func:`to_python` values) from a stream port; random ``ready`` drops.

    ``cycles`` holds the cycle number (of this sink's clock count) of every transfer.
    """

    def __init__(self, port, *, stall: float = 0.0, seed: int = 1):
        self.port, self.stall = port, stall
        self.rng = random.Random(seed)
        self.items: list = []
        self.cycles: list[int] = []

    async def run(self, ctx):
        port = self.port
        cycle = 0
        prev = None
        while True:
            ready = not (self.stall and self.rng.random() < self.stall)
            if ready != prev:   # every set costs a simulator delta cycle
                ctx.set(port.ready, ready)
                prev = ready
            _, _, valid, payload = await ctx.tick().sample(port.valid, port.payload)
            if ready and valid:
                self.items.append(to_python(payload))
                self.cycles.append(cycle)
            cycle += 1


# ------------------------------------------------------------------------------------ harnesses

def _sim(dut, sources, sinks, *, settle: int = 50, watch=None):
    """Run ``dut`` with ``sources`` (StreamSource) and ``sinks`` (StreamSink) until the first
    source is done and the outputs were quiet for ``settle`` cycles. ``watch(ctx)`` is an extra
    background testbench. Returns the number of cycles until the last source item was taken."""
    from amaranth.sim import Simulator

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    state = {"cycles": 0}

    async def main(ctx):
        cycles = 0
        while not all(s.done for s in sources):
            await ctx.tick()
            cycles += 1
        state["cycles"] = cycles
        quiet = 0
        last = sum(len(s.items) for s in sinks)
        while quiet < settle:
            await ctx.tick()
            now = sum(len(s.items) for s in sinks)
            quiet = 0 if now != last else quiet + 1
            last = now

    sim.add_testbench(main)
    for s in sources:
        sim.add_testbench(s.run, background=True)
    for s in sinks:
        sim.add_testbench(s.run, background=True)
    if watch is not None:
        sim.add_testbench(watch, background=True)
    sim.run()
    return state["cycles"]


def run_parser(data_width: int, frames, *, errors=None, idle=0.0, stall=0.0, seed=0):
    """Feed ``frames`` (bytes; ``errors[i]`` sets the MAC error flag) through a Parser.

    Returns a dict with ``hdr``, ``verdict`` (lists of to_python records), ``payload`` and
    ``frame`` (lists of ``(bytes, last_beat)``), ``cycles`` (until the last input beat was taken)
    and ``in_beats`` (input beats).
    """
    from .parser import Parser

    nb = data_width // 8
    dut = Parser(data_width)
    errors = errors or [False] * len(frames)
    beats = [b for f, e in zip(frames, errors, strict=True) for b in frame_to_beats(f, nb, e)]
    src = StreamSource(dut.i, beats, idle=idle, seed=seed)
    sinks = {name: StreamSink(getattr(dut, name), stall=stall, seed=seed + 1 + i)
             for i, name in enumerate(("hdr", "payload", "frame", "verdict"))}
    cycles = _sim(dut, [src], list(sinks.values()))
    return {
        "hdr": sinks["hdr"].items, "verdict": sinks["verdict"].items,
        "payload": beats_to_frames(sinks["payload"].items, nb),
        "frame": beats_to_frames(sinks["frame"].items, nb),
        "cycles": cycles, "in_beats": len(beats), "sinks": sinks,
        "in_span": src.cycles[-1] - src.cycles[0] + 1 if src.cycles else 0,
        "src_cycles": src.cycles,
    }


def deparse_header(raw: bytes, hdr_len: int, plen: int, ce_to_ect0: bool = False) -> dict:
    """A Deparser ``hdr`` item from header bytes."""
    from .layout import HDR_CAP

    raw = bytes(raw[:HDR_CAP]).ljust(HDR_CAP, b"\0")
    return {"raw": list(raw), "hdr_len": hdr_len, "plen": plen, "ce_to_ect0": int(ce_to_ect0)}


def payload_beats(payload: bytes, nbytes: int) -> list[dict]:
    """Payload stream beats; an empty payload is one beat with keep == 0."""
    if not payload:
        return [{"data": 0, "keep": 0, "first": 1, "last": 1, "error": 0}]
    return frame_to_beats(payload, nbytes)


def run_deparser(data_width: int, items, *, idle=0.0, stall=0.0, seed=0):
    """Build frames from ``items`` = [(deparse_header dict, payload bytes)] through a Deparser.

    Returns ``{"o": [(bytes, last_beat)], "cycles": ..., "out_beats": ...}``.
    """
    from .deparser import Deparser

    nb = data_width // 8
    dut = Deparser(data_width)
    hsrc = StreamSource(dut.hdr, [h for h, _ in items], idle=idle, seed=seed)
    psrc = StreamSource(dut.payload, [b for _, p in items for b in payload_beats(p, nb)],
                        idle=idle, seed=seed + 7)
    sink = StreamSink(dut.o, stall=stall, seed=seed + 1)
    cycles = _sim(dut, [hsrc, psrc], [sink])
    return {"o": beats_to_frames(sink.items, nb), "cycles": cycles, "out_beats": len(sink.items),
            "sink": sink, "hdr_cycles": hsrc.cycles}


def loopback_top(data_width: int):
    """Parser -> Deparser with the parser's DATA header records as deparser headers.

    Non-DATA records are dropped (they have no payload); ``frame`` and ``verdict`` are exposed
    for the testbench to drain. Ports: ``i``, ``o``, ``frame``, ``verdict``, ``ce_to_ect0``.
    """
    from amaranth.hdl import Module
    from amaranth.lib import stream, wiring
    from amaranth.lib.wiring import In, Out

    from ..stream import beat_signature
    from .deparser import Deparser
    from .layout import Kind, verdict_layout
    from .parser import Parser

    class Loopback(wiring.Component):
        def __init__(self):
            super().__init__({
                "i": In(beat_signature(data_width)),
                "o": Out(beat_signature(data_width)),
                "frame": Out(beat_signature(data_width)),
                "verdict": Out(stream.Signature(verdict_layout())),
                "ce_to_ect0": In(1),
            })

        def elaborate(self, platform):
            m = Module()
            m.submodules.parser = p = Parser(data_width)
            m.submodules.deparser = d = Deparser(data_width)
            wiring.connect(m, wiring.flipped(self.i), p.i)
            wiring.connect(m, p.payload, d.payload)
            wiring.connect(m, d.o, wiring.flipped(self.o))
            wiring.connect(m, p.frame, wiring.flipped(self.frame))
            wiring.connect(m, p.verdict, wiring.flipped(self.verdict))
            rec = p.hdr.payload
            is_data = rec.kind == Kind.DATA
            m.d.comb += [
                d.hdr.valid.eq(p.hdr.valid & is_data),
                d.hdr.payload.raw.eq(rec.raw), d.hdr.payload.hdr_len.eq(rec.hdr_len),
                d.hdr.payload.plen.eq(rec.plen), d.hdr.payload.ce_to_ect0.eq(self.ce_to_ect0),
                p.hdr.ready.eq(~is_data | d.hdr.ready),
            ]
            return m

    return Loopback()


def run_loopback(data_width: int, frames, *, ce_to_ect0=False, idle=0.0, stall=0.0, seed=0):
    """Frames through Parser -> Deparser; returns ``{"o": [(bytes, last)], "cycles", ...}``."""
    nb = data_width // 8
    dut = loopback_top(data_width)
    src = StreamSource(dut.i, [b for f in frames for b in frame_to_beats(f, nb)],
                       idle=idle, seed=seed)
    sinks = [StreamSink(dut.o, stall=stall, seed=seed + 1),
             StreamSink(dut.frame, seed=seed + 2), StreamSink(dut.verdict, seed=seed + 3)]

    async def ctl(ctx):
        ctx.set(dut.ce_to_ect0, int(ce_to_ect0))

    cycles = _sim(dut, [src], sinks, watch=ctl)
    return {"o": beats_to_frames(sinks[0].items, nb), "cycles": cycles,
            "out_beats": len(sinks[0].items), "out_cycles": sinks[0].cycles,
            "verdict": sinks[2].items}


def random_frame(rng: random.Random, *, opcode=None, plen=None, vlan=None, max_plen=300):
    """A random valid RoCEv2 frame as a :class:`netreduce.wire.RoceFrame` (any opcode of the
    table, optional 802.1Q tag, PSN anywhere including near the 24-bit wrap, any pad count)."""
    from netreduce.wire import OPCODES, PSN_MOD, RoceFrame

    if opcode is None:
        opcode = rng.choice(sorted(OPCODES))
    info = OPCODES[opcode]
    if plen is None:
        plen = rng.choice([0, 1, 2, 3, 4, rng.randrange(max_plen + 1)])
    payload = bytes(rng.getrandbits(8) for _ in range(plen)) if info.has_payload else b""
    if vlan is None:
        vlan = rng.random() < 0.4
    psn = rng.choice([0, PSN_MOD - 1, PSN_MOD - 2, rng.randrange(PSN_MOD)])
    kw = dict(
        opcode=opcode, dqpn=rng.randrange(1 << 24), psn=psn, payload=payload,
        vlan_tci=rng.randrange(1 << 16) if vlan else None, tos=rng.randrange(256),
        ident=rng.randrange(1 << 16), ttl=rng.randrange(1, 256), sport=rng.randrange(1 << 16),
        se=rng.randrange(2), m=rng.randrange(2), pkey=rng.randrange(1 << 16),
        fecn=rng.randrange(2), becn=rng.randrange(2), ackreq=rng.randrange(2),
        va=rng.getrandbits(64), rkey=rng.getrandbits(32), dmalen=rng.getrandbits(32),
        imm=rng.getrandbits(32), syndrome=rng.getrandbits(8), msn=rng.getrandbits(24),
        src_ip=rng.getrandbits(32), dst_ip=rng.getrandbits(32),
        dmac=bytes(rng.getrandbits(8) for _ in range(6)),
        smac=bytes(rng.getrandbits(8) for _ in range(6)),
    )
    return RoceFrame(**kw)
