"""The RTL fabric: the engine's Verilog (Verilator via :class:`~.fastsim.FastSim`, or Icarus) in
the middle of the network model, and the ``verilator`` / ``icarus`` backends of ``netreduce sim``.

:class:`RtlFabric` is a :class:`~netreduce.sim.net.network.NetworkFabric` like the model fabric:
endpoints' up links deliver frames to the engine's input port ``port_of(src_mac)``; frames the
engine emits cross the down link of the endpoint owning their destination MAC.

Time
    The network counts nanoseconds, the RTL cycles at :data:`~netreduce.regmap.CLOCK_HZ`
    (``cycles = ns * CLOCK_HZ // 10**9``; back rounding up). A frame arriving at the engine at
    time t is queued on its input port at cycle ``ns_to_cycles(t)``. A frame the engine emits is
    put on its down link at the time of the cycle its last beat left (``cycles_to_ns``), also
    when the fabric learns of it later, as long as its delivery is still to come; otherwise it
    leaves at once, counted ``late_outputs`` if its whole cycle lies in the past. Every cycle is
    simulated (the RTL's timers see true time). Event by event, an idle RTL (no input queued, no
    output in progress, no beat moved for ``quiet_cycles``) rests, and the next arrival first
    runs it through the idle cycles (an output of a timer meanwhile is late); with windows it
    rests only when no network event is left. Register accesses run at the current network time
    and take the AXI4-Lite cycles they take, so the RTL may run a few cycles ahead of the
    network; a frame arriving meanwhile enters at the RTL's cycle.

Windows (the default)
    Python does not stop the RTL at every event. A *pump* event every ``w`` cycles
    (:attr:`RtlFabric.window_cycles`) queues the frames that have arrived up to the current
    time, each for its own cycle (``FastSim.send_at``), runs the RTL up to now and hands the
    outputs of that window to the down links one window later. That is exact because of the
    down links' latency: an output of cycle t reaches an endpoint no earlier than its latency
    ``D`` after t, and ``2 w`` cycles stay under ``D``; the RTL never runs ahead of the network,
    so a register access (which first finishes the window in flight and catches up) still lands
    in the cycle of its network time. The outputs are those of running the RTL event by event
    (``windowed=False``; the default when ``D`` is under 52 ns, too short for 8-cycle
    windows), which stops at every network event and every output frame, wherever that has no
    late outputs. (Before windows, an output whose cycle began within the ns the pump ran at
    went on its link at that ns, up to 1 ns late, rather than at its own time: that artefact is
    gone in both ways of running.)
    With ``threaded=True`` each window runs in the harness's own thread
    (``FastSim.run_async``, which never needs the GIL) while Python goes on with the network
    for the next one, with the same
    outputs: nothing in that stretch of network time can depend on the window's outputs, and
    anything that touches the RTL waits for it first.

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

import heapq
import itertools
import math
from collections.abc import Callable

from netreduce.sim.net.scheduler import Scheduler, frame_dmac

from netreduce.regmap import CLOCK_HZ
from netreduce.regmap.clock import cycles_to_ns, ns_to_cycles

from ..backend import get_backend, open_engine, probe_backend
from ..net.network import KINDS, NetConfig, NetworkFabric
from .backend import ENGINE_TOP_NAME, HarnessBus, engine_top, engine_top_path  # noqa: F401

__all__ = ["RtlFabric", "RtlBus", "PeekScheduler", "rtl_params", "engine_top", "engine_top_path",
           "make_rtl_backend", "probe_rtl", "ENGINE_TOP_NAME"]

class PeekScheduler(Scheduler):
    """The network's scheduler plus :meth:`next_time` (the pump's lookahead)."""

    def next_time(self) -> int | None:
        q = self._queue
        while q and q[0][2].cancelled:
            heapq.heappop(q)
        return q[0][0] if q else None


class RtlBus(HarnessBus):
    """The engine's AXI4-Lite port as a :class:`~netreduce.regmap.RegisterBus`: each access
    first finishes the window in flight and hands on the frames emitted meanwhile."""

    def __init__(self, fabric: RtlFabric):
        super().__init__(fabric.sim, before=fabric.sync,
                         after=lambda: fabric._emit(fabric.sim.collect()))


def _window_cycles(net: NetConfig | None) -> int:
    """The RTL window of a network (cycles): outputs of cycles [b - w, b) are handed to the
    down links (at their own times) one window later, at cycle b + w, and a down link delivers
    no earlier than its latency after a frame's time, so 2 w cycles stay under the smallest
    down-link latency (less 2 ns for the rounding of cycles to ns)."""
    net = net or NetConfig()
    down = min(net.get("down", k).latency_ns for k in KINDS)
    return max(0, (down - 2) * CLOCK_HZ // 1_000_000_000 // 2)


_IN_FLIGHT = object()  # RtlFabric._held while the sim runs a window in its own thread


class RtlFabric(NetworkFabric):
    """The network around an RTL engine ``sim`` (a FastSim-like object: ``send``, ``run``,
    ``collect``, ``cycle``, ``status``, ``axil_read/write``; ``send_at`` where it has one); see
    the module docstring. ``stats`` adds ``engine_in``, ``engine_out``, ``engine_out_error``,
    ``late_outputs``, ``unroutable`` and ``pumps``.

    ``windowed`` (default: when the down links' latency allows windows of at least
    ``min_window`` cycles) runs the RTL in windows (module docstring, *Windows*); ``threaded``
    runs each window in the harness's thread (needs ``sim.send_at`` and ``sim.run_async``)
    while the network goes on; the outputs are the same either way. :attr:`window_cycles` is
    the window (0: per event). ``max_run`` bounds one RTL call of the per-event pump."""

    def __init__(self, sim, net: NetConfig | None = None, seed: int = 0, capture=None,
                 port_of: Callable[[bytes], int] | None = None, *, quiet_cycles: int = 1024,
                 max_run: int = 1 << 16, windowed: bool | None = None, threaded: bool = False,
                 min_window: int = 8):
        super().__init__(net, seed, PeekScheduler())
        self.sim = sim
        self.capture = capture
        self.port_of = port_of or (lambda mac: 0)
        self.quiet_cycles = quiet_cycles
        self.max_run = max_run
        self.bus = RtlBus(self)
        self._pump_timer = None
        down = min(self.net.get("down", k).latency_ns for k in KINDS)
        self._down_ns = down
        w = _window_cycles(self.net)
        if windowed is None:
            windowed = w >= min_window
        elif windowed and w < 1:
            raise ValueError(f"windowed RTL runs need a down-link latency of at least "
                             f"{2 * 10**9 // CLOCK_HZ + 3} ns, got {down}")
        self.window_cycles = w if windowed else 0
        if threaded and not (windowed and hasattr(sim, "send_at") and hasattr(sim, "run_async")):
            raise ValueError("threaded RTL runs need windows and a sim with send_at and "
                             "run_async (FastSim)")
        self.threaded = threaded
        self._arrivals: list = []  # (time ns, seq, source MAC, frame) not yet queued on the RTL
        self._aseq = itertools.count()
        self._pump_at: int | None = None
        self._held = None  # the outputs of the last window (a list, or _IN_FLIGHT)
        self._later: list = []  # (cycle, port, frame) for a sim without send_at

    # ------------------------------------------------------------------ time keeping
    def sync(self) -> int:
        """Bring the RTL to the network's current time (no-op if it is already there or ahead;
        with windows: after finishing the running window and queuing the frames that have
        arrived by now); returns the RTL's cycle."""
        target = ns_to_cycles(self.sched.now())
        sim = self.sim
        if self.window_cycles:
            self.wait()
            self._queue_arrivals(self.sched.now() + 1, by_time=True)
            c = sim.cycle
            if c < target:
                self._emit(self._run_rtl(target - c))
                return sim.cycle
            return c
        c = sim.cycle
        if c < target:
            self._emit(sim.run(target - c))
            return sim.cycle
        return c

    def wait(self) -> None:
        """Finish the RTL window in flight (if any) and hand its outputs to the network. Call
        before touching ``sim`` from outside (the fabric's own bus and ``close`` do)."""
        self._emit(self._collect())

    def _collect(self) -> list:
        """Finish the RTL window in flight (if any); its outputs, not yet handed on."""
        held, self._held = self._held, None
        if held is None:
            return []
        return self.sim.join() if held is _IN_FLIGHT else held

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
            t = cycles_to_ns(f.cycle, ceil=True)
            if t > now:
                self.sched.call_at(t, self._forward, f.frame)
            elif t + self._down_ns > now:
                # found after its time (a window's output, or a cycle that ends after the ns it
                # starts in): on the link at its own time, the delivery is still to come
                self._forward(f.frame, t)
            else:
                # late: the output's whole cycle lies before now (not just rounding within it)
                if cycles_to_ns(f.cycle + 1, ceil=True) <= now:
                    st["late_outputs"] += 1
                self._forward(f.frame)

    def _wake(self) -> None:
        if self._pump_timer is None:
            self._pump_timer = self.sched.call_at(self.sched.now(), self._pump)

    def _pump(self) -> None:
        if self.window_cycles:
            self._window_pump()
            return
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
            at = cycles_to_ns(cycle, ceil=True)
        self._pump_timer = self.sched.call_at(at, self._pump)

    # ------------------------------------------------------------------ windows
    def _arrival(self, t: int, mac: bytes, frame: bytes) -> None:
        heapq.heappush(self._arrivals, (t, next(self._aseq), mac, frame))
        if self._held is None:
            self._wake_for(t)

    def _wake_for(self, t: int) -> None:
        """The RTL rests: pump at the end of arrival time ``t``'s cycle (a window queues the
        frames of the cycles before its own)."""
        at = cycles_to_ns(ns_to_cycles(t) + 1, ceil=True)
        if self._pump_at is None or at < self._pump_at:
            self._schedule_pump(at)

    def _schedule_pump(self, t: int) -> None:
        if self._pump_timer is not None:
            self._pump_timer.cancel()
        self._pump_timer = self.sched.call_at(t, self._pump)
        self._pump_at = max(t, self.sched.now())

    def _queue_arrivals(self, bound: int, by_time: bool = False,
                        deferred: list | None = None) -> None:
        """Queue on the RTL, in arrival order, the recorded frames arriving before cycle
        ``bound`` (``by_time``: before time ``bound`` in ns), each in its arrival cycle (or the
        RTL's cycle, if that is later: it ran ahead for a register access). Their capture
        records go to ``deferred`` (``(port, frame, cycle)``) if given, for the caller to make
        once the RTL is running."""
        arr = self._arrivals
        sim = self.sim
        send_at = getattr(sim, "send_at", None)
        cap = self.capture
        st = self.stats
        while arr and (arr[0][0] < bound if by_time else ns_to_cycles(arr[0][0]) < bound):
            t, _, mac, frame = heapq.heappop(arr)
            c = max(ns_to_cycles(t), sim.cycle)
            port = self.port_of(mac)
            st["engine_in"] += 1
            if deferred is not None:
                deferred.append((port, frame, c))
            elif cap is not None:
                cap.frame_in(port, frame, c)
            if send_at is not None:
                send_at(port, frame, c)
            else:
                self._later.append((c, port, frame))

    def _run_rtl(self, n: int) -> list:
        """Run the RTL ``n`` cycles, feeding the frames queued for later cycles (``sim.send_at``,
        or here for a sim without it); returns the output frames."""
        sim = self.sim
        later = self._later
        if not later:
            return sim.run(n)
        end = sim.cycle + n
        out = []
        while later and later[0][0] < end:
            c, port, frame = later.pop(0)
            if c > sim.cycle:
                out += sim.run(c - sim.cycle)
            sim.send(port, frame)
        if end > sim.cycle:
            out += sim.run(end - sim.cycle)
        return out

    def _window_pump(self) -> None:
        self._pump_timer = self._pump_at = None
        self.stats["pumps"] += 1
        # the last window's outputs are handed on after the next window has started: they only
        # schedule deliveries at least a down-link latency after their cycles, which lie in the
        # network's future (see _window_cycles), so the thread need not wait for that work; a
        # threaded window's outputs even stay in the harness until the next one runs
        sim = self.sim
        in_sim = self._held is _IN_FLIGHT
        if in_sim:
            self._held = None
            sim.join(collect=False)
            held = []
        else:
            held = self._collect()
        w = self.window_cycles
        b = ns_to_cycles(self.sched.now())
        c = sim.cycle
        if c < b - w:
            # behind by more than a window (the RTL rested): catch up now, as sync does
            self._emit(held + (sim.collect() if in_sim else []))
            held, in_sim = [], False
            self._queue_arrivals(b - w)
            self._emit(self._run_rtl(b - w - c))
            c = sim.cycle
        arrived: list = []
        self._queue_arrivals(b, deferred=arrived)
        cycle, last, idle = sim.status()
        if (idle and cycle - last > self.quiet_cycles and not self._arrivals and not held
                and not arrived and not (in_sim and sim.outputs_ready())
                and self.sched.next_time() is None):
            return  # nothing left that could ever reach the RTL: rest (a later frame wakes it)
        # otherwise keep going, idle or not: an idle engine's timers may still emit, and the
        # windows hand that on in time (the cycles are simulated either way)
        if b > c:
            if self.threaded:
                sim.run_async(b - c)
                self._held = _IN_FLIGHT
            else:
                self._held = self._run_rtl(b - c)
        if in_sim:
            held = sim.collect()  # what the last window left (handed over as this one started)
        if self.capture is not None:
            for port, frame, c_in in arrived:
                self.capture.frame_in(port, frame, c_in)
        self._emit(held)
        self._schedule_pump(cycles_to_ns(max(b, c) + w, ceil=True))

    # ------------------------------------------------------------------ frames
    def _at_middle(self, src_mac: bytes, frame: bytes) -> None:
        if self.window_cycles:
            self._arrival(self.sched.now(), src_mac, frame)
            return
        self.stats["engine_in"] += 1
        c = self.sync()
        port = self.port_of(src_mac)
        if self.capture is not None:
            self.capture.frame_in(port, frame, c)
        self.sim.send(port, frame)
        self._wake()

    def _forward(self, frame: bytes, at: int | None = None) -> None:
        link = self.down.get(frame_dmac(frame))
        if link is None:
            self.stats["unroutable"] += 1
            return
        if at is None:
            link.send(frame)
        else:
            link.send(frame, at=at)

    def close(self) -> None:
        try:
            self.wait()
        finally:
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
    # stripes: one job at a time per stripe (SUM 256 after exponents 64: 512 slots each leave
    # room for the pool's fragmentation)
    par = _pow2(cfg.jobs * getattr(cfg, "stripes", 1))
    return dict(ports=cfg.nports, jobs=max(2, 2 * groups, par),
                flows=max(16, _pow2(2 * cfg.workers * groups), _pow2(cfg.workers * par)),
                slots=512 * par,
                pmtu_max=max(1024, cfg.pmtu), data_width=512,
                max_world=max(8, _pow2(cfg.workers)))


def probe_rtl(sim: str) -> None:
    """Raise BackendUnavailable (one line) if ``sim`` or the engine top is missing."""
    probe_backend(sim)


def make_rtl_backend(sim: str, top=None, fabric_options: dict | None = None, **overrides):
    """``(description, make, probe)`` for :func:`netreduce.sim.net.simrun.register_backend`.

    ``overrides`` replace build parameters of :func:`rtl_params` (tests use a 64-bit engine,
    which builds in a fraction of the time); ``top`` (an AxisTop) uses that engine top as it is
    (e.g. a stored one: :func:`~.fastsim.load_top`), whatever the run's parameters.
    ``fabric_options``: keyword arguments of :class:`RtlFabric` (``windowed``, ``threaded``;
    default: windows, on Verilator in the harness's thread: the same outputs either way)."""
    fabric_options = dict(fabric_options or {})

    def probe():
        probe_rtl(sim)

    def make(cfg, net, capture):
        params = {**rtl_params(cfg), **overrides}
        dut = open_engine(sim, params, seed=cfg.seed, top=top)
        nports = cfg.nports
        opts = dict(fabric_options)
        if "threaded" not in opts:  # two cores: the RTL's windows overlap the network model
            opts["threaded"] = (sim == "verilator" and opts.get("windowed") is not False
                                and _window_cycles(net) >= 8)
        if getattr(cfg, "port_gbps", 0):  # the ToR topology (netreduce.sim.net.topology)
            from ..net.topology import tor_rtl_class
            fab = tor_rtl_class(RtlFabric)(dut, net=net, seed=cfg.seed, capture=capture, **opts)
            fab._setup_tor(nports, cfg.port_gbps)
        else:
            fab = RtlFabric(dut, net=net, seed=cfg.seed, capture=capture, **opts)
            fab.rank_of_mac = {}
            fab.port_of = lambda mac: fab.rank_of_mac.get(mac, 0) % nports
        fab.rtl_params = params
        return fab

    return get_backend(sim).description, make, probe

