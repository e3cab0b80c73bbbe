"""PfcGenerator (issue 22): PFC frames from RX FIFO watermarks, checked against scapy and
netreduce.wire.linklocal, hysteresis, refresh, and insertion only between frames."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.boards.pfcgen import PfcGenerator

from netreduce.wire.linklocal import LinkLocal, classify, pfc_frame, station_mac

scapy_mac = pytest.importorskip("scapy.contrib.mac_control")
from scapy.layers.l2 import Ether  # noqa: E402


def _run(width, levels, *, enable=1, priority=3, quanta=0xFFFF, xoff=4096, xon=2048,
         traffic=(), cycles=None, ready_p=1.0, enable_at=None, seed=1):
    """Drive ``levels`` (one per cycle; the RX FIFO level in beats) and ``traffic`` (frames of
    beats on tx_i); return the frames on tx_o in order and the per-cycle xoff state."""
    dut = PfcGenerator(width, src_mac=station_mac(2))
    nb = width // 8
    rng = random.Random(seed)
    cycles = cycles or len(levels)
    got, xs, sent = [], [], [0]

    async def drive(ctx):
        ctx.set(dut.enable, enable)
        ctx.set(dut.priority, priority)
        ctx.set(dut.quanta, quanta)
        ctx.set(dut.xoff_bytes, xoff)
        ctx.set(dut.xon_bytes, xon)
        for t in range(cycles):
            ctx.set(dut.level, levels[min(t, len(levels) - 1)])
            if enable_at is not None and t == enable_at[0]:
                ctx.set(dut.enable, enable_at[1])
            await ctx.tick()

    async def source(ctx):
        for f in traffic:
            for i, (data, keep, last) in enumerate(f):
                ctx.set(dut.tx_i.payload.data, data)
                ctx.set(dut.tx_i.payload.keep, keep)
                ctx.set(dut.tx_i.payload.last, last)
                ctx.set(dut.tx_i.payload.first, i == 0)
                ctx.set(dut.tx_i.valid, 1)
                await ctx.tick().until(dut.tx_i.ready)
        ctx.set(dut.tx_i.valid, 0)

    async def sink(ctx):
        cur = b""
        for _ in range(cycles):
            rdy = rng.random() < ready_p
            ctx.set(dut.tx_o.ready, rdy)
            await ctx.delay(1e-9)
            xs.append(ctx.get(dut.xoff))
            sent[0] += ctx.get(dut.sent)
            if rdy and ctx.get(dut.tx_o.valid):
                p = ctx.get(dut.tx_o.payload)
                n = bin(p.keep).count("1")
                cur += p.data.to_bytes(nb, "little")[:n]
                if p.last:
                    got.append(cur)
                    cur = b""
            await ctx.tick()
        await ctx.delay(1e-9)
        sent[0] += ctx.get(dut.sent)  # the pulse of a frame that ended in the last cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(drive, background=True)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return got, xs, sent[0]


def _pfc(frames):
    return [f for f in frames if classify(f)[0] == LinkLocal.PFC]


@pytest.mark.parametrize("width", [64, 512])
def test_xoff_xon_frames_match_wire_and_scapy(width):
    nb = width // 8
    up, down = -(-4096 // nb), 2048 // nb  # beats at XOFF / XON
    levels = [0] * 5 + [up - 1] * 5 + [up] * 20 + [down + 1] * 20 + [down] * 20 + [0] * 20
    got, xs, sent = _run(width, levels, quanta=0x1234, priority=5)
    pfc = _pfc(got)
    assert pfc == got and sent == 2
    assert pfc[0] == pfc_frame({5: 0x1234}, station_mac(2))  # XOFF
    assert pfc[1] == pfc_frame({5: 0}, station_mac(2))  # XON
    for f, q in zip(pfc, (0x1234, 0), strict=True):
        p = Ether(f)
        c = p[scapy_mac.MACControlClassBasedFlowControl]
        assert p.dst == "01:80:c2:00:00:01" and p.type == 0x8808 and c._op_code == 0x0101
        assert (c.c5_enabled, c.c5_pause_time) == (1, q)
        assert all(getattr(c, f"c{i}_enabled") == 0 for i in range(8) if i != 5)
        assert classify(f)[1].quanta[5] == q
    # hysteresis: XOFF 2 cycles after the level reaches the XOFF mark (registered compare),
    # kept between the marks, XON 2 cycles after it falls to the XON mark
    assert xs[11] == 0 and xs[12] == 1 and all(xs[12:52]) and xs[53] == 0


def test_hysteresis_no_frames_between_marks_and_no_flap():
    nb = 8
    up, down = 4096 // nb, 2048 // nb
    rng = random.Random(3)
    # wander between the marks after one XOFF: nothing more until the level reaches XON
    levels = [up] * 3 + [rng.randint(down + 1, up + 50) for _ in range(300)] + [down] * 20
    got, xs, sent = _run(64, levels, quanta=0)  # quanta 0: no refresh
    assert [classify(f)[1].quanta[3] for f in _pfc(got)] == [0, 0]  # XOFF(0 quanta), XON
    # misconfigured XON >= XOFF: one XOFF, XON once the level leaves XOFF, never a flood
    levels = [up] * 10 + [up - 1] * 20
    got, _, _ = _run(64, levels, xon=8192, quanta=100)
    assert [classify(f)[1].quanta[3] for f in _pfc(got)] == [100, 0]


def test_refresh_while_xoff_and_disable_sends_xon():
    levels = [1000] * 400
    got, xs, _ = _run(64, levels, quanta=100, enable_at=(300, 0))
    q = [classify(f)[1].quanta[3] for f in _pfc(got)]
    # XOFF, a refresh every ~100 cycles (each frame is 8 beats), then XON when disabled
    assert q[0] == 100 and q[-1] == 0 and 3 <= q.count(100) <= 4 and q.count(0) == 1
    got, _, sent = _run(64, levels, enable=0)
    assert got == [] and sent == 0  # off by default in the register map: nothing is sent


@pytest.mark.parametrize("width", [64, 512])
def test_pfc_frames_only_between_frames(width):
    nb = width // 8
    rng = random.Random(7)
    traffic, want = [], []
    for _ in range(12):
        n = rng.randint(1, 60 if width == 64 else 8)
        beats = []
        data = b""
        for k in range(n):
            last = k == n - 1
            nbytes = rng.randint(1, nb) if last else nb
            d = rng.randbytes(nb)
            beats.append((int.from_bytes(d, "little"), (1 << nbytes) - 1, int(last)))
            data += d[:nbytes]
        traffic.append(beats)
        want.append(data)
    levels = [rng.choice((0, 10_000)) for _ in range(30) for _ in range(20)]
    got, _, sent = _run(width, levels, quanta=50, traffic=traffic, cycles=2500, ready_p=0.7)
    others = [f for f in got if classify(f)[0] != LinkLocal.PFC]
    assert others == want  # every frame whole and in order: PFC never lands inside one
    assert len(_pfc(got)) == sent >= 4


def test_rejects_bad_source_mac():
    with pytest.raises(ValueError, match="src_mac"):
        PfcGenerator(64, src_mac=b"\x01")
