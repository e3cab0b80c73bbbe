"""The ring all-reduce baseline (netreduce.sim.net.ring) over software RC endpoints through a
forwarding-only switch: correct results, the 2(N-1)/N traffic, recovery and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.net.network import LinkConfig, NetConfig, NetworkFabric
from netreduce.sim.net.ring import RingAllReduce, ring_allreduce
from netreduce.sim.net.scheduler import SimulationHang


def _ints(n, size, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-2**31, 2**31, size, dtype=np.int64).astype(np.int32) for _ in range(n)]


def _ref(xs):
    return np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)


@pytest.mark.parametrize("n, size, pmtu", [(2, 1, 256), (3, 1000, 1024), (5, 4099, 256),
                                           (8, 3, 4096), (6, 30000, 4096)])
def test_ring_int32_bit_exact(n, size, pmtu):
    xs = _ints(n, size, seed=n)
    res = ring_allreduce(NetworkFabric(), xs, pmtu=pmtu)
    ref = _ref(xs)
    for r, y in enumerate(res.results):
        assert np.array_equal(y, ref), f"rank {r}"
    assert res.stats["retransmitted"] == 0 and res.sim_ns > 0


def test_ring_float32_and_shape():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((7, 9)).astype(np.float32) for _ in range(4)]
    res = ring_allreduce(NetworkFabric(), xs)
    ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
    for y in res.results:
        assert y.shape == (7, 9) and y.dtype == np.float32
        assert np.allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_ring_recovers_from_loss_dup_reorder():
    xs = _ints(4, 20000, seed=3)
    fab = NetworkFabric(NetConfig.faulty(loss=0.03, dup=0.02, reorder=0.02), seed=5)
    res = ring_allreduce(fab, xs, pmtu=1024)
    ref = _ref(xs)
    assert all(np.array_equal(y, ref) for y in res.results)
    assert res.stats["retransmitted"] > 0


def test_ring_moves_2_n_minus_1_over_n_of_the_buffer():
    n, size = 4, 64 * 1024  # elements; 256 KiB per rank, 64 KiB chunks = 16 packets at 4096
    fab = NetworkFabric()
    ring_allreduce(fab, _ints(n, size), pmtu=4096)
    data = fab.link_stats()["up"]["data_frames"]
    assert data == n * 2 * (n - 1) * (size * 4 // n // 4096)


def test_ring_time_is_physical():
    # 2 ranks, 1 MiB: each sends S/2 twice over a 100 Gb/s link: ~ S * 8 / 98 Gb/s + latency
    n, size = 2, 256 * 1024
    fab = NetworkFabric(NetConfig(LinkConfig(gbps=100.0, latency_ns=500)))
    res = ring_allreduce(fab, _ints(n, size), pmtu=4096)
    ideal = size * 4 * 8 / (100 * 4096 / 4178)
    assert ideal < res.sim_ns < 1.1 * ideal


def test_ring_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 2 ranks"):
        RingAllReduce(NetworkFabric(), _ints(1, 4))
    with pytest.raises(ValueError, match="differs from rank 0"):
        RingAllReduce(NetworkFabric(), [np.zeros(4, np.int32), np.zeros(5, np.int32)])
    with pytest.raises(TypeError, match="float64"):
        RingAllReduce(NetworkFabric(), [np.zeros(4), np.zeros(4)])


def test_ring_hang_is_reported():
    # every data frame lost: the watchdog names every rank's progress
    net = NetConfig(LinkConfig(), overrides={("up", "data"): LinkConfig(loss=0.999)})
    with pytest.raises(SimulationHang, match=r"ring: r0: posted 1/2"):
        ring_allreduce(NetworkFabric(net), _ints(2, 64), timeout_ns=2_000_000)
