"""D19 (docs/design.md section 10): while a port is congested, ECT frames received on it are
CE-marked on arrival (checksum updated incrementally), so forwarded frames leave CE-marked and
contributions get D8's CNPs; nothing is dropped for congestion."""

from __future__ import annotations

import random

import numpy as np
import pytest
from netreduce.sim.model.congestion import csum_update, mark_ce
from netreduce.sim.model.kit import RingJob, engine_with
from netreduce.sw_driver.control import ConfigError

from netreduce.regmap import DISPOSITIONS, FC_RESETS
from netreduce.wire import (
    ECN_CE,
    ECN_ECT0,
    ECN_ECT1,
    ECN_NOT_ECT,
    Opcode,
    RoceFrame,
    ipv4_checksum,
    parse,
)


def _x(seed, ranks=2, lanes=16):
    return np.random.default_rng(seed).integers(-1000, 1000, (ranks, lanes)).astype(np.int32)


def test_mark_ce_keeps_checksum_and_icrc_valid():
    for tci in (None, 0x0003):
        for ecn in (ECN_ECT0, ECN_ECT1):
            f = RoceFrame(opcode=Opcode.ACK, dqpn=7, psn=3, tos=(26 << 2) | ecn,
                          vlan_tci=tci).pack()
            m = mark_ce(f)
            p = parse(m)  # raises on a bad IPv4 checksum or ICRC
            assert p.tos == (26 << 2) | ECN_CE and len(m) == len(f)
    for ecn in (ECN_NOT_ECT, ECN_CE):
        assert mark_ce(RoceFrame(opcode=Opcode.ACK, dqpn=7, psn=3, tos=ecn).pack()) is None
    assert mark_ce(bytes(60)) is None  # not IPv4
    assert mark_ce(bytes(10)) is None


def test_mark_ce_truncated_and_bad_checksum():
    f = RoceFrame(opcode=Opcode.ACK, dqpn=7, psn=3, tos=ECN_ECT0).pack()
    assert mark_ce(f[:16])[15] == ECN_CE  # TOS present, no checksum: only TOS changes
    assert mark_ce(f[:15]) is None
    assert mark_ce(f[:25]) == mark_ce(f[:24]) + f[24:25]  # half a checksum is left alone
    bad = bytearray(f)
    bad[25] ^= 0x10  # a wrong checksum stays exactly as wrong
    m = mark_ce(bytes(bad))
    good = mark_ce(f)
    assert m[:24] == good[:24] and (m[24] << 8 | m[25]) ^ (good[24] << 8 | good[25]) == 0x10


def test_csum_update_matches_recompute():
    rng = random.Random(5)
    for _ in range(2000):
        h = bytearray(rng.randbytes(20))
        h[0] = 0x45
        h[1] = rng.randrange(256) & ~3 | rng.choice((1, 2))
        h[10:12] = ipv4_checksum(h).to_bytes(2, "big")
        old = (h[0] << 8) | h[1]
        h2 = bytearray(h)
        h2[1] |= 3
        got = csum_update((h[10] << 8) | h[11], old, (h2[0] << 8) | h2[1])
        ref = ipv4_checksum(h2)
        # 0x0000 and 0xFFFF are the same one's complement value (RFC 1624 section 3)
        assert got == ref or {got, ref} == {0, 0xFFFF}


def test_congested_port_cnps_ect_contributions_rate_limited():
    j = RingJob(world=2, window=8, cnp_interval=100)
    eng, _ = engine_with(j, ports=2)
    x = _x(1)
    eng.congested[1] = True

    def cnps(r, k, t, port, ecn=ECN_ECT0):
        out = eng.receive(port, j.data_bytes(r, k, x[r], ecn=ecn), t)
        return [parse(e.frame) for e in out if parse(e.frame).opcode == Opcode.CNP]

    assert cnps(0, 0, 0, port=0) == []  # port 0 is not congested
    out = eng.receive(1, j.data_bytes(1, 0, x[1], ecn=ECN_ECT0), 10)  # completes index 0
    c = [parse(e.frame) for e in out if parse(e.frame).opcode == Opcode.CNP]
    assert len(c) == 1 and (c[0].dst_ip, c[0].dqpn, c[0].becn) == (j.ip(1), j.sq(1), 1)
    results = [parse(e.frame) for e in out if parse(e.frame).opcode != Opcode.CNP]
    assert len(results) == 2 and all(r.tos & 3 != ECN_CE for r in results)  # D5
    assert cnps(1, 1, 50, port=1) == []  # D8's interval
    assert cnps(1, 2, 110, port=1, ecn=ECN_NOT_ECT) == []  # not ECN-capable: no CNP
    assert len(cnps(1, 3, 120, port=1, ecn=ECN_ECT1)) == 1
    cnt = eng.counters(0)
    assert (cnt["cnp_sent"], cnt["cnp_suppressed"], cnt["contributions"]) == (2, 1, 5)
    assert eng.congested.marked == 3
    eng.congested[1] = False
    assert cnps(0, 1, 1000, port=1) == []


def test_congested_port_forwards_ect_frames_ce_marked():
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
    c = eng.counters()
    assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS)  # nothing new, nothing dropped
    assert c["fwd_unregistered"] == 4 and eng.congested.marked == 2
    (e,) = eng.receive(1, frames[ECN_ECT0], 0)  # port 1 is not congested
    assert e.frame == frames[ECN_ECT0]


def test_flow_control_registers_through_the_driver():
    j = RingJob(world=2, window=4)
    eng, ctl = engine_with(j, ports=2)
    fc = ctl.flow_control(1)
    assert (fc["pfc_enable"], fc["ecn_enable"], fc["priority"], fc["quanta"]) == (0, 0, 3, 0xFFFF)
    assert (fc["xoff"], fc["xon"], fc["ecn"]) == (FC_RESETS["xoff"], FC_RESETS["xon"],
                                                  FC_RESETS["ecn"])
    fc = ctl.flow_control(1, pfc_enable=1, ecn_enable=1, priority=5, xoff=12000, xon=6000,
                          ecn=5000)
    assert ctl.flow_control(1) == fc and ctl.flow_control(0)["pfc_enable"] == 0
    for bad, msg in (({"xon": 12000}, "xon"), ({"ecn": 12000}, "ecn"),
                     ({"priority": 8}, "priority"), ({"bogus": 1}, "bogus")):
        with pytest.raises(ConfigError, match=msg):
            ctl.flow_control(1, **bad)
    assert ctl.flow_control(1) == fc  # nothing written by a refused change
    with pytest.raises(ConfigError, match="port 2"):
        ctl.flow_control(2)
