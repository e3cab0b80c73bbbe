"""cocotb tests for a stream pass-through (the demo skid buffer): frames out = frames in.

Arguments (``tb_args``): ``frames`` (count), ``min_len``/``max_len`` (bytes), ``seed``,
``src_pause``/``sink_pause`` (pause patterns, see :func:`~.axis.cycle_pattern`; ``""`` = none),
``counters`` (check the ``frames``/``beats`` ports). Reports cycles, beats per cycle and simulated
cycles per wall-clock second.
"""

from __future__ import annotations

import itertools
import random
import time

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge

from .axis import (
    AxisSink,
    AxisSource,
    cycle_pattern,
    diff,
    report,
    reset,
    start_clock,
    tb_args,
)


def _frames(rng: random.Random, n: int, lo: int, hi: int, user_bits: int):
    out = []
    for _ in range(n):
        size = rng.randint(lo, hi)
        out.append((rng.randbytes(size), rng.getrandbits(user_bits) if user_bits else 0))
    return out


async def _run(dut, name: str, src_pause: str, sink_pause: str):
    a = tb_args()
    clk = start_clock(dut)
    src = AxisSource(dut, "s_axis")
    sink = AxisSink(dut, "m_axis")
    if src_pause:
        src.set_pause_generator(cycle_pattern(src_pause))
    if sink_pause:
        sink.set_pause_generator(cycle_pattern(sink_pause))
    await reset(dut)
    rng = random.Random(a.get("seed", 1))
    ubits = len(src.tuser) if src.tuser is not None else 0
    frames = _frames(rng, a.get("frames", 50), a.get("min_len", 1), a.get("max_len", 300), ubits)
    t0, c0 = time.perf_counter(), src.now()
    for data, user in frames:
        src.send(data, user)
    for i, (data, user) in enumerate(frames):
        rx = await sink.recv()
        assert rx.data == data, f"frame {i}: {diff(rx.data, data)}"
        assert all(u == user for u in rx.user), f"frame {i}: tuser {rx.user} != {user:#x}"
    cycles = src.now() - c0
    wall = time.perf_counter() - t0
    await ClockCycles(clk, 4)
    assert sink.empty(), f"{len(sink)} unexpected extra frames"
    if a.get("counters", True):
        await RisingEdge(clk)
        assert dut.frames.value.to_unsigned() == len(frames), (
            f"DUT counted {dut.frames.value.to_unsigned()} first beats for {len(frames)} frames")
        assert dut.beats.value.to_unsigned() == sink.beats_received
    beats = sink.beats_received
    report(**{name: {"frames": len(frames), "beats": beats, "cycles": cycles,
                     "beats_per_cycle": beats / cycles, "wall_s": wall,
                     "cycles_per_s": cycles / wall, "beats_per_s": beats / wall}})


@cocotb.test()
async def test_back_to_back(dut):
    """No idle, no backpressure: every cycle moves a beat."""
    await _run(dut, "back_to_back", "", "")


@cocotb.test()
async def test_idle_and_backpressure(dut):
    """Source idles and sink stalls in two coprime patterns: no beat lost, duplicated or moved."""
    a = tb_args()
    await _run(dut, "idle_backpressure", a.get("src_pause", "0010"), a.get("sink_pause", "011"))


@cocotb.test()
async def test_random_backpressure(dut):
    """Random idle/stall cycles (seeded)."""
    a = tb_args()
    rng = random.Random(a.get("seed", 1) + 7)
    pattern_src = "".join(rng.choice("0001") for _ in range(97))
    pattern_sink = "".join(rng.choice("001") for _ in range(89))
    await _run(dut, "random_backpressure", pattern_src, pattern_sink)


@cocotb.test()
async def test_stuck_sink_times_out(dut):
    """A sink that never takes a beat: recv() and wait() fail with a message instead of hanging."""
    start_clock(dut)
    src = AxisSource(dut, "s_axis")
    sink = AxisSink(dut, "m_axis")
    sink.set_pause_generator(itertools.repeat(1))
    await reset(dut)
    src.send(bytes(range(200)))
    try:
        await sink.recv(timeout_cycles=300)
    except AssertionError as e:
        assert "no frame completed within 300 cycles" in str(e), e
    else:
        raise AssertionError("recv() returned although tready never rose")
    try:
        await src.wait(timeout_cycles=100)
    except AssertionError as e:
        assert "still queued" in str(e), e
    else:
        raise AssertionError("wait() returned although the frame cannot have been taken")
