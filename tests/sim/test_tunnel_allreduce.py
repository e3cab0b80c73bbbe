"""All-reduce through the switch service over real TCP tunnels, in wall-clock time.

Two shapes: the in-process collective (every rank's RNIC on one Tunnel) and RankComm (one rank per
thread here, one per process under torchrun), with and without injected faults, plus failures: a
dead rank and a vanished switch must end in a clear error, not a hang.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
from netreduce.sim.emu.rank import CollectiveError, RankComm, RankCommConfig, thread_exchange
from netreduce.sim.emu.switch import FaultConfig, SwitchConfig, SwitchThread
from netreduce.sim.emu.tunnel import Tunnel
from netreduce.sim.net.collective import CollectiveConfig, Communicator
from netreduce.sw_driver import quant
from netreduce.sw_driver.control import EngineControl


def _floats(rng, world, n):
    # gradients: magnitudes spanning 6 decades across ranks
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
            for _ in range(world)]


def test_collective_over_one_tunnel():
    """The in-process Communicator runs unchanged on a Tunnel (a wall-clock Fabric)."""
    rng = np.random.default_rng(5)
    with SwitchThread() as sw, Tunnel(sw.address) as t:
        comm = Communicator(t, 3, CollectiveConfig(timeout=16, msg_packets=16))
        xi = [rng.integers(-2**31, 2**31, 20_000, dtype=np.int64).astype(np.int32)
              for _ in range(3)]
        res = comm.allreduce(xi)
        ref = np.sum(np.array(xi, dtype=np.int64), axis=0).astype(np.int32)
        assert all(np.array_equal(y, ref) for y in res.results)
        xf = _floats(rng, 3, 30_000)
        res = comm.allreduce(xf)
        ref = np.sum(np.array(xf, dtype=np.float64), axis=0)
        for y in res.results:
            assert (np.abs(y - ref) <= res.error_bound()).all()
        assert res.stats["slots_left"] == 0
        assert EngineControl(t.bus).enabled_jobs() == []


def _bound(x, cfg: RankCommConfig, world: int):
    """quant.error_bound for RankComm's segmentation: segments of max_bytes, chunks of one
    message, the exponent of a chunk being the maximum over the ranks."""
    ce, seg = cfg.chunk_elems, cfg.max_bytes // 4

    def bound(y):
        parts = []
        for s in range(0, y.size, seg):
            e = quant.scales(np.max([quant.chunk_exponents(xr[s:s + seg], ce) for xr in x],
                                    axis=0), world)
            parts.append(quant.error_bound(y[s:s + seg], e, ce, world))
        return np.concatenate(parts)

    return bound


def _run_ranks(address, world, body, cfg, setup_only=()):
    """Run ``body(comm, rank)`` in ``world`` threads; returns (results, errors) per rank."""
    ex = thread_exchange(world)
    out: list = [None] * world
    errs: list = [None] * world

    def rank(r):
        comm = None
        try:
            comm = RankComm(address, r, world, functools.partial(ex, r), cfg, seed=r)
            out[r] = body(comm, r)
            comm.close(barrier=r not in setup_only)
        except Exception as e:  # reported to the test
            errs[r] = e
            if comm is not None:
                comm.close(barrier=False)

    th = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world)]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
        assert not t.is_alive(), "a rank hung"
    return out, errs


@pytest.mark.parametrize("faults", [False, True], ids=["clean", "loss-dup-reorder"])
def test_rankcomm_allreduce(faults):
    world, n = 3, 20_000
    rng = np.random.default_rng(11)
    xs = [_floats(rng, world, n) for _ in range(3)]  # three calls
    xi = [rng.integers(-2**31, 2**31, 5_000, dtype=np.int64).astype(np.int32)
          for _ in range(world)]
    fc = FaultConfig(loss=0.01, dup=0.01, reorder=0.01) if faults else FaultConfig()
    # small messages and segments: several messages, segments and windows per call
    cfg = RankCommConfig(msg_packets=8, max_bytes=64 << 10, int32=True,
                         timeout=16 if faults else 17)

    def body(comm, r):
        ys = [comm.allreduce(x[r]) for x in xs]
        yi = comm.allreduce(xi[r])
        counters = comm.engine_counters() if r == 0 else None
        return ys, yi, counters, comm.qp_stats()

    with SwitchThread(cfg=SwitchConfig(up=fc, down=fc, seed=4)) as sw:
        out, errs = _run_ranks(sw.address, world, body, cfg)
        assert errs == [None] * world, errs
        with Tunnel(sw.address) as t:
            ctrl = EngineControl(t.bus)
            assert ctrl.enabled_jobs() == []  # rank 0 removed its jobs on close
            assert ctrl.slots_in_use() == 0
        n_sw = sw.counters()
    for call, x in enumerate(xs):
        ref = np.sum(np.array(x, dtype=np.float64), axis=0)
        bound = _bound(x, cfg, world)
        for r in range(world):
            y = out[r][0][call]
            assert np.array_equal(y, out[0][0][call]), f"rank {r} differs from rank 0"
            assert (np.abs(y - ref) <= bound(y)).all(), f"rank {r}, call {call}: beyond bound"
    refi = np.sum(np.array(xi, dtype=np.int64), axis=0).astype(np.int32)
    assert all(np.array_equal(o[1], refi) for o in out)
    eng = out[0][2]
    assert eng["sum"]["saturations"] == 0  # overflow is impossible by construction
    assert eng["sum"]["contributions"] > 0 and eng["exp"]["contributions"] > 0
    if faults:
        assert n_sw["up_lost"] + n_sw["down_lost"] > 0
        assert sum(o[3]["retransmitted"] for o in out) > 0  # recovered by the RC endpoints
    else:
        # (no assertion on retransmissions: a loaded machine may stall a rank past a timeout)
        assert eng["sum"]["drop_ahead"] == 0  # the credits keep every packet in the window


def test_dead_rank_fails_the_others_with_a_clear_error():
    world = 3
    cfg = RankCommConfig(timeout=13, retry_cnt=3, op_timeout_s=60)  # 4 x 33 ms of patience
    x = np.ones(10_000, np.float32)

    def body(comm, r):
        if r == 2:
            comm.tunnel.close()  # dies right after setup, before the first all-reduce
            return None
        t0 = time.monotonic()
        try:
            comm.allreduce(x)
        except CollectiveError as e:
            return e, time.monotonic() - t0
        return None

    with SwitchThread() as sw:
        out, errs = _run_ranks(sw.address, world, body, cfg, setup_only=(0, 1, 2))
    assert errs == [None] * world, errs
    for r in (0, 1):
        err, _ = out[r]
        assert isinstance(err, CollectiveError)
        assert f"rank {r}: all-reduce #1 failed" in str(err)
        assert "retry limit exceeded" in str(err) and "peer rank died" in str(err)


def test_switch_vanishing_is_a_clear_error():
    world = 2
    cfg = RankCommConfig(timeout=17)
    sw = SwitchThread().start()
    gate = threading.Barrier(world + 1, timeout=30)

    def body(comm, r):
        gate.wait()  # the test stops the switch here
        gate.wait()
        with pytest.raises(CollectiveError, match="closed the connection"):
            comm.allreduce(np.ones(1000, np.float32))
        with pytest.raises(CollectiveError):  # broken for good
            comm.allreduce(np.ones(1000, np.float32))
        return "ok"

    th = threading.Thread(target=lambda: res.append(_run_ranks(sw.address, world, body, cfg,
                                                               setup_only=(0, 1))))
    res: list = []
    th.start()
    gate.wait()
    sw.stop()
    gate.wait()
    th.join(60)
    out, errs = res[0]
    assert errs == [None] * world, errs
    assert out == ["ok"] * world


def test_rankcomm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rank must be 0..1"):
        RankComm(("127.0.0.1", 1), 2, 2, lambda o: [o, o])
    with pytest.raises(ValueError, match="msg_packets"):
        RankCommConfig(msg_packets=500)
    with pytest.raises(ValueError, match="max_bytes"):
        RankCommConfig(max_bytes=1000)
