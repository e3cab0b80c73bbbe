"""Protocol reference: cocotbext-axi bound with ``from_prefix`` to a generated top.

cocotbext-axi's AxiStreamSource/AxiStreamSink are the independent AXI-Stream implementation: they
check that the generated port names bind as-is and that the project's once-per-beat driver and
monitor speak the same protocol (each is paired with the other side's implementation). Slow
(per-byte Python), so a few frames only.

Arguments: ``frames`` (default 12), ``max_len`` (default 200), ``seed``.
"""

from __future__ import annotations

import itertools
import random

import cocotb
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from .axis import AxisSink, AxisSource, quiet, reset, start_clock, tb_args


def _frames(a: dict, user_bits: int):
    rng = random.Random(a.get("seed", 3))
    sizes = [1, 7, 8, 9, 63, 64, 65]
    sizes += [rng.randint(1, a.get("max_len", 200)) for _ in range(a.get("frames", 12))]
    return [(rng.randbytes(n), rng.getrandbits(user_bits) if user_bits else None) for n in sizes]


@cocotb.test()
async def test_cocotbext_both_sides(dut):
    """cocotbext-axi source -> DUT -> cocotbext-axi sink, with pauses on both sides."""
    start_clock(dut)
    quiet(dut, "s_axis", "m_axis")
    src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
    await reset(dut)
    src.set_pause_generator(itertools.cycle([0, 0, 1]))
    sink.set_pause_generator(itertools.cycle([0, 1, 1, 0, 0]))
    ubits = len(dut.s_axis_tuser) if hasattr(dut, "s_axis_tuser") else 0
    frames = _frames(tb_args(), ubits)
    for data, user in frames:
        await src.send(AxiStreamFrame(data, tuser=user))
    for i, (data, user) in enumerate(frames):
        rx = await sink.recv()
        assert bytes(rx.tdata) == data, f"frame {i} differs: {bytes(rx.tdata).hex()}"
        if user is not None:
            assert rx.tuser == user, f"frame {i}: tuser {rx.tuser} != {user}"
    assert sink.empty()


@cocotb.test()
async def test_own_source_cocotbext_sink(dut):
    """The project's AxisSource is read correctly by cocotbext-axi's sink."""
    start_clock(dut)
    quiet(dut, "m_axis")
    src = AxisSource(dut, "s_axis")
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
    await reset(dut)
    sink.set_pause_generator(itertools.cycle([0, 1]))
    ubits = len(dut.s_axis_tuser) if hasattr(dut, "s_axis_tuser") else 0
    frames = _frames(tb_args(), ubits)
    for data, user in frames:
        src.send(data, user or 0)
    for i, (data, user) in enumerate(frames):
        rx = await sink.recv()
        assert bytes(rx.tdata) == data, f"frame {i} differs"
        if user is not None:
            assert rx.tuser == user, f"frame {i}: tuser {rx.tuser} != {user}"


@cocotb.test()
async def test_cocotbext_source_own_sink(dut):
    """cocotbext-axi's source is read correctly by the project's AxisSink."""
    start_clock(dut)
    quiet(dut, "s_axis")
    src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
    sink = AxisSink(dut, "m_axis")
    await reset(dut)
    src.set_pause_generator(itertools.cycle([0, 1, 0]))
    sink.set_pause_generator(itertools.cycle([1, 0, 0]))
    ubits = len(dut.s_axis_tuser) if hasattr(dut, "s_axis_tuser") else 0
    frames = _frames(tb_args(), ubits)
    for data, user in frames:
        await src.send(AxiStreamFrame(data, tuser=user))
    for i, (data, user) in enumerate(frames):
        rx = await sink.recv()
        assert rx.data == data, f"frame {i} differs"
        if user is not None:
            assert set(rx.user) == {user}, f"frame {i}: tuser {rx.user} != {user}"
