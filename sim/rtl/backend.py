"""The RTL engine behind one interface: its Verilog top (converted once, cached), the simulator
that runs it, and its register bus.

Everything that runs the engine's RTL (``netreduce sim``/``demo``, replay, the switch service,
the soak, the fuzzers, the benches) gets it through the registry,
:func:`netreduce.sim.backend.open_engine`, which uses this module:

* :func:`engine_top` is the engine's Verilog top for a build (``build_regmap`` parameters),
  converted by Amaranth once and kept in the one cache of converted engines
  (:mod:`netreduce.hw.cache`, key: the engine's design digest).
* :func:`missing` says why a simulator (``verilator``: :class:`~.fastsim.FastSim`, ``icarus``:
  :class:`~.icarus.IcarusSim`) or the engine cannot run here; :func:`open_harness` starts one
  on a top (a build failure raises :class:`~.fastsim.BuildError`).
* :class:`HarnessBus` is the one :class:`~netreduce.regmap.RegisterBus` over a harness's
  AXI4-Lite master: a DECERR/SLVERR answer raises :class:`~netreduce.regmap.BusError` (as the
  model's register file does); hooks let a fabric catch up before an access and collect the
  frames the engine emitted while the access ran.

This module raises no "backend unavailable" error itself (the registry does, from the reasons
given here), so the registry can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from netreduce.hw import cache as hw_cache

from netreduce.regmap import BusError

__all__ = ["SIMULATORS", "ENGINE_TOP_NAME", "engine_module", "engine_top", "engine_top_path",
           "missing", "open_harness", "HarnessBus"]

SIMULATORS = ("verilator", "icarus")
ENGINE_TOP_NAME = hw_cache.ENGINE_TOP_NAME
_RESP = ("OKAY", "EXOKAY", "SLVERR", "DECERR")


def engine_module():
    """``netreduce.hw.engine``, or None where it cannot be imported (a trimmed tree)."""
    try:
        from netreduce.hw import engine
    except ImportError as e:
        if getattr(e, "name", "") and "engine" not in str(e.name):
            raise
        return None
    return engine


def engine_top_path(params: dict):
    """Where :func:`engine_top` caches the top of build ``params`` (exists once converted)."""
    return hw_cache.engine_top_path(params)


def engine_top(params: dict):
    """The engine's Verilog top (``netreduce.hw.engine.engine_verilog``) for build ``params``,
    from the one cache of converted engines (:func:`netreduce.hw.cache.engine_top`: outside the
    work tree, keyed by the engine's design digest; converting a 512-bit engine takes a while).
    A true ``roles`` entry builds the engine with flow roles (``NetReduceEngine(roles=True)``)."""
    if engine_module() is None:
        raise RuntimeError("netreduce.hw.engine is not available")
    return hw_cache.engine_top(params)


def simulator_missing(sim: str) -> str | None:
    """None if the frame-level harness of ``sim`` can build here, else the one-line reason."""
    if sim == "verilator":
        from .fastsim import verilator_missing
        return verilator_missing()
    if sim == "icarus":
        from .icarus import icarus_missing
        return icarus_missing()
    return f"unknown simulator {sim!r} (known: {', '.join(SIMULATORS)})"


def missing(sim: str, need_engine: bool = True) -> str | None:
    """Why the engine cannot run on ``sim`` here (None: it can): the simulator, its tools, or
    (``need_engine``) the engine's gateware is missing."""
    why = simulator_missing(sim)
    if why:
        return why
    if need_engine and engine_module() is None:
        return "the RTL engine top (netreduce.hw.engine) is not available yet"
    return None


def open_harness(sim: str, top, *, seed: int = 0):
    """The frame-level harness of ``sim`` running ``top`` (built first if needed; a failing
    build raises :class:`~.fastsim.BuildError`)."""
    if sim == "verilator":
        from .fastsim import FastSim
        return FastSim(top, seed=seed)
    if sim == "icarus":
        from .icarus import IcarusSim
        return IcarusSim(top, seed=seed)
    raise ValueError(f"unknown simulator {sim!r} (known: {', '.join(SIMULATORS)})")


class HarnessBus:
    """The engine's AXI4-Lite port on a harness as a :class:`~netreduce.regmap.RegisterBus`.

    ``before()`` runs before each access (a fabric finishes the window in flight), ``after()``
    after it (the caller collects the frames the engine emitted during the access's cycles).
    A write value must fit 32 bits; a non-OKAY response raises :class:`BusError` naming the
    address and the response. ``reads`` / ``writes`` count the accesses."""

    def __init__(self, sim, *, before: Callable[[], None] | None = None,
                 after: Callable[[], None] | None = None):
        self.sim = sim
        self._before = before
        self._after = after
        self.reads = self.writes = 0

    def read(self, addr: int) -> int:
        if self._before is not None:
            self._before()
        sim = self.sim
        v = sim.axil_read(addr, check=False)
        self.reads += 1
        resp = sim.last_resp
        if self._after is not None:
            self._after()
        # a DECERR read returns 0 on the bus; the model's RegisterFile raises: so do we
        if resp:
            raise BusError(f"read of 0x{addr:x}: {_RESP[resp]}")
        return v

    def write(self, addr: int, value: int) -> None:
        if not (isinstance(value, int) and 0 <= value < 2**32):
            raise BusError(f"value {value!r} does not fit 32 bits")
        if self._before is not None:
            self._before()
        resp = self.sim.axil_write(addr, value, check=False)
        self.writes += 1
        if self._after is not None:
            self._after()
        if resp:
            raise BusError(f"write of 0x{value:x} to 0x{addr:x}: {_RESP[resp]}")
