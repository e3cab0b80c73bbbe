"""Forged ACKs against the reference engine (issue 9): they may delay or fail a job, never corrupt.

The attack: the engine frees index k once every flow's acked_f passed it (docs/design.md section 4),
and acked_f comes from data-plane ACKs that anybody on the path can forge (ICRC is no
authentication). A forged ACK on flow f's reverse key frees k although f's receiver never got its
result (lost on the down link). When f's sender retransmits k, k is behind the window. Under the
original contract the engine forwarded the sender's raw contribution unchanged, and the receiver,
which really expects k, accepted it as the all-reduced result: silent corruption. Decision D15
(engine docstring, docs/guarantees.md) forwards a behind-window frame as a *duplicate probe*
(BTH-only WRITE MIDDLE, no payload) that a receiver can only use as a duplicate: it re-ACKs it if it
has k, and rejects it (NAK invalid request, QP to error: a loud failure) if it does not.
"""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob, engine_with
from netreduce.sim.net.collective import CollectiveConfig, Communicator, run
from netreduce.sim.net.model_fabric import ModelFabric
from netreduce.sim.net.rnic import RCError
from netreduce.sim.net.scheduler import SimulationHang

from netreduce.wire import Opcode, RoceFrame, parse

PSN_MOD = 1 << 24


def _x(seed, n=2, lanes=64):
    rng = np.random.default_rng(seed)
    return rng.integers(-(1 << 31), 1 << 31, size=(n, lanes), dtype=np.int64).astype(np.int32)


def test_forged_ack_then_retransmission_is_a_probe_not_the_raw_contribution():
    """Frame level: lost result + forged ACK + retransmission never emits the raw payload."""
    j = RingJob(world=2, window=4)
    eng, ctl = engine_with(j)
    x = _x(1)
    out = [e for r in range(2) for e in eng.receive(0, j.data_bytes(r, 0, x[r]), 0)]
    assert len(out) == 2  # released; suppose flow 0's result is lost on the way down
    eng.receive(0, j.ack(1, 0), 1)  # flow 1's receiver genuinely acknowledges index 0
    eng.receive(0, j.ack(0, 0), 2)  # FORGED: flow 0's receiver never got index 0
    assert eng.job_state(0)["free"] == 1 and ctl.slots_in_use(0) == 0  # freed early
    # next generation reuses the slot (index W = 4 lands in slot 0)
    eng.receive(0, j.data_bytes(0, 4, x[0]), 3)
    retx = j.data_bytes(0, 0, x[0])  # flow 0's sender times out and retransmits index 0
    out = eng.receive(0, retx, 4)
    assert len(out) == 1 and eng.counters(0)["behind_window"] == 1
    f = parse(out[0].frame)
    raw = parse(retx)
    assert f.payload == b"", "the sender's raw contribution must never reach the receiver"
    assert f.opcode == Opcode.WRITE_MIDDLE
    # the probe keeps everything a receiver uses to match it to its duplicate
    assert (f.src_ip, f.dst_ip, f.dqpn, f.psn, f.smac, f.dmac, f.pkey, f.tos) == \
        (raw.src_ip, raw.dst_ip, raw.dqpn, raw.psn, raw.smac, raw.dmac, raw.pkey, raw.tos)
    assert eng.job_state(0)["slots"] == {0: (4, "FILLING", 0b01)}  # reuse untouched


class _Attack:
    """Drops the first result of flow 0 on its way to rank 1 and injects, in its place, a forged
    ACK for it on flow 0's reverse key (source = rank 1's IPv4, DestQP = rank 0's send QP) into
    the engine. The forged ACK goes to a MAC nobody owns, so rank 0's sender never sees it."""

    def __init__(self, fab: ModelFabric, comm: Communicator, op):
        self.fab, self.comm, self.op = fab, comm, op
        self.dropped = 0
        mac1 = comm.rnics[1].mac
        link = fab.down[mac1]
        self._send = link.send
        link.send = self._down_to_rank1

    def _down_to_rank1(self, frame: bytes) -> None:
        p = self.op.cur
        try:
            f = parse(frame)
        except Exception:
            return self._send(frame)
        if (not self.dropped and f.src_ip == self.comm.rnics[0].ip and f.payload
                and f.dqpn == p.rq[1].qpn):
            self.dropped += 1
            sq = p.sq[0]
            forged = RoceFrame.ack(dqpn=sq.qpn, psn=f.psn, smac=b"\x02\xee\xee\xee\xee\xee",
                                   dmac=b"\x02\xdd\xdd\xdd\xdd\xdd",
                                   src_ip=self.comm.rnics[1].ip,
                                   dst_ip=self.comm.rnics[0].ip).pack()
            self.fab.call_at(self.fab.now() + 10, self.fab._at_middle, b"\x02" * 6, forged)
            return None
        return self._send(frame)


def test_forged_ack_with_lost_result_fails_loudly_never_corrupts():
    """System level, real RC endpoints: the job either fails with an RC error or hangs; rank 1's
    receive buffer never holds rank 0's raw data (the corruption the old contract allowed)."""
    fab = ModelFabric(seed=5)
    comm = Communicator(fab, 2, CollectiveConfig(pmtu=1024, msg_packets=1, window=8, margin=2,
                                                 timeout=4, retry_cnt=2), seed=5)
    x = _x(5, 2, 256)  # one packet per rank
    op = comm.allreduce_async([x[0], x[1]])
    atk = _Attack(fab, comm, op)
    outcome = "completed"
    try:
        run(fab, [op], timeout_ns=2 * 10**9)
    except RCError as e:
        outcome = f"rc_error: {e}"
    except SimulationHang as e:
        outcome = f"hang: {e}"
    assert atk.dropped == 1
    eng = fab.engine.counters()
    assert eng["behind_window"] >= 1, "the retransmission must have been behind the window"
    assert outcome != "completed", "a freed, never delivered result cannot be delivered"
    # the receiver rejected the probe (NAK invalid request: a MIDDLE without a FIRST), QP error
    assert outcome.startswith("rc_error") and "WRITE_MIDDLE" in outcome, outcome
    got = op.passes[0].mrs[1].buf.view(np.int32)
    assert not np.array_equal(got, x[0]), "rank 1 accepted rank 0's raw contribution"


def test_forged_ack_without_loss_only_frees_early_and_results_stay_exact():
    """A forged ACK ahead of the genuine one frees slots early, but every result was delivered,
    so later retransmissions are duplicates at the receiver: the job completes bit-exact."""
    fab = ModelFabric(seed=6)
    comm = Communicator(fab, 3, CollectiveConfig(pmtu=256, msg_packets=4, window=16, margin=4),
                        seed=6)
    x = _x(6, 3, 64 * 40)
    op = comm.allreduce_async(list(x))
    forged = []

    orig = fab._forward

    def forward(frame):  # after every result to a receiver, forge its ACK ahead of the real one
        try:
            f = parse(frame)
        except Exception:
            return orig(frame)
        p = op.cur
        if f.payload and p is not None and p.job is not None:
            for r in range(3):
                if f.dqpn == p.rq[(r + 1) % 3].qpn and f.src_ip == comm.rnics[r].ip:
                    a = RoceFrame.ack(dqpn=p.sq[r].qpn, psn=f.psn, smac=b"\x02" * 6,
                                      dmac=b"\x02\xdd\xdd\xdd\xdd\xdd",
                                      src_ip=comm.rnics[(r + 1) % 3].ip,
                                      dst_ip=comm.rnics[r].ip).pack()
                    forged.append(a)
                    fab.engine.receive(0, a, 0)
        return orig(frame)

    fab._forward = forward
    run(fab, [op], timeout_ns=10**10)
    want = x.sum(axis=0, dtype=np.int64).astype(np.int32)
    res = op.result()
    for r in range(3):
        assert np.array_equal(res.results[r], want), f"rank {r}"
    assert forged and res.stats["slots_left"] == 0


@pytest.mark.parametrize("beyond", [1, 5])
def test_forged_ack_beyond_release_is_stale_and_frees_nothing(beyond):
    j = RingJob(world=2, window=4)
    eng, ctl = engine_with(j)
    x = _x(2)
    for r in range(2):
        eng.receive(0, j.data_bytes(r, 0, x[r]), 0)
    eng.receive(0, j.data_bytes(0, 1, x[0]), 0)  # index 1 filling, not released
    before = eng.job_state(0)
    for r in range(2):
        eng.receive(0, j.ack(r, beyond), 0)  # acknowledges an unreleased index
    assert eng.job_state(0) == before and eng.counters(0)["ack_stale"] == 2
