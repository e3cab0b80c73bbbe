"""``netreduce sim --racks R``: one all-reduce across R racks through R leaf engines and a spine.

Topology (docs/spine-leaf.md)::

    rank --up--> leaf a --isl up--> spine --isl down--> leaf b --down--> rank

:class:`RackFabric` has R racks of M ranks (rank r in rack r // M; endpoints are placed in the
order they attach), each with its own up and down link to its leaf switch, and per rack an
inter-switch link pair (``isl``) to the spine switch. Every switch steers all traffic through its
engine (assumption A1): a leaf's port p < M is its rank p, port M its uplink; the spine's port a
is rack a. A frame an engine emits is routed by destination MAC: into the rack, or up; the spine
sends it down to the rack that owns the MAC. ``placement(i)`` picks the rack of the i-th endpoint
to attach (default i // M). Every link, the inter-switch links included, has
the run's bandwidth, latency and faults (loss, duplication, reordering), each with its own seeded
random stream. ``engines=None`` makes plain switches (the ring baselines).

:func:`run_rack_sim` runs one all-reduce through it with the collective driver
(:class:`RackCommunicator`, which programs the engines through
:class:`~netreduce.sw_driver.spine_leaf.SpineLeafControl`), checks the result like
:func:`~netreduce.sim.simrun.run_sim`, and reports every engine's counters and the slots each
held when its job was removed (must be 0). ``pcap=PREFIX`` writes one pair per engine:
``PREFIX.leaf<a>.in.pcap``/``.out.pcap`` and ``PREFIX.spine.in.pcap``/``.out.pcap``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netreduce.sw_driver.control import ConfigError, EngineControl
from netreduce.sw_driver.spine_leaf import SpineLeafControl

from .collective import CollectiveConfig, Communicator
from .model_fabric import cycles_to_ns, ns_to_cycles
from .network import EndpointLinks, Link, NetConfig
from .rnic import RCError
from .scheduler import Scheduler, frame_dmac
from .simrun import Capture, SimConfig, TappedEngine, _check, make_inputs, net_config

__all__ = ["RackFabric", "RackCommunicator", "RackRun", "run_rack_sim", "engine_names",
           "MAX_RACKS"]

MAX_RACKS = 4


def engine_names(racks: int) -> list[str]:
    return [f"leaf{a}" for a in range(racks)] + ["spine"]


class RackFabric(EndpointLinks):
    """R racks of ``per_rack`` endpoints, a leaf switch each and a spine switch (module doc).

    ``engines``: R + 1 engine objects (``receive(port, frame, cycle) -> [Emit]``, ``bus``), the
    leaves in rack order then the spine, or None for plain switches. ``buses`` lists their
    register buses; ``bus`` is the spine's (what a single-engine driver would look for).
    """

    def __init__(self, racks: int, per_rack: int, engines: Sequence | None = None,
                 net: NetConfig | None = None, seed: int = 0, sched: Scheduler | None = None,
                 placement: Callable[[int], int] | None = None):
        if not isinstance(racks, int) or not 2 <= racks <= MAX_RACKS:
            raise ValueError(f"racks must be 2..{MAX_RACKS}, got {racks!r}")
        if not isinstance(per_rack, int) or per_rack < 1:
            raise ValueError(f"ranks per rack must be >= 1, got {per_rack!r}")
        if engines is not None and len(engines) != racks + 1:
            raise ValueError(f"need {racks + 1} engines (leaves, spine), got {len(engines)}")
        self.racks, self.per_rack = racks, per_rack
        self.net = net or NetConfig()
        self.seed = seed
        self.sched = sched or Scheduler()
        self.engines = None if engines is None else list(engines)
        self.up: dict[bytes, Link] = {}
        self.down: dict[bytes, Link] = {}
        self.rack_of_mac: dict[bytes, int] = {}
        self.port_of_mac: dict[bytes, int] = {}
        self.stats: Counter = Counter()
        # attach order -> rack (default: consecutive blocks of per_rack)
        self.placement = placement or (lambda i: i // per_rack)
        self._in_rack = [0] * racks
        self.isl_up = [Link(self.sched, f"isl{a}/up", "up", self.net, seed,
                            lambda fr, a=a: self._at_spine(a, fr)) for a in range(racks)]
        self.isl_down = [Link(self.sched, f"isl{a}/down", "down", self.net, seed,
                              lambda fr, a=a: self._at_leaf(a, per_rack, fr))
                         for a in range(racks)]

    @property
    def buses(self) -> list | None:
        return None if self.engines is None else [e.bus for e in self.engines]

    @property
    def bus(self):
        return None if self.engines is None else self.engines[-1].bus

    # ------------------------------------------------------------------ endpoints
    def attach(self, mac: bytes, deliver: Callable[[bytes], None]) -> None:
        mac = self._new_mac(mac)
        i = len(self.up)
        if i >= self.racks * self.per_rack:
            raise ValueError(f"all {self.racks} x {self.per_rack} endpoint ports are taken")
        a = self.placement(i)
        if not isinstance(a, int) or not 0 <= a < self.racks or self._in_rack[a] >= self.per_rack:
            raise ValueError(f"endpoint {i}: placed in rack {a!r}, which has no free port")
        port = self._in_rack[a]
        self._in_rack[a] += 1
        self.rack_of_mac[mac], self.port_of_mac[mac] = a, port
        self._add_links(mac, lambda fr, a=a, p=port: self._at_leaf(a, p, fr), deliver)

    # ------------------------------------------------------------------ switches
    def _engine(self, i: int, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """(time ns, frame) the switch's engine emits for ``frame`` (itself: plain switch)."""
        now = self.sched.now()
        if self.engines is None:
            return [(now, frame)]
        self.stats["engine_in"] += 1
        out = []
        for e in self.engines[i].receive(port, frame, ns_to_cycles(now)):
            out.append((max(now, cycles_to_ns(e.time)), bytes(e.frame)))
        self.stats["engine_out"] += len(out)
        return out

    def _at_leaf(self, a: int, port: int, frame: bytes) -> None:
        for t, fr in self._engine(a, port, frame):
            dst = frame_dmac(fr)
            b = self.rack_of_mac.get(dst)
            if b is None:
                self.stats["unroutable"] += 1
            elif b == a:
                self._send_at(self.down[dst], t, fr)
            else:
                self._send_at(self.isl_up[a], t, fr)

    def _at_spine(self, a: int, frame: bytes) -> None:
        for t, fr in self._engine(self.racks, a, frame):
            b = self.rack_of_mac.get(frame_dmac(fr))
            if b is None:
                self.stats["unroutable"] += 1
            else:
                self._send_at(self.isl_down[b], t, fr)

    def _send_at(self, link: Link, t: int, frame: bytes) -> None:
        if t <= self.sched.now():
            link.send(frame)
        else:
            self.sched.call_at(t, link.send, frame)

    def link_stats(self) -> dict[str, Counter]:
        """Counters summed per link group: host "up"/"down", inter-switch "isl_up"/"isl_down"."""
        out = {k: Counter() for k in ("up", "down", "isl_up", "isl_down")}
        for k, links in (("up", self.up.values()), ("down", self.down.values()),
                         ("isl_up", self.isl_up), ("isl_down", self.isl_down)):
            for link in links:
                out[k].update(link.stats)
        return out


class _FanOut:
    """What the collective's pass asks of ``comm.ctrl`` (an :class:`EngineControl`), served by
    several engines: a job of the pass is a *virtual* job id standing for one job per engine,
    added and removed together through :class:`SpineLeafControl` (each engine picks its own job
    id and slots). Records each engine's counters and the slots it held at removal."""

    def __init__(self, comm: RackCommunicator, multi: SpineLeafControl):
        self.comm, self.multi = comm, multi
        self.jobs: dict[int, list[int]] = {}  # virtual job id -> job id per engine
        self.stats_per_engine: list[Counter] = [Counter() for _ in multi.engines]
        # slots each engine's job still held when it was removed, summed over the passes
        self.slots_per_engine = [0] * len(multi.engines)

    def enabled_jobs(self) -> list[int]:
        return sorted(self.jobs)

    def alloc_slots(self, window: int) -> int:
        return 0  # every engine allocates its own in add_job

    def add_job(self, cfg) -> None:
        if cfg.fast_retx:
            raise ConfigError("fast_retx is not supported on spine-leaf jobs")
        self.jobs[cfg.job] = self.multi.add_job(cfg.flows, self.comm.rack_of, cfg.window,
                                                cfg.pmtu, cfg.op)

    def slots_in_use(self, job: int | None = None) -> int:
        if job is None:
            return self.multi.slots_in_use()
        return self.multi.slots_in_use(self.jobs[job])

    def counters(self, job: int) -> dict[str, int]:
        total: Counter = Counter()
        for c in self.multi.counters(self.jobs[job]):
            total.update(c)
        return dict(total)

    def remove_job(self, job: int) -> None:
        ids = self.jobs.pop(job)
        held = [c.slots_in_use(j) for c, j in zip(self.multi.engines, ids, strict=True)]
        self.slots_per_engine = [a + b for a, b in zip(self.slots_per_engine, held, strict=True)]
        for acc, c in zip(self.stats_per_engine, self.multi.counters(ids), strict=True):
            acc.update(c)
        self.multi.remove_job(ids)


class RackCommunicator(Communicator):
    """``world`` ranks in ``racks`` racks of consecutive ranks on a fabric with one engine per
    leaf switch and a spine engine (``fabric.buses``: leaves in rack order, then the spine).
    The collective runs unchanged: its ``ctrl`` fans each job out to every engine."""

    def __init__(self, fabric, world: int, racks: int, cfg: CollectiveConfig | None = None,
                 seed: int = 0, name: str = "comm"):
        if not isinstance(racks, int) or racks < 2 or world % racks:
            raise ValueError(f"racks must be >= 2 and divide the world size {world}, "
                             f"got {racks!r}")
        buses = getattr(fabric, "buses", None)
        if buses is None or len(buses) != racks + 1:
            raise ValueError(f"the fabric needs {racks + 1} engine buses (leaves, spine), has "
                             f"{0 if buses is None else len(buses)}")
        if cfg is not None and cfg.fast_retx:
            raise ValueError("fast_retx is not supported on spine-leaf jobs")
        super().__init__(fabric, world, cfg, seed, name)
        self.racks = racks
        self.rack_of = [r * racks // world for r in range(world)]
        self.ctrl = _FanOut(self, SpineLeafControl([EngineControl(b) for b in buses[:-1]],
                                                   EngineControl(buses[-1])))

    @property
    def stats_per_engine(self) -> list[Counter]:
        """Each engine's job counters summed over the passes (leaves, then the spine)."""
        return self.ctrl.stats_per_engine

    @property
    def slots_per_engine(self) -> list[int]:
        """Slots each engine's jobs held when they were removed, summed over the passes."""
        return self.ctrl.slots_per_engine


@dataclass
class RackRun:
    """Outcome of :func:`run_rack_sim`; ``engines[name]``: that engine's job counters summed
    over the passes, ``slots_left[name]``: slots it held when its jobs were removed."""

    cfg: SimConfig
    racks: int
    ok: bool = False
    error: str | None = None
    error_kind: str | None = None
    sim_ns: int = 0
    wall_s: float = 0.0
    checks: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    engines: dict[str, dict] = field(default_factory=dict)
    slots_left: dict[str, int] = field(default_factory=dict)
    link_stats: dict = field(default_factory=dict)
    pcaps: list[str] = field(default_factory=list)


def run_rack_sim(cfg: SimConfig, racks: int, pcap: str | Path | None = None,
                 progress: Callable[[float], None] | None = None,
                 setup: Callable[[RackFabric], None] | None = None) -> RackRun:
    """One all-reduce of ``cfg.workers`` ranks in ``racks`` racks (module doc). Engines: the
    model (``cfg.backend`` "model") or one Verilator engine per switch ("verilator": the engine
    RTL built with flow roles, :class:`~netreduce.sim.rtl.rack_engine.RtlRackEngine`, untimed
    like the model; the collective's window is then
    :data:`~netreduce.sim.rtl.rack_engine.RACK_WINDOW`). ``cfg.ports`` and ``cfg.jobs`` must
    be their defaults (0, 1). ``setup(fabric)`` runs before the first frame (tests: targeted
    losses with :class:`~.network.DropOnce`)."""
    from ..model import Engine
    from .collective import run as run_ops
    from .scheduler import SimulationHang

    if not isinstance(racks, int) or not 2 <= racks <= MAX_RACKS:
        raise ValueError(f"racks must be 2..{MAX_RACKS}, got {racks!r}")
    if cfg.workers % racks:
        raise ValueError(f"workers {cfg.workers} is not a multiple of racks {racks}")
    if cfg.backend not in ("model", "verilator"):
        raise ValueError(f"backend {cfg.backend!r}: --racks runs on the model or verilator")
    if cfg.jobs != 1 or cfg.ports:
        raise ValueError(f"--racks runs one job with the default ports, got jobs {cfg.jobs}, "
                         f"ports {cfg.ports}")
    m = cfg.workers // racks
    names = engine_names(racks)
    caps = [Capture(None if pcap is None else f"{pcap}.{n}") for n in names]
    knobs = dict(pmtu=cfg.pmtu, sim_timeout_ns=cfg.timeout_ns, timeout=cfg.qp_timeout)
    if cfg.backend == "verilator":
        from ..backend import probe_backend
        from ..rtl.rack_engine import RACK_WINDOW, RtlRackEngine, rack_build_params

        probe_backend("verilator")  # BackendUnavailable, one line
        params = rack_build_params(cfg.workers, racks, cfg.pmtu)
        raw = [RtlRackEngine(params, seed=cfg.seed + i) for i in range(racks + 1)]
        knobs.update(window=RACK_WINDOW, exp_window=RACK_WINDOW, margin=RACK_WINDOW // 2,
                     msg_packets=RACK_WINDOW // 2)
    else:
        raw = [Engine(ports=m + 1 if i < racks else racks) for i in range(racks + 1)]
    engines = [TappedEngine(e, c) for e, c in zip(raw, caps, strict=True)]
    ccfg = CollectiveConfig(**knobs)
    out = RackRun(cfg, racks)
    for c in caps:
        if c.paths is not None:
            out.pcaps += [str(p) for p in c.paths]
    fab = RackFabric(racks, m, engines, net_config(cfg), cfg.seed)
    if setup is not None:
        setup(fab)
    comm = RackCommunicator(fab, cfg.workers, racks, ccfg, seed=cfg.seed, name="g0")
    xs = make_inputs(cfg, 0)
    t0 = time.perf_counter()
    op = None
    try:
        op = comm.allreduce_async(xs)
        run_ops(fab, [op], timeout_ns=cfg.timeout_ns, progress=progress)
    except SimulationHang as e:
        out.error, out.error_kind = f"watchdog: {e}", "hang"
    except RCError as e:
        out.error, out.error_kind = f"RC error: {e}", "rc_error"
    finally:
        for c in caps:
            c.close()
    out.wall_s = time.perf_counter() - t0
    out.sim_ns = fab.now()
    out.link_stats = {k: dict(v) for k, v in fab.link_stats().items()}
    out.engines = {n: dict(c) for n, c in zip(names, comm.stats_per_engine, strict=True)}
    if out.error is None:
        res = op.result()
        out.checks.append(_check(cfg, xs, res, 0))
        out.stats = {k: v for k, v in res.stats.items() if isinstance(v, int)}
    elif op is not None:
        op.abort()
    # what each engine held when its jobs were removed (and holds now: nothing, jobs are gone)
    left = Counter()
    for n, e in zip(names, engines, strict=True):
        left[n] = e.engine.slots_in_use()
        if hasattr(e.engine, "close"):
            e.engine.close()
    for n, v in zip(names, comm.slots_per_engine, strict=True):
        left[n] += v
    out.slots_left = dict(left)
    out.ok = (out.error is None and not any(out.slots_left.values()) and bool(out.checks)
              and all(c["ok"] for c in out.checks))
    return out
