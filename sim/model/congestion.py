"""D19: congestion signalling when the engine's own input buffer fills (issue 22).

The model is untimed, so congestion is an input it is told: ``Engine.congested[p]`` is true
while port p's input buffer (the shell's RX FIFO in front of the datapath) is above its ECN
threshold. Whoever keeps time sets it before :meth:`Engine.receive`: the system simulation from
its buffer occupancy (:mod:`netreduce.sim.net.overload`), the gateware from the FIFO level
against ``PORT.PFC_ECN`` (docs/fabric.md). While port p is congested, a frame received on p

* that is forwarded unchanged (bypass traffic, ACK/NAK/CNP of registered flows) and is IPv4 with
  ECN ECT(0) or ECT(1) leaves with ECN = CE, its IPv4 header checksum recomputed (the ICRC masks
  TOS, so it stays valid): its receiver answers with a CNP to its sender, as it would for a
  switch's mark (``ce_marked`` counts them);
* that is a data frame of a registered flow which D8 would answer if it were CE-marked
  (contribution, duplicate, re-emit, ahead or mismatch drop) is answered with a CNP to its
  sender by D8's rule and rate limit (``JOB.CNP_INTERVAL``; ``cnp_sent`` / ``cnp_suppressed``),
  whatever its own ECN field (``cnp_congested`` counts the CNPs sent for congestion alone).

Nothing else changes: no frame is dropped because of congestion. The frames a full buffer drops
never reach the engine; the shell counts them (``PORT.RX_DROP_FULL``).
"""

from __future__ import annotations

from netreduce.wire import ECN_CE, ETHERTYPE_IPV4
from netreduce.wire.icrc import ipv4_checksum
from netreduce.wire.view import l3_offset

__all__ = ["Congestion", "mark_ce"]

_TOS, _CSUM = 1, 10  # IPv4 header offsets


def mark_ce(frame: bytes) -> bytes | None:
    """``frame`` with ECN = CE and its IPv4 checksum fixed, if it is an IPv4 (IHL 5) frame with
    ECT(0) or ECT(1) (802.1Q tag allowed); else None."""
    if len(frame) < 18:
        return None
    l3 = l3_offset(frame)
    if (len(frame) < l3 + 20 or int.from_bytes(frame[l3 - 2:l3], "big") != ETHERTYPE_IPV4
            or frame[l3] != 0x45):
        return None
    ecn = frame[l3 + _TOS] & 3
    if ecn == 0 or ecn == ECN_CE:
        return None
    b = bytearray(frame)
    b[l3 + _TOS] |= ECN_CE
    b[l3 + _CSUM:l3 + _CSUM + 2] = ipv4_checksum(b[l3:l3 + 20]).to_bytes(2, "big")
    return bytes(b)


class Congestion:
    """Per-port congested flags (the model's input) and D19's counts (model-side only)."""

    def __init__(self, ports: int):
        self.flags = [False] * ports
        self.ce_marked = 0  # forwarded ECT frames marked CE
        self.cnp_congested = 0  # CNPs sent for congestion alone (the frame was not CE)

    def __getitem__(self, port: int) -> bool:
        return self.flags[port]

    def __setitem__(self, port: int, value: bool) -> None:
        self.flags[port] = bool(value)

    def mark_forwarded(self, frame: bytes, out: list) -> list:
        """Apply the CE rule to ``out`` (the emits of ``frame``): the emit carrying ``frame``
        itself, forwarded unchanged, is marked."""
        for i, e in enumerate(out):
            if e.frame is frame:
                m = mark_ce(frame)
                if m is not None:
                    out[i] = type(e)(e.port, m, e.time)
                    self.ce_marked += 1
        return out
