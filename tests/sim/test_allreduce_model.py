"""The collective all-reduce through the reference engine on a lossy network (seeded scenarios)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.net.collective import CollectiveConfig, Communicator, allreduce, run
from netreduce.sim.net.model_fabric import ModelFabric
from netreduce.sim.net.network import LinkConfig, NetConfig
from netreduce.sim.net.rnic import RCError
from netreduce.sim.net.scheduler import SimulationHang
from netreduce.sw_driver.control import EngineControl

from netreduce.wire import PSN_MOD


def _inputs(rng: np.random.Generator, world: int, n: int, dtype: str):
    if dtype == "int32":
        return [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
                for _ in range(world)]
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
            for _ in range(world)]


def _check(xs, res):
    """int32: bit-exact (two's complement wrap); float32: within the stated bound."""
    if xs[0].dtype == np.int32:
        ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
        for r, y in enumerate(res.results):
            assert np.array_equal(y, ref), f"rank {r} differs"
    else:
        ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
        bound = res.error_bound()
        for r, y in enumerate(res.results):
            assert np.array_equal(y, res.results[0]), f"rank {r} differs from rank 0"
            assert (np.abs(y.astype(np.float64) - ref) <= bound).all()
    assert res.stats["slots_left"] == 0


def test_lossless_int32_exact_and_never_ahead_of_window():
    fab = ModelFabric(seed=1)
    rng = np.random.default_rng(1)
    xs = _inputs(rng, 4, 100_003, "int32")  # 400012 B: not a multiple of the PMTU
    res = allreduce(fab, xs, CollectiveConfig())  # the defaults: W 256, margin 64, 64-packet msgs
    _check(xs, res)
    st, eng = res.stats, res.stats["engine"]
    npk = 4 * -(-400_012 // 1024)
    assert st["sent"] == npk and st["retransmitted"] == 0 and st["timeouts"] == 0
    assert eng["drop_ahead"] == 0 and eng["duplicates"] == 0 and eng["contributions"] == npk
    assert eng["results_sent"] == npk and eng["freed"] == npk // 4
    assert EngineControl(fab.bus).enabled_jobs() == []


def test_credits_bound_the_window_even_with_a_burst_limit_above_it():
    # W - margin = 48 < 128 (the RNIC's own limit): only the credits keep drop_ahead at 0
    fab = ModelFabric(seed=2)
    xs = _inputs(np.random.default_rng(2), 3, 60_000, "int32")
    res = allreduce(fab, xs, CollectiveConfig(pmtu=256, msg_packets=16, window=64, margin=16))
    _check(xs, res)
    assert res.stats["engine"]["drop_ahead"] == 0 and res.stats["retransmitted"] == 0


def test_float32_with_loss_within_bound():
    fab = ModelFabric(net=NetConfig.faulty(loss=0.02), seed=3)
    xs = _inputs(np.random.default_rng(3), 3, 50_001, "float32")
    res = allreduce(fab, xs, CollectiveConfig(pmtu=512, msg_packets=8))
    _check(xs, res)
    assert res.stats["passes"] == 2 and res.stats["engine"]["saturations"] == 0
    assert res.stats["retransmitted"] > 0 and res.stats["naks_received"] > 0


def _scenario(seed: int):
    """2-4 concurrent jobs of random shape on one engine, faults up to 5 % everywhere."""
    r = random.Random(seed)
    net = NetConfig.faulty(loss=r.uniform(0, 0.05), dup=r.uniform(0, 0.05),
                           reorder=r.uniform(0, 0.05), jitter_ns=r.choice([0, 200]))
    fab = ModelFabric(net=net, seed=seed)
    rng = np.random.default_rng(seed)
    jobs = []
    for j in range(r.randint(2, 4)):
        world = 32 if seed % 3 == 1 and j == 0 else r.choice([2, 3, 5, r.randint(2, 32)])
        pmtu = r.choice([256, 512, 1024])
        budget = 160 if world < 16 else 64  # packets per rank: bounded CI time
        n = r.randint(1, budget * pmtu // 4)
        if n % (pmtu // 4) == 0:
            n += 1  # never a multiple of the PMTU
        window = r.choice([32, 64, 256])
        cfg = CollectiveConfig(
            pmtu=pmtu, window=window, margin=window // 4,
            msg_packets=r.randint(1, min(16, window - window // 4)),
            timeout=r.choice([6, 8]),
            # start PSNs just below 2^24: the PSN wraps in the middle of a message
            start_psns=tuple(PSN_MOD - r.randint(1, 40) for _ in range(world)))
        dtype = r.choice(["int32", "float32"])
        xs = _inputs(rng, world, n, dtype)
        jobs.append((Communicator(fab, world, cfg, seed=seed, name=f"job{j}"), xs))
    return fab, jobs


@pytest.mark.parametrize("seed", range(6))
def test_random_concurrent_jobs_under_faults(seed):
    fab, jobs = _scenario(seed)
    ops = [comm.allreduce_async(xs) for comm, xs in jobs]
    run(fab, ops, timeout_ns=10**11)
    for op, (_, xs) in zip(ops, jobs, strict=True):
        _check(xs, op.result())
    ctrl = EngineControl(fab.bus)
    assert ctrl.enabled_jobs() == [] and ctrl.slots_in_use() == 0


def test_ce_marks_are_answered_with_cnps():
    fab = ModelFabric(net=NetConfig(LinkConfig(ce=0.2)), seed=7)
    xs = _inputs(np.random.default_rng(7), 3, 20_000, "int32")
    res = allreduce(fab, xs, CollectiveConfig(pmtu=1024, ecn=True))
    _check(xs, res)
    assert res.stats["engine"]["cnp_sent"] > 0 and res.stats["cnps"] > 0
    assert res.stats["retransmitted"] == 0


def test_psn_wrap_mid_message_lossless():
    fab = ModelFabric(seed=4)
    xs = _inputs(np.random.default_rng(4), 2, 2000, "int32")
    cfg = CollectiveConfig(pmtu=256, msg_packets=8, start_psns=(PSN_MOD - 3, PSN_MOD - 30))
    res = allreduce(fab, xs, cfg)
    _check(xs, res)
    assert res.stats["retransmitted"] == 0


def test_dead_uplink_gives_retry_limit_error_and_removes_the_job():
    net = NetConfig(overrides={("up", "data"): LinkConfig(loss=0.999)})
    fab = ModelFabric(net=net, seed=5)
    xs = _inputs(np.random.default_rng(5), 2, 1000, "int32")
    with pytest.raises(RCError, match=r"retry limit exceeded.*PSN"):
        allreduce(fab, xs, CollectiveConfig(pmtu=256, timeout=4, retry_cnt=2))
    assert EngineControl(fab.bus).enabled_jobs() == []


def test_watchdog_names_the_stuck_ranks():
    net = NetConfig(overrides={("down", "data"): LinkConfig(loss=0.999)})
    fab = ModelFabric(net=net, seed=6)
    xs = _inputs(np.random.default_rng(6), 2, 1000, "int32")
    with pytest.raises(SimulationHang, match=r"simulated-time limit.*r0: posted"):
        allreduce(fab, xs, CollectiveConfig(pmtu=256, timeout=16, sim_timeout_ns=10**6))
    assert EngineControl(fab.bus).enabled_jobs() == []


def test_argument_validation():
    fab = ModelFabric(engine=Engine())
    comm = Communicator(fab, 2)
    with pytest.raises(ValueError, match="one array per rank"):
        comm.allreduce([np.zeros(4, np.int32)])
    with pytest.raises(ValueError, match="rank 1"):
        comm.allreduce([np.zeros(4, np.int32), np.zeros(5, np.int32)])
    with pytest.raises(TypeError, match="float64"):
        comm.allreduce([np.zeros(4), np.zeros(4)])
    with pytest.raises(ValueError, match="world size"):
        Communicator(fab, 1)
    with pytest.raises(ValueError, match="msg_packets"):
        CollectiveConfig(window=64, margin=16, msg_packets=64)
    with pytest.raises(ValueError, match="power of two"):
        CollectiveConfig(window=100)
    with pytest.raises(ValueError, match="NaN"):
        comm.allreduce([np.full(4, np.nan, np.float32), np.zeros(4, np.float32)])
