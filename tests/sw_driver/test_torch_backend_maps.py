"""The torch backend's exact integer maps (MAX/MIN keys, int64 limbs) with ranks as threads and a
fake engine (numpy MAX and wrapping SUM): fast, many values, edge cases; host grouping, options
and a world of one. The real engine runs the maps in tests/sw_driver/test_torch_backend.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch not installed: pip install '.[torch]'")

from netreduce.sim.emu.rank import thread_exchange  # noqa: E402
from netreduce.sw_driver import torch_backend as tb  # noqa: E402

RedOp = tb.RedOp


class FakeComm:
    """What the engine does with int32 lanes: signed MAX (the "exp" ring), wrapping SUM."""

    def __init__(self, rank: int, exchange):
        self.rank, self.ex = rank, exchange

    def ring_reduce(self, name: str, a: np.ndarray) -> np.ndarray:
        assert name == "exp" and a.dtype == np.int32
        return np.maximum.reduce(self.ex(self.rank, a))

    def allreduce(self, a: np.ndarray) -> np.ndarray:
        assert a.dtype == np.int32
        return np.add.reduce(self.ex(self.rank, a), dtype=np.int32)


def _ranks(fn, inputs: list[np.ndarray]) -> list[np.ndarray]:
    ex = thread_exchange(len(inputs))
    out: list = [None] * len(inputs)

    def run(r):
        out[r] = fn(FakeComm(r, ex), inputs[r])
    ts = [threading.Thread(target=run, args=(r,)) for r in range(len(inputs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return out


def _maxmin(comm, a, op):
    fl = a.dtype.kind == "f"
    if a.itemsize == 4:
        return tb._unkey32(tb._max32(comm, tb._key32(a), op, fl), a.dtype)
    return tb._unkey64(tb._max64(comm, tb._key64(a), op, fl), a.dtype)


EDGE = {
    np.int32: [0, 1, -1, 2**31 - 1, -(2**31), 12345, -12345],
    np.int64: [0, 1, -1, 2**63 - 1, -(2**63), 2**32, -(2**32), 2**32 - 1, -(2**32) + 1,
               (1 << 40) + 5, -(1 << 40) - 5],
    np.float32: [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38],
    np.float64: [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 5e-324, -5e-324, 1.7e308, -1.7e308],
}


@pytest.mark.parametrize("dt", list(EDGE))
@pytest.mark.parametrize("world", [2, 3])
def test_max_min_equal_numpy_on_edges_and_random_values(dt, world):
    g = np.random.default_rng(world)
    edge = np.array(EDGE[dt], dtype=dt)
    xs = []
    for r in range(world):
        if np.dtype(dt).kind == "i":
            rnd = g.integers(np.iinfo(dt).min, np.iinfo(dt).max, 500, dtype=dt, endpoint=True)
        else:
            rnd = (g.standard_normal(500) * 10.0 ** g.integers(-30, 30, 500)).astype(dt)
        xs.append(np.concatenate([np.roll(edge, r), rnd]))
    for op, ref in ((RedOp.MAX, np.maximum), (RedOp.MIN, np.minimum)):
        got = _ranks(lambda c, a, op=op: _maxmin(c, a, op), xs)
        want = ref.reduce(xs)
        for y in got:
            assert y.dtype == np.dtype(dt)
            np.testing.assert_array_equal(y, want)


def test_nan_wins_max_and_min_of_floats():
    for dt in (np.float32, np.float64):
        xs = [np.array([1.0, np.nan, -np.inf], dt), np.array([-np.nan, 2.0, np.nan], dt)]
        for op in (RedOp.MAX, RedOp.MIN):
            for y in _ranks(lambda c, a, op=op: _maxmin(c, a, op), xs):
                assert np.isnan(y).all(), (dt, op, y)


def test_int64_sum_is_exact_and_wraps():
    g = np.random.default_rng(0)
    for world in (2, 5):
        xs = [np.concatenate([np.array([2**63 - 1, -(2**63), -1, 0], np.int64),
                              g.integers(-(2**63), 2**63 - 1, 1000, dtype=np.int64)])
              for _ in range(world)]
        want = np.add.reduce(xs, dtype=np.int64)  # wraps like torch's int64 sum
        for y in _ranks(tb._int64_sum, xs):
            assert np.array_equal(y, want)


def test_host_groups():
    assert tb.host_groups(["a", "a", "b", "b"]) == [[0, 1], [2, 3]]
    assert tb.host_groups(["a", "b", "a", "b"]) == [[0, 2], [1, 3]]
    assert tb.host_groups(["a", "a", "a"]) is None  # one host: flat
    assert tb.host_groups(["a", "b", "c"]) is None  # one rank per host: flat
    assert tb.host_groups(["a", "a", "b"]) is None  # unequal hosts: flat


def test_options_need_a_switch(monkeypatch):
    monkeypatch.delenv("NETREDUCE_SWITCH", raising=False)
    with pytest.raises(RuntimeError, match="NETREDUCE_SWITCH"):
        tb.Options().resolved(None)
    monkeypatch.setenv("NETREDUCE_SWITCH", "127.0.0.1:1")
    monkeypatch.setenv("NETREDUCE_LOCAL_SIZE", "2")
    o = tb.Options().resolved(None)
    assert o.switch == "127.0.0.1:1" and o.local_size == 2 and o.ints and not o.exact
    assert tb._host_key(o, 3) == tb._host_key(o, 2) != tb._host_key(o, 1)


def test_the_backend_is_registered_for_cpu():
    import torch.distributed as dist

    assert "netreduce" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["netreduce"] == ["cpu"]
    tb.register()  # idempotent


def test_world_of_one_needs_no_switch():
    import torch
    import torch.distributed as dist

    dist.init_process_group("netreduce", store=dist.HashStore(), rank=0, world_size=1,
                            pg_options=tb.Options(switch="127.0.0.1:1"))  # nothing listens
    try:
        t = torch.tensor([3, -7], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert t.tolist() == [3, -7]
        h = torch.tensor([0.5, -2.0], dtype=torch.bfloat16)
        dist.all_reduce(h, op=dist.ReduceOp.MAX, async_op=True).wait()
        assert h.tolist() == [0.5, -2.0]
        with pytest.raises(RuntimeError, match=r"rank 0: all_reduce\(PRODUCT.*no QP"):
            dist.all_reduce(h, op=dist.ReduceOp.PRODUCT)
    finally:
        dist.destroy_process_group()
