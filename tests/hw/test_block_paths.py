"""Paths between blocks (issue 16 item 6): registered boundaries, no combinational path through
the blocks that carry them, bounded fanout of the nets between blocks.

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
# the largest number of gate inputs one bit of a net between blocks may drive (small parameters)
FANOUT_LIMIT = 64


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


@pytest.fixture(scope="module")
def control_net():
    from netreduce.hw.agg.control import AggControl
    from netreduce.hw.pathcheck import gate_netlist

    return gate_netlist(AggControl(build_regmap(**SMALL)))


@needs_yosys
def test_skid_buffer_and_control_have_no_combinational_path(control_net):
    """The skid buffer and the control path (hdr and dec end in skid buffers) have no
    combinational path from an input port to an output port; the TX arbiter does (its sources'
    ready follows the port's ready), which shows the check finds one."""
    from netreduce.hw.pathcheck import comb_paths, gate_netlist
    from netreduce.hw.txarb import TxArbiter

    assert comb_paths(gate_netlist(SkidBuffer(8))) == []
    assert comb_paths(control_net) == []
    arb = comb_paths(gate_netlist(TxArbiter(64)))
    assert ("o__ready", "fwd__ready") in arb and ("o__ready", "dep__ready") in arb


# nets between the control path's blocks that drive more than FANOUT_LIMIT gate inputs (small
# parameters), open: the pipeline's advance (the flow table's lookup enable is the global stall
# of the decision pipeline, ``ft.lk_en`` / ``ft.rd__en``; ``lookup`` / ``check`` /
# ``decide.advance``, ``retx.x_rd__en``), the output stages' move (``retx.adv``, part of
# advance), the sequencer's job (selects its
# configuration, binds flow entries; ``jobs.seq_job``), the frame records between the decision
# stages (``lookup.o`` = ``check.i``: the frame's job and rank select the job state in the check
# stage; ``check.o`` = ``decide.i`` = ``retx.i`` / ``relq.dec_cmd``: the decision's frame), the
# release scheduler's job / command (``jobs.sch_job``), the D16 word write (``retx.wr_en`` =
# ``jobs.rtx_wr``: the per-flow written bits)
KNOWN_WIDE = {"ft.rd__en", "ft.lk_en", "ft.wr__data", "ft.bind_job", "sequencer.job",
              "sequencer.ft__bind_data", "jobs.seq_job", "lookup.advance", "check.advance",
              "decide.advance", "lookup.o", "check.i", "check.o", "decide.i", "release.job",
              "release.cmd", "jobs.sch_job", "retx.x_rd__en", "retx.adv", "retx.i", "retx.wr_en",
              "jobs.rtx_wr", "relq.dec_cmd"}


@needs_yosys
def test_control_fanout_between_blocks(control_net):
    """Every net between the control path's sub-blocks drives at most FANOUT_LIMIT gate inputs,
    except the stated ones (clock and reset go on global buffers)."""
    from netreduce.hw.pathcheck import port_fanout

    kids = sorted({m.split(".")[1] for m in control_net.module_ports if m.count(".") == 1})
    assert {"decide", "release", "freemin", "sequencer", "ft", "hdr_skid", "dec_skid"} <= set(kids)
    fan = port_fanout(control_net, kids)
    wide = {k for k, v in fan.items() if v > FANOUT_LIMIT and "$" not in k
            and not k.endswith((".clk", ".rst"))}
    assert wide <= KNOWN_WIDE, sorted((k, fan[k]) for k in wide - KNOWN_WIDE)
    # the widest is the pipeline's advance (ft.rd__en): it enables every stage register, about
    # 1050 gate inputs here with the check and fast-retransmit stages
    assert max(fan[k] for k in wide) < 1536
