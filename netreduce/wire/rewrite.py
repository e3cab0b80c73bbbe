"""The frames the engine makes out of the frames it receives, byte for byte (docs/design.md
section 10: D5 result, D8 CNP, D15 duplicate probe, D16 NAK-sequence).

Each takes a frame (or its header) and ``l3``, the offset of its IPv4 header (14, or 18 behind an
802.1Q tag, which is kept), as :func:`netreduce.wire.view.roce_l3` gives it, and returns a new
frame: lengths, IPv4 checksum and ICRC recomputed where they change, padded to the 60-byte
Ethernet minimum. The reference model (:mod:`netreduce.sim.model`) is their user; the gateware
builds the same bytes.
"""

from __future__ import annotations

from .fields import AETH, BTH, CNP_PAD, ECN_CE, ECN_ECT0, ECN_NOT_ECT, ETH, IPV4, UDP
from .icrc import icrc_bytes, ipv4_checksum
from .opcodes import NAK_PSN_SEQ, Opcode
from .view import BTH_AT, ROCEV2_PORT_BYTES, l3_offset

__all__ = ["cnp_for", "duplicate_probe", "nak_seq", "result_frame", "mark_ce", "MIN_FRAME"]

MIN_FRAME = 60  # Ethernet minimum without FCS
_ICRC = 4
_UDP_AT = IPV4.size
_SRC_AT, _DST_AT = IPV4.src.offset, IPV4.dst.offset
_TOS_AT, _TOTAL_AT, _CSUM_AT = IPV4.tos.offset, IPV4.total_length.offset, IPV4.checksum.offset
_ID_AT, _FRAG_AT, _TTL_AT = IPV4.identification.offset, IPV4.flags_frag.offset, IPV4.ttl.offset
_DF = (1 << 14).to_bytes(2, "big")  # flags: don't fragment, offset 0
_ULEN_AT = _UDP_AT + UDP.length.offset
_PSN = BTH.psn.offset
_HDR = BTH.tver.offset  # SE, M, PadCnt, TVer
_PKEY = BTH.pkey.offset
_CNP_TTL = 64
_CNP_FECN_BECN = 0x40  # BECN set (IBA A17.9.3)
_CNP_IP_LEN = IPV4.size + UDP.size + BTH.size + CNP_PAD.size + _ICRC
_PROBE_IP_LEN = IPV4.size + UDP.size + BTH.size + _ICRC


def _pad(h) -> bytes:
    if len(h) < MIN_FRAME:
        h += bytes(MIN_FRAME - len(h))
    return bytes(h)


def cnp_for(buf, l3: int, dqpn: int) -> bytes:
    """The CNP flow f's receiving NIC would send for the CE-marked data frame ``buf`` (D8): MACs
    and IPv4 addresses swapped, VLAN tag and DSCP kept, not-ECT, BTH to QP ``dqpn`` with the
    frame's P_Key and BECN, 16 reserved bytes."""
    h = bytearray(buf[ETH.src.offset:ETH.src.offset + 6] + buf[0:ETH.src.offset]
                  + buf[ETH.ethertype.offset:l3])
    ip = bytearray(buf[l3:l3 + IPV4.size])
    ip[_TOS_AT] &= 0xFC  # DSCP kept, not-ECT
    ip[_TOTAL_AT:_TOTAL_AT + 2] = _CNP_IP_LEN.to_bytes(2, "big")
    ip[_ID_AT:_ID_AT + 2] = b"\x00\x00"
    ip[_FRAG_AT:_FRAG_AT + 2] = _DF
    ip[_TTL_AT] = _CNP_TTL
    ip[_SRC_AT:_SRC_AT + 4], ip[_DST_AT:_DST_AT + 4] = (buf[l3 + _DST_AT:l3 + _DST_AT + 4],
                                                        buf[l3 + _SRC_AT:l3 + _SRC_AT + 4])
    ip[_CSUM_AT:_CSUM_AT + 2] = b"\x00\x00"
    ip[_CSUM_AT:_CSUM_AT + 2] = ipv4_checksum(ip).to_bytes(2, "big")
    u = l3 + _UDP_AT
    udp = (buf[u:u + UDP.dport.offset] + ROCEV2_PORT_BYTES
           + (_CNP_IP_LEN - IPV4.size).to_bytes(2, "big") + b"\x00\x00")
    b = l3 + BTH_AT
    bth = (bytes([int(Opcode.CNP), 0]) + buf[b + _PKEY:b + _PKEY + 2] + bytes([_CNP_FECN_BECN])
           + dqpn.to_bytes(3, "big") + bytes(4))
    l3_bytes = bytes(ip) + udp + bth + bytes(CNP_PAD.size)
    return _pad(bytes(h) + l3_bytes + icrc_bytes(l3_bytes))


def duplicate_probe(buf, l3: int, psn: int | None = None) -> bytes:
    """The duplicate probe for the behind-window data frame ``buf`` (D15): BTH-only WRITE MIDDLE,
    PadCnt 0, lengths, IPv4 checksum and ICRC recomputed, every other header field kept (the
    PSN too, unless ``psn`` is given: D16's ACK request)."""
    b = l3 + BTH_AT
    h = bytearray(buf[:b + BTH.size])
    if psn is not None:
        h[b + _PSN:b + _PSN + 3] = psn.to_bytes(3, "big")
    h[l3 + _TOTAL_AT:l3 + _TOTAL_AT + 2] = _PROBE_IP_LEN.to_bytes(2, "big")
    h[l3 + _CSUM_AT:l3 + _CSUM_AT + 2] = ipv4_checksum(h[l3:l3 + IPV4.size]).to_bytes(2, "big")
    h[l3 + _ULEN_AT:l3 + _ULEN_AT + 2] = (_PROBE_IP_LEN - IPV4.size).to_bytes(2, "big")
    h[b] = int(Opcode.WRITE_MIDDLE)
    h[b + _HDR] &= 0xCF  # PadCnt 0 (SE, M and TVer kept)
    h += icrc_bytes(memoryview(h)[l3:])
    return _pad(h)


def nak_seq(buf, l3: int, psn: int) -> bytes:
    """The ACK ``buf`` rewritten as a NAK-sequence at ``psn`` (D16): BTH PSN and AETH syndrome
    replaced, MSN and every other byte kept, ICRC recomputed (lengths are unchanged)."""
    b = l3 + BTH_AT
    end = l3 + ((buf[l3 + _TOTAL_AT] << 8) | buf[l3 + _TOTAL_AT + 1])
    h = bytearray(buf)
    h[b + _PSN:b + _PSN + 3] = psn.to_bytes(3, "big")
    h[b + BTH.size + AETH.syndrome.offset] = NAK_PSN_SEQ
    h[end - _ICRC:end] = icrc_bytes(memoryview(h)[l3:end - _ICRC])
    return bytes(h)


def result_frame(hdr, l3: int, payload: bytes) -> bytes:
    """Flow f's header (Ethernet .. last extension header) with ``payload`` (D5): CE -> ECT(0)
    (and the IPv4 checksum), ICRC, 60-byte minimum."""
    h = bytearray(hdr)
    tos = h[l3 + _TOS_AT]
    if tos & 3 == ECN_CE:
        h[l3 + _TOS_AT] = (tos & 0xFC) | ECN_ECT0
        h[l3 + _CSUM_AT:l3 + _CSUM_AT + 2] = \
            ipv4_checksum(h[l3:l3 + IPV4.size]).to_bytes(2, "big")
    h += payload
    h += icrc_bytes(memoryview(h)[l3:])
    return _pad(h)


def mark_ce(frame) -> bytes | None:
    """The IPv4 frame with ECN = CE (a congested switch's marking) if it is ECT(0)/ECT(1), else
    None; the IPv4 checksum recomputed (the ICRC masks the TOS byte)."""
    l3 = l3_offset(frame)
    tos = frame[l3 + _TOS_AT]
    if tos & 3 == ECN_NOT_ECT or tos & 3 == ECN_CE:
        return None
    b = bytearray(frame)
    b[l3 + _TOS_AT] = tos | ECN_CE
    b[l3 + _CSUM_AT:l3 + _CSUM_AT + 2] = ipv4_checksum(b[l3:l3 + IPV4.size]).to_bytes(2, "big")
    return bytes(b)
