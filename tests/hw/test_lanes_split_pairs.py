"""LaneSplit (netreduce.hw.lanes) with pairs: the control path's second decision per cycle
(``dec2``) goes to its own lane in the same cycle as the first, with the next ordinal.

A random decision stream (contributions, forwards and pairs of two ports; a few pairs naming one
port, which the control never makes, to show they pass in two cycles) against random lane
readiness, checked against a Python model: every decision reaches its port's lane once, in
decision order, with the global ordinal ``seq`` and the lane bits' ``overwrite`` / ``lmask``;
``dec.ready`` is both lanes' ready; with every lane ready, a pair passes every cycle.
"""

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.agg.control import AggControl
from netreduce.hw.agg.types import Action
from netreduce.hw.lanes import LaneSplit

from netreduce.regmap import build_regmap

P, SLOTS, JOBS = 4, 8, 2


def dec_layout():
    ctl = AggControl(build_regmap(ports=P, jobs=JOBS, flows=8, slots=SLOTS, max_world=4,
                                  pmtu_max=256, data_width=64))
    ctl._MustUse__silence = True  # only its layout is used
    return ctl.dec_layout


def decision(rng, port, con):
    if con:
        return {"action": Action.CONTRIBUTE, "port": port, "slot": rng.randrange(SLOTS),
                "overwrite": rng.random() < 0.2, "job": rng.randrange(JOBS),
                "op": rng.randrange(4), "index": rng.randrange(1 << 24)}
    return {"action": Action.FORWARD, "port": port, "slot": rng.randrange(SLOTS),
            "index": rng.randrange(1 << 24), "nak": rng.random() < 0.3}


def make_stream(rng, n, pair_rate, same_rate):
    out = []
    for _ in range(n):
        port = rng.randrange(P)
        if rng.random() < pair_rate:
            p2 = port if rng.random() < same_rate else rng.choice([q for q in range(P)
                                                                    if q != port])
            out.append((decision(rng, port, False), decision(rng, p2, False)))
        else:
            out.append((decision(rng, port, rng.random() < 0.5), None))
    return out


def expected(stream):
    """(port, seq, fields) of every decision in order, with the lane bits' overwrite / lmask."""
    bits = [0] * SLOTS
    items, seq = [], 0
    for main, side in stream:
        p = main["port"]
        if main["action"] == Action.CONTRIBUTE:
            b = bits[main["slot"]]
            ow = 1 if main["overwrite"] else int(not b >> p & 1)
            bits[main["slot"]] = (1 << p) if main["overwrite"] else b | (1 << p)
            lmask = bits[main["slot"]]
        else:
            ow, lmask = 0, bits[main["slot"]]
        items.append((p, seq, main["index"], ow, lmask))
        seq += 1
        if side is not None:
            items.append((side["port"], seq, side["index"], 0, 0))
            seq += 1
    return items


def run(stream, ready_rate, seed):
    dl = dec_layout()
    dut = LaneSplit(dl, lanes=P, slots=SLOTS, jobs=JOBS, pairs=True)
    rng = random.Random(seed)
    got = [[] for _ in range(P)]
    log = {"cycles": 0, "two": 0}

    async def bench(ctx):
        i = 0
        while i < len(stream):
            main, side = stream[i]
            ctx.set(dut.dec.valid, 1)
            ctx.set(dut.dec.payload, dl.const(main))
            ctx.set(dut.dec2, {"v": side is not None, "d": dl.const(side or {})})
            rdy = [rng.random() < ready_rate for _ in range(P)]
            for k in range(P):
                ctx.set(getattr(dut, f"lane{k}").ready, rdy[k])
            n = 0
            for k in range(P):
                ln = getattr(dut, f"lane{k}")
                if ctx.get(ln.valid):
                    assert rdy[k], "a lane offered an item it does not take"
                    it = ctx.get(ln.payload)
                    got[k].append((k, it.seq, it.dec.index, it.dec.overwrite, it.lmask))
                    assert it.dec.port == k
                    n += 1
            log["two"] += n == 2
            if ctx.get(dut.dec.ready):
                # taken: both decisions of a two-port pair reached their lanes this cycle
                two_ports = side is not None and side["port"] != main["port"]
                assert n == 1 + two_ports
                i += 1
            log["cycles"] += 1
            await ctx.tick()
        ctx.set(dut.dec.valid, 0)
        await ctx.tick()
        assert ctx.get(dut.n_split) == len(expected(stream)) % (1 << 16)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = expected(stream)
    for k in range(P):
        assert got[k] == [w for w in want if w[0] == k], f"lane {k}"
    return log


@pytest.mark.parametrize("ready_rate,seed", [(0.5, 1), (0.85, 2), (1.0, 3)])
def test_lane_split_pairs_random(ready_rate, seed):
    rng = random.Random(seed)
    stream = make_stream(rng, 1500, pair_rate=0.5, same_rate=0.05)
    log = run(stream, ready_rate, seed)
    assert log["two"] > 300


def test_lane_split_pairs_line_rate():
    """Every lane ready, a two-port pair every cycle: two decisions per cycle."""
    rng = random.Random(7)
    stream = make_stream(rng, 400, pair_rate=1.0, same_rate=0.0)
    log = run(stream, 1.0, 7)
    assert log["cycles"] == 400 and log["two"] == 400


def test_lane_split_one_port_pair_takes_two_cycles():
    """A pair naming one port (outside the control's contract): the first decision, then the
    second, in order, with consecutive ordinals."""
    rng = random.Random(9)
    stream = make_stream(rng, 200, pair_rate=1.0, same_rate=1.0)
    log = run(stream, 1.0, 9)
    assert log["cycles"] == 400 and log["two"] == 0


def test_lane_split_without_pairs_has_no_dec2():
    dut = LaneSplit(dec_layout(), lanes=P, slots=SLOTS, jobs=JOBS)
    dut._MustUse__silence = True
    assert "dec2" not in dut.signature.members
