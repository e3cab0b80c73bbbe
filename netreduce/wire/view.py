"""A fast view of RoCEv2 frames by byte offset, for the Python hot paths.

:func:`netreduce.wire.parse` checks everything and explains a rejection (:class:`WireError`); it
is the reference. The simulation's per-frame code (the software RNIC, the network model's
classification, captures, the scoreboard, the VM lab's pcap check, the RTL switch adapter) needs
far less per frame, far faster: this module gives it the offsets (derived from the field tables
of :mod:`.fields`) and small peeks, plus :func:`parse_fast`, which returns the same
:class:`~.frame.RoceFrame` as ``parse`` for the common case (untagged RC frame, every check
passed) and None for anything else (the caller then asks ``parse`` for the verdict).

The engine's own reading of a frame is here too, tagged or not: :func:`roce_l3` (its
classification), :func:`check` (the checks of ``parse``, in its order, giving its reason),
:func:`flow_key` and :func:`ecn`. The reference model uses them (the last two as their offsets
inline, on its hot path) and builds its frames with :mod:`.rewrite`. Small readers
(:func:`src_ip`, :func:`udp_dport`, :func:`udp_dport_to`, :func:`dst_mac` ...) serve captures,
the network model, the switch service and management: the simulation and the host driver read
frames only through this module.

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
    "DQPN_AT", "TOS_AT", "NOT_ROCE", "SHORT_ROCE", "roce_l3", "flow_key", "ecn", "Checked",
    "check", "udp_dport_to", "udp_payload", "is_ipv4", "is_udp", "udp_dport", "src_ip", "dst_ip",
    "syndrome", "payload_len", "dst_mac", "src_mac",
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


# ------------------------------------------------------------ the engine's per-frame view
# What the reference model (and the RTL adapters) read of a frame, tagged or not: classification
# (:func:`roce_l3`), the flow key (:func:`flow_key`), and the checks of :func:`netreduce.wire.parse`
# in its order (:func:`check`). Offsets count from ``l3``, the IPv4 header.
_IPV4_VIHL = 0x45  # version 4, IHL 5 (no options)
_FRAG_AT = IPV4.flags_frag.offset  # MF flag and fragment offset: 0x3FFF (DF may be set)
_FRAG_MASK = 0x3FFF
_TOTAL_AT = IPV4.total_length.offset
_CSUM_AT = IPV4.checksum.offset
TOS_AT = _TOS_AT = IPV4.tos.offset
_VLAN_TAG = 4  # an 802.1Q tag moves every later header by 4 bytes
_BTH_HDR = BTH.tver.offset  # the byte holding SE, M, PadCnt, TVer
DQPN_AT = _DQPN_AT = BTH_AT + BTH.dqpn.offset
_BPSN_AT = BTH_AT + BTH.psn.offset
_EXT_AT = BTH_AT + BTH.size  # the first extension header, from the IPv4 header
_MIN_TOTAL = IPV4.size + UDP.size + BTH.size + 4  # IPv4 total length of a BTH-only frame + ICRC
_MIN_FRAME = 60  # Ethernet minimum (no FCS): a shorter frame is padded, padding is not checked
_ICRC = 4

#: :func:`roce_l3` results other than an offset
NOT_ROCE, SHORT_ROCE = 0, -1


def roce_l3(buf) -> int:
    """The IPv4 header's offset (14, or 18 behind one 802.1Q tag) of a frame the engine takes for
    RoCEv2 (IPv4, IHL 5, not a fragment, UDP to 4791, room for a BTH); :data:`NOT_ROCE` for
    anything else or too short to tell, :data:`SHORT_ROCE` for RoCEv2 cut inside its BTH."""
    n = len(buf)
    if n < IPV4_OFF:
        return NOT_ROCE
    l3 = IPV4_OFF
    if buf[ETHERTYPE_OFF] == _VLAN_HI and buf[ETHERTYPE_OFF + 1] == _VLAN_LO:
        if n < IPV4_OFF + _VLAN_TAG:
            return NOT_ROCE
        l3 = IPV4_OFF + _VLAN_TAG
    u = l3 + IPV4.size
    if (buf[l3 - 2] != ETHERTYPE_IPV4 >> 8 or buf[l3 - 1] != ETHERTYPE_IPV4 & 0xFF
            or n < u + UDP.length.offset or buf[l3] != _IPV4_VIHL
            or buf[l3 + PROTO_AT] != IP_PROTO_UDP
            or ((buf[l3 + _FRAG_AT] << 8) | buf[l3 + _FRAG_AT + 1]) & _FRAG_MASK
            or buf[l3 + DPORT_AT] != ROCEV2_UDP_PORT >> 8
            or buf[l3 + DPORT_AT + 1] != ROCEV2_UDP_PORT & 0xFF):
        return NOT_ROCE
    if n < l3 + BTH_AT + BTH.size:
        return SHORT_ROCE
    return l3


def flow_key(buf, l3: int, src: bool = True) -> bytes:
    """The engine's flow-table key of a RoCEv2 frame: the IPv4 source (``src``; else the
    destination) and the BTH destination QP, 7 bytes."""
    ip = l3 + (SRC_IP_AT if src else DST_IP_AT)
    q = l3 + _DQPN_AT
    return bytes(buf[ip:ip + 4]) + bytes(buf[q:q + 3])


def ecn(buf, l3: int) -> int:
    """The IPv4 ECN field (``ECN_CE`` = congestion experienced)."""
    return buf[l3 + _TOS_AT] & 3


class Checked:
    """A RoCEv2 frame that passed every structural and integrity check of :func:`check`."""

    __slots__ = ("opcode", "info", "psn", "x", "end")

    def __init__(self, opcode, info, psn, x, end):
        self.opcode, self.info, self.psn = opcode, info, psn
        self.x = x  # payload (or AETH/CNP body) offset
        self.end = end  # payload end (pad excluded)


def check(buf, l3: int) -> Checked | str:
    """Check a frame :func:`roce_l3` classified (IPv4 header at ``l3``) as
    :func:`netreduce.wire.parse` does, in the same order: a :class:`Checked`, or the
    ``WireError.reason`` ``parse`` would raise (``ip_length``, ``udp_length``, ``ip_checksum``,
    ``tver``, ``opcode``, ``truncated``, ``padcnt``, ``icrc``)."""
    n = len(buf)
    total = (buf[l3 + _TOTAL_AT] << 8) | buf[l3 + _TOTAL_AT + 1]
    end = l3 + total
    if total < _MIN_TOTAL or end > n or (end < n and n > _MIN_FRAME):
        return "ip_length"
    u = l3 + IPV4.size
    if (buf[l3 + UDP_LEN_AT] << 8) | buf[l3 + UDP_LEN_AT + 1] != total - IPV4.size:
        return "udp_length"
    if ipv4_checksum(buf[l3:u]) != (buf[l3 + _CSUM_AT] << 8) | buf[l3 + _CSUM_AT + 1]:
        return "ip_checksum"
    b = l3 + BTH_AT
    if buf[b + _BTH_HDR] & 0x0F:
        return "tver"
    opcode = buf[b]
    info = OPCODES.get(opcode)
    if info is None:
        return "opcode"
    x = l3 + _EXT_AT + info.ext_len
    pay_end = end - _ICRC
    if x > pay_end:
        return "truncated"
    padded = pay_end - x
    pad = (buf[b + _BTH_HDR] >> 4) & 3
    if not info.has_payload:
        if padded or pad:
            return "ip_length"
        if info.aeth:
            x -= AETH.size  # point at the AETH
    elif pad > padded:
        return "padcnt"
    if icrc_bytes(memoryview(buf)[l3:pay_end]) != buf[pay_end:end]:
        return "icrc"
    return Checked(opcode, info, int.from_bytes(buf[l3 + _BPSN_AT:l3 + _BPSN_AT + 3], "big"), x,
                   pay_end - pad)


def udp_dport_to(frame, dst_ip: bytes) -> int | None:
    """For an IPv4/UDP frame (untagged or behind one 802.1Q tag) to ``dst_ip`` (4 bytes): its UDP
    destination port, or -1 where it cannot be read (IHL not 5, a fragment, cut before the
    port); None for any other frame (the management path's match, docs/management.md)."""
    n = len(frame)
    if n < IPV4_OFF + IPV4.size:
        return None
    l3 = IPV4_OFF
    if frame[ETHERTYPE_OFF] == _VLAN_HI and frame[ETHERTYPE_OFF + 1] == _VLAN_LO:
        l3 = IPV4_OFF + _VLAN_TAG
        if n < l3 + IPV4.size:
            return None
    if (frame[l3 - 2] != ETHERTYPE_IPV4 >> 8 or frame[l3 - 1] != ETHERTYPE_IPV4 & 0xFF
            or frame[l3 + PROTO_AT] != IP_PROTO_UDP or frame[l3 + DST_IP_AT:l3 + DST_IP_AT + 4]
            != dst_ip):
        return None
    if (frame[l3] != _IPV4_VIHL
            or ((frame[l3 + _FRAG_AT] << 8) | frame[l3 + _FRAG_AT + 1]) & IPV4.frag_offset.mask
            or n < l3 + DPORT_AT + 2):
        return -1
    return (frame[l3 + DPORT_AT] << 8) | frame[l3 + DPORT_AT + 1]


def udp_payload(frame, l3: int) -> bytes:
    """The UDP payload of an IPv4 frame (IPv4 header at ``l3``, IHL 5), to the IPv4 total
    length."""
    total = (frame[l3 + _TOTAL_AT] << 8) | frame[l3 + _TOTAL_AT + 1]
    return bytes(frame[l3 + BTH_AT:l3 + total])


def is_ipv4(frame, l3: int = IPV4_OFF) -> bool:
    """Whether ``frame`` has EtherType IPv4 before ``l3`` and room for the IPv4 header's
    addresses (IHL and the rest unchecked)."""
    return (len(frame) >= l3 + IPV4.size and frame[l3 - 2] == ETHERTYPE_IPV4 >> 8
            and frame[l3 - 1] == ETHERTYPE_IPV4 & 0xFF)


def is_udp(frame, l3: int = IPV4_OFF) -> bool:
    """Whether ``frame`` is IPv4/UDP with room for the UDP ports (any port)."""
    return (len(frame) >= l3 + DPORT_AT + 2 and frame[l3 - 2] == ETHERTYPE_IPV4 >> 8
            and frame[l3 - 1] == ETHERTYPE_IPV4 & 0xFF and frame[l3 + PROTO_AT] == IP_PROTO_UDP)


def udp_dport(frame, l3: int = IPV4_OFF) -> int:
    """UDP destination port of an IPv4/UDP frame (see :func:`is_udp`)."""
    return (frame[l3 + DPORT_AT] << 8) | frame[l3 + DPORT_AT + 1]


def src_ip(frame, l3: int = IPV4_OFF) -> bytes:
    """IPv4 source address (4 bytes)."""
    return bytes(frame[l3 + SRC_IP_AT:l3 + SRC_IP_AT + 4])


def dst_ip(frame, l3: int = IPV4_OFF) -> bytes:
    """IPv4 destination address (4 bytes)."""
    return bytes(frame[l3 + DST_IP_AT:l3 + DST_IP_AT + 4])


def syndrome(frame, l3: int = IPV4_OFF) -> int:
    """AETH syndrome of an ACK (the AETH follows the BTH)."""
    return frame[l3 + _EXT_AT + AETH.syndrome.offset]


_EXT_LEN = {int(code): o.ext_len for code, o in OPCODES.items()
            if o.ext_len and o.transport in ("RC", "CNP")}


def payload_len(frame, l3: int = IPV4_OFF) -> int:
    """Payload bytes of a RoCEv2 frame from its UDP length (extension headers, pad and ICRC
    taken off; no check)."""
    b = l3 + BTH_AT
    udp_len = (frame[l3 + UDP_LEN_AT] << 8) | frame[l3 + UDP_LEN_AT + 1]
    return (udp_len - UDP.size - BTH.size - _EXT_LEN.get(frame[b], 0)
            - ((frame[b + _BTH_HDR] >> 4) & 3) - _ICRC)


_DMAC, _SMAC = ETH.dst.offset, ETH.src.offset


def dst_mac(frame) -> bytes:
    """Ethernet destination MAC (6 bytes)."""
    return bytes(frame[_DMAC:_DMAC + 6])


def src_mac(frame) -> bytes:
    """Ethernet source MAC (6 bytes)."""
    return bytes(frame[_SMAC:_SMAC + 6])
