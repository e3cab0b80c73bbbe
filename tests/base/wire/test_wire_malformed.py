"""Malformed input: parse() raises WireError naming the reason, the field and the value."""

import pytest

from netreduce.wire import NOT_ROCE_REASONS, RoceFrame, WireError, icrc_bytes, ipv4_checksum, parse
from netreduce.wire.opcodes import Opcode

SAMPLES = {
    "write_first_vlan": RoceFrame(opcode=Opcode.WRITE_FIRST, psn=7, payload=bytes(range(256)),
                                  vlan_tci=0x2064, va=0x1000, rkey=0x42, dmalen=1024),
    "write_only_imm": RoceFrame(opcode=Opcode.WRITE_ONLY_IMM, payload=b"abcdefg", imm=5),
    "send_last_imm_vlan": RoceFrame(opcode=Opcode.SEND_LAST_IMM, payload=b"xyz", vlan_tci=5),
    "ack": RoceFrame.ack(psn=3, msn=2),
    "cnp": RoceFrame.cnp(dqpn=9),
}


def _l3(frame: bytes) -> int:
    return 18 if frame[12:14] == b"\x81\x00" else 14


def _raises(frame, reason, field, value=None, expected=None) -> WireError:
    with pytest.raises(WireError) as ei:
        parse(frame)
    e = ei.value
    assert (e.reason, e.field) == (reason, field), str(e)
    msg = str(e)
    assert msg.startswith(reason) and field in msg
    if value is not None:
        assert e.value == value
        assert (hex(value) if isinstance(value, int) else value.hex()) in msg
    if expected is not None:
        assert e.expected == expected
        assert f"expected {expected}" in msg
    assert e.not_roce == (reason in NOT_ROCE_REASONS)
    return e


def _fix(frame: bytearray) -> bytes:
    """Recompute IPv4 checksum and ICRC after a deliberate header edit (isolates one fault)."""
    l3 = _l3(frame)
    frame[l3 + 10:l3 + 12] = b"\0\0"
    frame[l3 + 10:l3 + 12] = ipv4_checksum(frame[l3:l3 + 20]).to_bytes(2, "big")
    end = l3 + int.from_bytes(frame[l3 + 2:l3 + 4], "big")
    frame[end - 4:end] = icrc_bytes(frame[l3:end - 4])
    return bytes(frame)


@pytest.mark.parametrize("name", SAMPLES)
def test_every_truncation_point(name):
    frame = SAMPLES[name].pack()
    l3 = _l3(frame)
    total = int.from_bytes(frame[l3 + 2:l3 + 4], "big")
    end = l3 + total
    assert parse(frame).copy().pack() == frame
    for k in range(len(frame)):
        cut = frame[:k]
        if k < 14:
            _raises(cut, "truncated", "ETH", k, 14)
        elif k < l3:
            _raises(cut, "truncated", "DOT1Q", k, 18)
        elif k < l3 + 20:
            _raises(cut, "truncated", "IPV4", k)
        elif k < l3 + 28:
            _raises(cut, "truncated", "UDP", k, l3 + 28)
        elif k < end:
            e = _raises(cut, "ip_length", "IPV4.total_length", total, k - l3)
            assert "past the end" in str(e)
        else:  # only Ethernet padding is cut: still a valid frame
            assert parse(cut).psn == SAMPLES[name].psn


def test_ip_lengths():
    frame = bytearray(SAMPLES["write_only_imm"].pack())
    total = int.from_bytes(frame[16:18], "big")
    longer = bytearray(frame)
    longer[16:18] = (total + 4).to_bytes(2, "big")
    _raises(bytes(longer), "ip_length", "IPV4.total_length", total + 4, total)
    tiny = bytearray(frame)
    tiny[16:18] = (43).to_bytes(2, "big")
    e = _raises(bytes(tiny), "ip_length", "IPV4.total_length", 43)
    assert "minimum" in str(e)
    trailing = bytes(frame) + b"\0" * 8  # extra bytes in a frame above 60 B are not padding
    _raises(trailing, "ip_length", "IPV4.total_length", total, total + 8)
    ack_with_data = bytearray(RoceFrame.ack(psn=1).pack())
    ack_with_data[16:18] = (int.from_bytes(ack_with_data[16:18], "big") + 4).to_bytes(2, "big")
    ack_with_data[38:40] = (int.from_bytes(ack_with_data[38:40], "big") + 4).to_bytes(2, "big")
    _raises(_fix(ack_with_data + bytes(4)), "ip_length", "IPV4.total_length")


def test_udp_length():
    frame = bytearray(SAMPLES["write_only_imm"].pack())
    udp_len = int.from_bytes(frame[38:40], "big")
    frame[38:40] = (udp_len + 1).to_bytes(2, "big")
    _raises(bytes(frame), "udp_length", "UDP.length", udp_len + 1, udp_len)


@pytest.mark.parametrize(("edit", "reason", "field", "value", "expected"), [
    (lambda b: b.__setitem__(slice(12, 14), b"\x86\xdd"), "ethertype", "ETH.ethertype",
     0x86DD, 0x0800),
    (lambda b: b.__setitem__(14, 0x65), "ip_version", "IPV4.version", 6, 4),
    (lambda b: b.__setitem__(14, 0x46), "ihl", "IPV4.ihl", 6, 5),
    (lambda b: b.__setitem__(23, 6), "protocol", "IPV4.protocol", 6, 17),
    (lambda b: b.__setitem__(slice(20, 22), b"\x20\x00"), "fragment", "IPV4.flags_frag",
     0x2000, 0x4000),
    (lambda b: b.__setitem__(slice(20, 22), b"\x40\x08"), "fragment", "IPV4.flags_frag",
     0x4008, 0x4000),
    (lambda b: b.__setitem__(slice(36, 38), b"\x12\xb8"), "udp_port", "UDP.dport", 4792, 4791),
])
def test_not_roce(edit, reason, field, value, expected):
    frame = bytearray(SAMPLES["write_only_imm"].pack())
    edit(frame)
    e = _raises(bytes(frame), reason, field, value, expected)
    assert e.not_roce


def test_bad_ip_checksum():
    frame = bytearray(SAMPLES["write_only_imm"].pack())
    good = int.from_bytes(frame[24:26], "big")
    frame[24:26] = (good ^ 0x0101).to_bytes(2, "big")
    e = _raises(bytes(frame), "ip_checksum", "IPV4.checksum", good ^ 0x0101, good)
    assert not e.not_roce
    assert parse(bytes(frame), check=False).payload == b"abcdefg"  # check=False skips it


@pytest.mark.parametrize("name", SAMPLES)
def test_bad_icrc(name):
    frame = bytearray(SAMPLES[name].pack())
    l3 = _l3(frame)
    end = l3 + int.from_bytes(frame[l3 + 2:l3 + 4], "big")
    good = bytes(frame[end - 4:end])
    frame[end - 5] ^= 0x80  # last covered byte (pad, payload or extension header)
    e = _raises(bytes(frame), "icrc", "ICRC", good)
    assert e.expected == icrc_bytes(frame[l3:end - 4])
    assert good.hex() in str(e)
    assert not e.not_roce


def test_tver():
    frame = RoceFrame(opcode=Opcode.SEND_ONLY, payload=b"1234", tver=1).pack()
    _raises(frame, "tver", "BTH.tver", 1, 0)


@pytest.mark.parametrize("opcode", [0x0C, 0x10, 0x12, 0x2C, 0x64, 0x80, 0xFF])
def test_unknown_opcode(opcode):
    frame = bytearray(RoceFrame(opcode=Opcode.SEND_ONLY, payload=b"1234").pack())
    frame[42] = opcode
    e = _raises(_fix(frame), "opcode", "BTH.opcode", opcode)
    assert "not an RC/UC/CNP opcode" in str(e)


def test_padcnt_too_large():
    frame = bytearray(RoceFrame(opcode=Opcode.SEND_ONLY, payload=b"").pack())
    frame[43] |= 0x10  # PadCnt 1 with nothing after the BTH
    e = _raises(_fix(frame), "padcnt", "BTH.padcnt", 1)
    assert "only 0 B" in str(e)
    frame = bytearray(RoceFrame(opcode=Opcode.SEND_ONLY, payload=b"ab").pack())
    frame[43] = (frame[43] & 0xCF) | 0x30  # PadCnt 3 but only 4 bytes (2 data + 2 pad) follow
    assert parse(_fix(frame)).payload == b"a"  # 3 <= 4: legal, just a different split
    short = bytearray(RoceFrame(opcode=Opcode.SEND_ONLY, payload=b"ab").pack())
    short[16:18] = (int.from_bytes(short[16:18], "big") - 2).to_bytes(2, "big")
    short[38:40] = (int.from_bytes(short[38:40], "big") - 2).to_bytes(2, "big")
    short[43] = (short[43] & 0xCF) | 0x30  # PadCnt 3 with 2 bytes after the BTH
    _raises(_fix(short)[:-2], "padcnt", "BTH.padcnt", 3)


def test_extension_headers_past_datagram():
    frame = bytearray(RoceFrame(opcode=Opcode.SEND_ONLY, payload=b"abcd").pack())
    frame[42] = Opcode.WRITE_ONLY  # claims a 16-byte RETH, only 4 bytes follow
    e = _raises(_fix(frame), "truncated", "BTH.opcode", Opcode.WRITE_ONLY)
    assert "16 B of extension headers" in str(e)


def test_message_shows_value_in_hex_and_decimal():
    e = WireError("udp_port", "UDP.dport", 4792, 4791)
    assert str(e) == "udp_port: UDP.dport = 4792 (0x12b8), expected 4791 (0x12b7)"
    assert e.not_roce and not WireError("icrc", "ICRC", b"\0").not_roce
