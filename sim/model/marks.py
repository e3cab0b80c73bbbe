"""D17's stage marks (spine-leaf, docs/spine-leaf.md) in BTH byte 4: FECN, BECN and 6 reserved
bits, which the ICRC covers as 0xFF, so a mark changes neither the ICRC nor a checksum. A leaf's
partial carries MARK_PARTIAL, the spine's total MARK_TOTAL; workers send neither, and a leaf
clears them before a frame reaches a worker."""

from __future__ import annotations

from netreduce.wire.marks import MARK_PARTIAL, MARK_TOTAL, MARKS

__all__ = ["MARK_PARTIAL", "MARK_TOTAL", "MARKS", "remark"]

_BTH_BYTE4 = 28 + 4  # from the start of the IPv4 header


def remark(buf: bytes, l2: int, mark: int) -> bytes:
    """``buf`` with its stage mark set to ``mark`` (0: none)."""
    b = l2 + _BTH_BYTE4
    if buf[b] & MARKS == mark:
        return buf
    h = bytearray(buf)
    h[b] = (h[b] & ~MARKS & 0xFF) | mark
    return bytes(h)
