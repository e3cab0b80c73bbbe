"""Paths between blocks (issue 16 item 6): registered boundaries, no combinational path through
the blocks that carry them, bounded fanout of the nets between the engine's blocks.

The netlist checks flatten each design to single-bit gates with the native Yosys (small
parameters) and walk it (:mod:`netreduce.hw.pathcheck`)."""

from __future__ import annotations

import random
import shutil

import pytest
from amaranth.sim import Simulator
from netreduce.hw.skid import SkidBuffer

from netreduce.regmap import build_regmap

NATIVE = shutil.which("yosys")
needs_yosys = pytest.mark.skipif(NATIVE is None, reason="the path checks need the native yosys")
SMALL = dict(ports=1, jobs=2, flows=4, slots=8, max_world=4, pmtu_max=256, data_width=64)
# the largest number of gate inputs one bit of a port between the engine's blocks may drive
# (small parameters: 64-bit data); a registered boundary drives only its register's D/CE inputs
FANOUT_LIMIT = 128


def test_skid_buffer_keeps_order_and_rate():
    """Random valid / ready: every item comes out once, in order; with ready held high it takes
    and gives one item per cycle."""
    dut = SkidBuffer(16)
    rng = random.Random(1)
    items = list(range(1, 1000))
    got, full_rate = [], []

    async def bench(ctx):
        i = 0
        for cyc in range(3000):
            steady = cyc >= 1500    # last phase: both sides always willing
            ctx.set(dut.i.valid, i < len(items) and (steady or rng.random() < 0.7))
            if i < len(items):
                ctx.set(dut.i.payload, items[i])
            ctx.set(dut.o.ready, steady or rng.random() < 0.6)
            took_in = ctx.get(dut.i.valid) and ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                got.append(ctx.get(dut.o.payload))
            if steady and i < len(items):
                full_rate.append(took_in)
            i += took_in
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == items
    assert full_rate and all(full_rate[2:])


@needs_yosys
def test_skid_buffer_and_control_have_no_combinational_path():
    """The skid buffer and the control path (hdr and dec end in skid buffers) have no
    combinational path from an input port to an output port; the TX arbiter does (its sources'
    ready follows the port's ready), which shows the check finds one."""
    from netreduce.hw.agg.control import AggControl
    from netreduce.hw.pathcheck import comb_paths, gate_netlist
    from netreduce.hw.txarb import TxArbiter

    assert comb_paths(gate_netlist(SkidBuffer(8))) == []
    assert comb_paths(gate_netlist(AggControl(build_regmap(**SMALL)))) == []
    arb = comb_paths(gate_netlist(TxArbiter(64)))
    assert ("o__ready", "fwd__ready") in arb and ("o__ready", "dep__ready") in arb


@pytest.fixture(scope="module")
def engine_net():
    from netreduce.hw.engine import engine_for
    from netreduce.hw.pathcheck import gate_netlist

    return gate_netlist(engine_for(max_frame=512, **SMALL))


@needs_yosys
def test_engine_ports_registered_and_fanout_bounded(engine_net):
    """The engine top has no combinational path from an input port to an output port, and no
    port of one of its blocks (the nets between blocks) drives more than FANOUT_LIMIT gate
    inputs."""
    from netreduce.hw.pathcheck import comb_paths, port_fanout

    assert comb_paths(engine_net) == []
    kids = sorted({m.split(".")[1] for m in engine_net.module_ports if m.count(".") == 1})
    assert {"ctl", "dispatch", "emitter", "deparser", "slotmem", "txarb0"} <= set(kids)
    fan = port_fanout(engine_net, kids)
    worst = sorted(fan.items(), key=lambda kv: -kv[1])[:5]
    assert worst[0][1] <= FANOUT_LIMIT, worst
