"""Simulator speed floor under cocotb, to judge the driver's overhead (bench only).

Measures, on any generated top with ``s_axis``/``m_axis``: bare rising edges per second, and one
``s_axis_tdata`` write plus one ``m_axis_tdata`` read per edge (the least a beat-per-cycle driver
and monitor must do). ``cycles`` (tb arg, default 20000) edges each.
"""

from __future__ import annotations

import time

import cocotb
from cocotb.triggers import RisingEdge

from .axis import report, start_clock, tb_args


@cocotb.test()
async def test_speed_floor(dut):
    n = tb_args().get("cycles", 20000)
    clk = start_clock(dut)
    for name in ("s_axis_tdata", "s_axis_tkeep", "s_axis_tlast", "s_axis_tuser", "s_axis_tvalid",
                 "rst"):
        if hasattr(dut, name):
            getattr(dut, name).value = 0
    dut.m_axis_tready.value = 1
    edge = RisingEdge(clk)
    t = time.perf_counter()
    for _ in range(n):
        await edge
    bare = n / (time.perf_counter() - t)
    w, r = dut.s_axis_tdata, dut.m_axis_tdata._handle.get_signal_val_binstr
    mask = (1 << len(w)) - 1
    t = time.perf_counter()
    for i in range(n):
        await edge
        w.value = (i * 0x9E3779B97F4A7C15) & mask
        int(r(), 2)
    rw = n / (time.perf_counter() - t)
    report(bare_edges_per_s=bare, one_write_one_read_per_s=rw)


@cocotb.test()
async def test_cocotbext_speed(dut):
    """cocotbext-axi source and sink on the same stream pair, for comparison (``beats``)."""
    from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

    from .axis import quiet, reset

    start_clock(dut)
    quiet(dut, "s_axis", "m_axis")
    src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
    await reset(dut)
    lanes = len(dut.s_axis_tdata) // 8
    beats = tb_args().get("beats", 2000)
    frame = bytes(range(256)) * (lanes * 20 // 256 + 1)
    frame = frame[:lanes * 20]  # 20 beats per frame
    t = time.perf_counter()
    for _ in range(beats // 20):
        await src.send(AxiStreamFrame(frame))
    for _ in range(beats // 20):
        rx = await sink.recv()
        assert bytes(rx.tdata) == frame
    report(cocotbext_beats_per_s=(beats // 20) * 20 / (time.perf_counter() - t))
