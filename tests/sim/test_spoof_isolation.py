"""Spoofing and isolation (issue 9): frames the engine must not trust, against two live jobs.

The engine trusts the control plane (registers) and the switch's steering (a registered source
IPv4 arrives only from its worker), never the content of data-plane frames. Every attack frame
below is handled as docs/design.md section 4 (+ D15) says, counted under a named disposition, and
neither job's result nor state changes. Each test runs two jobs to the end around its attack frames
and checks both results bit-exact, every slot freed and the counters balanced.
"""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob, engine_with
from netreduce.sim.model.mgmt import attach_mgmt
from netreduce.sw_driver.mgmt import MgmtSettings, MgmtSource

from netreduce.regmap import DISPOSITIONS, Op
from netreduce.wire import ECN_CE, ECN_ECT0, Opcode, ip, parse
from netreduce.wire.mgmt import MgmtFrame, MgmtMessage, MgmtOp, MgmtType, pack_mgmt

PSN_MOD = 1 << 24
K = 6  # indices per job


class Pair:
    """Jobs A (N=3, SUM_WRAP) and B (N=2, MAX) with overlapping PSNs, driven index by index."""

    def __init__(self, seed=0, **params):
        self.a = RingJob(job=0, world=3, window=4, slot_base=0, start_psns=[100, 100, 100])
        self.b = RingJob(job=1, world=2, window=4, slot_base=4, start_psns=[100, 100],
                         op=Op.MAX, pmtu=512)
        self.eng, self.ctl = engine_with(self.a, self.b, **params)
        rng = np.random.default_rng(seed)
        self.x = {j: rng.integers(-2**31, 2**31, size=(K, job.world, 32), dtype=np.int64)
                  .astype(np.int32) for j, job in ((0, self.a), (1, self.b))}
        self.got: dict = {}  # (job, rank, index) -> payloads of results
        self.t = 0

    def job(self, j):
        return self.a if j == 0 else self.b

    def feed(self, frame, port=0):
        self.t += 1
        out = self.eng.receive(port, frame, self.t)
        for e in out:
            try:
                f = parse(e.frame)
            except Exception:
                continue
            if f.payload and e.frame != frame:
                for j in (0, 1):
                    job = self.job(j)
                    for r in range(job.world):
                        if f.src_ip == job.ip(r) and f.dqpn == job.rq(job.succ(r)):
                            k = (f.psn - job.start_psns[r]) % PSN_MOD
                            self.got.setdefault((j, r, k), []).append(f.payload)
        return out

    def contribute(self, k, ranks=None):
        for j in (0, 1):
            job = self.job(j)
            for r in ranks if ranks is not None else range(job.world):
                if r < job.world:
                    self.feed(job.data_bytes(r, k, self.x[j][k][r]))

    def ack(self, k):
        for j in (0, 1):
            for f in self.job(j).ack_all(k):
                self.feed(f)

    def finish_and_check(self):
        for k in range(K):
            self.contribute(k)
            self.ack(k)
        for j in (0, 1):
            job = self.job(j)
            xs = self.x[j]
            for k in range(K):
                want = (xs[k].max(axis=0) if job.op == Op.MAX else
                        xs[k].sum(axis=0, dtype=np.int64).astype(np.int32))
                for r in range(job.world):
                    res = self.got.get((j, r, k))
                    assert res, f"job {j} rank {r} index {k}: no result"
                    assert all(p == want.tobytes() for p in res), f"job {j} r{r} k{k} changed"
        assert self.ctl.slots_in_use() == 0
        assert [self.eng.job_state(j)["free"] for j in (0, 1)] == [K, K]
        c = self.eng.counters()
        assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS)
        return c


def _fwd_unchanged(p: Pair, frame):
    before = [p.eng.job_state(j) for j in (0, 1)]
    out = p.feed(frame)
    assert [e.frame for e in out] == [frame]
    assert [p.eng.job_state(j) for j in (0, 1)] == before


def test_registered_qpn_with_wrong_source_ip_is_unregistered_traffic():
    p = Pair(1)
    p.contribute(0, ranks=[0])
    good = p.a.data(1, 0, p.x[0][0][1] + 1)
    for spoof in (good.copy(src_ip=ip("10.0.0.99")), good.copy(src_ip=p.b.ip(1)),
                  p.a.data(0, 0, p.x[0][0][0]).copy(src_ip=p.a.ip(2))):
        _fwd_unchanged(p, spoof.pack())
    c = p.finish_and_check()
    assert c["fwd_unregistered"] == 3 and c["contributions"] == K * 5


def test_unregistered_and_other_jobs_qpn():
    p = Pair(2)
    p.contribute(0)
    other = RingJob(job=5, world=2)  # never registered
    frames = [other.data_bytes(0, 0, p.x[0][0][0]), other.ack(0, 0),
              # job A's source carrying job B's QPN (and the reverse): keys are (IP, QPN) pairs
              p.a.data(0, 1, p.x[0][1][0]).copy(dqpn=p.b.rq(1)).pack(),
              p.b.data(1, 1, p.x[1][1][1]).copy(dqpn=p.a.rq(1)).pack(),
              # an ACK from job B's receiver onto job A's sending QP
              p.b.data(0, 0, b"").copy(opcode=Opcode.ACK, dqpn=p.a.sq(0)).pack()]
    for f in frames:
        _fwd_unchanged(p, f)
    c = p.finish_and_check()
    assert c["fwd_unregistered"] == 5 and c["drop_opcode"] == 0


@pytest.mark.parametrize("far", [4, 5, 1000, (1 << 23) - 1])
def test_psn_ahead_of_the_window_dropped_and_counted(far):
    p = Pair(3)
    p.contribute(0, ranks=[0])
    before = [p.eng.job_state(j) for j in (0, 1)]
    for r in range(3):
        assert p.feed(p.a.data_bytes(r, far, p.x[0][0][r])) == []
    assert [p.eng.job_state(j) for j in (0, 1)] == before
    assert p.eng.counters(0)["drop_ahead"] == 3
    p.finish_and_check()


@pytest.mark.parametrize("behind", [1, 2, 1 << 22, 1 << 23])
def test_replay_after_free_is_a_probe_and_changes_nothing(behind):
    p = Pair(4)
    for k in range(2):
        p.contribute(k)
        p.ack(k)
    old = [p.a.data_bytes(r, 0, p.x[0][0][r]) for r in range(3)]
    old += [p.a.data_bytes(0, 2 - behind, p.x[0][0][0])]
    old += [p.a.ack(0, 0), p.a.ack(1, 1, nak=True)]  # replayed ACK/NAK: not ahead of acked_f
    before = [p.eng.job_state(j) for j in (0, 1)]
    for f in old:
        out = p.feed(f)
        assert len(out) == 1
        g = parse(out[0].frame)
        if g.opcode != Opcode.ACK:
            assert g.opcode == Opcode.WRITE_MIDDLE and g.payload == b""  # the probe (D15)
            assert g.psn == parse(f).psn
    assert [p.eng.job_state(j) for j in (0, 1)] == before
    c0 = p.eng.counters(0)
    assert c0["behind_window"] == 4 and c0["ack_stale"] == 2
    p.finish_and_check()


def test_replay_inside_the_window_is_a_duplicate_or_reemit_of_the_true_result():
    p = Pair(5)
    p.contribute(0)  # released, not acked: replays are answered from the slot
    p.contribute(1, ranks=[0, 1])  # filling: replays are duplicates
    outs = [p.feed(p.a.data_bytes(2, 0, p.x[0][0][2])), p.feed(p.a.data_bytes(0, 1, p.x[0][1][0]))]
    assert len(outs[0]) == 1 and outs[1] == []
    assert p.eng.counters(0)["reemits"] == 1 and p.eng.counters(0)["duplicates"] == 1
    p.finish_and_check()  # the re-emitted copy carries the true aggregate too


def test_forged_reverse_frames_of_another_job_never_free_this_job():
    p = Pair(6)
    p.contribute(0)
    # job B's receivers acknowledge job A's PSNs: their keys are B's, so they free B only
    for f in p.b.ack_all(0):
        p.feed(f)
    assert p.eng.job_state(0)["free"] == 0 and p.eng.job_state(1)["free"] == 1
    p.finish_and_check()


def test_cnp_rate_limited_under_a_ce_storm():
    """A CE storm on every flow of both jobs: per flow at most one CNP per interval, every other
    CE-marked frame counted as suppressed, and the storm changes no result."""
    interval = 50
    a = RingJob(job=0, world=3, window=8, cnp_interval=interval)
    b = RingJob(job=1, world=2, window=8, slot_base=8, cnp_interval=interval)
    eng, ctl = engine_with(a, b)
    rng = np.random.default_rng(7)
    t, ce_frames, cnps = 0, 0, {}
    want = {}
    for k in range(8):
        for job in (a, b):
            x = rng.integers(-1000, 1000, size=(job.world, 16), dtype=np.int32)
            want[(job.job, k)] = x.sum(axis=0)
            for r in range(job.world):
                for _ in range(4):  # the original and 3 CE-marked duplicates, 1 cycle apart
                    t += 1
                    ce_frames += 1
                    f = job.data_bytes(r, k, x[r], ecn=ECN_CE)
                    for e in eng.receive(0, f, t):
                        g = parse(e.frame)
                        if g.opcode == Opcode.CNP:
                            cnps.setdefault((g.dst_ip, g.dqpn), []).append(t)
                        else:
                            assert g.ecn == ECN_ECT0  # CE -> ECT(0) on results
                            assert np.array_equal(np.frombuffer(g.payload, "<i4"),
                                                  want[(job.job, k)])
        for job in (a, b):
            for f in job.ack_all(k):
                eng.receive(0, f, t)
    assert len(cnps) == 5  # one limiter per flow
    for times in cnps.values():
        assert all(t2 - t1 >= interval for t1, t2 in zip(times, times[1:], strict=False))
        assert len(times) <= t // interval + 1
    c = eng.counters()
    assert c["cnp_sent"] == sum(map(len, cnps.values()))
    assert c["cnp_sent"] + c["cnp_suppressed"] == ce_frames
    assert c["cnp_suppressed"] > c["cnp_sent"] and ctl.slots_in_use() == 0


def test_management_rejects_unauthorised_and_replayed_frames_mid_job():
    """Unauthorised, badly tagged and replayed management requests that would disable job A or
    rewrite its flow keys arrive between its packets: nothing changes, everything is counted."""
    key = bytes(range(16))
    e_ip, e_mac = ip("10.9.0.254"), b"\x02\xee\x00\x00\x00\x09"
    c_ip, c_mac = ip("10.9.0.1"), b"\x02\xcc\x00\x00\x00\x09"
    p = Pair(8, jobs=2, flows=8, slots=64)
    attach_mgmt(p.eng, MgmtSettings(e_ip, e_mac, sources=[MgmtSource(c_ip)], key=key))
    rm = p.eng.regmap
    evil = [MgmtOp.write(rm.addr("JOB.CTRL", 0), 0), MgmtOp.write(rm.addr("FLOW.FWD_IP", 0), 1)]

    def req(seq, src=c_ip, k=key):
        return pack_mgmt(MgmtFrame(MgmtMessage(MgmtType.REQUEST, seq, evil), c_mac, e_mac, src,
                                   e_ip, 40000, 0x4E52), k)

    ok = pack_mgmt(MgmtFrame(MgmtMessage(MgmtType.REQUEST, 10,
                                         [MgmtOp.read(rm.addr("GLOBAL.SCRATCH"))]),
                             c_mac, e_mac, c_ip, e_ip, 40000, 0x4E52), key)
    assert len(p.feed(ok)) == 1  # accepted: seq 10 is now the last
    p.contribute(0, ranks=[0, 1])
    for f in (req(11, src=ip("10.9.0.66")), req(12, k=bytes(16)), req(10), req(3), ok):
        p.feed(f)
    c = p.eng.counters()
    assert (c["mgmt_reject_source"], c["mgmt_reject_auth"], c["mgmt_reject_replay"]) == (1, 1, 3)
    assert c["mgmt_accepted"] == 1 and p.ctl.job_status(0).enabled
    p.finish_and_check()
