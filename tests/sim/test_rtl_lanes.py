"""Per-port lanes on Verilator (FastSim, 64-bit, 2 ports, ``lanes = 2``): both ports loaded at
once, against the model (decision D20).

Two jobs whose ranks are split across the two ports (A: N=4, SUM_SAT with values that clip;
B: N=3, MAX, PMTU 1024). All frames of the first phase are queued on both ports at once, so the
two lanes and the two deparsers work concurrently; contributions are lost on both ports (resent
later) and duplicated on both ports, a result of each job is re-emitted, every receiver ACKs at the
end. Traffic is chosen so that no disposition depends on how the two ports interleave (a
duplicate is of an index still incomplete; re-emits and ACKs come after the engine went idle),
so the model may take each phase in any order. Checks: frames per output port and flow equal the
model's, in order; every global and job counter equals the model's.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.rtl.backend import engine_top
from netreduce.sim.rtl.fastsim import FastSim, verilator_missing
from netreduce.sim.rtl.soak_rtl import soak_params
from netreduce.sim.verif.scoreboard import Out, WriteRecorder, compare
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import ALL_GLOBAL_COUNTERS, JOB_COUNTERS, Op, build_regmap

# the 64-bit two-port lanes build of the RTL soak and fuzzing (one Verilator build for all three)
PARAMS = soak_params(lanes=2)
A = RingJob(job=0, world=4, window=8, slot_base=0, pmtu=256, op=Op.SUM_SAT)
B = RingJob(job=1, world=3, window=8, slot_base=8, pmtu=1024, op=Op.MAX)
K = 6
BIG = 2**31 - 1


@functools.cache
def _top():
    return engine_top(PARAMS)


def _port(job, r):
    return r % 2 if job is A else (r + 1) % 2


def _payloads(rng):
    xa = rng.integers(-2**31, 2**31, size=(K, A.world, 20), dtype=np.int64)
    xa[:, :, 0] = np.where(np.arange(A.world) % 2 == 0, BIG, -BIG)  # clip in each lane
    xa[:, :, 1] = BIG  # clips in both lanes and in the combination
    xb = rng.integers(-2**31, 2**31, size=(K, B.world, 200), dtype=np.int64)
    return {A.job: xa.astype(np.int32), B.job: xb.astype(np.int32)}


@pytest.mark.xdist_group("fastsim_lanes_soak")
def test_two_ports_loaded_at_once_lanes():
    why = verilator_missing()
    if why:
        pytest.skip(why)
    eng = Engine(**{k: v for k, v in PARAMS.items() if k != "data_width"},
                 data_width=PARAMS["data_width"])
    ops: list = []
    ctl = EngineControl(WriteRecorder(eng.bus, ops))
    for j in (A, B):
        ctl.add_job(j.config())
    x = _payloads(np.random.default_rng(17))

    def data(job, r, k):
        return (_port(job, r), job.data_bytes(r, k, x[job.job][k, r]))

    lost = {(A.job, 1, 3), (B.job, 2, 2), (A.job, 2, 4)}   # ports 1, 1 and 0
    dup = {(A.job, 0, 3), (B.job, 0, 2)}  # ports 0 and 1; incomplete until the resend
    assert {_port(j, r) for j, r in ((A, 1), (B, 2), (A, 2))} == {0, 1}
    assert {_port(A, 0), _port(B, 0)} == {0, 1}
    phase1 = []
    for k in range(K):
        for job in (A, B):
            for r in range(job.world):
                if (job.job, r, k) in lost:
                    continue
                phase1.append(data(job, r, k))
                if (job.job, r, k) in dup:
                    phase1.append(data(job, r, k))
    phases = [phase1,
              [data(A, 1, 3), data(B, 2, 2), data(A, 2, 4)],        # the lost ones, resent
              [data(A, 0, 1), data(B, 1, 4)],                       # after release: re-emits
              [(_port(j, r), j.ack(r, K - 1)) for j in (A, B) for r in range(j.world)]]
    want = []
    with FastSim(_top(), seed=3) as sim:
        sim.set_ready_duty(0, 4, 5)
        sim.set_ready_duty(1, 3, 4)
        for a, v in ops:
            sim.axil_write(a, v)
        sim.run(4 * PARAMS["flows"] + 4 * PARAMS["slots"] + 100)
        got = sim.collect()
        for frames in phases:
            for port, f in frames:
                want += [(e.port, e.frame) for e in eng.receive(port, f, 0)]
                sim.send(port, f)
            got += sim.run(400_000, until_idle=True, quiet=500)
            assert sim.idle()
        rm = build_regmap(**PARAMS)
        base = rm.table("CNT").base
        rtl_cnt = {c.name: sim.axil_read(base + 4 * i) for i, c in enumerate(ALL_GLOBAL_COUNTERS)}
        t = rm.table("JOB_CNT")
        rtl_job = [{c.name: sim.axil_read(t.base + j * t.stride + 4 * i)
                    for i, c in enumerate(JOB_COUNTERS)} for j in range(2)]
    assert not any(g.error for g in got)
    bad = compare([Out(port, f, 0) for port, f in want], [Out(g.port, g.frame, 0) for g in got])
    assert not bad, bad[0].describe()
    m32 = (1 << 32) - 1
    assert rtl_cnt == {n: v & m32 for n, v in eng.counters().items() if n in rtl_cnt}
    for j in range(2):
        assert rtl_job[j] == {n: v & m32 for n, v in eng.counters(j).items()
                              if n in rtl_job[j]}
    c = eng.counters()
    assert c["duplicates"] == 2 and c["reemits"] == 2 and c["saturations"] > 0
    assert c["released"] == 2 * K and c["freed"] == 2 * K
    # the results really used both ports at once (ranks of each job on both ports)
    assert {g.port for g in got} == {0, 1}
