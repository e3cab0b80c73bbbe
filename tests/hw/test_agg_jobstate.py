"""JobState (netreduce.hw.agg.jobstate): the accounting of free_j computations in flight.

A data frame of a job waits while a free_j computation of the job is in flight (``free_wait``),
and the enable sequencer discards a job only when it is ``idle``. Both must count an ACK/NAK from
the cycle after the decision stage commits it (the cycle its snapshot enters the free-pointer
tree) until its result is applied, and ``free_wait`` one cycle more (the result moved free_j).
The ACK's strobe is registered before it enters the count's adder (logic depth), so the cycle
right after the commit is the one to watch. Random strobes are checked cycle by cycle against a
reference count kept here in Python.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.agg.control import AggControl
from netreduce.hw.agg.jobstate import JobState

from netreduce.regmap import build_regmap

SMALL = dict(data_width=64, ports=1, jobs=3, flows=8, slots=8, pmtu_max=256, max_world=4)


def _run(seed: int, cycles: int) -> dict:
    ctl = AggControl(build_regmap(**SMALL))
    ctl._MustUse__silence = True  # for its parameters only
    st = JobState(ctl)
    J, lat = ctl.jobs, ctl.free_latency
    rng = random.Random(seed)
    seen = {"fw": 0, "pend": 0}

    async def bench(ctx):
        commits = []  # (cycle, job) of every ACK/NAK taken, oldest first: the results to come
        applied = {}  # cycle -> job of a result applied
        for t in range(cycles):
            # one ACK/NAK commit (cj one-hot with ack_take) or another commit, or none
            j = rng.randrange(J)
            ack = rng.random() < 0.35
            other = not ack and rng.random() < 0.3
            ctx.set(st.cj, (1 << j) if (ack or other) else 0)
            ctx.set(st.ack_take, int(ack))
            # a result: the oldest snapshot, free_latency cycles after its commit (the tree's
            # latency) or later (more cases: a result never comes earlier)
            res = None
            if commits and t - commits[0][0] >= lat and rng.random() < 0.6:
                res = commits[0][1]
            ctx.set(st.f_valid, int(res is not None))
            ctx.set(st.f_job, res if res is not None else rng.randrange(J))
            # the state as it reads in cycle t, against the reference
            for jj in range(J):
                flight = sum(1 for c_, x in commits if x == jj and c_ < t)
                just = applied.get(t - 1) == jj
                idle = ctx.get(st.idle[jj])
                wait = ctx.get(st.free_wait[jj])
                assert idle == (flight == 0), (t, jj, flight, commits)
                assert wait == (flight > 0 or just), (t, jj, flight, just)
                seen["pend"] += any(c_ == t - 1 and x == jj for c_, x in commits)
                seen["fw"] += just and flight == 0
            if res is not None:  # in flight until the cycle after its result
                applied[t] = commits.pop(0)[1]
            if ack:
                commits.append((t, j))
            await ctx.tick()

    sim = Simulator(st)
    sim.add_clock(4e-9)
    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_acks_in_flight_count_from_the_cycle_after_commit(seed):
    seen = _run(seed, 400)
    # the cycles the test is about occurred: right after a commit, right after a last result
    assert seen["pend"] > 20 and seen["fw"] > 5, seen
