"""D17's stage marks (spine-leaf, docs/spine-leaf.md) in BTH byte 4: FECN, BECN and 6 reserved
bits, which the ICRC covers as 0xFF, so a mark changes neither the ICRC nor a checksum. A leaf's
partial carries MARK_PARTIAL, the spine's total MARK_TOTAL; workers send neither, and a leaf
clears them before a frame reaches a worker."""

from __future__ import annotations

from netreduce.wire.marks import BTH_MARK_BYTE, MARK_PARTIAL, MARK_TOTAL, MARKS
from netreduce.wire.view import BTH_AT

__all__ = ["MARK_PARTIAL", "MARK_TOTAL", "MARKS", "MARK_AT", "remark"]

MARK_AT = BTH_AT + BTH_MARK_BYTE  # BTH byte 4, from the start of the IPv4 header


def remark(buf: bytes, l2: int, mark: int) -> bytes:
    """``buf`` with its stage mark set to ``mark`` (0: none)."""
    b = l2 + MARK_AT
    if buf[b] & MARKS == mark:
        return buf
    h = bytearray(buf)
    h[b] = (h[b] & ~MARKS & 0xFF) | mark
    return bytes(h)
