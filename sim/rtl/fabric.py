"""The RTL fabric: the engine's Verilog (Verilator via :class:`~.fastsim.FastSim`, or Icarus) in
the middle of the network model, and the ``verilator`` / ``icarus`` backends of ``netreduce sim``.

:class:`RtlFabric` is a :class:`~netreduce.sim.network.NetworkFabric` like the model fabric:
endpoints' up links deliver frames to the engine's input port ``port_of(src_mac)``; frames the
engine emits cross the down link of the endpoint owning their destination MAC.

Time
    The network counts nanoseconds, the RTL cycles at :data:`~netreduce.regmap.CLOCK_HZ`
    (``cycles = ns * CLOCK_HZ // 10**9``; back rounding up). A frame arriving at the engine at
    time t is queued on its input port at cycle ``ns_to_cycles(t)`` (the RTL is first advanced to
    that cycle). While the RTL has work, a *pump* event advances it up to the time of the next
    network event (conservative: nothing can reach an input before then) and stops at every
    output frame, which is handed to the network at the cycle its last beat left. When the RTL is
    idle (no input queued, no output in progress, no beat moved for ``quiet_cycles``) the pump
    stops; the next arrival first runs the RTL through the idle cycles (every cycle is simulated:
    the RTL's timers see true time). Register accesses run at the current network time and take
    the AXI4-Lite cycles they take, so the RTL may run a few cycles ahead of the network; a frame
    arriving meanwhile enters at the RTL's cycle. Outputs found while catching up or during a
    register access leave at once (counted ``late_outputs`` if their cycle lies in the past).

Registers
    :attr:`RtlFabric.bus` (``read(addr)`` / ``write(addr, value)``) is AXI4-Lite on ``s_axil``;
    :class:`~netreduce.sw_driver.control.EngineControl` programs the engine through it exactly
    as the driver would. A DECERR/SLVERR answer raises :class:`~netreduce.regmap.BusError`.

Capture
    ``capture.frame_in(port, frame, cycle)`` when a frame is queued on an input,
    ``capture.frame_out(port, frame, cycle)`` when one leaves (error-flagged frames are captured
    and then dropped, counted ``engine_out_error``, as a MAC would corrupt their FCS).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Callable

from netreduce.sw_driver.fabric import Scheduler, frame_dmac

from netreduce.regmap import BusError, build_regmap

from ..fabric_model import cycles_to_ns, ns_to_cycles
from ..network import NetConfig, NetworkFabric

__all__ = ["RtlFabric", "RtlBus", "PeekScheduler", "rtl_params", "engine_top", "engine_top_path",
           "make_rtl_backend", "probe_rtl", "ENGINE_TOP_NAME"]

ENGINE_TOP_NAME = "netreduce_engine"


class PeekScheduler(Scheduler):
    """The network's scheduler plus :meth:`next_time` (the pump's lookahead)."""

    def next_time(self) -> int | None:
        q = self._queue
        while q and q[0][2].cancelled:
            heapq.heappop(q)
        return q[0][0] if q else None


class RtlBus:
    """The engine's AXI4-Lite port as a :class:`~netreduce.regmap.RegisterBus`."""

    def __init__(self, fabric: RtlFabric):
        self._fab = fabric
        self.reads = self.writes = 0

    def read(self, addr: int) -> int:
        fab = self._fab
        fab.sync()
        r = fab.sim.axil_read(addr, check=False)
        self.reads += 1
        fab._emit(fab.sim.collect())
        resp = fab.sim.last_resp
        # a DECERR read returns 0 on the bus; the model's RegisterFile raises: so do we
        if resp:
            raise BusError(f"read of 0x{addr:x}: {('OKAY', 'EXOKAY', 'SLVERR', 'DECERR')[resp]}")
        return r

    def write(self, addr: int, value: int) -> None:
        if not (isinstance(value, int) and 0 <= value < 2**32):
            raise BusError(f"value {value!r} does not fit 32 bits")
        fab = self._fab
        fab.sync()
        resp = fab.sim.axil_write(addr, value, check=False)
        self.writes += 1
        fab._emit(fab.sim.collect())
        if resp:
            raise BusError(f"write of 0x{value:x} to 0x{addr:x}: "
                           f"{('OKAY', 'EXOKAY', 'SLVERR', 'DECERR')[resp]}")


class RtlFabric(NetworkFabric):
    """The network around an RTL engine ``sim`` (a FastSim-like object: ``send``, ``run``,
    ``collect``, ``cycle``, ``status``, ``axil_read/write``); see the module
    docstring. ``stats`` adds ``engine_in``, ``engine_out``, ``engine_out_error``,
    ``late_outputs``, ``unroutable`` and ``pumps``."""

    def __init__(self, sim, net: NetConfig | None = None, seed: int = 0, capture=None,
                 port_of: Callable[[bytes], int] | None = None, *, quiet_cycles: int = 1024,
                 max_run: int = 1 << 16):
        super().__init__(net, seed, PeekScheduler())
        self.sim = sim
        self.capture = capture
        self.port_of = port_of or (lambda mac: 0)
        self.quiet_cycles = quiet_cycles
        self.max_run = max_run
        self.bus = RtlBus(self)
        self._pump_timer = None

    # ------------------------------------------------------------------ time keeping
    def sync(self) -> int:
        """Advance the RTL to the network's current time (no-op if it is already there);
        returns the RTL's cycle."""
        target = ns_to_cycles(self.sched.now())
        sim = self.sim
        c = sim.cycle
        if c < target:
            self._emit(sim.run(target - c))
            return sim.cycle
        return c

    def _emit(self, frames) -> None:
        now = self.sched.now()
        st = self.stats
        cap = self.capture
        for f in frames:
            st["engine_out"] += 1
            if cap is not None:
                cap.frame_out(f.port, f.frame, f.cycle)
            if f.error:
                st["engine_out_error"] += 1
                continue
            t = cycles_to_ns(f.cycle)
            if t <= now:
                # late: the output's whole cycle lies before now (not just rounding within it)
                if cycles_to_ns(f.cycle + 1) <= now:
                    st["late_outputs"] += 1
                self._forward(f.frame)
            else:
                self.sched.call_at(t, self._forward, f.frame)

    def _wake(self) -> None:
        if self._pump_timer is None:
            self._pump_timer = self.sched.call_at(self.sched.now(), self._pump)

    def _pump(self) -> None:
        self._pump_timer = None
        self.stats["pumps"] += 1
        c = self.sync()
        sim = self.sim
        nxt = self.sched.next_time()
        limit = c + self.max_run
        if nxt is not None:
            limit = min(limit, ns_to_cycles(nxt))
        if limit > c:
            self._emit(sim.run(limit - c, until_output=True))
        cycle, last, idle = sim.status()
        if idle and cycle - last > self.quiet_cycles:
            return  # quiescent: the next arrival wakes the pump again
        if nxt is not None and cycle >= ns_to_cycles(nxt):
            at = nxt  # reached the next event: continue after it (it may bring a frame)
        else:
            at = cycles_to_ns(cycle)
        self._pump_timer = self.sched.call_at(at, self._pump)

    # ------------------------------------------------------------------ frames
    def _at_middle(self, src_mac: bytes, frame: bytes) -> None:
        self.stats["engine_in"] += 1
        c = self.sync()
        port = self.port_of(src_mac)
        if self.capture is not None:
            self.capture.frame_in(port, frame, c)
        self.sim.send(port, frame)
        self._wake()

    def _forward(self, frame: bytes) -> None:
        link = self.down.get(frame_dmac(frame))
        if link is None:
            self.stats["unroutable"] += 1
            return
        link.send(frame)

    def close(self) -> None:
        close = getattr(self.sim, "close", None)
        if close is not None:
            close()


# ---------------------------------------------------------------------------------- backends
def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def rtl_params(cfg) -> dict:
    """Engine build parameters for a ``netreduce sim`` configuration: as small as the run allows
    (the Verilog grows with the flow table and the slot pool), rounded to powers of two so that
    similar runs share one build. Per group: a SUM job (window 256) and an exponent MAX job
    (window 64), N flows each."""
    groups = _pow2(cfg.jobs)
    return dict(ports=cfg.nports, jobs=max(2, 2 * groups),
                flows=max(16, _pow2(2 * cfg.workers * groups)), slots=512 * groups,
                pmtu_max=max(1024, cfg.pmtu), data_width=512,
                max_world=max(8, _pow2(cfg.workers)))


def _engine_module():
    try:
        from netreduce.hw import engine
    except ImportError as e:
        if getattr(e, "name", "") and "engine" not in str(e.name):
            raise
        return None
    return engine


def engine_top_path(params: dict):
    """Where :func:`engine_top` caches the top of build ``params`` (exists once converted)."""
    from netreduce.sim.cocotb.runner import _sources_digest, gen_cache_root

    key = hashlib.sha256(json.dumps([sorted(params.items()), _sources_digest(
        ("netreduce.hw", "netreduce.wire", "netreduce.regmap"))]).encode()).hexdigest()[:16]
    return gen_cache_root() / f"{ENGINE_TOP_NAME}-{key}.json"


def engine_top(params: dict):
    """The engine's Verilog top (``netreduce.hw.engine.engine_verilog``) for build ``params``,
    cached in :func:`netreduce.sim.cocotb.runner.gen_cache_root` (outside the work tree, shared
    by clones) by the parameters and the source text of netreduce.hw, .wire and .regmap
    (elaborating a 512-bit engine takes a while)."""
    from .fastsim import load_top, save_top

    eng = _engine_module()
    if eng is None:
        raise RuntimeError("netreduce.hw.engine is not available")
    path = engine_top_path(params)
    if path.exists():
        return load_top(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    top = eng.engine_verilog(build_regmap(**params))
    save_top(top, path)
    return top


def probe_rtl(sim: str) -> None:
    """Raise BackendUnavailable (one line) if ``sim`` or the engine top is missing."""
    from ..simrun import BackendUnavailable

    if sim == "verilator":
        from .fastsim import verilator_missing
        reason = verilator_missing()
    else:
        from .icarus import icarus_missing
        reason = icarus_missing()
    if reason:
        raise BackendUnavailable(f"backend {sim!r}: {reason} (use --backend model)")
    if _engine_module() is None:
        raise BackendUnavailable(f"backend {sim!r}: the RTL engine top (netreduce.hw.engine) is "
                                 "not available yet (use --backend model)")


def make_rtl_backend(sim: str, top=None, **overrides):
    """``(description, make, probe)`` for :func:`netreduce.sim.simrun.register_backend`.

    ``overrides`` replace build parameters of :func:`rtl_params` (tests use a 64-bit engine,
    which builds in a fraction of the time); ``top`` (an AxisTop) uses that engine top as it is
    (e.g. a stored one: :func:`~.fastsim.load_top`), whatever the run's parameters."""

    def probe():
        probe_rtl(sim)

    def make(cfg, net, capture):
        probe()
        params = {**rtl_params(cfg), **overrides}
        dut_top = top if top is not None else engine_top(params)
        if sim == "verilator":
            from .fastsim import FastSim
            dut = FastSim(dut_top, seed=cfg.seed)
        else:
            from .icarus import IcarusSim
            dut = IcarusSim(dut_top, seed=cfg.seed)
        nports = cfg.nports
        fab = RtlFabric(dut, net=net, seed=cfg.seed, capture=capture)
        fab.rank_of_mac = {}
        fab.port_of = lambda mac: fab.rank_of_mac.get(mac, 0) % nports
        fab.rtl_params = params
        return fab

    what = ("Verilator, C++ frame-level harness" if sim == "verilator"
            else "Icarus Verilog, frame-level Verilog testbench")
    return f"engine RTL ({what})", make, probe

