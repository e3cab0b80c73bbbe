"""TxHoldGate (hw/txhold.py, model D21): a held port drops whole frames and counts them, a short
stall drops nothing, and the input never waits much longer than the hold bound."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.txhold import TxHoldGate

W = 64
NB = W // 8


def _run(frames, ready_at, hold, cycles, later=(), later_at=0):
    """Offer ``frames`` (byte strings) back to back, then ``later`` from cycle ``later_at``;
    ``ready_at(cycle)`` drives o.ready.
    Returns (frames out as (bytes, error), drop pulses, longest wait of an input beat)."""
    dut = TxHoldGate(W)
    out, drops, wait = [], [0], [0]

    async def src(ctx):
        ctx.set(dut.hold, hold)
        now = 0
        for i, f in enumerate([*frames, *later]):
            if i == len(frames):
                ctx.set(dut.i.valid, 0)
                await ctx.tick().repeat(max(1, later_at - now))
            n = -(-len(f) // NB)
            for b in range(n):
                chunk = f[b * NB:(b + 1) * NB]
                ctx.set(dut.i.payload.data, int.from_bytes(chunk.ljust(NB, b"\0"), "little"))
                ctx.set(dut.i.payload.keep, (1 << len(chunk)) - 1)
                ctx.set(dut.i.payload.first, b == 0)
                ctx.set(dut.i.payload.last, b == n - 1)
                ctx.set(dut.i.valid, 1)
                waited = 0
                while True:
                    await ctx.delay(1e-9)
                    if ctx.get(dut.i.ready):
                        break
                    await ctx.tick()
                    waited += 1
                wait[0] = max(wait[0], waited)
                await ctx.tick()
                now += waited + 1
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        buf = bytearray()
        for c in range(cycles):
            ctx.set(dut.o.ready, ready_at(c))
            await ctx.delay(1e-9)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                keep = ctx.get(dut.o.payload.keep)
                buf += ctx.get(dut.o.payload.data).to_bytes(NB, "little")[:bin(keep).count("1")]
                if ctx.get(dut.o.payload.last):
                    out.append((bytes(buf), ctx.get(dut.o.payload.error)))
                    buf = bytearray()
            drops[0] += ctx.get(dut.drop)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(src)
    sim.add_testbench(sink)
    sim.run()
    return out, drops[0], wait[0]


def _frames(rng, n):
    return [bytes(rng.randrange(256) for _ in range(rng.randrange(20, 90))) for _ in range(n)]


def test_short_stalls_drop_nothing():
    """Stalls shorter than the bound (2^5 - 1 cycles) only slow the port down."""
    rng = random.Random(1)
    frames = _frames(rng, 12)
    out, drops, _ = _run(frames, lambda c: int((c // 20) % 2 == 0), hold=5, cycles=2000)
    assert drops == 0 and out == [(f, 0) for f in frames]


@pytest.mark.parametrize("hold", [4, 6])
def test_held_port_drops_whole_frames_and_recovers(hold):
    """Port held from cycle 30 to 900: the frames that reach the gate while held are dropped
    whole and counted; the frame entering the queue when the hold is declared leaves cut (error
    set) after the release, counted too; the input waits at most about 2^hold cycles; after the
    release frames pass again, unchanged and in order."""
    rng = random.Random(hold)
    frames, later = _frames(rng, 40), _frames(rng, 8)
    out, drops, wait = _run(frames, lambda c: int(not 30 <= c < 900), hold=hold, cycles=3000,
                            later=later, later_at=1000)
    assert wait <= (1 << hold) + 8
    good = [f for f, e in out if not e]
    cut = [f for f, e in out if e]
    assert len(cut) <= 1
    # what left whole is the input in order, minus the dropped frames
    it = iter(frames + later)
    assert all(any(g == f for f in it) for g in good)
    assert drops == len(frames) - len(good[:-len(later)]) and drops > 0
    assert good[-len(later):] == later   # the port recovered: nothing dropped after the hold
    if cut:
        f = next(f for f in frames if f.startswith(cut[0][:-1]) and f not in good)
        assert len(cut[0]) < len(f) + 1


def test_hold_zero_never_drops():
    """tx_hold = 0: a held port holds its input as long as it is held (lossless)."""
    rng = random.Random(3)
    frames = _frames(rng, 10)
    out, drops, wait = _run(frames, lambda c: int(not 10 <= c < 400), hold=0, cycles=2000)
    assert drops == 0 and out == [(f, 0) for f in frames] and wait > 300
