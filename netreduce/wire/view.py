"""A fast view of RoCEv2 frames by byte offset, for the Python hot paths.

:func:`netreduce.wire.parse` checks everything and explains a rejection (:class:`WireError`); it
is the reference. The simulation's per-frame code (the software RNIC, the network model's
classification, captures, the scoreboard, the VM lab's pcap check, the RTL switch adapter) needs
far less per frame, far faster: this module gives it the offsets (derived from the field tables
of :mod:`.fields`) and small peeks, plus :func:`parse_fast`, which returns the same
:class:`~.frame.RoceFrame` as ``parse`` for the common case (untagged RC frame, every check
passed) and None for anything else (the caller then asks ``parse`` for the verdict).

Offsets named ``*_OFF`` are from the start of an untagged frame; :func:`l3_offset` gives the
IPv4 header's offset (14, or 18 behind an 802.1Q tag), from which the ``*_AT`` offsets count.
"""

from __future__ import annotations

from .fields import (
    AETH,
    BTH,
    ETH,
    ETHERTYPE_IPV4,
    ETHERTYPE_VLAN,
    IP_PROTO_UDP,
    IPV4,
    ROCEV2_UDP_PORT,
    UDP,
)
from .frame import RoceFrame
from .icrc import icrc_bytes, ipv4_checksum
from .opcodes import OPCODES, Opcode

__all__ = [
    "ETHERTYPE_OFF", "IPV4_OFF", "UDP_OFF", "BTH_OFF", "EXT_OFF", "PROTO_AT", "SRC_IP_AT",
    "DST_IP_AT", "DPORT_AT", "UDP_LEN_AT", "BTH_AT", "ETHERTYPE_IPV4_BYTES",
    "ROCEV2_PORT_BYTES", "OP_ACK", "OP_CNP", "CONTROL_OPCODES", "DATA_OPCODES", "WRITE_OPCODES",
    "l3_offset",
    "is_roce", "opcode", "psn", "dqpn", "parse_fast",
]

ETHERTYPE_OFF = ETH.ethertype.offset  # 12
IPV4_OFF = ETH.size  # 14: the IPv4 header of an untagged frame
UDP_OFF = IPV4_OFF + IPV4.size  # 34
BTH_OFF = UDP_OFF + UDP.size  # 42
EXT_OFF = BTH_OFF + BTH.size  # 54: the first extension header (RETH, ImmDt, AETH)
# offsets from the IPv4 header (tagged or not)
PROTO_AT = IPV4.protocol.offset  # 9
SRC_IP_AT = IPV4.src.offset  # 12
DST_IP_AT = IPV4.dst.offset  # 16
DPORT_AT = IPV4.size + UDP.dport.offset  # 22
UDP_LEN_AT = IPV4.size + UDP.length.offset  # 24
BTH_AT = IPV4.size + UDP.size  # 28

ETHERTYPE_IPV4_BYTES = ETHERTYPE_IPV4.to_bytes(2, "big")  # b"\x08\x00"
ROCEV2_PORT_BYTES = ROCEV2_UDP_PORT.to_bytes(2, "big")  # b"\x12\xb7"
_VLAN_HI, _VLAN_LO = ETHERTYPE_VLAN >> 8, ETHERTYPE_VLAN & 0xFF

OP_ACK = int(Opcode.ACK)  # 0x11: ACK/NAK (an AETH follows the BTH)
OP_CNP = int(Opcode.CNP)  # 0x81: congestion notification
#: the opcodes an engine looks up by the reverse key (ACK/NAK and CNP; D12)
CONTROL_OPCODES = frozenset((OP_ACK, OP_CNP))
#: RC SEND and RDMA WRITE opcodes (0x00..0x0B): the data an engine aggregates
DATA_OPCODES = frozenset(code for code, o in OPCODES.items()
                         if o.transport == "RC" and code <= 0x0B)
#: RC RDMA WRITE opcodes (0x06..0x0B)
WRITE_OPCODES = frozenset(int(o) for o in Opcode if o.name.startswith("WRITE_"))


def l3_offset(frame) -> int:
    """Offset of the IPv4 header: 18 behind one 802.1Q tag, else 14."""
    if len(frame) >= IPV4_OFF + 4 and frame[ETHERTYPE_OFF] == _VLAN_HI and \
            frame[ETHERTYPE_OFF + 1] == _VLAN_LO:
        return IPV4_OFF + 4
    return IPV4_OFF


def is_roce(frame, l3: int = IPV4_OFF) -> bool:
    """Whether ``frame`` (IPv4 header at ``l3``) is IPv4/UDP to port 4791 with room for a BTH.
    Only the type fields are looked at (no length, checksum or ICRC check)."""
    return (len(frame) >= l3 + BTH_AT + BTH.size
            and frame[l3 - 2] == ETHERTYPE_IPV4 >> 8 and frame[l3 - 1] == ETHERTYPE_IPV4 & 0xFF
            and frame[l3 + PROTO_AT] == IP_PROTO_UDP
            and frame[l3 + DPORT_AT] == ROCEV2_UDP_PORT >> 8
            and frame[l3 + DPORT_AT + 1] == ROCEV2_UDP_PORT & 0xFF)


def opcode(frame, l3: int = IPV4_OFF) -> int:
    """BTH opcode of a RoCEv2 frame (see :func:`is_roce`)."""
    return frame[l3 + BTH_AT]


def psn(frame, l3: int = IPV4_OFF) -> int:
    """BTH PSN of a RoCEv2 frame."""
    o = l3 + BTH_AT + BTH.psn.offset
    return int.from_bytes(frame[o:o + 3], "big")


def dqpn(frame, l3: int = IPV4_OFF) -> int:
    """BTH destination QP of a RoCEv2 frame."""
    o = l3 + BTH_AT + BTH.dqpn.offset
    return int.from_bytes(frame[o:o + 3], "big")


_EXT = {code: (o.reth, o.immdt, o.aeth, o.ext_len, o.has_payload) for code, o in OPCODES.items()
        if o.transport in ("RC", "CNP")}
_PSN_OFF = BTH_OFF + BTH.psn.offset  # 51
_AETH_OFF = EXT_OFF  # an ACK's AETH directly follows the BTH
assert AETH.size == 4


def parse_fast(buf: bytes) -> RoceFrame | None:
    """Parse an untagged RC frame with full checks (lengths, IPv4 checksum, ICRC), or return None
    when the frame is anything else or fails a check: the caller then runs :func:`parse` for the
    verdict. Much faster than :func:`parse` for the common case; same result when it succeeds."""
    n = len(buf)
    if (n < 62 or buf[12] != 0x08 or buf[13] != 0x00 or buf[14] != 0x45 or buf[23] != 17
            or buf[36] != 0x12 or buf[37] != 0xB7 or buf[20] & 0x3F or buf[21]):
        return None
    total = (buf[16] << 8) | buf[17]
    end = 14 + total
    if end > n or (end < n and n > 60) or ((buf[38] << 8) | buf[39]) != total - 20:
        return None
    ext = _EXT.get(buf[42])
    if ext is None or buf[43] & 0x0F:
        return None
    reth, immdt, aeth, ext_len, has_payload = ext
    x = 54 + ext_len
    pay_end = end - 4
    pad = (buf[43] >> 4) & 3
    if x > pay_end or (not has_payload and (pay_end != x or pad)) or pad > pay_end - x:
        return None
    if ipv4_checksum(buf[14:34]) != ((buf[24] << 8) | buf[25]):
        return None
    if icrc_bytes(memoryview(buf)[14:pay_end]) != buf[pay_end:end]:
        return None
    kw = {}
    o = 54
    if reth:
        kw["va"] = int.from_bytes(buf[o:o + 8], "big")
        kw["rkey"] = int.from_bytes(buf[o + 8:o + 12], "big")
        kw["dmalen"] = int.from_bytes(buf[o + 12:o + 16], "big")
        o += 16
    if immdt:
        kw["imm"] = int.from_bytes(buf[o:o + 4], "big")
        o += 4
    if aeth:
        kw["syndrome"] = buf[o]
        kw["msn"] = int.from_bytes(buf[o + 1:o + 4], "big")
    return RoceFrame(opcode=buf[42], dqpn=int.from_bytes(buf[47:50], "big"),
                     psn=int.from_bytes(buf[51:54], "big"), payload=buf[x:pay_end - pad],
                     dmac=buf[0:6], smac=buf[6:12], src_ip=int.from_bytes(buf[26:30], "big"),
                     dst_ip=int.from_bytes(buf[30:34], "big"), tos=buf[15],
                     pkey=(buf[44] << 8) | buf[45], ackreq=buf[50] >> 7, becn=(buf[46] >> 6) & 1,
                     fecn=buf[46] >> 7, padcnt=pad, **kw)
