"""LBUS converters of the UltraScale CMAC: byte order, sop/eop/mty, packets at any segment."""

import math
import random

from amaranth.sim import Simulator
from netreduce.hw.boards.lbus import BeatsToLbus, LbusToBeats

NB = 64  # bytes per beat


def _frames(rng, n, lo=60, hi=300):
    return [(bytes(rng.getrandbits(8) for _ in range(rng.randint(lo, hi))), rng.random() < .2)
            for _ in range(n)]


def _beats(frame, err):
    out = []
    for off in range(0, len(frame), NB):
        chunk = frame[off:off + NB]
        last = off + NB >= len(frame)
        out.append((int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, last, err and last))
    return out


def test_tx_segments_big_endian_sop_eop_mty():
    rng = random.Random(7)
    assert _tx_run(_frames(rng, 25), 400)


def test_tx_every_last_beat_length():
    """Every length of the last beat (1..64 bytes: eop in each segment, every mty), so the
    thermometer decode of eop / mty is checked against the byte count for all of them."""
    rng = random.Random(8)
    frames = [(bytes(rng.getrandbits(8) for _ in range(n)), n % 5 == 0)
              for n in range(128, 192)]
    assert _tx_run(frames, 400)


def _tx_run(frames, cycles):
    dut = BeatsToLbus()
    got, cur = [], bytearray()

    async def source(ctx):
        for f, err in frames:
            for d, k, last, e in _beats(f, err):
                ctx.set(dut.i.payload.data, d)
                ctx.set(dut.i.payload.keep, k)
                ctx.set(dut.i.payload.last, last)
                ctx.set(dut.i.payload.error, e)
                ctx.set(dut.i.valid, 1)
                await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        nonlocal cur
        for cyc in range(cycles):
            ctx.set(dut.rdy, (cyc % 7) != 3)  # the MAC's almost-full flag drops now and then
            await ctx.tick()
            for s in range(4):
                seg = ctx.get(dut.seg[s])
                if not seg.ena:
                    continue
                if seg.sop:
                    assert s == 0 and not cur
                b = seg.data.to_bytes(16, "big")  # segment byte 0 is bits 127..120
                if seg.eop:
                    cur += b[:16 - seg.mty]
                    got.append((bytes(cur), bool(seg.err)))
                    cur = bytearray()
                else:
                    assert seg.mty == 0 and not seg.err
                    cur += b

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert got == frames
    return True


def _lbus_cycles(rng, frames, line_rate=False, burst=8):
    """RX LBUS as a MAC would present it: packets start at any segment, idle segments between
    packets, whole idle cycles now and then (also inside a packet). With ``line_rate`` the LBUS
    runs at most ``burst`` segments ahead of 100 Gb/s (a frame of L bytes takes max(L, 60) + 24
    bytes of wire time, at 38.8 bytes a cycle, 9.7 a segment), pausing now and then and
    catching up with frames back to back."""
    segs, wire = [], 0.0
    for f, err in frames:
        n = (len(f) + 15) // 16
        idle = rng.choice([0, 0, 1, 2, 3])
        if line_rate:
            wire += (max(len(f), 60) + 24) / 9.7
            # f's end no earlier than the wire brings it (less `burst`); a pause (the MAC
            # holding data) now and then lets the next frames follow back to back
            ahead = wire - len(segs) - n
            idle = max(idle, math.ceil(ahead - burst)) + (rng.randint(8, 16)
                                                          if rng.random() < .2 else 0)
        for _ in range(idle):
            segs.append(None)
        for i in range(n):
            chunk = f[16 * i:16 * i + 16]
            eop = i == n - 1
            segs.append(dict(data=int.from_bytes(chunk.ljust(16, b"\0"), "big"), sop=i == 0,
                             eop=eop, err=err and eop, mty=16 - len(chunk) if eop else 0))
    cycles = []
    for i in range(0, len(segs), 4):
        cycles.append((segs[i:i + 4] + [None] * 4)[:4])
        if rng.random() < .1:
            cycles.append([None] * 4)
    return cycles


def _lbus_source(dut, cycles):
    """A testbench driving the converter's four LBUS segments with ``cycles`` (see
    :func:`_lbus_cycles`), then idle."""
    async def source(ctx):
        for cyc in cycles:
            for s in range(4):
                seg = cyc[s]
                ctx.set(dut.seg[s].ena, seg is not None)
                if seg is not None:
                    for k, v in seg.items():
                        ctx.set(getattr(dut.seg[s], k), v)
            await ctx.tick()
        for s in range(4):
            ctx.set(dut.seg[s].ena, 0)
    return source


def test_rx_packets_at_any_segment_become_beats():
    rng = random.Random(8)
    frames = _frames(rng, 60, 60, 200)
    cycles = _lbus_cycles(rng, frames)
    dut = LbusToBeats()
    got, cur, ovf = [], bytearray(), [0]

    source = _lbus_source(dut, cycles)

    async def sink(ctx):
        nonlocal cur
        ctx.set(dut.o.ready, 1)
        for _ in range(len(cycles) + 40):
            await ctx.delay(1e-9)
            if ctx.get(dut.overflow):
                ovf[0] += 1
            if ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                assert p.first == (not cur)
                n = bin(p.keep).count("1")
                assert p.keep == (1 << n) - 1, "keep must be a thermometer code"
                assert p.last or n == NB
                cur += p.data.to_bytes(NB, "little")[:n]
                if p.last:
                    got.append((bytes(cur), bool(p.error)))
                    cur = bytearray()
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert ovf[0] == 0
    assert got == frames


def test_tx_then_rx_round_trip_minimum_frames():
    """Back-to-back 60-byte frames (64 B on the wire): one beat per frame through both sides."""
    rng = random.Random(9)
    frames = [(bytes(rng.getrandbits(8) for _ in range(60)), False) for _ in range(30)]
    cycles = _lbus_cycles(random.Random(1), frames)
    assert len(cycles) >= 30
    test_rx = LbusToBeats()
    got = []

    source = _lbus_source(test_rx, cycles)

    async def sink(ctx):
        ctx.set(test_rx.o.ready, 1)
        for _ in range(len(cycles) + 20):
            await ctx.delay(1e-9)
            if ctx.get(test_rx.o.valid):
                p = ctx.get(test_rx.o.payload)
                assert p.last and p.first
                got.append(p.data.to_bytes(NB, "little")[:60])
            await ctx.tick()

    sim = Simulator(test_rx)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert got == [f for f, _ in frames]


def test_rx_overflow_is_flagged_and_queue_stays_consistent():
    """With the output stalled, a 28-segment packet overruns the converter (one beat in the
    output register, one in its skid register, 16 segments queued): the seventh cycle's
    segments are dropped with ``overflow``; what was taken comes out intact."""
    dut = LbusToBeats()
    payload = bytes(range(256)) + bytes(range(192))   # 448 bytes = 28 segments
    seen = {"ovf": 0, "out": bytearray(), "last": False}

    async def bench(ctx):
        ctx.set(dut.o.ready, 0)
        for c in range(7):
            for s in range(4):
                i = 4 * c + s
                ctx.set(dut.seg[s].ena, 1)
                ctx.set(dut.seg[s].sop, i == 0)
                ctx.set(dut.seg[s].eop, i == 27)
                ctx.set(dut.seg[s].mty, 0)
                ctx.set(dut.seg[s].data, int.from_bytes(payload[16 * i:16 * i + 16], "big"))
            await ctx.tick()
            if ctx.get(dut.overflow):
                seen["ovf"] += 1
        for s in range(4):
            ctx.set(dut.seg[s].ena, 0)
        await ctx.tick()
        seen["ovf"] += ctx.get(dut.overflow)
        ctx.set(dut.o.ready, 1)
        for _ in range(8):
            await ctx.delay(1e-9)
            if ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                seen["out"] += p.data.to_bytes(64, "little")[:bin(p.keep).count("1")]
                seen["last"] |= bool(p.last)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen["ovf"] == 1
    assert bytes(seen["out"]) == payload[:384]   # the first 24 segments, in order
    assert not seen["last"]                       # the eop was in the dropped cycle


def test_rx_runts_errors_and_output_stalls():
    """Runts (down to 1 byte: eops in consecutive segments of one cycle), errored frames and
    `o.ready` low about one cycle in ten, at line rate: frames byte-exact with their err flag,
    every beat up to 4 segments of one packet, cut at its eop (non-last beats are full),
    ceil(L / 64) beats a frame, and nothing dropped."""
    rng = random.Random(11)
    frames = [(bytes(rng.getrandbits(8) for _ in range(rng.choice([rng.randint(1, 48),
                                                                  rng.randint(60, 300)]))),
               rng.random() < .3) for _ in range(150)]
    cycles = _lbus_cycles(rng, frames, line_rate=True)
    dut = LbusToBeats()
    got, cur, stats = [], bytearray(), {"ovf": 0, "beats": 0}

    source = _lbus_source(dut, cycles)

    async def sink(ctx):
        nonlocal cur
        for _ in range(len(cycles) + 200):
            ready = rng.random() < .9
            ctx.set(dut.o.ready, ready)
            await ctx.delay(1e-9)
            stats["ovf"] += ctx.get(dut.overflow)
            if ctx.get(dut.o.valid) and ready:
                p = ctx.get(dut.o.payload)
                assert p.first == (not cur)
                n = bin(p.keep).count("1")
                assert n and p.keep == (1 << n) - 1, "keep must be a non-empty thermometer code"
                assert p.last or n == NB
                assert not p.error or p.last
                cur += p.data.to_bytes(NB, "little")[:n]
                stats["beats"] += 1
                if p.last:
                    got.append((bytes(cur), bool(p.error)))
                    cur = bytearray()
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert stats["ovf"] == 0
    assert got == frames
    assert stats["beats"] == sum((len(f) + NB - 1) // NB for f, _ in frames)
