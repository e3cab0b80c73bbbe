"""netreduce.wire.view (the engine's per-frame view) and .rewrite (the frames it makes) against
netreduce.wire.parse and scapy."""

import random

import pytest
from netreduce.sim.cocotb.packets import malformed_frames, random_frame
from netreduce.sim.model.kit import RingJob

from netreduce.wire import ECN_CE, ECN_ECT0, NAK_PSN_SEQ, Opcode, WireError, parse, view
from netreduce.wire.rewrite import cnp_for, duplicate_probe, mark_ce, nak_seq, result_frame

scapy = pytest.importorskip("scapy.all")


def _reason(frame):
    try:
        parse(frame)
        return None
    except WireError as e:
        return e.reason


@pytest.mark.parametrize("vlan", [False, True])
def test_classification_and_fields(vlan):
    rng = random.Random(5)
    for _ in range(50):
        f = random_frame(rng, vlan=vlan)
        b = f.pack()
        l3 = view.roce_l3(b)
        assert l3 == (18 if vlan else 14) == view.l3_offset(b)
        assert view.flow_key(b, l3) == f.src_ip.to_bytes(4, "big") + f.dqpn.to_bytes(3, "big")
        assert view.flow_key(b, l3, src=False)[:4] == f.dst_ip.to_bytes(4, "big")
        assert view.opcode(b, l3) == f.opcode and view.psn(b, l3) == f.psn
        assert view.ecn(b, l3) == f.tos & 3
        c = view.check(b, l3)
        assert not isinstance(c, str) and c.opcode == f.opcode and c.psn == f.psn
        if f.info.has_payload:
            assert b[c.x:c.end] == f.payload
        if not vlan:
            assert view.payload_len(b) == len(f.payload)
            assert view.src_ip(b) == f.src_ip.to_bytes(4, "big") and view.is_roce(b)
            assert view.dst_mac(b) == f.dmac and view.src_mac(b) == f.smac


def test_check_gives_parse_reason():
    rng = random.Random(6)
    seen = set()
    for _ in range(10):
        for m in malformed_frames(rng):
            l3 = view.roce_l3(m.frame)
            if l3 <= 0:
                assert l3 == view.SHORT_ROCE or _reason(m.frame) in (
                    "ethertype", "ip_version", "ihl", "fragment", "protocol", "udp_port",
                    "truncated")
                continue
            c = view.check(m.frame, l3)
            assert (c if isinstance(c, str) else None) == _reason(m.frame), m.name
            seen.add(m.name)
    assert {"bad_icrc", "bad_ip_checksum", "udp_length", "tver", "unknown_opcode"} <= seen


def test_not_roce():
    b = bytes(scapy.Ether() / scapy.IP() / scapy.UDP(dport=4792) / bytes(40))
    assert view.roce_l3(b) == view.NOT_ROCE and view.is_udp(b) and view.udp_dport(b) == 4792
    b = bytes(scapy.Ether() / scapy.IP(flags="MF") / scapy.UDP(dport=4791) / bytes(40))
    assert view.roce_l3(b) == view.NOT_ROCE    # a fragment
    b = bytes(scapy.Ether() / scapy.IP() / scapy.UDP(dport=4791) / bytes(4))
    assert view.roce_l3(b) == view.SHORT_ROCE  # cut inside the BTH
    assert view.roce_l3(b[:13]) == view.NOT_ROCE
    mgmt = bytes(scapy.Ether() / scapy.Dot1Q(vlan=3) / scapy.IP(dst="10.0.0.9")
                 / scapy.UDP(dport=5000) / b"x")
    ip9 = bytes([10, 0, 0, 9])
    assert view.udp_dport_to(mgmt, ip9) == 5000 and view.udp_dport_to(mgmt, bytes(4)) is None
    assert view.udp_payload(mgmt, 18) == b"x"


@pytest.mark.parametrize("vlan", [False, True])
def test_rewrites_parse_back(vlan):
    j = RingJob(world=2, vlan_tci=5 if vlan else None)
    data = j.data(0, 3, list(range(8)), ecn=ECN_CE)
    b = data.pack()
    l3 = view.roce_l3(b)
    cnp = parse(cnp_for(b, l3, 0x123))
    assert cnp.opcode == Opcode.CNP and cnp.dqpn == 0x123 and cnp.becn
    assert (cnp.src_ip, cnp.dst_ip, cnp.dmac, cnp.smac) == (data.dst_ip, data.src_ip, data.smac,
                                                             data.dmac)
    assert cnp.tos & 3 == 0 and len(cnp_for(b, l3, 1)) >= 60
    probe = parse(duplicate_probe(b, l3))
    assert probe.opcode == Opcode.WRITE_MIDDLE and probe.psn == data.psn and not probe.payload
    assert parse(duplicate_probe(b, l3, psn=7)).psn == 7
    res = parse(result_frame(b[:view.check(b, l3).x], l3, bytes(range(32))))
    assert res.payload == bytes(range(32)) and res.tos & 3 == ECN_ECT0 and res.psn == data.psn
    ack = j.ack(1, 3)
    nak = parse(nak_seq(ack, view.roce_l3(ack), 99))
    assert nak.opcode == Opcode.ACK and nak.syndrome == NAK_PSN_SEQ and nak.psn == 99
    ect = j.data(0, 3, list(range(8)), ecn=ECN_ECT0).pack()
    marked = parse(mark_ce(ect))
    assert marked.tos & 3 == ECN_CE and marked.payload == data.payload
    assert mark_ce(b) is None  # already CE
