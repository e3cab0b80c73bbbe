"""The engine's pairs of ACK headers (HeaderArbiter side records -> AggControl(pairs=True)'s
side lane -> LaneSplit ``dec2``), end to end against the model.

The engine's arbiter forms the pairs, the control decides both headers of a pair in one cycle,
``LaneSplit`` splits them into the lanes: outputs and counters must equal the model's, and
pairs must have been made (the transfers carrying a side record and the decisions handed over
in pairs are counted on the control's ports).
"""

from __future__ import annotations

import importlib.util
import inspect
import random
import sys
from pathlib import Path

import pytest
from amaranth.sim import Simulator
from netreduce.sim.model.kit import RingJob


def _load(name: str):
    """A sibling test module by path (the suite imports with --import-mode=importlib)."""
    key = f"_pairs_harness_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(name))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


top = _load("test_engine_top.py")


class CountingSim(Simulator):
    """The engine test's simulator, counting the transfers that carry a side record and the
    decisions handed over in pairs."""

    counts: dict = {}

    def __init__(self, dut):
        super().__init__(dut)
        ctl = dut.ctl
        CountingSim.counts = c = {"side": 0, "dec2": 0}

        async def count(ctx):
            async for *_, hv, hr, sv, dv, dr, d2 in ctx.tick().sample(
                    ctl.hdr.valid, ctl.hdr.ready, ctl.hdr.payload.side.v,
                    ctl.dec.valid, ctl.dec.ready, ctl.dec2.v):
                c["side"] += hv and hr and sv
                c["dec2"] += dv and dr and d2

        self.add_process(count)


@pytest.fixture
def pairing(monkeypatch):
    import netreduce.hw.engine as engine_mod

    assert "pairs" in inspect.signature(engine_mod.AggControl).parameters
    monkeypatch.setattr(top, "Simulator", CountingSim)
    return CountingSim


@pytest.mark.parametrize("width,seed", [(512, 1), (64, 2)])
def test_lanes_pairs_of_acks_match_the_model(pairing, width, seed):
    """Four ports, one rank per port, every port sending at once: its data frames and, two
    indices behind, its receiver's ACK (a NAK now and then). The ACKs of different ports arrive
    together and go to the control in pairs; outputs and counters equal the model's."""
    rng = random.Random(seed)
    sc = top.Scenario(ports=4, lanes=4, data_width=width, flows=8, slots=16, max_world=4,
                      pmtu_max=256)
    job = sc.add(RingJob(job=0, world=4, window=16, slot_base=0, pmtu=256))
    for k in range(14):
        for r in range(4):
            sc.frame(job.data_bytes(r, k, rng.randbytes(256)), r)
            if k >= 2:
                sc.frame(job.ack(r, k - 2, nak=rng.random() < 0.1), r)
    got = top.check(sc, stall=0.2, seed=seed, parallel=True)
    assert len(got) == 14 * 4 + 12 * 4
    c = pairing.counts
    assert c["side"] > 5 and c["side"] == c["dec2"], c


@pytest.mark.parametrize("fast", [False, True])
def test_lanes_no_pairs_with_fast_retransmit(pairing, fast):
    """Four ports, one rank per port, rank 0 losing indices (holes), every receiver ACKing at
    once. With JOB.CTRL.fast_retx on, the engine pairs no ACKs (the control's side lane has no
    fast retransmit) and the NAK rewrites equal the model's; with it off the same traffic is
    paired."""
    fr = _load("test_engine_fast_retx.py")
    rng = random.Random(9)
    sc = top.Scenario(ports=4, lanes=4, data_width=64, flows=8, slots=16, max_world=4,
                      pmtu_max=256)
    job = sc.add(RingJob(job=0, world=4, window=16, slot_base=0, pmtu=256))
    if fast:
        fr.fast_on(sc, job)
    for k in range(10):
        for r in range(4):
            if not (r == 0 and k in (3, 7)):
                sc.frame(job.data_bytes(r, k, rng.randbytes(64)), r)
        if k >= 2:
            for r in range(4):
                sc.frame(job.ack(r, k - 2), r)
    got = top.check(sc, stall=0.1, seed=3, parallel=True)
    c = pairing.counts
    if fast:
        assert c["side"] == 0 and sc.eng.counters(0)["fast_retx"] > 0
        assert fr.naks(got)
    else:
        assert c["side"] > 5 and c["side"] == c["dec2"], c
