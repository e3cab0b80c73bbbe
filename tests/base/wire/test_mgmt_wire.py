"""Management frame format (netreduce.wire.mgmt): field tables, pack/parse, SipHash, errors."""

import random

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether

from netreduce.regmap import MGMT_PORT_RESET
from netreduce.wire import WireError, ipv4_checksum
from netreduce.wire.mgmt import (
    MGMT_DEFAULT_PORT,
    MGMT_HDR,
    MGMT_MAX_OPS,
    MGMT_OP,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtType,
    auth_input,
    mgmt_tag,
    pack_mgmt,
    parse_mgmt,
    parse_mgmt_payload,
    siphash24,
    udp_checksum,
)

# SipHash-2-4 reference vectors (vectors_sip64 of the reference implementation): key 00..0f,
# message 00..n-1 for n = 0..16.
SIP64 = [0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
         0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
         0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
         0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
         0x3f2acc7f57c29bdb]
KEY = bytes(range(16))


def _frame(ops=None, seq=7, vlan=None, **kw):
    msg = MgmtMessage(MgmtType.REQUEST, seq, ops or [MgmtOp.read(0x30), MgmtOp.write(0x30, 5)])
    args = dict(src_mac=b"\x02\xcc\0\0\0\1", dst_mac=b"\x02\xee\0\0\0\1", src_ip=0x0A000001,
                dst_ip=0x0A0000FE, sport=40000, dport=MGMT_DEFAULT_PORT, vlan_tci=vlan)
    args.update(kw)
    return MgmtFrame(msg, **args)


@pytest.mark.parametrize("n", range(len(SIP64)))
def test_siphash_reference_vectors(n):
    assert siphash24(KEY, bytes(range(n))) == SIP64[n]


def test_siphash_key_length():
    with pytest.raises(ValueError, match="16 bytes"):
        siphash24(bytes(15), b"")


def test_field_tables_tile_their_headers():
    for h in (MGMT_HDR, MGMT_OP):
        covered = []
        for f in h.fields:
            covered += range(f.offset, f.offset + f.size)
        assert sorted(covered) == list(range(h.size)), h.name
    assert MGMT_HDR.size == 24 and MGMT_OP.size == 12
    assert MGMT_PORT_RESET == MGMT_DEFAULT_PORT  # regmap reset value = protocol default


@pytest.mark.parametrize("vlan", [None, 0x2064])
@pytest.mark.parametrize("key", [None, KEY])
def test_roundtrip_and_scapy_checksums(vlan, key):
    fr = _frame(vlan=vlan)
    raw = pack_mgmt(fr, key)
    assert len(raw) >= 60
    back = parse_mgmt(raw)
    assert back.msg.ops == fr.msg.ops and back.msg.seq == 7 and back.vlan_tci == vlan
    assert (back.src_ip, back.dst_ip, back.sport, back.dport) == (0x0A000001, 0x0A0000FE, 40000,
                                                                  MGMT_DEFAULT_PORT)
    if key is None:
        assert back.msg.tag == bytes(8)
    else:
        assert back.msg.tag == fr.msg.tag != bytes(8)
    # scapy recomputes both checksums from scratch: they must equal ours
    p = Ether(raw)
    ip, udp = p[IP], p[UDP]
    assert (Dot1Q in p) == (vlan is not None)
    c_ip, c_udp = ip.chksum, udp.chksum
    del ip.chksum, udp.chksum
    q = Ether(bytes(p))
    assert q[IP].chksum == c_ip and q[UDP].chksum == c_udp
    assert udp.dport == MGMT_DEFAULT_PORT and udp.len == 8 + 24 + 12 * 2
    assert bytes(udp.payload)[:2] == b"NM"


def test_tag_binds_addresses_and_payload():
    fr = _frame()
    payload = bytes(pack_mgmt(fr, KEY)[42:42 + 48])
    t = mgmt_tag(KEY, 1, 2, 3, 4, payload)
    assert t == mgmt_tag(KEY, 1, 2, 3, 4, payload[:16] + bytes(8) + payload[24:])  # tag ignored
    assert auth_input(1, 2, 3, 4, payload)[12 + 16:12 + 24] == bytes(8)
    for args in ((9, 2, 3, 4), (1, 9, 3, 4), (1, 2, 9, 4), (1, 2, 3, 9)):
        assert mgmt_tag(KEY, *args, payload) != t
    for i in [*range(16), *range(24, len(payload))]:
        b = bytearray(payload)
        b[i] ^= 0x01
        assert mgmt_tag(KEY, 1, 2, 3, 4, bytes(b)) != t, i
    assert mgmt_tag(bytes(16), 1, 2, 3, 4, payload) != t


def test_pack_rejects_bad_values():
    with pytest.raises(ValueError, match="1..64 ops, got 0"):
        pack_mgmt(MgmtFrame(MgmtMessage(MgmtType.REQUEST, 1, []), b"\0" * 6, b"\0" * 6, 1, 2, 3, 4))
    with pytest.raises(ValueError, match="65"):
        pack_mgmt(_frame(ops=[MgmtOp.read(0)] * (MGMT_MAX_OPS + 1)))
    with pytest.raises(ValueError, match="addr = 4294967296"):
        pack_mgmt(_frame(ops=[MgmtOp.read(1 << 32)]))
    with pytest.raises(ValueError, match="value = -1"):
        pack_mgmt(_frame(ops=[MgmtOp.write(0, -1)]))
    with pytest.raises(ValueError, match="seq"):
        pack_mgmt(_frame(seq=1 << 32))
    assert len(parse_mgmt(pack_mgmt(_frame(ops=[MgmtOp.read(4)] * MGMT_MAX_OPS))).msg.ops) == 64


def _payload_bytes(raw):
    return bytearray(raw[42:42 + ((raw[16] << 8) | raw[17]) - 28])


def _reframe(raw, payload):
    """The frame with a new UDP payload, lengths and checksums fixed (only the payload is bad)."""
    fr = parse_mgmt(raw)
    eth = bytearray(raw[:14])
    ip = bytearray(raw[14:34])
    ip[2:4] = (28 + len(payload)).to_bytes(2, "big")
    ip[10:12] = b"\0\0"
    ip[10:12] = ipv4_checksum(ip).to_bytes(2, "big")
    udp = bytearray(fr.sport.to_bytes(2, "big") + fr.dport.to_bytes(2, "big")
                    + (8 + len(payload)).to_bytes(2, "big") + b"\0\0") + payload
    udp[6:8] = udp_checksum(fr.src_ip, fr.dst_ip, bytes(udp)).to_bytes(2, "big")
    return bytes(eth + ip + udp)


@pytest.mark.parametrize("offset,value,field", [
    (0, 0x4F, "MGMT_HDR.magic"), (2, 2, "MGMT_HDR.version"), (3, 0, "MGMT_HDR.type"),
    (3, 3, "MGMT_HDR.type"), (8, 0, "MGMT_HDR.count"), (8, 3, "MGMT_HDR.count"),
    (8, 65, "MGMT_HDR.count"), (9, 1, "MGMT_HDR.status"), (10, 1, "MGMT_HDR.err_index"),
    (11, 1, "MGMT_HDR.reserved"), (15, 1, "MGMT_HDR.last_seq"), (24 + 1, 1, "MGMT_OP.status"),
    (24 + 3, 1, "MGMT_OP.reserved"), (24 + 11, 1, "MGMT_OP.value"),
])
def test_malformed_payload_fields(offset, value, field):
    raw = pack_mgmt(_frame())
    p = _payload_bytes(raw)
    p[offset] = value
    with pytest.raises(WireError) as e:
        parse_mgmt(_reframe(raw, p))
    assert e.value.reason == "malformed" and e.value.field == field


def test_response_fields_allowed_nonstrict():
    msg = MgmtMessage(MgmtType.RESPONSE, 3, [MgmtOp(1, 0x30, 99, 0)], status=4, err_index=255,
                      last_seq=9)
    fr = parse_mgmt(pack_mgmt(MgmtFrame(msg, b"\1" * 6, b"\2" * 6, 1, 2, 3, 4)))
    assert (fr.msg.status, fr.msg.err_index, fr.msg.last_seq, fr.msg.ops[0].value) == (4, 255, 9,
                                                                                      99)


def test_payload_length_must_match_count():
    p = bytes(_payload_bytes(pack_mgmt(_frame())))
    for bad in (p[:-1], p + b"\0", p[:23]):
        with pytest.raises(WireError, match="malformed"):
            parse_mgmt_payload(bad)


def test_every_truncation_is_a_wire_error():
    raw = pack_mgmt(_frame(vlan=5), KEY)
    for n in range(len(raw)):
        with pytest.raises(WireError) as e:
            parse_mgmt(raw[:n])
        assert e.value.reason in ("not_mgmt", "malformed"), n


def test_ip_udp_layer_defects():
    raw = bytearray(pack_mgmt(_frame()))
    cases = {}
    b = bytearray(raw)
    b[24] ^= 1  # IPv4 checksum
    cases["IPV4.checksum"] = b
    b = bytearray(raw)
    b[41] ^= 1  # UDP checksum
    cases["UDP.checksum"] = b
    b = bytearray(raw)
    b[60] ^= 1  # payload byte: UDP checksum catches it
    cases["UDP.checksum "] = b
    b = bytearray(raw)
    b[38:40] = (int.from_bytes(b[38:40], "big") - 1).to_bytes(2, "big")
    cases["UDP.length"] = b
    for name, frame in cases.items():
        with pytest.raises(WireError) as e:
            parse_mgmt(bytes(frame))
        assert e.value.reason == "malformed" and e.value.field == name.strip(), name
    b = bytearray(raw)
    b[40:42] = b"\0\0"  # UDP checksum 0: none (RFC 768) is accepted
    assert parse_mgmt(bytes(b)).msg.seq == 7
    frag = bytearray(raw)
    frag[20] |= 0x20  # MF
    with pytest.raises(WireError, match="fragment"):
        parse_mgmt(bytes(frag))
    tcp = bytearray(raw)
    tcp[23] = 6
    with pytest.raises(WireError) as e:
        parse_mgmt(bytes(tcp))
    assert e.value.reason == "not_mgmt"


def test_random_bytes_never_crash():
    rng = random.Random(7)
    raw = pack_mgmt(_frame(), KEY)
    for _ in range(400):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            parse_mgmt(bytes(b))
        except WireError:
            pass
