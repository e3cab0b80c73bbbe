"""D19: congestion signalling when the engine's own input buffer fills (issue 22).

The model is untimed, so congestion is an input it is told: ``Engine.congested[p]`` is true
while port p's input buffer (the shell's RX FIFO in front of the datapath) is above its ECN
threshold (``PORT.FC_ECN`` with ``PORT.FC_CTRL.ecn_enable``). Whoever keeps time sets it before
:meth:`Engine.receive`: the system simulation from its buffer occupancy
(:mod:`netreduce.sim.net.overload`), the board shell from the RX FIFO level
(:class:`netreduce.hw.boards.cemark.CeMarker`).

Rule: while port p is congested, a frame received on p is ECN-marked as a switch's egress queue
would mark it, before anything else looks at it (:func:`mark_ce`), and then processed as any
frame. So a forwarded ECT frame leaves CE-marked and its receiver answers its sender with a CNP;
an ECT contribution of a registered flow is answered by the engine with a CNP (D8, with D8's
rate limit ``JOB.CNP_INTERVAL``); results are unaffected (D5 turns CE into ECT(0)). A sender
that does not mark its frames ECT is not ECN-capable and gets no CNP. Congestion never drops a
frame; frames a full buffer drops never reach the engine and are counted by the shell
(``PORT.RX_DROP_FULL``). ``Engine.congested.marked`` counts the frames marked.

:func:`mark_ce` (the gateware's :class:`~netreduce.hw.boards.cemark.CeMarker` applies the same
rule, scoreboarded against this function): an Ethernet frame, untagged or with one 802.1Q tag,
of EtherType IPv4 whose first IPv4 byte is 0x45 and whose ECN field is ECT(0) or ECT(1) gets
ECN = CE. Its header checksum, if the frame is long enough to hold it, is updated incrementally
(RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m') over the 16-bit word holding TOS), so a frame that
arrived with a bad checksum still has one: marking never repairs or breaks a checksum. The
ICRC masks TOS, so it stays valid.
"""

from __future__ import annotations

from netreduce.wire import ECN_CE, ETHERTYPE_IPV4, ETHERTYPE_VLAN

__all__ = ["Congestion", "mark_ce", "csum_update"]

_TOS, _CSUM = 1, 10  # IPv4 header offsets


def _add1c(a: int, b: int) -> int:
    s = a + b
    return (s & 0xFFFF) + (s >> 16)


def csum_update(hc: int, old: int, new: int) -> int:
    """RFC 1624 eqn. 3: the checksum after one 16-bit word changes from ``old`` to ``new``."""
    s = _add1c(_add1c(~hc & 0xFFFF, ~old & 0xFFFF), new)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def mark_ce(frame: bytes) -> bytes | None:
    """``frame`` CE-marked by D19's rule (module doc), or None if the rule does not apply."""
    n = len(frame)
    if n < 14:
        return None
    l3, et = 14, (frame[12] << 8) | frame[13]
    if et == ETHERTYPE_VLAN:
        if n < 18:
            return None
        l3, et = 18, (frame[16] << 8) | frame[17]
    if et != ETHERTYPE_IPV4 or n < l3 + 2 or frame[l3] != 0x45:
        return None
    tos = frame[l3 + _TOS]
    if tos & 3 == 0 or tos & 3 == ECN_CE:
        return None
    b = bytearray(frame)
    b[l3 + _TOS] = tos | ECN_CE
    c = l3 + _CSUM
    if n >= c + 2:
        hc = (b[c] << 8) | b[c + 1]
        new = csum_update(hc, (0x45 << 8) | tos, (0x45 << 8) | tos | ECN_CE)
        b[c:c + 2] = new.to_bytes(2, "big")
    return bytes(b)


class Congestion:
    """Per-port congested flags (the model's input) and the count of marked frames."""

    def __init__(self, ports: int):
        self.flags = [False] * ports
        self.marked = 0  # frames CE-marked on arrival (model-side count)

    def __getitem__(self, port: int) -> bool:
        return self.flags[port]

    def __setitem__(self, port: int, value: bool) -> None:
        self.flags[port] = bool(value)

    def mark(self, port: int, frame: bytes) -> bytes:
        """The frame as the engine sees it on ``port`` (marked while the port is congested)."""
        if self.flags[port]:
            m = mark_ce(frame)
            if m is not None:
                self.marked += 1
                return m
        return frame
