"""The engine's core clock: cycles and nanoseconds, converted in one place.

Every engine time (the model's ``time`` argument, the RTL's cycle counter, CNP intervals, capture
timestamps) counts cycles of :data:`~.netreduce_map.CLOCK_HZ`.
"""

from __future__ import annotations

from .netreduce_map import CLOCK_HZ

__all__ = ["CLOCK_HZ", "ns_to_cycles", "cycles_to_ns"]


def ns_to_cycles(ns: int) -> int:
    """Nanoseconds to core clock cycles: the cycle that time falls in (floor)."""
    return ns * CLOCK_HZ // 1_000_000_000


def cycles_to_ns(cycles: int, *, ceil: bool = False) -> int:
    """Core clock cycles to nanoseconds: floored (timestamps: a pcap of cycles stays
    monotonic and :func:`ns_to_cycles` of it gives the cycle back), or with ``ceil`` rounded up
    (the network model must not see an engine output before the cycle it happened in)."""
    if ceil:
        return -(-cycles * 1_000_000_000 // CLOCK_HZ)
    return cycles * 1_000_000_000 // CLOCK_HZ
