"""The carry-chain compare of the control path (netreduce.hw.agg.wide.differs): exact at every
width, and a compare wider than one chain within the depth budget (docs/engine.md, "Clock
plan": at most 8 CARRY8 per register-to-register path)."""

from __future__ import annotations

import random
import shutil

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from netreduce.hw.agg.wide import CHAIN_BITS, differs


class _Differs(wiring.Component):
    """``o`` = registered ``a != b`` of registered inputs (a register-to-register path)."""

    def __init__(self, width):
        self._w = width
        super().__init__({"a": In(width), "b": In(width), "o": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a, b = Signal(self._w), Signal(self._w)
        m.d.sync += [a.eq(self.a), b.eq(self.b), self.o.eq(differs(m, a, b, "d"))]
        return m


@pytest.mark.parametrize("width", [1, 8, CHAIN_BITS, CHAIN_BITS + 1, 64, 70])
def test_differs_is_exact(width):
    dut = _Differs(width)
    rng = random.Random(width)

    async def bench(ctx):
        prev = None
        for i in range(200):
            x = rng.getrandbits(width)
            y = x if i % 3 == 0 else x ^ (1 << rng.randrange(width))
            if i % 7 == 0:
                y = rng.getrandbits(width)
            ctx.set(dut.a, x)
            ctx.set(dut.b, y)
            await ctx.tick()
            if prev is not None:
                assert ctx.get(dut.o) == prev, (i, width)
            prev = int(x != y)

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.skipif(shutil.which("yosys") is None,
                    reason="needs the native yosys (apt-get install yosys)")
def test_wide_differs_within_the_carry_budget():
    from netreduce.hw.pathcheck import levels

    lv = levels(_Differs(64))  # the default build's rank masks (max_world 64)
    assert lv["carry_max"] <= 5 and lv["lut_levels"] <= 2, lv
