"""The engine RTL (Verilator, :class:`~.fastsim.FastSim`) as the switch service's engine.

:class:`RtlSwitchEngine` gives :class:`~netreduce.sim.emu.switch.SwitchService` what the reference
:class:`~netreduce.sim.model.Engine` gives it (``ports``, ``bus``, ``counters()``, and
``receive(port, frame, cycles)`` for one frame at a time), plus a batched interface the service
prefers (``batched = True``): :meth:`~RtlSwitchEngine.send` queues frames, one
:meth:`~RtlSwitchEngine.run` per event-loop turn processes them all.

Time
    The RTL is not wall-clock timed: it only runs when there is work. :meth:`run` advances it
    until it is idle (nothing queued on any input, no output frame in progress, and no beat moved
    on any port for ``quiet_cycles``) and returns every frame it emitted meanwhile, in completion
    order. The quiet time must cover the engine's longest internal gap, from a frame's last beat
    in to the first beat of what it causes: for data, a payload's slot write before its release
    (default ``quiet_cycles`` = 2 x the beats of a PMTU payload + 256); for a management request,
    its ops run one by one over the register bank (up to 64 ops of ~8 cycles: a run with a
    management frame queued, UDP to ``MGMT.PORT``, waits ``mgmt_quiet_cycles``, default 1024).
    Measured on the 64-bit build at PMTU 1024: at most 162 cycles for data and single-op
    requests, 571 for a 64-op request. Every simulated cycle costs the same wall time (tens of
    microseconds for the 64-bit engine), so the quiet time is the fixed cost of a run. The RTL's
    cycle counter is therefore not the wall clock: the CNP interval (the one time-dependent rule)
    counts simulated cycles only. :meth:`sweep` runs ``mgmt_quiet_cycles`` more to collect
    stragglers (the service calls it once after the traffic stops); outputs found there or
    during a register access count ``late_outputs`` (nonzero: a quiet time is too short).
Watchdog
    One :meth:`run` stops after ``max_run`` cycles even if the RTL is not idle (the output ports'
    ``tready`` is always high, so only a bug keeps it busy that long): it counts ``watchdog``,
    logs a warning and sets :attr:`more` if beats still moved (the caller runs again on a later
    loop turn) or counts ``stuck`` (nothing moved in the whole run: the next frame or sweep runs
    it again). Never raises, never hangs the caller for more than ``max_run`` cycles.
Registers
    :attr:`bus` is the AXI4-Lite port as a :class:`~netreduce.regmap.RegisterBus` (a DECERR /
    SLVERR answer raises :class:`~netreduce.regmap.BusError`). Register accesses take RTL cycles
    while the streams keep flowing: frames completed during one are kept and handed out by the
    next :meth:`run`, and :attr:`wake` (set by the service) is called so that run happens soon.
    :meth:`counters` reads the ``CNT`` table through it (like
    :meth:`~netreduce.sw_driver.control.EngineControl.counters`).
Management
    :meth:`provision_mgmt` writes :class:`~netreduce.sw_driver.mgmt.MgmtSettings` into the
    ``MGMT`` registers (:func:`~netreduce.sw_driver.mgmt.provision`), so management frames are
    handled by the RTL's own management path (``netreduce.hw.mgmt_path``), not a Python agent.
Errors
    Error-flagged output frames (a frame that entered longer than the engine's buffers) are
    dropped and counted ``out_error``, as a MAC would corrupt their FCS. :meth:`stats` are the
    adapter's own counters (the service shows them as ``rtl.*``).

Build parameters are the register map's (``ports, jobs, flows, slots, max_world, pmtu_max,
data_width``; defaults :data:`~netreduce.regmap.DEFAULT_PARAMS`, 512-bit). The first use of a
parameter set elaborates and verilates the engine (minutes at 512 bits; cached, see
:func:`~.backend.engine_top` and :func:`~.fastsim.build_fastsim`); tests use 64-bit builds.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from netreduce.regmap import (
    ALL_GLOBAL_COUNTERS,
    DEFAULT_PARAMS,
    MGMT_PORT_RESET,
    build_regmap,
)
from netreduce.wire.view import is_udp, udp_dport

from .backend import HarnessBus

__all__ = ["RtlSwitchEngine", "RTL_COUNTER_HELP", "switch_build_params"]

log = logging.getLogger("netreduce.switch.rtl")


RTL_COUNTER_HELP = {
    "rtl.runs": "RTL runs (one per event-loop turn with frames)",
    "rtl.cycles": "RTL cycles simulated",
    "rtl.frames_in": "frames queued on the RTL's inputs",
    "rtl.frames_out": "frames the RTL emitted",
    "rtl.out_error": "error-flagged frames the RTL emitted: dropped",
    "rtl.late_outputs": "frames found by a sweep or a register access (quiet_cycles too short?)",
    "rtl.watchdog": "runs stopped by the watchdog before the RTL was idle",
    "rtl.stuck": "watchdog runs in which no beat moved at all",
    "rtl.truncated": "output frames longer than the harness buffer (cut)",
    "rtl.sweeps": "straggler sweeps after the traffic stopped",
}


def switch_build_params(ports: int = DEFAULT_PARAMS["ports"], jobs: int = DEFAULT_PARAMS["jobs"],
                        flows: int = DEFAULT_PARAMS["flows"], slots: int = DEFAULT_PARAMS["slots"],
                        max_world: int = DEFAULT_PARAMS["max_world"],
                        pmtu_max: int = DEFAULT_PARAMS["pmtu_max"],
                        data_width: int = DEFAULT_PARAMS["data_width"]) -> dict:
    """The engine build parameters as a dict (validated by ``build_regmap``)."""
    p = dict(ports=ports, jobs=jobs, flows=flows, slots=slots, max_world=max_world,
             pmtu_max=pmtu_max, data_width=data_width)
    build_regmap(**p)  # raises ValueError / TypeError on a bad set
    return p


class RtlSwitchEngine:
    """The engine's Verilog under Verilator, driven frame-batch by frame-batch (module doc).

    ``top`` (an :class:`~netreduce.hw.verilog.AxisTop`) uses that engine top instead of building
    one from the parameters; ``sim`` (a FastSim-like object) uses that model as it is (the build
    parameters must then describe it). ``quiet_cycles`` / ``mgmt_quiet_cycles`` / ``max_run``:
    see the module doc. ``roles``: the engine build with flow roles (spine-leaf, D17).
    """

    batched = True  # SwitchService: send() every frame of a loop turn, then one run()

    def __init__(self, ports: int = DEFAULT_PARAMS["ports"], jobs: int = DEFAULT_PARAMS["jobs"],
                 flows: int = DEFAULT_PARAMS["flows"], slots: int = DEFAULT_PARAMS["slots"],
                 max_world: int = DEFAULT_PARAMS["max_world"],
                 pmtu_max: int = DEFAULT_PARAMS["pmtu_max"],
                 data_width: int = DEFAULT_PARAMS["data_width"], *, top=None, sim=None,
                 seed: int = 0, quiet_cycles: int | None = None, mgmt_quiet_cycles: int = 1024,
                 max_run: int = 1 << 18, roles: bool = False):
        self.params = switch_build_params(ports, jobs, flows, slots, max_world, pmtu_max,
                                          data_width)
        self.regmap = build_regmap(**self.params)
        if sim is None:
            from ..backend import open_engine

            # roles: the build with flow roles (a leaf or spine engine, docs/spine-leaf.md)
            sim = open_engine("verilator", {**self.params, "roles": True} if roles
                              else self.params, seed=seed, top=top)
        self.sim = sim
        self.ports = ports
        if quiet_cycles is None:
            quiet_cycles = 2 * (pmtu_max // (data_width // 8)) + 256
        for name, q in (("quiet_cycles", quiet_cycles), ("mgmt_quiet_cycles", mgmt_quiet_cycles)):
            if not (isinstance(q, int) and 1 <= q <= max_run):
                raise ValueError(f"need 1 <= {name} ({q!r}) <= max_run ({max_run})")
        self.quiet_cycles = quiet_cycles
        self.mgmt_quiet_cycles = mgmt_quiet_cycles
        self.max_run = max_run
        self._mgmt_port = MGMT_PORT_RESET  # MGMT.PORT (provision_mgmt sets it)
        self._mgmt_queued = False
        # the AXI4-Lite port; frames completed during an access are kept for the next run
        self.bus = HarnessBus(sim, after=self._stash_outputs)
        self.wake: Callable[[], None] | None = None
        self.more = False  # the last run hit the watchdog while beats still moved
        self._stash: list = []
        self._c: Counter = Counter()
        self._g_base = self.regmap.table("CNT").base

    # ------------------------------------------------------------------ frames
    def send(self, port: int, frame: bytes) -> None:
        """Queue ``frame`` on input ``port`` (it enters at the next :meth:`run`)."""
        if not 0 <= port < self.ports:
            raise ValueError(f"port {port} outside 0..{self.ports - 1}")
        self.sim.send(port, frame)
        self._c["frames_in"] += 1
        if is_udp(frame) and udp_dport(frame) == self._mgmt_port:
            self._mgmt_queued = True  # UDP to the management port: wait for its ops

    def run(self) -> list:
        """Run until idle (or the watchdog); returns the frames emitted since the last run
        (``RxFrame``: ``.port``, ``.frame``, ``.cycle``), error-flagged ones dropped."""
        sim = self.sim
        c0 = sim.cycle
        self._c["runs"] += 1
        quiet = self.mgmt_quiet_cycles if self._mgmt_queued else self.quiet_cycles
        frames = self._stash + sim.run(self.max_run, until_idle=True, quiet=quiet)
        self._stash = []
        cycle, last, idle = sim.status()
        self._c["cycles"] += cycle - c0
        self.more = False
        if idle:
            self._mgmt_queued = False
        else:
            self._c["watchdog"] += 1
            moved = last > c0
            if moved:
                self.more = True
            else:
                self._c["stuck"] += 1
            if self._c["watchdog"] in (1, 10, 100) or self._c["watchdog"] % 1000 == 0:
                log.warning("RTL not idle after %d cycles (watchdog #%d, %s; %d input frame(s) "
                            "queued)", self.max_run, self._c["watchdog"],
                            "still moving" if moved else "no beat moved", sim.pending())
        return self._out(frames)

    def sweep(self) -> list:
        """Run ``mgmt_quiet_cycles`` more (the traffic stopped) and return what comes out:
        stragglers, counted ``late_outputs``. Frames queued since the last :meth:`run` (they
        can arrive just before the sweep's timer fires) first get an ordinary run: their outputs
        are not stragglers."""
        self._c["sweeps"] += 1
        first = self.run() if self.sim.pending() else []
        c0 = self.sim.cycle
        got = self.sim.run(self.mgmt_quiet_cycles)
        frames, self._stash = self._stash + got, []
        self._c["cycles"] += self.sim.cycle - c0
        self._c["late_outputs"] += len(got)
        return first + self._out(frames)

    def receive(self, port: int, frame: bytes, cycles: int = 0) -> list:
        """One frame at a time (the model's interface): queue it, run, return the emitted frames.
        ``cycles`` is ignored (the RTL keeps its own time)."""
        self.send(port, frame)
        return self.run()

    def _out(self, frames) -> list:
        out = []
        for f in frames:
            if f.error:
                self._c["out_error"] += 1
                continue
            out.append(f)
        self._c["frames_out"] += len(out)
        return out

    def _stash_outputs(self) -> None:
        got = self.sim.collect()
        if got:
            self._stash += got
            self._c["late_outputs"] += len(got)
            if self.wake is not None:
                self.wake()

    # ------------------------------------------------------------------ control
    def provision_mgmt(self, settings) -> None:
        """Configure the RTL's management path (``MGMT.*``, ``MGMT_SRC``) through the bus."""
        from netreduce.sw_driver.mgmt import provision

        provision(self.bus, settings, self.regmap)
        self._mgmt_port = settings.port

    def counters(self) -> dict[str, int]:
        """The engine-wide counters (``CNT`` table) by name, read through the bus."""
        rd, base = self.bus.read, self._g_base
        return {c.name: rd(base + 4 * i) for i, c in enumerate(ALL_GLOBAL_COUNTERS)}

    def stats(self) -> dict[str, int]:
        """The adapter's own counters (module doc), every key of :data:`RTL_COUNTER_HELP`."""
        out = {k.removeprefix("rtl."): 0 for k in RTL_COUNTER_HELP}
        out.update(self._c)
        out["truncated"] = getattr(self.sim, "truncated", 0)
        return out

    @property
    def run_seconds(self) -> float:
        """Wall time spent inside the Verilator model."""
        return getattr(self.sim, "run_seconds", 0.0)

    def close(self) -> None:
        close = getattr(self.sim, "close", None)
        if close is not None:
            close()
