"""Spine-leaf (issue 19, model D17, docs/spine-leaf.md): flow roles frame by frame on the model,
the driver programming several engines, and whole all-reduces across 2-4 racks with loss,
duplication and reordering on every link (the inter-switch links included)."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.model.marks import MARK_PARTIAL, MARK_TOTAL, MARKS
from netreduce.sim.model.marks import remark as _remark
from netreduce.sim.net.simrun import SimConfig
from netreduce.sim.net.spine_leaf import run_rack_sim
from netreduce.sw_driver.control import ConfigError, EngineControl
from netreduce.sw_driver.spine_leaf import SpineLeafControl, rack_flows

from netreduce.regmap import JobError, Role
from netreduce.wire import Opcode, parse

RACK_OF = [0, 0, 1, 1]  # ranks 0,1 in rack 0; 2,3 in rack 1: flows 1 (1->2) and 3 (3->0) cross


def _engines(job: RingJob):
    engs = [Engine(ports=3), Engine(ports=3), Engine(ports=2)]
    ctl = SpineLeafControl([EngineControl(e.bus) for e in engs[:2]], EngineControl(engs[2].bus))
    cfg = job.config()
    jobs = ctl.add_job(cfg.flows, RACK_OF, cfg.window, cfg.pmtu, cfg.op)
    return engs, ctl, jobs


def _payload(frame: bytes) -> np.ndarray:
    return np.frombuffer(parse(frame).payload, dtype="<i4")


def _key(frame: bytes) -> tuple[int, int]:
    f = parse(frame)
    return f.dqpn, f.psn


def test_rack_flows_roles():
    job = RingJob(world=4)
    leaf0, leaf1, spine = rack_flows(job.config().flows, RACK_OF)
    assert [f.role for f in leaf0] == [Role.MEMBER, Role.UP, Role.DOWN]
    assert [f.role for f in leaf1] == [Role.DOWN, Role.MEMBER, Role.UP]
    assert [f.role for f in spine] == [Role.RACK, Role.RACK]
    assert [f.rank for f in leaf0] == [0, 1, 2] and [f.rank for f in spine] == [0, 1]
    with pytest.raises(ConfigError, match="rack 0: 2 ring flows leave it"):
        rack_flows(job.config().flows, [0, 1, 0, 1])


def test_one_index_through_two_leaves_and_the_spine():
    job = RingJob(world=4)
    (l0, l1, sp), ctl, jobs = _engines(job)
    xs = [np.arange(64, dtype=np.int32) * (r + 1) + r for r in range(4)]
    total = sum(x.astype(np.int64) for x in xs).astype(np.int32)
    assert l0.receive(0, job.data_bytes(0, 0, xs[0]), 0) == []
    up0 = l0.receive(1, job.data_bytes(1, 0, xs[1]), 1)  # rank 1's flow leaves rack 0
    assert len(up0) == 1 and _key(up0[0].frame) == _key(job.data_bytes(1, 0, xs[1]))
    assert np.array_equal(_payload(up0[0].frame), xs[0] + xs[1])
    assert l1.receive(1, job.data_bytes(2, 0, xs[2]), 2) == []
    up1 = l1.receive(2, job.data_bytes(3, 0, xs[3]), 3)
    assert np.array_equal(_payload(up1[0].frame), xs[2] + xs[3])
    assert sp.receive(0, up0[0].frame, 4) == []
    down = sp.receive(1, up1[0].frame, 5)  # the totals on flows 1 (into rack 1) and 3 (rack 0)
    assert sorted(_key(e.frame) for e in down) == sorted(
        [_key(up0[0].frame), _key(up1[0].frame)])
    into = {_key(e.frame)[0]: e.frame for e in down}
    # leaf 1 gets flow 1's total: forwards it (to rank 2) and releases rank 2's result (to rank 3)
    out1 = l1.receive(0, into[job.rq(2)], 6)
    out0 = l0.receive(2, into[job.rq(0)], 6)
    got = {parse(e.frame).dqpn: _payload(e.frame) for e in out0 + out1}
    assert sorted(got) == sorted(job.rq(s) for s in range(4))
    for v in got.values():
        assert np.array_equal(v, total)
    assert l0.counters(jobs[0])["partials_up"] == 1 and l0.counters(jobs[0])["totals"] == 1
    st = ctl.leaves[0].job_status(jobs[0])
    assert st.release_ptr == 1 and ctl.leaves[0]._rd("JOB.PARTIAL_PTR", jobs[0]) == 1
    # ACKs of every flow at index 0 free the slot everywhere
    for r in range(4):
        a = job.ack(r, 0)
        l0.receive(2, a, 10)
        l1.receive(2, a, 10)
        if r in (1, 3):
            sp.receive(0, a, 10)
    assert ctl.slots_in_use(jobs) == 0
    # a resent packet of the UP flow now lies behind leaf 0's window: its probe passes the spine
    # (RACK) and leaf 1 (DOWN) unchanged
    probe = l0.receive(1, job.data_bytes(1, 0, xs[1]), 11)[0].frame
    assert parse(probe).opcode == Opcode.WRITE_MIDDLE and not parse(probe).payload
    assert [e.frame for e in sp.receive(0, probe, 12)] == [probe]
    assert [e.frame for e in l1.receive(0, probe, 13)] == [probe]


def test_lost_partial_is_resent_by_the_up_flows_retransmission():
    job = RingJob(world=4)
    (l0, l1, sp), ctl, jobs = _engines(job)
    xs = [np.full(16, r + 1, np.int32) for r in range(4)]
    l0.receive(0, job.data_bytes(0, 0, xs[0]), 0)
    l0.receive(1, job.data_bytes(1, 0, xs[1]), 0)  # the partial is lost on the way up
    again = l0.receive(1, job.data_bytes(1, 0, xs[1]), 9)  # rank 1 times out and resends
    assert len(again) == 1 and np.array_equal(_payload(again[0].frame), xs[0] + xs[1])
    assert l0.counters(jobs[0])["reemits"] == 1
    assert l0.receive(0, job.data_bytes(0, 0, xs[0]), 9) == []  # a MEMBER's resend: duplicate
    assert l0.counters(jobs[0])["duplicates"] == 1


def _mark(frame: bytes) -> int:
    return frame[14 + 28 + 4] & MARKS


def test_wrong_stage_or_engine_frames_are_dropped_and_change_nothing():
    job = RingJob(world=4)
    (l0, l1, sp), ctl, jobs = _engines(job)
    xs = [np.full(16, r + 1, np.int32) for r in range(4)]
    total = sum(xs)
    tot = lambda r, x: _remark(job.data_bytes(r, 0, x), 14, MARK_TOTAL)  # noqa: E731
    # flow 3's raw packet (rack 1's worker frame, no mark) at leaf 0 on its DOWN flow
    assert l0.receive(2, job.data_bytes(3, 0, xs[3]), 0) == []
    # a marked total before leaf 0's partial went up: it cannot be genuine
    assert l0.receive(2, tot(3, total), 0) == []
    assert l0.counters(jobs[0])["drop_role"] == 2
    l0.receive(0, job.data_bytes(0, 0, xs[0]), 1)
    up0 = l0.receive(1, job.data_bytes(1, 0, xs[1]), 1)[0].frame
    assert _mark(up0) == MARK_PARTIAL
    l1.receive(1, job.data_bytes(2, 0, xs[2]), 1)
    up1 = l1.receive(2, job.data_bytes(3, 0, xs[3]), 1)[0].frame
    # leaf 1's partial bypassing the spine into leaf 0 (flow 3 is leaf 0's DOWN flow)
    assert l0.receive(2, up1, 2) == []
    # a total of another length than the slot's partial
    assert l0.receive(2, tot(3, np.zeros(8, np.int32)), 2) == []
    # the spine's total on flow 1 looped back into leaf 0, where flow 1 is the UP flow
    assert l0.receive(2, tot(1, total), 2) == []
    assert l0.counters(jobs[0])["drop_role"] == 5
    assert l0.counters(jobs[0])["totals"] == 0
    # a worker's raw frame of flow 1 at the spine (leaf 0 bypassed), a total sent up again
    assert sp.receive(0, job.data_bytes(1, 0, xs[1]), 3) == []
    assert sp.receive(1, tot(3, total), 3) == []
    assert sp.counters(jobs[2])["drop_role"] == 2 and sp.counters(jobs[2])["contributions"] == 0
    # the genuine stages still complete index 0, and no frame towards a worker carries a mark
    sp.receive(0, up0, 4)
    down = {parse(e.frame).dqpn: e.frame for e in sp.receive(1, up1, 4)}
    assert all(_mark(f) == MARK_TOTAL for f in down.values())
    out = l0.receive(2, down[job.rq(0)], 5) + l1.receive(0, down[job.rq(2)], 5)
    assert len(out) == 4
    for e in out:
        assert np.array_equal(_payload(e.frame), total) and _mark(e.frame) == 0
    # a rack-local flow's frame at the spine matches nothing there: forwarded, not aggregated
    assert len(sp.receive(0, job.data_bytes(0, 1, xs[0]), 6)) == 1
    assert sp.counters()["fwd_unregistered"] == 1


def test_engine_refuses_bad_role_sets():
    eng = Engine(ports=2)
    ctl = EngineControl(eng.bus)
    job = RingJob(world=3)
    cfg = job.config()
    cfg.flows[0].role = Role.UP  # an UP flow without a DOWN flow
    with pytest.raises(ConfigError, match="one UP and one DOWN"):
        ctl.add_job(cfg)
    # past the driver's check, the engine itself refuses (JOB.STATUS.error = ROLES)
    rm = ctl.regmap
    ctl.validate = lambda cfg: None
    with pytest.raises(ConfigError, match="ROLES"):
        ctl.add_job(cfg)
    assert ctl.job_status(0).error == JobError.ROLES
    assert rm.field("FLOW.CFG.role").get(eng.bus.read(rm.addr("FLOW.CFG", 0))) == 0


@pytest.mark.parametrize("racks,workers,dtype,seed", [
    (2, 4, "int32", 1), (3, 6, "float32", 2), (4, 8, "int32", 3), (2, 2, "int32", 4)])
def test_all_reduce_across_racks_with_faults_everywhere(racks, workers, dtype, seed):
    cfg = SimConfig(workers=workers, size=48 << 10, dtype=dtype, loss=0.02, dup=0.02,
                    reorder=0.02, seed=seed, qp_timeout=4)
    run = run_rack_sim(cfg, racks)
    assert run.ok, (run.error, run.checks, run.slots_left)
    assert set(run.slots_left) == {*(f"leaf{a}" for a in range(racks)), "spine"}
    assert not any(run.slots_left.values())
    isl = run.link_stats
    for k in ("isl_up", "isl_down"):  # the faults hit the inter-switch links too
        assert isl[k]["lost"] and isl[k]["duplicated"] and isl[k]["reordered"], isl[k]
    for a in range(racks):
        c = run.engines[f"leaf{a}"]
        assert c["partials_up"] == c["totals"] == c["released"] > 0
        assert c["drop_role"] == 0
    assert run.engines["spine"]["released"] == run.engines["leaf0"]["released"]


class _DropNth:
    """Drops the n-th RC data frame with a payload that enters ``link`` (its first
    transmission: the PSNs are random per QP, so count frames instead)."""

    def __init__(self, link, n: int):
        self.n, self.seen, self.dropped = n, 0, 0
        inner = link.send

        def send(frame, *a, **kw):
            f = parse(frame)
            if f.payload and not self.dropped:
                self.seen += 1
                if self.seen == self.n:
                    self.dropped = 1
                    return
            inner(frame, *a, **kw)
        link.send = send


@pytest.mark.parametrize("where,n", [("isl_up", 5), ("isl_down", 5), ("isl_up", 32)])
def test_one_lost_partial_or_total(where, n):
    """One partial (leaf 0 -> spine) or one total (spine -> leaf 1) is lost; RC recovers it."""
    cfg = SimConfig(workers=4, size=32 << 10, dtype="int32", seed=5, qp_timeout=4)
    drops = []

    def setup(fab):
        drops.append(_DropNth(fab.isl_up[0] if where == "isl_up" else fab.isl_down[1], n))

    run = run_rack_sim(cfg, 2, setup=setup)
    assert run.ok, (run.error, run.checks, run.slots_left)
    assert drops[0].dropped == 1
    assert run.stats["retransmitted"] > 0  # the workers' own RC did the recovery
    assert run.engines["leaf0"]["reemits"] > 0  # rank 1's resent packet sent the partial again


def test_cli_racks_pcaps_one_pair_per_engine(tmp_path):
    from click.testing import CliRunner

    from netreduce.cli import main

    scapy = pytest.importorskip("scapy.all")
    pre = tmp_path / "sl"
    r = CliRunner().invoke(main, ["sim", "--racks", "2", "-n", "4", "-s", "16KiB", "--dtype",
                                  "int32", "--loss", "0.01", "--pcap", str(pre), "--json",
                                  str(tmp_path / "r.json"), "--qp-timeout", "4"])
    assert r.exit_code == 0, r.output
    names = ["leaf0", "leaf1", "spine"]
    for n in names:
        for d in ("in", "out"):
            assert (tmp_path / f"sl.{n}.{d}.pcap").stat().st_size > 24
    # the spine sees only the two cross-rack flows (sources: ranks 1 and 3), leaves all four
    spine_src = {p["IP"].src for p in scapy.rdpcap(str(tmp_path / "sl.spine.in.pcap"))
                 if p.haslayer("UDP") and p["UDP"].dport == 4791 and len(p["UDP"].payload) > 64}
    leaf_src = {p["IP"].src for p in scapy.rdpcap(str(tmp_path / "sl.leaf0.in.pcap"))
                if p.haslayer("UDP") and p["UDP"].dport == 4791 and len(p["UDP"].payload) > 64}
    assert len(spine_src) == 2 and len(leaf_src) == 3, (spine_src, leaf_src)
    # stage marks (BTH byte 4) only between switches: the spine's results carry MARK_TOTAL,
    # nothing leaf 0 sends to its own ranks (10.0.0.1, 10.0.0.2) carries a mark
    def roce(path):
        return [p for p in scapy.rdpcap(str(path)) if p.haslayer("UDP")
                and p["UDP"].dport == 4791 and len(p["UDP"].payload) > 64]

    spine_out = roce(tmp_path / "sl.spine.out.pcap")
    assert spine_out and all(bytes(p)[46] & MARKS == MARK_TOTAL for p in spine_out)
    to_rack0 = [p for p in roce(tmp_path / "sl.leaf0.out.pcap")
                if p["IP"].dst in ("10.0.0.1", "10.0.0.2")]
    assert to_rack0 and all(bytes(p)[46] & MARKS == 0 for p in to_rack0)
    rep = __import__("json").loads((tmp_path / "r.json").read_text())
    assert rep["ok"] and set(rep["slots_left"]) == set(names)
    bad = CliRunner().invoke(main, ["sim", "--racks", "3", "-n", "4"])
    assert bad.exit_code == 2 and "not a multiple of racks 3" in bad.output


def test_ce_marks_on_every_link_become_cnps_from_the_engine_that_consumes_them():
    """ECT frames, 5 % CE marking on every link (host and inter-switch): every engine answers
    the CE-marked frames it consumes (contributions, partials at the spine, totals at a leaf)
    with CNPs to the flow's sender; the frames the engines send carry no CE; result exact."""
    from netreduce.sim.model import Engine
    from netreduce.sim.net.collective import CollectiveConfig
    from netreduce.sim.net.collective import run as run_ops
    from netreduce.sim.net.network import LinkConfig, NetConfig
    from netreduce.sim.net.spine_leaf import RackCommunicator, RackFabric

    engs = [Engine(ports=3), Engine(ports=3), Engine(ports=2)]
    fab = RackFabric(2, 2, engs, NetConfig(LinkConfig(ce=0.05)), seed=3)
    comm = RackCommunicator(fab, 4, 2, CollectiveConfig(ecn=True, timeout=4), seed=3)
    rng = np.random.default_rng(3)
    xs = [rng.integers(-2**31, 2**31, 8192, dtype=np.int64).astype(np.int32) for _ in range(4)]
    op = comm.allreduce_async(xs)
    run_ops(fab, [op], timeout_ns=10**10)
    res = op.result()
    ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    assert all(np.array_equal(y, ref) for y in res.results)
    assert res.stats["slots_left"] == 0
    for name, c in zip(("leaf0", "leaf1", "spine"), comm.stats_per_engine, strict=True):
        assert c["cnp_sent"] > 0, (name, dict(c))
    assert res.stats["cnps"] > 0
    isl = fab.link_stats()
    assert isl["isl_up"]["ce_marked"] > 0 and isl["isl_down"]["ce_marked"] > 0


def test_psn_wrap_across_racks_with_loss():
    """Start PSNs just below 2^24 on every QP: the leaves' partial pointers, the DOWN flows'
    indices and the spine wrap with the PSNs; 3 % loss/dup/reorder everywhere."""
    from netreduce.sim.model import Engine
    from netreduce.sim.net.collective import CollectiveConfig
    from netreduce.sim.net.collective import run as run_ops
    from netreduce.sim.net.network import NetConfig
    from netreduce.sim.net.spine_leaf import RackCommunicator, RackFabric

    engs = [Engine(ports=3), Engine(ports=3), Engine(ports=2)]
    fab = RackFabric(2, 2, engs, NetConfig.faulty(loss=0.03, dup=0.03, reorder=0.03), seed=9)
    psns = tuple((1 << 24) - 5 - 7 * r for r in range(4))
    comm = RackCommunicator(fab, 4, 2, CollectiveConfig(timeout=4, start_psns=psns), seed=9)
    rng = np.random.default_rng(9)
    xs = [rng.integers(-2**31, 2**31, 8192, dtype=np.int64).astype(np.int32) for _ in range(4)]
    op = comm.allreduce_async(xs)
    run_ops(fab, [op], timeout_ns=10**10)
    res = op.result()
    ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    assert all(np.array_equal(y, ref) for y in res.results)
    assert res.stats["slots_left"] == 0 and comm.slots_per_engine == [0, 0, 0]


def test_frames_at_the_wrong_engine_never_change_a_result():
    """A misbehaving fabric (an A1 violation): 5 % of the partials are also delivered straight
    into the next rack's leaf (bypassing the spine), 5 % of the totals also go back up into the
    spine, 5 % of the workers' frames also reach the spine directly (bypassing their leaf).
    Every such copy is dropped by its stage mark (drop_role); the result stays exact."""
    import random

    cfg = SimConfig(workers=6, size=32 << 10, dtype="int32", seed=8, qp_timeout=4,
                    loss=0.01)
    rng = random.Random(8)

    def setup(fab):
        m, r = fab.per_rack, fab.racks
        at_leaf, at_spine = fab._at_leaf, fab._at_spine

        def leaf(a, port, frame):
            if port < m and rng.random() < 0.05:  # a worker's frame, also at the spine
                fab.sched.call_later(300, at_spine, a, frame)
            if port == m and rng.random() < 0.05:  # a total, also back up into the spine
                fab.sched.call_later(300, at_spine, a, frame)
            at_leaf(a, port, frame)

        def spine(a, frame):
            if rng.random() < 0.05:  # a partial, also straight into the next rack's leaf
                fab.sched.call_later(300, at_leaf, (a + 1) % r, m, frame)
            at_spine(a, frame)

        fab._at_leaf, fab._at_spine = leaf, spine
        for a in range(r):  # the links were built with the original sinks
            fab.isl_up[a].sink = lambda fr, a=a: spine(a, fr)
            fab.isl_down[a].sink = lambda fr, a=a: leaf(a, m, fr)

    run = run_rack_sim(cfg, 3, setup=setup)
    assert run.ok, (run.error, run.checks, run.slots_left)
    assert run.engines["spine"]["drop_role"] > 0
    assert sum(run.engines[f"leaf{a}"]["drop_role"] for a in range(3)) > 0
