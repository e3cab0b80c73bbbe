"""Fast retransmit in the reference model (JOB.CTRL.fast_retx, decision D16).

With the bit on: an ACK of flow f not behind acked_f leaves as a NAK-sequence at its PSN + 1 when
f has a hole (a contribution missing while a later one of f is present) that was not NAKed
before, and the first contribution past a hole also sends f's receiver a duplicate probe (an ACK
request). End to end, the software RNICs (go-back-N like rxe) finish an all-reduce with loss on
the contributions bit-exact, with fewer RC timeouts than with the bit off.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob, engine_with
from netreduce.sim.net.collective import CollectiveConfig, Communicator
from netreduce.sim.net.model_fabric import ModelFabric
from netreduce.sim.net.network import LinkConfig, NetConfig
from netreduce.sw_driver.control import EngineControl

from netreduce.wire import NAK_PSN_SEQ, RoceFrame, parse
from netreduce.wire.icrc import icrc_bytes

PARAMS = dict(jobs=2, flows=8, slots=64, pmtu_max=256)


def setup(world=2, bit=True, **kw):
    job = RingJob(world=world, window=16, pmtu=256, **kw)
    eng, _ = engine_with(job, **PARAMS)
    if bit:
        set_bit(eng, 0, True)
    return eng, job


def set_bit(eng, j: int, on: bool) -> None:
    rm = eng.regmap
    a = rm.addr("JOB.CTRL", j)
    eng.bus.write(a, rm.field("JOB.CTRL.fast_retx").put(eng.bus.read(a), int(on)))


def feed(eng, job, frames_of: dict[int, list[int]]) -> None:
    """Contributions: rank -> indices, in that order (one rank after the other)."""
    for r, ks in frames_of.items():
        for k in ks:
            out = eng.receive(0, job.data_bytes(r, k, [k + 1, r, 7, 9]), 0)
            assert all(e.frame[42] != 0x11 for e in out)


def ack(job, r: int, index: int, msn: int = 0x123456) -> bytes:
    s = job.succ(r)
    return RoceFrame.ack(dqpn=job.sq(r), psn=job.psn(r, index), msn=msn, smac=job.mac(s),
                         dmac=job.mac(r), src_ip=job.ip(s), dst_ip=job.ip(r),
                         vlan_tci=job.vlan_tci).pack()


def one(eng, buf: bytes) -> bytes:
    out = eng.receive(0, buf, 0)
    assert len(out) == 1 and out[0].port == 0
    return out[0].frame


def hole_at_2(eng, job):
    """Rank 0 lost index 2 and sent 3; rank 1 sent 0..3: results 0 and 1 released."""
    feed(eng, job, {0: [0, 1, 3], 1: [0, 1, 2, 3]})


@pytest.mark.parametrize("vlan", [None, 0x0ABC])
def test_fires_on_a_hole_and_nak_bytes(vlan):
    eng, job = setup(vlan_tci=vlan)
    hole_at_2(eng, job)
    a = ack(job, 0, 1)
    out = one(eng, a)
    p = parse(out)  # lengths, IPv4 checksum and ICRC check out
    assert (p.opcode, p.syndrome, p.psn, p.msn) == (0x11, NAK_PSN_SEQ, job.psn(0, 2), 0x123456)
    assert p.dqpn == job.sq(0) and p.src_ip == job.ip(1) and p.dst_ip == job.ip(0)
    l3 = 18 if vlan is not None else 14
    b = l3 + 28
    assert len(out) == len(a)
    changed = [i for i in range(len(a)) if a[i] != out[i]]
    assert set(changed) <= {b + 9, b + 10, b + 11, b + 12, *range(len(a) - 4, len(a))}
    assert out[-4:] == icrc_bytes(out[l3:-4])
    c = eng.counters(0)
    assert (c["fast_retx"], c["fwd_ack"], eng.counters()["fast_retx"]) == (1, 1, 1)
    # the rewrite acknowledges what the ACK did: acked_f = 2 either way
    assert eng.job_state(0)["acked"][0] == 2


def test_psn_wrap():
    eng, job = setup(start_psns=[0xFFFFFE, 5])
    hole_at_2(eng, job)
    p = parse(one(eng, ack(job, 0, 1)))
    assert p.syndrome == NAK_PSN_SEQ and p.psn == 0 == job.psn(0, 2)


def test_no_hole_no_rewrite():
    eng, job = setup()
    feed(eng, job, {0: [0, 1, 2], 1: [0, 1, 2]})      # nothing missing
    a = ack(job, 0, 1)
    assert one(eng, a) == a
    b = ack(job, 1, 1)
    assert one(eng, b) == b
    feed(eng, job, {0: [4], 1: [3]})                   # rank 0 skipped 3 ...
    a = ack(job, 0, 2)
    assert one(eng, a) != a                            # ... now it is a hole
    b = ack(job, 1, 2)
    assert one(eng, b) == b                            # rank 1 has none
    assert eng.counters(0)["fast_retx"] == 1


def test_missing_contribution_without_a_later_one_is_no_hole():
    eng, job = setup()
    feed(eng, job, {0: [0, 1], 1: [0, 1, 2, 3]})      # rank 0 just has not sent 2 yet
    a = ack(job, 0, 1)
    assert one(eng, a) == a
    assert eng.counters(0)["fast_retx"] == 0


def test_never_without_the_bit_and_the_bit_is_live():
    eng, job = setup(bit=False)
    hole_at_2(eng, job)
    a = ack(job, 0, 0)
    assert one(eng, a) == a
    assert eng.counters(0)["fast_retx"] == 0
    set_bit(eng, 0, True)                              # while the job runs
    assert eng.regmap.field("JOB.STATUS.enabled").get(
        eng.bus.read(eng.regmap.addr("JOB.STATUS", 0)))
    assert parse(one(eng, ack(job, 0, 1))).syndrome == NAK_PSN_SEQ
    set_bit(eng, 0, False)
    feed(eng, job, {0: [2, 3, 5], 1: [4, 5]})         # go-back-N fills 2; a new hole at 4
    a = ack(job, 0, 3)
    assert one(eng, a) == a
    assert eng.counters(0)["fast_retx"] == 1


def test_once_per_hole_then_next_hole():
    eng, job = setup()
    hole_at_2(eng, job)
    assert parse(one(eng, ack(job, 0, 0))).psn == job.psn(0, 1)   # NAK at 1: go back to 1
    a = ack(job, 0, 1)
    assert one(eng, a) == a                            # the same hole: not again
    feed(eng, job, {0: [1, 2, 3], 1: [4, 5]})         # go-back-N: 1 (re-emit), 2, 3 (dup)
    a = ack(job, 0, 3)
    assert one(eng, a) == a                            # filled: no hole
    feed(eng, job, {0: [5]})                           # rank 0 lost 4
    a = ack(job, 0, 2)
    assert one(eng, a) == a                            # behind acked_f: never rewritten
    p = parse(one(eng, ack(job, 0, 3)))                # a repeat of the latest ACK (what the
    assert (p.syndrome, p.psn) == (NAK_PSN_SEQ, job.psn(0, 4))  # ACK request gets back)
    feed(eng, job, {0: [4, 5], 1: [6, 7]})
    feed(eng, job, {0: [7]})                           # lost 6
    p = parse(one(eng, ack(job, 0, 5)))
    assert (p.syndrome, p.psn) == (NAK_PSN_SEQ, job.psn(0, 6))
    assert eng.counters(0)["fast_retx"] == 3


def test_ack_request_on_the_first_contribution_past_a_hole():
    """The contribution that shows the hole also sends f's receiver a payload-free duplicate
    (PSN of an index it acknowledged): its re-ACK comes back through the engine and is
    rewritten, even when the receiver's last ACK passed before the hole appeared."""
    eng, job = setup()
    feed(eng, job, {0: [0, 1], 1: [0, 1, 2, 3]})
    assert one(eng, ack(job, 0, 1)) == ack(job, 0, 1)      # before the loss: plain ACK
    out = eng.receive(0, job.data_bytes(0, 3, [1, 2, 3, 4]), 0)   # index 2 was lost
    assert len(out) == 1
    p = parse(out[0].frame)                             # ICRC, lengths check out
    assert (p.opcode, p.psn, p.payload, p.dqpn) == (0x07, job.psn(0, 1), b"", job.rq(1))
    assert (p.src_ip, p.dst_ip) == (job.ip(0), job.ip(1))
    assert eng.counters(0)["fast_retx_probes"] == 1
    assert eng.receive(0, job.data_bytes(0, 4, [1, 2, 3, 4]), 0) == []   # once per hole
    q = parse(one(eng, ack(job, 0, 1)))                 # the receiver's re-ACK
    assert (q.syndrome, q.psn) == (NAK_PSN_SEQ, job.psn(0, 2))
    # nothing acknowledged yet: the request carries S_f - 1 (behind the receiver's first PSN)
    eng, job = setup(start_psns=[0, 9])
    feed(eng, job, {0: [1]})
    assert eng.counters(0)["fast_retx_probes"] == 1
    eng2, job2 = setup(bit=False)
    feed(eng2, job2, {0: [1, 3]})
    assert eng2.counters(0)["fast_retx_probes"] == 0


def test_stale_acks_naks_and_rnr_pass_unchanged():
    eng, job = setup()
    hole_at_2(eng, job)
    assert one(eng, ack(job, 0, 1)) != ack(job, 0, 1)  # NAKed hole 2 (acked_f = 2)
    feed(eng, job, {0: [2, 3, 5], 1: [4, 5]})          # filled; a new hole at 4
    stale = ack(job, 0, 0)
    assert one(eng, stale) == stale                     # behind acked_f
    for syn in (NAK_PSN_SEQ, 0x20 | 3):  # NAK-sequence, RNR NAK
        s = job.succ(0)
        nak = RoceFrame.ack(dqpn=job.sq(0), psn=job.psn(0, 3), syndrome=syn, smac=job.mac(s),
                            dmac=job.mac(0), src_ip=job.ip(s), dst_ip=job.ip(0)).pack()
        assert one(eng, nak) == nak
    assert eng.counters(0)["fast_retx"] == 1


def test_reordering_and_the_go_back_fill():
    """A reordered pair (3 before 2) costs a spurious ACK request, no NAK once 2 arrives (the
    frame at the prefix moves it to top); a spurious NAK only if an ACK passes in between.
    The contribution that fills a hole moves the prefix past the duplicates of the go-back-N,
    which therefore do not look like holes."""
    eng, job = setup()
    feed(eng, job, {0: [0, 1, 3, 2], 1: [0, 1, 2]})   # rank 1 holds the release at 3
    assert eng.counters(0)["fast_retx_probes"] == 1
    a = ack(job, 0, 1)
    assert one(eng, a) == a
    eng, job = setup()
    feed(eng, job, {0: [0, 1, 3], 1: [0, 1, 2]})
    assert parse(one(eng, ack(job, 0, 1))).psn == job.psn(0, 2)   # spurious if 2 is late
    eng, job = setup()
    feed(eng, job, {0: [0, 1, 3, 4, 5], 1: [0, 1, 2, 3]})         # lost 2
    assert parse(one(eng, ack(job, 0, 1))).psn == job.psn(0, 2)
    feed(eng, job, {0: [2, 3]})                                   # the go-back-N, under way
    a = ack(job, 0, 2)                                            # results 2, 3 released
    assert one(eng, a) == a
    feed(eng, job, {0: [4, 5], 1: [5]})                           # rank 1 lost 4
    a = ack(job, 0, 3)
    assert one(eng, a) == a                                       # rank 0 has no hole
    assert eng.counters(0)["fast_retx"] == 1


def test_disable_resets_the_flow_state():
    eng, job = setup()
    hole_at_2(eng, job)
    ctl = EngineControl(eng.bus)
    ctl.remove_job(0)
    ctl.add_job(job.config())
    set_bit(eng, 0, True)
    feed(eng, job, {0: [0, 1], 1: [0, 1]})
    a = ack(job, 0, 0)
    assert one(eng, a) == a


# ---------------------------------------------------------------------------- end to end
def allreduce(on: bool, seed: int, loss: float = 0.02, world: int = 4, kib: int = 128,
              msg_packets: int = 16):
    rng = np.random.default_rng(seed)
    n = kib * 256
    xs = [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(world)]
    fab = ModelFabric(net=NetConfig(LinkConfig(), {("up", "data"): LinkConfig(loss=loss)}),
                      seed=seed)
    comm = Communicator(fab, world, CollectiveConfig(msg_packets=msg_packets, fast_retx=on), seed)
    res = comm.allreduce(xs)
    want = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    for y in res.results:
        np.testing.assert_array_equal(y, want)
    assert res.stats["slots_left"] == 0
    return res.stats, fab.now()


def test_allreduce_with_contribution_loss_fewer_timeouts():
    off = [allreduce(False, s) for s in range(3)]
    on = [allreduce(True, s) for s in range(3)]
    assert sum(st["engine"].get("fast_retx", 0) for st, _ in off) == 0
    fired = sum(st["engine"]["fast_retx"] for st, _ in on)
    assert fired > 0
    assert sum(st["naks_received"] for st, _ in on) >= fired
    t_off = sum(st["timeouts"] for st, _ in off)
    t_on = sum(st["timeouts"] for st, _ in on)
    assert t_on < t_off, (t_on, t_off)
    assert sum(ns for _, ns in on) < sum(ns for _, ns in off)


def test_job_config_sets_the_bit_and_rejects_a_non_bool():
    from netreduce.sw_driver.control import ConfigError

    j = RingJob(world=2, window=4)
    eng, ctl = engine_with()
    rm = eng.regmap
    on = rm.field("JOB.CTRL.fast_retx")
    ctl.add_job(dataclasses.replace(j.config(), fast_retx=True))
    assert on.get(eng.bus.read(rm.addr("JOB.CTRL", 0))) == 1
    assert ctl.job_status(0).enabled
    ctl.remove_job(0)
    ctl.add_job(j.config())
    assert on.get(eng.bus.read(rm.addr("JOB.CTRL", 0))) == 0
    ctl.remove_job(0)
    with pytest.raises(ConfigError, match="fast_retx = 1 is not a bool"):
        ctl.add_job(dataclasses.replace(j.config(), fast_retx=1))
