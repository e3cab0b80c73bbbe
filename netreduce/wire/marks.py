"""Spine-leaf stage marks (decision D17, docs/spine-leaf.md) in BTH byte 4's reserved bits.

BTH byte 4 holds FECN, BECN and 6 reserved bits (``BTH.resv6``), which the ICRC covers as all
ones: a mark changes neither the ICRC nor a checksum. A leaf engine's partial carries
MARK_PARTIAL, the spine engine's total MARK_TOTAL; workers send neither, and a leaf clears them
before a frame reaches a worker."""

from __future__ import annotations

__all__ = ["MARK_PARTIAL", "MARK_TOTAL", "MARKS", "BTH_MARK_BYTE"]

MARK_PARTIAL, MARK_TOTAL = 0x01, 0x02
MARKS = MARK_PARTIAL | MARK_TOTAL
BTH_MARK_BYTE = 4  # offset in the BTH; the marks are bits 1..0 (the low bits of resv6)
