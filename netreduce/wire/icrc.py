"""ICRC (RoCEv2 invariant CRC) and the IPv4 header checksum.

ICRC (IBA Annex A17.4.1): CRC-32 as the Ethernet FCS over 8 bytes of 0xFF, then the IPv4 header
with TOS, TTL and header checksum set to all ones, the UDP header with its checksum set to 0xFFFF,
the BTH with byte 4 (FECN/BECN/resv6) set to 0xFF, then extension headers, payload and pad. It is
sent least-significant byte first. The masks apply to the copy fed to the CRC, never to the wire.
"""

from __future__ import annotations

import struct
import zlib

from .fields import BTH, IPV4, UDP

__all__ = ["ICRC_BYTES", "ICRC_MASKED_BYTES", "ICRC_PREFIX", "icrc", "icrc_bytes", "ipv4_checksum",
           "masked_l3_prefix", "crc32_ethernet"]

ICRC_PREFIX = b"\xff" * 8
ICRC_BYTES = 4  # the ICRC trailer after the payload (and pad)

# Byte offsets, relative to the start of the IPv4 header, that the ICRC covers as 0xFF.
ICRC_MASKED_BYTES: tuple[int, ...] = tuple(sorted(
    [IPV4.tos.offset, IPV4.ttl.offset]
    + list(range(IPV4.checksum.offset, IPV4.checksum.offset + IPV4.checksum.size))
    + [IPV4.size + UDP.checksum.offset + i for i in range(UDP.checksum.size)]
    + [IPV4.size + UDP.size + BTH.fecn.offset]
))

_MASKED_LEN = IPV4.size + UDP.size + BTH.size  # the masks all fall inside these 40 bytes


def crc32_ethernet(data, crc: int = 0) -> int:
    """CRC-32 exactly as the Ethernet FCS (zlib.crc32), continuing from ``crc``."""
    return zlib.crc32(data, crc)


def masked_l3_prefix(l3) -> bytes:
    """The first 40 bytes of ``l3`` (IPv4+UDP+BTH) with the ICRC masks applied."""
    b = bytearray(l3[:_MASKED_LEN])
    for i in ICRC_MASKED_BYTES:
        b[i] = 0xFF
    return bytes(b)


_PREFIX_CRC = zlib.crc32(ICRC_PREFIX)


def icrc(l3, end: int | None = None) -> int:
    """ICRC value of ``l3`` = IPv4 header .. end of pad (ICRC itself excluded).

    ``end`` limits the covered bytes (default: all of ``l3``). Returns the CRC as an integer; the
    wire carries it little-endian (see :func:`icrc_bytes`).
    """
    mv = memoryview(l3)
    if end is None:
        end = len(mv)
    crc = zlib.crc32(masked_l3_prefix(mv[:_MASKED_LEN]), _PREFIX_CRC)
    return zlib.crc32(mv[_MASKED_LEN:end], crc)


def icrc_bytes(l3, end: int | None = None) -> bytes:
    """The 4 ICRC bytes as they appear on the wire (least-significant byte first)."""
    return icrc(l3, end).to_bytes(4, "little")


def ipv4_checksum(hdr) -> int:
    """RFC 1071 checksum of a 20-byte IPv4 header, computed with the checksum field as zero."""
    words = struct.unpack(">10H", bytes(hdr[:IPV4.size]))
    s = sum(words) - words[IPV4.checksum.offset // 2]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF
