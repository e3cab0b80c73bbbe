"""CeMarker (model D19) scoreboarded against netreduce.sim.model.congestion.mark_ce: random
RoCE frames (ECN codepoints, VLAN tags, bad checksums), truncations at every length around the
fields, garbage; congested per frame; several widths, with backpressure."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.boards.cemark import CeMarker
from netreduce.sim.model.congestion import mark_ce

from netreduce.wire import ECN_CE, ECN_ECT0, ECN_ECT1, ECN_NOT_ECT, Opcode, RoceFrame


def _frames(rng: random.Random, n: int) -> list[tuple[bytes, bool]]:
    out = []
    for _ in range(n):
        f = RoceFrame(opcode=rng.choice((Opcode.ACK, Opcode.WRITE_ONLY, Opcode.CNP)),
                      dqpn=rng.getrandbits(24), psn=rng.getrandbits(24),
                      tos=(rng.getrandbits(6) << 2) | rng.choice(
                          (ECN_NOT_ECT, ECN_ECT0, ECN_ECT1, ECN_CE, ECN_ECT0)),
                      vlan_tci=rng.choice((None, None, rng.getrandbits(12))),
                      payload=rng.randbytes(rng.choice((0, 4, 64, 200)))
                      if rng.random() < .5 else b"").pack()
        b = bytearray(f)
        r = rng.random()
        if r < .15:
            b = b[:rng.randint(1, 40)]  # truncated around the fields
        elif r < .25:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)  # bad checksum, wrong version, ...
        elif r < .3:
            b = bytearray(rng.randbytes(rng.randint(1, 80)))
        out.append((bytes(b), rng.random() < .7))
    return out


def _run(width: int, frames, ready_p: float, seed: int):
    dut = CeMarker(width)
    nb = width // 8
    rng = random.Random(seed)
    got, marks = [], [0]

    async def source(ctx):
        for f, cong in frames:
            beats = [f[k:k + nb] for k in range(0, len(f), nb)]
            for k, b in enumerate(beats):
                ctx.set(dut.congested, cong if k == 0 else rng.random() < .5)  # sampled at 1st
                ctx.set(dut.i.payload.data, int.from_bytes(b.ljust(nb, b"\xa5"), "little"))
                ctx.set(dut.i.payload.keep, (1 << len(b)) - 1)
                ctx.set(dut.i.payload.last, k == len(beats) - 1)
                ctx.set(dut.i.payload.first, k == 0)
                ctx.set(dut.i.valid, 1)
                await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        cur = b""
        while len(got) < len(frames):
            rdy = rng.random() < ready_p
            ctx.set(dut.o.ready, rdy)
            await ctx.delay(1e-9)
            marks[0] += ctx.get(dut.marked)
            if rdy and ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                cur += p.data.to_bytes(nb, "little")[:bin(p.keep).count("1")]
                if p.last:
                    got.append(cur)
                    cur = b""
            await ctx.tick()
        await ctx.tick()
        marks[0] += ctx.get(dut.marked)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return got, marks[0]


@pytest.mark.parametrize("width,ready_p", [(64, 0.6), (128, 1.0), (512, 0.8)])
def test_cemarker_matches_model(width, ready_p):
    rng = random.Random(width)
    frames = _frames(rng, 150)
    got, marks = _run(width, frames, ready_p, seed=width)
    want = [(mark_ce(f) or f) if cong else f for f, cong in frames]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, (k, frames[k][0].hex(), frames[k][1])
    n = sum(1 for f, cong in frames if cong and mark_ce(f) is not None)
    assert marks == n and n > 20  # the fuzz marks a good share
