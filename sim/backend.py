"""The engine-backend registry: every way of running "the engine" (the reference model, its RTL on
Verilator, its RTL on Icarus) behind one interface.

:func:`open_engine` ``(kind, params)`` returns the engine of build ``params`` (the keyword
arguments of :func:`netreduce.regmap.build_regmap`, as ``netreduce.sim.model.Engine`` takes
them):

* ``model``: the bit-exact reference :class:`~netreduce.sim.model.Engine` (``receive(port,
  frame, time) -> [Emit]``, ``bus``), untimed;
* ``verilator`` / ``icarus``: the engine's Verilog (:func:`netreduce.sim.rtl.backend.engine_top`,
  converted once and cached) in the frame-level harness of that simulator
  (:class:`~netreduce.sim.rtl.fastsim.FastSim` / :class:`~netreduce.sim.rtl.icarus.IcarusSim`:
  ``send``, ``run``, ``axil_read`` ...), its register bus a
  :class:`~netreduce.sim.rtl.backend.HarnessBus`. ``top`` runs a given top instead.

The callers drive what they get in their own time base: ``netreduce sim``/``demo`` in the
network model (:mod:`netreduce.sim.net.simrun`, :mod:`netreduce.sim.rtl.fabric`), replay
(:mod:`netreduce.sim.emu.replay`), the switch service (:mod:`netreduce.sim.rtl.switch_engine`),
the soak (:mod:`netreduce.sim.rtl.soak_rtl`) and the fuzzers (:mod:`netreduce.sim.verif.
scenarios`).

"Cannot run here" is one exception, :class:`BackendUnavailable` (one-line message: the missing
simulator or tool, the missing gateware, or the first line of a failed build), raised by
:func:`probe_backend` before anything is built and by :func:`open_engine`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BackendUnavailable", "BuildFailed", "Backend", "BACKENDS", "get_backend",
           "probe_backend", "open_engine"]


class BackendUnavailable(RuntimeError):
    """The backend is registered but cannot run here; the message is one line."""


class BuildFailed(BackendUnavailable):
    """Building the engine for the simulator failed (the message is the log's first line; the
    whole log is in :attr:`log`)."""

    def __init__(self, msg: str, log: str = ""):
        super().__init__(msg)
        self.log = log


@dataclass(frozen=True)
class Backend:
    """One registered engine backend; ``simulator`` is None for the reference model."""

    name: str
    description: str
    simulator: str | None = None

    def probe(self, need_engine: bool = True) -> None:
        """Raise :class:`BackendUnavailable` if this backend cannot run here (``need_engine``:
        the engine's gateware must be there too, not only the simulator)."""
        if self.simulator is None:
            return
        try:
            from .rtl import backend as rtl
            why = rtl.missing(self.simulator, need_engine)
        except ImportError as e:
            raise BackendUnavailable(f"backend {self.name!r}: the RTL harness (netreduce.sim.rtl)"
                                     f" is not importable ({e}); use --backend model") from None
        if why:
            raise BackendUnavailable(f"backend {self.name!r}: {why} (use --backend model)")

    def open(self, params: dict, *, seed: int = 0, top=None):
        """The engine of build ``params`` (module doc); ``top``: an RTL top to run as it is."""
        if self.simulator is None:
            from .model import Engine
            return Engine(**params)
        self.probe(need_engine=top is None)
        from .rtl import backend as rtl
        from .rtl.fastsim import BuildError

        try:
            if top is None:
                top = rtl.engine_top(params)
            return rtl.open_harness(self.simulator, top, seed=seed)
        except BuildError as e:
            first = str(e).splitlines()[0] if str(e) else "build failed"
            raise BuildFailed(f"backend {self.name!r}: building the engine failed: {first}",
                              str(e)) from None


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("model", "bit-exact reference engine model (in-process, untimed)"),
    Backend("verilator", "engine RTL (Verilator, C++ frame-level harness)", "verilator"),
    Backend("icarus", "engine RTL (Icarus Verilog, frame-level Verilog testbench)", "icarus"),
)}


def get_backend(kind: str) -> Backend:
    """The registered backend ``kind``; ``ValueError`` naming it and the known ones otherwise."""
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(f"unknown backend {kind!r} (known: {', '.join(BACKENDS)})") from None


def probe_backend(kind: str, need_engine: bool = True) -> None:
    """Raise :class:`BackendUnavailable` (one line) if backend ``kind`` cannot run here."""
    get_backend(kind).probe(need_engine)


def open_engine(kind: str, params: dict, *, seed: int = 0, top=None):
    """The engine of backend ``kind`` for build ``params`` (module doc)."""
    return get_backend(kind).open(params, seed=seed, top=top)
