"""Frames the reference model builds from the frames it received: results (D5), duplicate
probes (D15), and the :class:`Emit` record (shared by :mod:`.engine` and :mod:`.roles`)."""

from __future__ import annotations

from dataclasses import dataclass

from netreduce.wire import ECN_CE, ECN_ECT0
from netreduce.wire.icrc import icrc_bytes, ipv4_checksum

__all__ = ["Emit", "MARK_PARTIAL", "MARK_TOTAL", "MARKS"]

_OP_WRITE_MIDDLE = 0x07
# D17's stage marks in BTH byte 4 (FECN, BECN, 6 reserved bits; the ICRC covers it as 0xFF):
# a leaf's partial carries MARK_PARTIAL, the spine's total MARK_TOTAL; workers send neither and
# a leaf clears them before a frame reaches a worker.
MARK_PARTIAL, MARK_TOTAL = 0x01, 0x02
MARKS = MARK_PARTIAL | MARK_TOTAL


def _remark(buf: bytes, l2: int, mark: int) -> bytes:
    """``buf`` with D17's stage mark set to ``mark`` (0: none); ICRC and checksums unchanged."""
    b = l2 + 28 + 4
    if buf[b] & MARKS == mark:
        return buf
    h = bytearray(buf)
    h[b] = (h[b] & ~MARKS & 0xFF) | mark
    return bytes(h)


@dataclass(frozen=True)
class Emit:
    """A frame the engine sends out of ``port`` at ``time`` (cycles)."""

    port: int
    frame: bytes
    time: int


def _probe(buf: bytes, l2: int, psn: int | None = None) -> bytes:
    """The duplicate probe for the behind-window data frame ``buf`` (D15): BTH-only WRITE MIDDLE,
    PadCnt 0, lengths, IPv4 checksum and ICRC recomputed, every other header field kept (the
    PSN too, unless ``psn`` is given: D16's ACK request)."""
    b = l2 + 28
    h = bytearray(buf[:b + 12])
    if psn is not None:
        h[b + 9:b + 12] = psn.to_bytes(3, "big")
    h[l2 + 2:l2 + 4] = (20 + 8 + 12 + 4).to_bytes(2, "big")
    h[l2 + 10:l2 + 12] = ipv4_checksum(h[l2:l2 + 20]).to_bytes(2, "big")
    h[l2 + 24:l2 + 26] = (8 + 12 + 4).to_bytes(2, "big")
    h[b] = _OP_WRITE_MIDDLE
    h[b + 1] &= 0xCF  # PadCnt 0 (SE, M and TVer kept)
    h += icrc_bytes(memoryview(h)[l2:])
    if len(h) < 60:
        h += bytes(60 - len(h))
    return bytes(h)


def _result(hdr: bytes, l2: int, payload: bytes) -> bytes:
    """Flow f's header with ``payload``: CE -> ECT(0) (+ IPv4 checksum), ICRC, 60-byte minimum."""
    h = bytearray(hdr)
    tos = h[l2 + 1]
    if tos & 3 == ECN_CE:
        h[l2 + 1] = (tos & 0xFC) | ECN_ECT0
        h[l2 + 10:l2 + 12] = ipv4_checksum(h[l2:l2 + 20]).to_bytes(2, "big")
    h += payload
    h += icrc_bytes(memoryview(h)[l2:])
    if len(h) < 60:
        h += bytes(60 - len(h))
    return bytes(h)
