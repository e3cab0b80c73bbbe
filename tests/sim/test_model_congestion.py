"""D19 (docs/design.md section 10): a congested port marks forwarded ECT frames CE and answers
contributions with CNPs, rate limited as D8; nothing is dropped for congestion."""

from __future__ import annotations

import numpy as np
from netreduce.sim.model.congestion import mark_ce
from netreduce.sim.model.kit import RingJob, engine_with

from netreduce.regmap import DISPOSITIONS
from netreduce.wire import ECN_CE, ECN_ECT0, ECN_ECT1, ECN_NOT_ECT, Opcode, RoceFrame, parse


def _x(seed, ranks=2, lanes=16):
    return np.random.default_rng(seed).integers(-1000, 1000, (ranks, lanes)).astype(np.int32)


def test_mark_ce_fixes_checksum_and_keeps_icrc():
    for tci in (None, 0x0003):
        f = RoceFrame(opcode=Opcode.ACK, dqpn=7, psn=3, tos=(26 << 2) | ECN_ECT0,
                      vlan_tci=tci).pack()
        m = mark_ce(f)
        p = parse(m)  # raises on a bad IPv4 checksum or ICRC
        assert p.tos == (26 << 2) | ECN_CE
        assert len(m) == len(f)
    for ecn in (ECN_NOT_ECT, ECN_CE):
        assert mark_ce(RoceFrame(opcode=Opcode.ACK, dqpn=7, psn=3, tos=ecn).pack()) is None
    assert mark_ce(bytes(60)) is None  # not IPv4
    assert mark_ce(bytes(10)) is None


def test_congested_port_cnps_contributions_rate_limited():
    j = RingJob(world=2, window=8, cnp_interval=100)
    eng, _ = engine_with(j, ports=2)
    x = _x(1)
    eng.congested[1] = True

    def cnps(r, k, t, port, ecn=ECN_ECT0):
        out = eng.receive(port, j.data_bytes(r, k, x[r], ecn=ecn), t)
        return [parse(e.frame) for e in out if parse(e.frame).opcode == Opcode.CNP]

    assert cnps(0, 0, 0, port=0) == []  # port 0 is not congested
    c = cnps(1, 0, 10, port=1)  # not CE-marked, but port 1 is congested
    assert len(c) == 1 and (c[0].dst_ip, c[0].dqpn, c[0].becn) == (j.ip(1), j.sq(1), 1)
    assert cnps(1, 1, 50, port=1) == []  # D8's interval
    assert len(cnps(1, 2, 110, port=1, ecn=ECN_NOT_ECT)) == 1  # whatever its ECN field
    cnt = eng.counters(0)
    assert (cnt["cnp_sent"], cnt["cnp_suppressed"], cnt["contributions"]) == (2, 1, 4)
    assert eng.congested.cnp_congested == 2
    eng.congested[1] = False
    assert cnps(0, 1, 1000, port=1) == []


def test_congested_port_marks_forwarded_ect_frames():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j, ports=2)
    eng.congested[0] = True
    frames = {ecn: RoceFrame(opcode=Opcode.WRITE_ONLY, dqpn=99, psn=1, tos=ecn,
                             payload=bytes(64)).pack()
              for ecn in (ECN_NOT_ECT, ECN_ECT0, ECN_ECT1, ECN_CE)}  # unregistered: forwarded
    for ecn, f in frames.items():
        (e,) = eng.receive(0, f, 0)
        p = parse(e.frame)
        assert p.tos & 3 == (ECN_NOT_ECT if ecn == ECN_NOT_ECT else ECN_CE)
        assert p.payload == parse(f).payload and e.port == 0
    ack = j.ack(0, 0)  # a registered flow's ACK, forwarded
    eng.receive(0, ack, 0)
    assert eng.congested.ce_marked == 2  # ECT(0), ECT(1); the kit's ACK is not ECT
    c = eng.counters()
    assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS)  # nothing new, nothing dropped
    (e,) = eng.receive(1, frames[ECN_ECT0], 0)  # port 1 is not congested
    assert e.frame == frames[ECN_ECT0]
