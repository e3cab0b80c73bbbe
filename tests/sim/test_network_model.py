"""The network model: seeded links (loss, duplication, reordering, CE), per direction and kind."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.net.network import LinkConfig, NetConfig, NetworkFabric, classify
from netreduce.sim.net.rnic import RNIC, QPConfig
from netreduce.sim.net.scheduler import Scheduler, SimulationHang

from netreduce.wire import ECN_CE, ECN_ECT0, PSN_MOD, Opcode, RoceFrame, parse

A, B = b"\x02\x00\x00\x00\x00\x01", b"\x02\x00\x00\x00\x00\x02"


def _data(i, tos=0):
    return RoceFrame(opcode=Opcode.WRITE_MIDDLE, psn=i, payload=i.to_bytes(4, "big") * 16,
                     smac=A, dmac=B, tos=tos).pack()


def _ack(i):
    return RoceFrame.ack(i, smac=A, dmac=B).pack()


def _run(net, seed, frames, **kw):
    fab = NetworkFabric(net, seed=seed)
    got = []
    fab.attach(A, lambda f: None)
    fab.attach(B, lambda f: got.append((fab.now(), f)))
    for i, fr in enumerate(frames):
        fab.call_at(i * 100, fab.send, fr)
    fab.run_all(10**9)
    return got, fab


def test_same_seed_same_run_different_seed_different_run():
    net = NetConfig.faulty(loss=0.05, dup=0.05, reorder=0.05)
    frames = [_data(i) for i in range(2000)]
    a, fa = _run(net, 7, frames)
    b, fb = _run(net, 7, frames)
    c, _ = _run(net, 8, frames)
    assert a == b and fa.link_stats() == fb.link_stats()
    assert a != c


def test_fault_rates_and_reordering():
    n = 8000
    got, fab = _run(NetConfig.faulty(loss=0.05, dup=0.05, reorder=0.05), 1,
                    [_data(i) for i in range(n)])
    st = fab.link_stats()
    for d in ("up", "down"):
        for k in ("lost", "duplicated", "reordered"):
            # two links in series; each fault near 5 % of the frames that reached the link
            assert 0.035 < st[d][k] / st[d]["frames"] < 0.065, (d, k, st[d])
    psns = [parse(f).psn for _, f in got]
    assert len(psns) == st["down"]["frames"] - st["down"]["lost"] + st["down"]["duplicated"]
    assert any(b < a for a, b in zip(psns, psns[1:], strict=False))  # reordered
    assert len(set(psns)) < n  # lost


def test_no_faults_keeps_order_and_timing():
    cfg = LinkConfig(latency_ns=700, gbps=100.0)
    got, _ = _run(NetConfig(cfg), 0, [_data(i) for i in range(50)])
    assert [parse(f).psn for _, f in got] == list(range(50))
    t0 = got[0][0]
    assert t0 >= 2 * 700  # two links
    assert all(t2 > t1 for (t1, _), (t2, _) in zip(got, got[1:], strict=False))


def test_per_direction_and_kind_overrides():
    lossy = LinkConfig(loss=0.5)
    net = NetConfig(overrides={("down", "ack"): lossy})
    frames = [_data(i) for i in range(400)] + [_ack(i) for i in range(400)]
    got, fab = _run(net, 3, frames)
    kinds = [classify(f) for _, f in got]
    assert kinds.count("data") == 400
    assert 120 < kinds.count("ack") < 280
    st = fab.link_stats()
    assert st["up"]["lost"] == 0 and st["down"]["data_lost"] == 0
    assert st["down"]["ack_lost"] == st["down"]["lost"] > 0


def test_ce_marking_keeps_the_frame_valid():
    net = NetConfig(LinkConfig(ce=1.0))
    got, _ = _run(net, 0, [_data(1, tos=ECN_ECT0), _data(2)])
    f1, f2 = (parse(f) for _, f in got)  # parse checks the IPv4 checksum and the ICRC
    assert f1.ecn == ECN_CE and f2.ecn == 0  # non-ECT traffic is never marked


def test_unroutable_frames_are_counted():
    fab = NetworkFabric()
    fab.attach(A, lambda f: None)
    fab.send(RoceFrame.ack(1, smac=A, dmac=b"\x02\x00\x00\x00\x00\x99").pack())
    fab.send(RoceFrame.ack(1, smac=b"\x02\x00\x00\x00\x00\x98", dmac=A).pack())
    fab.run_all(10**6)
    assert fab.stats["unroutable"] == 2
    with pytest.raises(ValueError, match="already attached"):
        fab.attach(A, lambda f: None)


@pytest.mark.parametrize("kw, msg", [
    (dict(loss=1.0), "loss"), (dict(dup=-0.1), "dup"), (dict(reorder=2), "reorder"),
    (dict(latency_ns=-1), "latency_ns"), (dict(gbps=-5), "gbps"),
])
def test_link_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LinkConfig(**kw)


def test_bad_override_key():
    with pytest.raises(ValueError, match="override key"):
        NetConfig(overrides={("sideways", "data"): LinkConfig()})


def test_scheduler_order_and_watchdog():
    s = Scheduler()
    out = []
    s.call_at(10, out.append, "b")
    s.call_at(5, out.append, "a")
    s.call_at(10, out.append, "c")
    t = s.call_at(7, out.append, "x")
    t.cancel()
    s.run_until(lambda: len(out) == 3)
    assert out == ["a", "b", "c"] and s.now() == 10
    s.call_at(10**9, out.append, "late")
    with pytest.raises(SimulationHang, match="simulated-time limit"):
        s.run_until(lambda: False, 1000)
    with pytest.raises(SimulationHang, match="event limit"):
        def again():
            s.call_later(1, again)
        again()
        s.run_until(lambda: False, max_events=100)


@pytest.mark.parametrize("seed", range(3))
def test_rc_endpoints_alone_survive_a_faulty_network(seed):
    """Two software RNICs over the plain fabric (no engine): every WRITE lands intact, in order."""
    net = NetConfig.faulty(loss=0.05, dup=0.05, reorder=0.05, jitter_ns=300)
    fab = NetworkFabric(net, seed=seed)
    a = RNIC(fab, A, "10.0.0.1", seed=seed)
    b = RNIC(fab, B, "10.0.0.2", seed=seed)
    mr = b.reg_mr(1 << 16)
    got, done = [], []
    cfg = QPConfig(pmtu=512, timeout=8)
    qa = a.create_qp(cfg, PSN_MOD - 50, on_send=lambda q, c: done.append(c.wr_id))
    qb = b.create_qp(cfg, on_recv=lambda q, c: got.append(c.imm))
    qa.connect(B, b.ip, qb.qpn, qb.start_psn)
    qb.connect(A, a.ip, qa.qpn, qa.start_psn)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    cuts = np.sort(rng.choice(np.arange(1, 1 << 16), 11, replace=False))
    bounds = [0, *cuts.tolist(), 1 << 16]
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        qa.post_write(data[lo:hi], mr.va + lo, mr.rkey, imm=i, wr_id=i)
    fab.run_until(lambda: len(done) == 12 or qa.error or qb.error, 10**11)
    assert qa.error is None and qb.error is None
    assert done == list(range(12)) and got == list(range(12))
    assert np.array_equal(mr.buf, data)
    assert qa.stats.retransmitted > 0 and qb.stats.duplicates > 0
