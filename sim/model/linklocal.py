"""Link-local frames in the reference model: consumed, counted, and PAUSE/PFC honoured.

The rule is :func:`netreduce.wire.linklocal.classify` (module doc there). :meth:`Engine.receive`
applies it after the management match and before RoCE classification (D18 in
:mod:`netreduce.sim.model.engine`): a link-local frame is consumed, counted under its reason
(``ll_pause``, ``ll_pfc``, ``ll_mac_control``, ``ll_group``) and never forwarded; a PAUSE or PFC
frame also sets the receiving port's pause timers (:class:`PauseTimers`).

Pause semantics (IEEE 802.3 annex 31B / 802.1Q clause 36): a request for q quanta on priority p
holds the port's transmission of p's traffic for q x 512 bit times from the frame's arrival,
replacing whatever was left of the previous request (q = 0 resumes at once). PAUSE applies to
every priority. Frames already being sent finish. The model is untimed, so the timers are state
for whoever schedules transmission: the system simulation (:mod:`netreduce.sim.net.network`) holds a
port's engine-to-switch frames of a paused priority until :meth:`PauseTimers.held_until`.
"""

from __future__ import annotations

from netreduce.regmap import CLOCK_HZ
from netreduce.wire.linklocal import (
    COUNTERS,
    PAUSE_QUANTUM_BITS,
    PFC_PRIORITIES,
    LinkLocal,
    Pause,
    classify,
)

__all__ = ["LINK_BPS", "PauseTimers", "quanta_to_cycles", "classify", "LinkLocal", "COUNTERS"]

LINK_BPS = 100_000_000_000  # the ports' line rate (100GBASE-R4)


def quanta_to_cycles(q: int, link_bps: int = LINK_BPS, clock_hz: int = CLOCK_HZ) -> int:
    """Pause time of ``q`` quanta in datapath cycles, rounded up (1 quantum = 1.65 cycles)."""
    return -(-q * PAUSE_QUANTUM_BITS * clock_hz // link_bps)


class PauseTimers:
    """Per port and priority: the datapath cycle until which received PAUSE/PFC holds TX."""

    def __init__(self, ports: int, link_bps: int = LINK_BPS):
        self.link_bps = link_bps
        self._until = [[0] * PFC_PRIORITIES for _ in range(ports)]
        self.requests = [0] * ports  # PAUSE/PFC frames acted on, per port

    def update(self, port: int, pause: Pause, time: int) -> None:
        """Apply a received request at ``time`` (cycles)."""
        u = self._until[port]
        for p in range(PFC_PRIORITIES):
            if pause.enable >> p & 1:
                u[p] = time + quanta_to_cycles(pause.quanta[p], self.link_bps)
        self.requests[port] += 1

    def held_until(self, port: int, priority: int) -> int:
        """First cycle at which ``port`` may send ``priority`` again (past: not held)."""
        return self._until[port][priority]

    def paused(self, port: int, priority: int, time: int) -> bool:
        return time < self._until[port][priority]
