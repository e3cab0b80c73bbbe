"""One-lane engine on Verilator (FastSim, a small 512-bit build): a port at line rate while the
dispatcher is busy, against the model.

The one-lane engine (``lanes = 1``) has one dispatcher for every port, so one port can take 1
beat per cycle. Its dispatcher spends a data frame's beats on the frame, and the control path
decides the frames behind it meanwhile (a burst of ACKs, the next contribution): its decisions
wait in the decision queue between the control path and the dispatcher (``hw/engine.py``,
``decq``). Without room there the control path stops whole behind the busy dispatcher, and the
dispatcher then waits out the decisions it could not make in time: ingress falls below 1.0.
At 512 bits an ACK is one beat, so a burst of ACKs needs a decision per cycle (at 64 bits an
ACK is 8 beats and a queue of one decision, which passes one every other cycle, would keep up).

Load: one job of N = 8 ranks, all on port 0, back-to-back full-PMTU contributions (PMTU 256:
6 beats, 4096: 66) queued at once with every receiver's ACK of index k - W/2 right after the
contributions of index k (a burst of N one-beat ACKs per index), outputs always ready. The
window wraps several times, so ACKs free slots and contributions land on freed slots. Checks,
in cycles: port 0 takes every beat with at most a few cycles of backpressure in all (not per
index); every output frame and every counter equals the model's.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.rtl.backend import engine_top
from netreduce.sim.rtl.fastsim import FastSim, verilator_missing
from netreduce.sim.verif.scoreboard import Out, WriteRecorder, compare
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import ALL_GLOBAL_COUNTERS, JOB_COUNTERS, Op, build_regmap

# one port, one lane, 512 bits, small tables (the Verilog grows with flows and slots)
PARAMS = dict(ports=1, jobs=2, flows=16, slots=16, max_world=8, pmtu_max=4096, data_width=512)
WINDOW = 16
INDICES = 128   # the window wraps 8 times
# backpressure cycles allowed in the whole run: the port's first beats wait for the pipeline
# to start (none measured); a decision queue without room loses cycles on every ACK burst
SLACK = 8


@functools.cache
def _top():
    return engine_top(PARAMS)


def _load(job: RingJob, rng) -> list[bytes]:
    """Every frame of the run in port order: contributions of k, then the ACKs of k - W/2."""
    frames = []
    lag = WINDOW // 2
    for k in range(INDICES):
        x = rng.integers(-2**31, 2**31, size=(job.world, job.pmtu // 4), dtype=np.int64)
        frames += [job.data_bytes(r, k, x[r].astype(np.int32)) for r in range(job.world)]
        if k >= lag:
            frames += [job.ack(r, k - lag) for r in range(job.world)]
    return frames


@pytest.mark.xdist_group("fastsim_one_lane_512")
@pytest.mark.parametrize("pmtu", [256, 4096])
def test_one_lane_port_at_line_rate_behind_a_busy_dispatcher(pmtu):
    why = verilator_missing()
    if why:
        pytest.skip(why)
    eng = Engine(**{k: v for k, v in PARAMS.items() if k != "data_width"},
                 data_width=PARAMS["data_width"])
    ops: list = []
    job = RingJob(job=0, world=8, window=WINDOW, slot_base=0, pmtu=pmtu, op=Op.SUM_WRAP)
    EngineControl(WriteRecorder(eng.bus, ops)).add_job(job.config())
    frames = _load(job, np.random.default_rng(pmtu))
    nb = PARAMS["data_width"] // 8
    beats = sum(-(-len(f) // nb) for f in frames)
    want = [(e.port, e.frame) for f in frames for e in eng.receive(0, f, 0)]
    with FastSim(_top(), seed=5) as sim:
        for a, v in ops:
            sim.axil_write(a, v)
        sim.run(4 * PARAMS["flows"] + 4 * PARAMS["slots"] + 100)   # the enable sequence
        got = sim.collect()
        assert sim.idle()
        start = sim.cycle
        for f in frames:
            sim.send(0, f)
        # to the cycle the port's last beat was taken (at most 2 cycles late: pending() counts a
        # frame until its last beat has been driven)
        while sim.pending(0) > 1:
            got += sim.run(32)
        while sim.pending(0):
            got += sim.run(1)
        taken = sim.cycle - start
        got += sim.run(200_000, until_idle=True, quiet=1000)
        assert sim.idle()
        rm = build_regmap(**PARAMS)
        base = rm.table("CNT").base
        rtl_cnt = {c.name: sim.axil_read(base + 4 * i) for i, c in enumerate(ALL_GLOBAL_COUNTERS)}
        t = rm.table("JOB_CNT")
        rtl_job = {c.name: sim.axil_read(t.base + 4 * i) for i, c in enumerate(JOB_COUNTERS)}
    # line rate: every beat taken, backpressure a few cycles in the whole run
    assert taken - beats <= SLACK, (
        f"port 0 took {beats} beats in {taken} cycles ({beats / taken:.4f} beats/cycle)")
    assert not any(g.error for g in got)
    bad = compare([Out(port, f, 0) for port, f in want], [Out(g.port, g.frame, 0) for g in got])
    assert not bad, bad[0].describe()
    m32 = (1 << 32) - 1
    assert rtl_cnt == {n: v & m32 for n, v in eng.counters().items() if n in rtl_cnt}
    assert rtl_job == {n: v & m32 for n, v in eng.counters(0).items() if n in rtl_job}
    c = eng.counters()
    assert c["released"] == INDICES and c["freed"] == INDICES - WINDOW // 2
    # the results and the forwarded ACKs left on port 0, and all of them
    assert {g.port for g in got} == {0} and len(got) == len(want)
