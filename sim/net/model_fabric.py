"""The model fabric: the reference engine (:mod:`netreduce.sim.model`) in the middle of the network.

Every frame an endpoint sends crosses its up link into ``Engine.receive(port, frame, cycles)``;
every frame the engine emits crosses the down link of the endpoint that owns its destination MAC,
leaving the engine at the emit's time. The fabric programs nothing itself: the driver registers
jobs through :class:`netreduce.sw_driver.control.EngineControl` over :attr:`ModelFabric.bus`.

Time: the network counts integer nanoseconds, the engine cycles of its 250 MHz core clock
(CLOCK_HZ); ``cycles = ns * CLOCK_HZ // 10**9`` and back, rounding up, so an emit never leaves
before the frame that caused it arrived.
"""

from __future__ import annotations

from collections.abc import Callable

from netreduce.sim.net.scheduler import Scheduler, frame_dmac

from netreduce.regmap.clock import cycles_to_ns, ns_to_cycles

from .network import NetConfig, NetworkFabric

__all__ = ["ModelFabric", "ns_to_cycles", "cycles_to_ns"]

class ModelFabric(NetworkFabric):
    """A :class:`NetworkFabric` whose middle is ``engine`` (default: a new ``Engine()``).

    ``port_of(mac)`` chooses the engine port an endpoint's up link enters (default: port 0 for
    all). Emitted frames are routed by destination MAC; unknown destinations are counted in
    ``stats["unroutable"]``. ``stats["engine_in"]``/``["engine_out"]`` count frames into and out
    of the engine.
    """

    def __init__(self, engine=None, net: NetConfig | None = None, seed: int = 0,
                 sched: Scheduler | None = None, port_of: Callable[[bytes], int] | None = None):
        super().__init__(net, seed, sched)
        if engine is None:
            from ..backend import open_engine

            engine = open_engine("model", {})
        self.engine = engine
        self.port_of = port_of or (lambda mac: 0)

    @property
    def bus(self):
        return self.engine.bus

    def _at_middle(self, src_mac: bytes, frame: bytes) -> None:
        self.stats["engine_in"] += 1
        now = self.sched.now()
        emits = self.engine.receive(self.port_of(src_mac), frame, ns_to_cycles(now))
        for e in emits:
            self.stats["engine_out"] += 1
            t = max(now, cycles_to_ns(e.time, ceil=True))
            if t == now:
                self._forward(bytes(e.frame))
            else:
                self.sched.call_at(t, self._forward, bytes(e.frame))

    def _forward(self, frame: bytes) -> None:
        if frame_dmac(frame) not in self.down:
            self.stats["unroutable"] += 1
            return
        self.down[frame_dmac(frame)].send(frame)
