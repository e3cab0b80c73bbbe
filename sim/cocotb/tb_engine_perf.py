"""Engine top throughput and latency under cocotb (bench/engine.py runs it).

tb args (or a JSON file named by ``file``): ``ops`` (register writes ``[addr, value]`` and
``["sync", job, status address]`` waits, recorded from the driver's EngineControl on the
model), ``frames`` (hex strings, all into port 0, back to back), ``expect_out`` (frames the model
emits), ``world``, ``completing`` and ``result_keys`` (for the latency). Reports:

* ``in_beats``, ``in_cycles`` (first input beat to last input beat accepted), ``stall_cycles``
  (``tvalid`` high, ``tready`` low: backpressure) and ``beats_per_cycle``;
* ``latency``: per released index, cycles from the last beat of its completing contribution
  entering to the first beat of its first result leaving (list);
* ``out_frames`` and ``matches`` (outputs equal to the model's, as a multiset).
"""

from __future__ import annotations

import cocotb
from cocotb.triggers import RisingEdge

from netreduce.wire.view import dqpn, dst_ip, l3_offset, psn

from .axis import AxisSink, AxisSource, quiet, report, reset, start_clock, tb_args


async def axil_write(dut, clk, addr: int, value: int) -> None:
    dut.s_axil_awaddr.value = addr
    dut.s_axil_awvalid.value = 1
    dut.s_axil_wdata.value = value
    dut.s_axil_wstrb.value = 0xF
    dut.s_axil_wvalid.value = 1
    dut.s_axil_bready.value = 1
    aw = w = False
    for _ in range(1000):
        await RisingEdge(clk)
        if dut.s_axil_awready.value:
            aw = True
        if dut.s_axil_wready.value:
            w = True
        if aw:
            dut.s_axil_awvalid.value = 0
        if w:
            dut.s_axil_wvalid.value = 0
        if aw and w:
            break
    for _ in range(1000):
        if dut.s_axil_bvalid.value:
            await RisingEdge(clk)
            dut.s_axil_bready.value = 0
            return
        await RisingEdge(clk)
    raise AssertionError(f"AXI4-Lite write 0x{addr:x}: no response")


async def axil_read(dut, clk, addr: int) -> int:
    dut.s_axil_araddr.value = addr
    dut.s_axil_arvalid.value = 1
    dut.s_axil_rready.value = 1
    for _ in range(1000):
        await RisingEdge(clk)
        if dut.s_axil_arready.value:
            dut.s_axil_arvalid.value = 0
            break
    for _ in range(1000):
        if dut.s_axil_rvalid.value:
            v = int(dut.s_axil_rdata.value)
            await RisingEdge(clk)
            dut.s_axil_rready.value = 0
            return v
        await RisingEdge(clk)
    raise AssertionError(f"AXI4-Lite read 0x{addr:x}: no response")


def _psn_key(f: bytes):
    l3 = l3_offset(f)
    return dst_ip(f, l3), dqpn(f, l3), psn(f, l3)


@cocotb.test()
async def test_perf(dut):
    args = tb_args()
    if "file" in args:  # large scenarios travel in a file (environment strings are limited)
        import json

        with open(args["file"]) as f:
            args = json.load(f)
    clk = start_clock(dut)
    quiet(dut, "s_axis_p0", "m_axis_p0")
    for n in ("awvalid", "wvalid", "arvalid", "bready", "rready", "awaddr", "araddr", "wdata",
              "wstrb", "awprot", "arprot"):
        getattr(dut, f"s_axil_{n}").value = 0
    src = AxisSource(dut, "s_axis_p0", clk)
    sink = AxisSink(dut, "m_axis_p0", clk)
    await reset(dut)
    for op in args["ops"]:
        if op[0] == "sync":
            for _ in range(5000):
                if (await axil_read(dut, clk, op[2])) & 1:
                    break
            else:
                raise AssertionError(f"job {op[1]} not enabled")
        else:
            await axil_write(dut, clk, op[0], op[1])
    frames = [bytes.fromhex(h) for h in args["frames"]]
    # per-cycle monitor of the input: accepted beats, stalls, last-beat cycles
    mon = {"beats": 0, "stalls": 0, "first": None, "last": None, "ends": []}
    cycle = [0]

    async def watch():
        while True:
            await RisingEdge(clk)
            cycle[0] += 1
            v, r = int(dut.s_axis_p0_tvalid.value), int(dut.s_axis_p0_tready.value)
            if v and r:
                mon["beats"] += 1
                mon["first"] = mon["first"] if mon["first"] is not None else src.now()
                mon["last"] = src.now()
                if int(dut.s_axis_p0_tlast.value):
                    mon["ends"].append(src.now())
            elif v:
                mon["stalls"] += 1

    cocotb.start_soon(watch())
    for f in frames:
        src.send(f)
    await src.wait()
    want = [bytes.fromhex(h) for h in args["expect_out"]]
    got = []
    for _ in range(len(want)):
        got.append(await sink.recv(timeout_cycles=100_000))
    # latency: the completing contribution of each index is the last of its N frames
    n = args["world"]
    lat = []
    first_out: dict = {}
    for rx in got:
        key = _psn_key(rx.data)
        first_out.setdefault(key, rx.first_cycle)
    for k, frame_group in enumerate(args["result_keys"]):
        t_in = mon["ends"][args["completing"][k]]
        t_out = min(first_out[tuple_key(x)] for x in frame_group)
        lat.append(t_out - t_in)
    matches = sorted(r.data for r in got) == sorted(want)
    report(in_beats=mon["beats"], in_cycles=mon["last"] - mon["first"] + 1,
           stall_cycles=mon["stalls"], beats_per_cycle=mon["beats"] / (mon["last"] - mon["first"]
                                                                         + 1),
           latency=lat, out_frames=len(got), matches=matches, world=n)
    assert matches, "engine outputs differ from the model's"


def tuple_key(x):
    return bytes.fromhex(x[0]), bytes.fromhex(x[1]), x[2]
