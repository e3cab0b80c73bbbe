"""Per-port counters of the reference model (register table ``PORT``; issue 22).

The engine-side counters of :data:`netreduce.regmap.PORT_COUNTERS` (``rx_frames``, ``rx_bytes``,
``tx_frames``, ``tx_bytes``, ``pause_rx``, ``tx_drop_held``) are counted here at the engine's port
boundary, as the gateware's :class:`netreduce.hw.ports.PortStats` does: every frame
:meth:`Engine.receive` takes on port p, every frame it emits on port p (bytes without FCS), every
PAUSE/PFC request acted on, every frame dropped because port p was held (D21,
:attr:`Engine.tx_held`).
The shell-side counters and ``PORT.STATUS`` belong to the board shell around the MAC; the model
has none, so they read 0 here as on an engine without a shell.
"""

from __future__ import annotations

from netreduce.regmap import PORT_COUNTERS

__all__ = ["PortCounters"]

ENGINE_COUNTERS = tuple(n for n, src, _ in PORT_COUNTERS if src == "engine")


class PortCounters:
    def __init__(self, ports: int, regs, regmap, link):
        self.rx_frames = [0] * ports
        self.rx_bytes = [0] * ports
        self.tx_frames = [0] * ports
        self.tx_bytes = [0] * ports
        self.pause_rx = link.requests  # the PauseTimers' per-port request count
        self.tx_drop_held = [0] * ports
        for k in range(ports):
            for name in ENGINE_COUNTERS:
                regs.bind(regmap.addr(f"PORT.{name.upper()}", k),
                          lambda k=k, a=getattr(self, name): a[k])

    def count(self, port: int, frame: bytes, out, held=()) -> None:
        """One frame in on ``port``, the emits ``out`` it caused and those ``held`` dropped."""
        self.rx_frames[port] += 1
        self.rx_bytes[port] += len(frame)
        for e in held:
            self.tx_drop_held[e.port] += 1
        for e in out:
            self.tx_frames[e.port] += 1
            self.tx_bytes[e.port] += len(e.frame)

    def clear(self) -> None:
        for a in (self.rx_frames, self.rx_bytes, self.tx_frames, self.tx_bytes, self.pause_rx,
                  self.tx_drop_held):
            a[:] = [0] * len(a)

    def as_dict(self, port: int) -> dict[str, int]:
        return {n: getattr(self, n)[port] for n in ENGINE_COUNTERS}
