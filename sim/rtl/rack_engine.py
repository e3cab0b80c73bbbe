"""A spine-leaf switch's engine on the RTL (Verilator): ``netreduce sim --racks R --backend
verilator`` (:func:`netreduce.sim.net.spine_leaf.run_rack_sim`).

:class:`RtlRackEngine` gives :class:`~netreduce.sim.net.spine_leaf.RackFabric` what the reference
model gives it (``receive(port, frame, time) -> [Emit]``, ``bus``, ``slots_in_use()``), on the
engine's Verilog built with flow roles (``NetReduceEngine(roles=True)``), through
:class:`~.switch_engine.RtlSwitchEngine`. Like the model (and the switch service), the RTL is
used untimed: one frame in, run until the RTL is idle, the frames it emitted out, all at the
input's time. Every engine of a run (the leaves and the spine) is one instance of one build
(:func:`rack_build_params`: sized for the largest of them), so one Verilator build serves a run.
"""

from __future__ import annotations

from typing import NamedTuple

from netreduce.regmap import build_regmap

from .switch_engine import RtlSwitchEngine

__all__ = ["RtlRackEngine", "rack_build_params", "RACK_WINDOW", "RACK_SLOTS"]

RACK_WINDOW = 8  # the collective's window on RTL racks (each pass: one job per engine)
RACK_SLOTS = 32  # two jobs of RACK_WINDOW with room for the allocator


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def rack_build_params(workers: int, racks: int, pmtu: int) -> dict:
    """The one engine build of an R-rack run of ``workers`` ranks: a leaf has a port per rank of
    its rack and an uplink, the spine a port per rack; 64-bit data path (a correctness run).
    An engine's job has at most max(M + 1, R) flows, but the collective checks the whole ring's
    world against the engine it identifies (the spine), so max_world covers ``workers``."""
    m = workers // racks
    p = dict(ports=max(3, m + 1, racks), jobs=2, flows=max(8, _pow2(m + 1)), slots=RACK_SLOTS,
             max_world=max(4, _pow2(workers)), pmtu_max=max(1024, _pow2(pmtu)), data_width=64)
    build_regmap(**p)
    return p


class Emit(NamedTuple):
    port: int
    frame: bytes
    time: int


class RtlRackEngine:
    """One switch's engine (module doc). ``params``: :func:`rack_build_params`."""

    def __init__(self, params: dict, seed: int = 0):
        self.rtl = RtlSwitchEngine(**params, seed=seed, roles=True)
        self.bus = self.rtl.bus
        self.ports = params["ports"]
        self.regmap = self.rtl.regmap
        self._jobs = params["jobs"]

    def receive(self, port: int, frame: bytes, time: int = 0) -> list[Emit]:
        return [Emit(f.port, bytes(f.frame), time) for f in self.rtl.receive(port, frame)]

    def slots_in_use(self, job: int | None = None) -> int:
        jobs = range(self._jobs) if job is None else (job,)
        return sum(self.bus.read(self.regmap.addr("JOB.SLOTS_BUSY", j)) for j in jobs)

    def stats(self) -> dict[str, int]:
        return self.rtl.stats()

    def close(self) -> None:
        self.rtl.close()
