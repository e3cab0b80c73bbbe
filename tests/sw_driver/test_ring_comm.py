"""The ring communicators' shared parts (RankComm and VerbsComm): ring layout, job
registration and its rollback, rank 0's failure reaching every rank, argument checks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from netreduce.sw_driver import ring_comm
from netreduce.sw_driver.control import Op


def _cfg(**kw):
    base = dict(pmtu=1024, msg_packets=16, window=256, margin=64, exp_window=64,
                max_bytes=1 << 20, int32=True)
    base.update(kw)
    return SimpleNamespace(chunk_elems=base["msg_packets"] * base["pmtu"] // 4, **base)


def test_make_rings_layout():
    rings = ring_comm.make_rings(_cfg(), lambda *a: a, exp_bytes=1 << 16)
    assert list(rings) == ["exp", "sum", "int"]
    # 256 chunks of 16 KiB -> 1 KiB of exponents, raised to exp_bytes
    assert rings["exp"] == ("exp", Op.MAX, 64, 16, 16, 1 << 16)
    assert rings["sum"] == ("sum", Op.SUM_SAT, 256, 64, 16, 1 << 20)
    assert rings["int"] == ("int", Op.SUM_WRAP, 256, 64, 16, 1 << 20)
    assert list(ring_comm.make_rings(_cfg(), lambda *a: a, float32=False)) == ["int"]
    assert list(ring_comm.make_rings(_cfg(int32=False), lambda *a: a)) == ["exp", "sum"]


class _Ctrl:
    def __init__(self, jobs):
        self.jobs, self.added, self.removed = jobs, [], []

    def identify(self):
        return SimpleNamespace(jobs=self.jobs, pmtu_max=4096)

    def enabled_jobs(self):
        return [c.job for c in self.added if c.job not in self.removed]

    def alloc_slots(self, window):
        return 0

    def add_job(self, cfg):
        self.added.append(cfg)

    def remove_job(self, job):
        self.removed.append(job)


def _peers(n, names):
    return [{"ip": 100 + r, "rings": {k: {"sq": 10 * r, "rq": 10 * r + 1, "sq_psn": r}
                                      for k in names}} for r in range(n)]


def test_register_jobs_flows_and_rollback():
    rings = {k: SimpleNamespace(window=64, op=Op.SUM_WRAP) for k in ("a", "b")}
    ctrl = _Ctrl(jobs=4)
    assert ring_comm.register_jobs(ctrl, rings, _peers(3, rings), 1024) == {"a": 0, "b": 1}
    f = ctrl.added[0].flows[2]  # rank 2 forwards to rank 0's receive QP
    assert (f.fwd_ip, f.fwd_qpn, f.rev_ip, f.rev_qpn, f.start_psn) == (102, 1, 100, 20, 2)
    ctrl = _Ctrl(jobs=1)
    with pytest.raises(RuntimeError, match="all 1 engine jobs are in use; hint"):
        ring_comm.register_jobs(ctrl, rings, _peers(3, rings), 1024, "; hint")
    assert ctrl.removed == [0]
    with pytest.raises(ValueError, match="pmtu 8192 exceeds the engine's pmtu_max 4096"):
        ring_comm.register_jobs(_Ctrl(jobs=4), rings, _peers(2, rings), 8192)


def test_share_jobs_reports_rank0_failure():
    def fail():
        raise RuntimeError("no engine")

    with pytest.raises(KeyError, match="rank 0 could not register.*RuntimeError: no engine"):
        ring_comm.share_jobs(0, lambda s: [s], fail, KeyError)
    bad = {"ok": False, "error": "X"}
    with pytest.raises(KeyError, match="rank 1: rank 0 could not"):
        ring_comm.share_jobs(1, lambda s: [bad, s], fail, KeyError)
    assert ring_comm.share_jobs(1, lambda s: [{"ok": True, "jobs": {"a": 3}}], fail,
                                KeyError) == {"a": 3}


def test_check_allreduce_args():
    both = {"sum": 0, "int": 0}
    a, out, o = ring_comm.check_allreduce_args(np.zeros((2, 3), np.float32), None, both, "C")
    assert a.shape == o.shape == (6,) and out.shape == (6,)
    with pytest.raises(TypeError, match="float64"):
        ring_comm.check_allreduce_args(np.zeros(3), None, both, "C")
    with pytest.raises(TypeError, match=r"needs C\(int32=True\)"):
        ring_comm.check_allreduce_args(np.zeros(3, np.int32), None, {"sum": 0}, "C")
    with pytest.raises(TypeError, match=r"needs C\(float32=True\)"):
        ring_comm.check_allreduce_args(np.zeros(3, np.float32), None, {"int": 0}, "C")
    with pytest.raises(ValueError, match=r"out is int32\[3\], need float32\[3\]"):
        ring_comm.check_allreduce_args(np.zeros(3, np.float32), np.zeros(3, np.int32), both,
                                       "C")


def test_reduce_segments_int_and_float():
    class Sum:  # two ranks holding the same data: the ring returns twice the input
        def __init__(self, dt, op):
            self.dt, self.op = dt, op

        def reduce(self, b):
            return self.op(b.view(self.dt)).view(np.uint8)

    rings = {"int": Sum(np.int32, lambda v: v * 2), "exp": Sum(np.int32, lambda v: v),
             "sum": Sum(np.int32, lambda v: v * 2)}
    comm = SimpleNamespace(rings=rings, world=2, last_exponents=None,
                           cfg=SimpleNamespace(max_bytes=64, chunk_elems=4))
    a = np.arange(-20, 20, dtype=np.int32)
    o = np.empty_like(a)
    ring_comm.reduce_segments(comm, a, o)
    assert (o == 2 * a).all() and comm.last_exponents is None
    x = np.linspace(-3, 3, 40, dtype=np.float32)
    y = np.empty_like(x)
    ring_comm.reduce_segments(comm, x, y)
    assert comm.last_exponents is not None
    assert np.allclose(y, 2 * x, atol=1e-5)
