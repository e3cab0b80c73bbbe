"""The shell's core clock (MMCM settings) and its per-port clock-domain crossing, simulated with
the MAC clock (322.27 MHz) and the core clock (250 MHz) running asynchronously."""

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.boards.coreclock import CORE_HZ, CoreClock, PortCrossing, mmcm_params
from netreduce.hw.boards.platforms import CMAC_DATAPATH_HZ

W = 64


def test_mmcm_settings():
    assert mmcm_params(125e6, 250e6) == (10.0, 1, 5.0)      # VCO 1250 MHz
    m, d, o = mmcm_params(125e6, 322.265625e6 / 2)
    assert 800e6 <= 125e6 * m / d <= 1440e6
    assert 125e6 * m / d / o == pytest.approx(322.265625e6 / 2)
    with pytest.raises(ValueError, match="no MMCM setting"):
        mmcm_params(125e6, 1e6 / 3)
    with pytest.raises(ValueError, match="family"):
        CoreClock("xc7")


def _frames(rng, n):
    beats = []
    for _ in range(n):
        length = rng.randint(1, 9)
        for b in range(length):
            beats.append((rng.getrandbits(W), b == length - 1))
    return beats


def _run(beats, w_dom, r_dom, *, ready_p, stream_in, stream_out, dut):
    """Write ``beats`` into ``stream_in`` (valid held, one per ``w_dom`` cycle when ready), read
    ``stream_out`` with random ready; returns (beats read, write cycles spent)."""
    rng = random.Random(7)
    got, spent = [], []

    async def writer(ctx):
        cycles = 0
        for data, last in beats:
            ctx.set(stream_in.payload.data, data)
            ctx.set(stream_in.payload.last, last)
            ctx.set(stream_in.payload.keep, (1 << (W // 8)) - 1)
            ctx.set(stream_in.valid, 1)
            while True:
                cycles += 1
                _, _, ready = await ctx.tick(w_dom).sample(stream_in.ready)
                if ready:
                    break
        ctx.set(stream_in.valid, 0)
        spent.append(cycles)

    async def reader(ctx):
        while len(got) < len(beats):
            ctx.set(stream_out.ready, rng.random() < ready_p)
            _, _, valid, ready, data, last = await ctx.tick(r_dom).sample(
                stream_out.valid, stream_out.ready, stream_out.payload.data,
                stream_out.payload.last)
            if valid and ready:
                got.append((data, bool(last)))

    sim = Simulator(dut)
    sim.add_clock(1 / CMAC_DATAPATH_HZ, domain="mac")
    sim.add_clock(1 / CORE_HZ, domain="core", phase=0.37e-9)
    sim.add_testbench(writer)
    sim.add_testbench(reader)
    sim.run_until(1e-9 * (20 * len(beats) + 2000))
    return got, spent[0] if spent else None


@pytest.mark.parametrize("direction", ["rx", "tx"])
def test_crossing_keeps_every_beat_in_order_under_backpressure(direction):
    dut = PortCrossing(W, mac_domain="mac", core_domain="core", depth=16)
    beats = _frames(random.Random(direction), 60)
    if direction == "rx":
        got, _ = _run(beats, "mac", "core", ready_p=0.6, stream_in=dut.mac_rx,
                      stream_out=dut.core_rx, dut=dut)
    else:
        got, _ = _run(beats, "core", "mac", ready_p=0.6, stream_in=dut.core_tx,
                      stream_out=dut.mac_tx, dut=dut)
    assert got == beats


def test_crossing_sustains_one_beat_per_cycle_of_the_slower_clock():
    """Core -> MAC (250 -> 322 MHz, MAC always ready): the core writes a beat every core cycle,
    never stalled: 16 entries cover the pointer synchronisation round trip."""
    dut = PortCrossing(W, mac_domain="mac", core_domain="core", depth=16)
    beats = _frames(random.Random(1), 80)
    got, cycles = _run(beats, "core", "mac", ready_p=1.0, stream_in=dut.core_tx,
                       stream_out=dut.mac_tx, dut=dut)
    assert got == beats
    assert cycles == len(beats)
