"""An engine port's link going down and up again (a flap, or a MAC reset) in the model fabric.

:class:`PortFlap` wraps a :class:`netreduce.sim.net.model_fabric.ModelFabric`'s engine: while port
``port`` is down (``start_ns <= now < end_ns``), frames that would enter the engine on it are lost
(the switch's transmitter sends into a dead link) and frames the engine emits on it are lost
(the shell's :class:`netreduce.hw.boards.linkgate.LinkGate` discards them instead of stalling
the core). The engine itself keeps every job, flow and slot, as the board's core does since its
reset is the board reset and not a MAC's (issue 22, docs/fabric.md "Reset domains"): the RC
endpoints recover what the flap lost by retransmission. ``stats``: ``rx_lost`` / ``tx_lost``.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["PortFlap"]


class PortFlap:
    def __init__(self, fab, port: int, start_ns: int, end_ns: int):
        if not 0 <= start_ns < end_ns:
            raise ValueError(f"flap window {start_ns}..{end_ns} ns is empty or negative")
        eng = fab.engine
        if not 0 <= port < eng.ports:
            raise ValueError(f"port {port} outside 0..{eng.ports - 1}")
        self.port, self.start_ns, self.end_ns = port, start_ns, end_ns
        self.stats: Counter = Counter()
        sched, inner = fab.sched, eng.receive

        def receive(p, frame, time, inner=inner):
            down = self.start_ns <= sched.now() < self.end_ns
            if down and p == self.port:
                self.stats["rx_lost"] += 1
                return []
            out = inner(p, frame, time)
            if down:
                kept = [e for e in out if e.port != self.port]
                self.stats["tx_lost"] += len(out) - len(kept)
                out = kept
            return out

        eng.receive = receive
