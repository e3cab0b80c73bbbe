"""``netreduce sim``'s engine: N software RC endpoints all-reduce through an engine backend.

:func:`run_sim` builds a star network (:mod:`.network`) of N :class:`~netreduce.sim.net.rnic.RNIC`
ranks around an engine backend (:func:`get_backend`), runs one all-reduce with the
collective driver, and returns a :class:`SimRun`: the result check, the driver's statistics, the
engine counters and a :class:`Capture` of every frame entering and leaving the engine (optionally
streamed to ``PREFIX.in.pcap`` / ``PREFIX.out.pcap``). :mod:`.report` turns it into the JSON report,
the terminal summary and the plot.

Backends
    A backend builds the fabric: ``make(cfg, net, capture) -> Fabric`` whose middle is an engine
    and which calls ``capture.frame_in(port, frame, cycle)`` / ``capture.frame_out(...)`` for
    every frame entering / leaving the engine, ``cycle`` counted at :data:`CLOCK_HZ`. ``model`` is
    the bit-exact reference engine (untimed: results leave in the cycle their last contribution
    arrived). ``verilator`` and ``icarus`` run the engine's RTL
    (:mod:`netreduce.sim.rtl.fabric`; their probe raises :class:`BackendUnavailable` when the
    simulator or the engine top is missing). The names are those of the one engine registry
    (:mod:`netreduce.sim.backend`); :func:`register_backend` adds a variant (a test build).

Ports
    The engine gets ``cfg.ports`` Ethernet ports (default: one per rank); rank r's up link enters
    port r mod ports, and each result leaves on the port its rank's frame came in on. With
    ``cfg.port_gbps`` > 0 the ranks sit on a ToR switch and the engine hangs off it by those
    ports at that rate (:mod:`.topology`: steering per flow, the model engine timed);
    ``cfg.stripes`` splits each all-reduce over engine ports (and ``cfg.engines`` engines).

Errors
    Bad configuration: ``ValueError`` naming the value. Hang: the driver's watchdog raises
    :class:`~netreduce.sim.net.scheduler.SimulationHang`; an RC error
    :class:`~netreduce.sim.net.rnic.RCError`. Both are caught and returned in ``SimRun.error``
    (with the capture so far), so the caller can still write the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from netreduce.sim.net.collective import CollectiveConfig, Communicator
from netreduce.sim.net.rnic import RCError
from netreduce.sim.net.scheduler import SimulationHang
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import CLOCK_HZ
from netreduce.regmap.clock import cycles_to_ns
from netreduce.wire import IP_PROTO_UDP, OPCODES
from netreduce.wire.fields import AETH, BTH, UDP
from netreduce.wire.pcap import PcapWriter
from netreduce.wire.view import (
    BTH_OFF,
    DPORT_AT,
    ETHERTYPE_IPV4_BYTES,
    ETHERTYPE_OFF,
    EXT_OFF,
    IPV4_OFF,
    OP_ACK,
    PROTO_AT,
    ROCEV2_PORT_BYTES,
    SRC_IP_AT,
    UDP_LEN_AT,
)

from .. import backend as engines
from ..backend import BackendUnavailable
from .model_fabric import ModelFabric
from .network import LinkConfig, NetConfig

__all__ = ["CLOCK_HZ", "SimConfig", "SimRun", "Capture", "Backend", "BACKENDS",
           "BackendUnavailable", "register_backend", "get_backend", "run_sim", "make_inputs",
           "cycles_to_ns", "wire_limit_gbps", "WIRE_OVERHEAD", "net_config"]

#: Bytes per frame on the wire besides the payload (docs/roce.md): preamble+SFD 8, IFG 12, Ethernet
#: 14, IPv4 20, UDP 8, BTH 12, ICRC 4, FCS 4.
WIRE_OVERHEAD = 82


def wire_limit_gbps(pmtu: int, link_gbps: float = 100.0) -> float:
    """Payload goodput ceiling of one link at full-PMTU packets (docs/roce.md table)."""
    return link_gbps * pmtu / (pmtu + WIRE_OVERHEAD)


@dataclass(frozen=True)
class SimConfig:
    """One ``netreduce sim`` run. Sizes in bytes, probabilities per frame on every link."""

    workers: int = 4
    size: int = 1 << 20
    dtype: str = "float32"
    pmtu: int = 1024
    jobs: int = 1
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    seed: int = 1
    backend: str = "model"
    ports: int = 0  # 0: one engine port per rank
    link_gbps: float = 100.0
    # > 0: the ToR topology (.topology): workers at link_gbps on a switch, the engine (timed on
    # the model) attached by `nports` links of port_gbps; 0: the star, each rank's link is an
    # engine port and the model engine is untimed
    port_gbps: float = 0.0
    stripes: int = 1  # each all-reduce split across this many engine jobs, stripe e on port e
    engines: int = 1  # engines on the ToR switch (model backend), each with `ports` ports
    latency_ns: int = 500
    timeout_ns: int = 10_000_000_000  # watchdog on simulated time
    ack_priority: bool = True  # ACK/NAK/CNP overtake queued data on a link (see net_config)
    qp_timeout: int = 8  # RC local ACK timeout exponent: 4.096 us * 2^t (8: 1.05 ms)

    def __post_init__(self):
        if not isinstance(self.workers, int) or not 2 <= self.workers <= 64:
            raise ValueError(f"workers must be 2..64, got {self.workers!r}")
        if not isinstance(self.size, int) or self.size < 4 or self.size % 4:
            raise ValueError(f"size must be a positive multiple of 4 bytes, got {self.size!r}")
        if self.dtype not in ("float32", "int32"):
            raise ValueError(f"dtype must be float32 or int32, got {self.dtype!r}")
        if not isinstance(self.jobs, int) or not 1 <= self.jobs <= 4:
            raise ValueError(f"jobs must be 1..4 (concurrent all-reduces), got {self.jobs!r}")
        if not isinstance(self.ports, int) or self.ports < 0:
            raise ValueError(f"ports must be >= 0 (0: one per rank), got {self.ports!r}")
        if not isinstance(self.stripes, int) or not 1 <= self.stripes <= 8:
            raise ValueError(f"stripes must be 1..8, got {self.stripes!r}")
        if self.stripes > 1 and self.size // 4 < self.stripes:
            raise ValueError(f"size {self.size} B has fewer elements than stripes "
                             f"{self.stripes}")
        if not isinstance(self.engines, int) or not 1 <= self.engines <= 8:
            raise ValueError(f"engines must be 1..8, got {self.engines!r}")
        if self.engines > 1 and not (self.port_gbps and self.backend == "model"):
            raise ValueError(f"engines {self.engines}: several engines need the ToR topology "
                             "(port_gbps > 0) and the model backend")
        if not (isinstance(self.port_gbps, int | float) and 0 <= self.port_gbps <= 1000):
            raise ValueError(f"port_gbps must be 0 (star) or an engine port rate in Gb/s up to "
                             f"1000, got {self.port_gbps!r}")
        LinkConfig(latency_ns=self.latency_ns, gbps=self.link_gbps, loss=self.loss, dup=self.dup,
                   reorder=self.reorder)  # validates the link parameters
        CollectiveConfig(pmtu=self.pmtu, timeout=self.qp_timeout)  # validates PMTU, timeout

    @property
    def nports(self) -> int:
        """Engine ports in all (every engine's, engine k's numbered from k x per-engine)."""
        return (self.ports or self.workers) * self.engines


# ---------------------------------------------------------------------------------- capture
_MIN_RECORD = EXT_OFF + AETH.size  # a RoCEv2 frame with room for an AETH
_PSN = BTH_OFF + BTH.psn.offset
_ULEN = IPV4_OFF + UDP_LEN_AT
_PAD = BTH_OFF + BTH.padcnt.offset
_BTH_ICRC = UDP.size + BTH.size + 4  # UDP and BTH headers, ICRC
# extension-header bytes after the BTH per opcode (docs/roce.md), for the payload length
_EXT = {int(code): o.ext_len for code, o in OPCODES.items()
        if o.ext_len and o.transport in ("RC", "CNP")}
_DQPN = BTH_OFF + BTH.dqpn.offset
_SRC_IP = IPV4_OFF + SRC_IP_AT


class Capture:
    """Every frame entering and leaving the engine, as compact records (and optionally pcaps).

    ``ins``/``outs`` hold ``(cycle, port, src_ip, dqpn, opcode, psn, aux)`` tuples for RoCEv2
    frames: ``aux`` is the payload length for data opcodes and the AETH syndrome for ACKs. Other
    frames only count (``other_in``/``other_out``). pcap timestamps are ``cycle`` at CLOCK_HZ in
    nanoseconds, so they are monotonic per file (the engine emits in time order).
    """

    def __init__(self, prefix: str | Path | None = None):
        self.ins: list[tuple] = []
        self.outs: list[tuple] = []
        self.other_in = self.other_out = 0
        self.paths: tuple[Path, Path] | None = None
        self._w = None
        if prefix is not None:
            p = str(prefix)
            self.paths = (Path(p + ".in.pcap"), Path(p + ".out.pcap"))
            self._w = (PcapWriter(self.paths[0]), PcapWriter(self.paths[1]))

    @staticmethod
    def _record(cycle: int, port: int, f: bytes):
        # the view's offsets inline (is_roce, payload_len): this runs for every engine frame
        if (len(f) < _MIN_RECORD or f[ETHERTYPE_OFF:ETHERTYPE_OFF + 2] != ETHERTYPE_IPV4_BYTES
                or f[IPV4_OFF + PROTO_AT] != IP_PROTO_UDP
                or f[IPV4_OFF + DPORT_AT:IPV4_OFF + DPORT_AT + 2] != ROCEV2_PORT_BYTES):
            return None
        op = f[BTH_OFF]
        if op == OP_ACK:
            aux = f[EXT_OFF]  # the AETH syndrome
        else:
            udp_len = (f[_ULEN] << 8) | f[_ULEN + 1]
            aux = udp_len - _BTH_ICRC - _EXT.get(op, 0) - ((f[_PAD] >> 4) & 3)
        return (cycle, port, f[_SRC_IP:_SRC_IP + 4], int.from_bytes(f[_DQPN:_DQPN + 3], "big"),
                op, int.from_bytes(f[_PSN:_PSN + 3], "big"), aux)

    def frame_in(self, port: int, frame: bytes, cycle: int) -> None:
        r = self._record(cycle, port, frame)
        if r is None:
            self.other_in += 1
        else:
            self.ins.append(r)
        if self._w is not None:
            self._w[0].write(frame, cycles_to_ns(cycle))

    def frame_out(self, port: int, frame: bytes, cycle: int) -> None:
        r = self._record(cycle, port, frame)
        if r is None:
            self.other_out += 1
        else:
            self.outs.append(r)
        if self._w is not None:
            self._w[1].write(frame, cycles_to_ns(cycle))

    def close(self) -> None:
        if self._w is not None:
            for w in self._w:
                w.close()


class TappedEngine:
    """Wraps an engine object (``receive(port, frame, cycle) -> [Emit]``, ``bus``) and reports
    every frame in and out to a :class:`Capture`. Behaviour is the wrapped engine's."""

    def __init__(self, engine, capture: Capture):
        self.engine = engine
        self.capture = capture
        self.bus = engine.bus

    def receive(self, port: int, frame: bytes, time: int):
        self.capture.frame_in(port, frame, time)
        emits = self.engine.receive(port, frame, time)
        for e in emits:
            self.capture.frame_out(e.port, e.frame, e.time)
        return emits

    def __getattr__(self, name):
        return getattr(self.engine, name)


# ---------------------------------------------------------------------------------- backends
@dataclass(frozen=True)
class Backend:
    """``make(cfg, net, capture)`` builds the fabric; ``probe()`` raises
    :class:`BackendUnavailable` (one-line message) if the backend cannot run here (missing
    simulator, no engine top), before anything is built."""

    name: str
    description: str
    make: Callable  # (SimConfig, NetConfig, Capture) -> Fabric with an engine in the middle
    probe_fn: Callable[[], None] | None = None

    def probe(self) -> None:
        if self.probe_fn is not None:
            self.probe_fn()


#: Variants registered on top of the engine registry (a test or bench build of a backend, a
#: fabric with other options); every engine backend of :data:`netreduce.sim.backend.BACKENDS`
#: is available by its name without an entry here.
BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, description: str, make: Callable,
                     probe: Callable[[], None] | None = None) -> None:
    """Add or replace a variant (e.g. an RTL backend with a small test build)."""
    BACKENDS[name] = Backend(name, description, make, probe)


def get_backend(name: str) -> Backend:
    """The variant ``name``, else the fabric around engine backend ``name`` of the one registry
    (:func:`netreduce.sim.backend.get_backend`: ``ValueError`` naming an unknown one)."""
    b = BACKENDS.get(name)
    if b is not None:
        return b
    engine = engines.get_backend(name)
    if engine.simulator is None:
        return Backend(name, _MODEL_DESCRIPTION, _make_model)
    from ..rtl.fabric import make_rtl_backend

    return Backend(name, *make_rtl_backend(name))


_MODEL_DESCRIPTION = ("bit-exact reference engine model (in-process; timed from the RTL's "
                      "figures in the ToR topology, untimed in the star)")


def _make_model(cfg: SimConfig, net: NetConfig, capture: Capture):
    if cfg.port_gbps:
        from .topology import make_tor_model
        return make_tor_model(cfg, net, capture)
    nports = cfg.nports
    eng = TappedEngine(engines.open_engine("model", {"ports": nports}), capture)
    # each rank's MAC is registered before its first frame (see run_sim: port_of)
    fab = ModelFabric(engine=eng, net=net, seed=cfg.seed)
    fab.rank_of_mac = {}
    fab.port_of = lambda mac: fab.rank_of_mac.get(mac, 0) % nports
    return fab


# ---------------------------------------------------------------------------------- the run
def net_config(cfg: SimConfig) -> NetConfig:
    """The links of a run: ``cfg``'s bandwidth, latency and faults on every link and direction;
    with ``cfg.ack_priority`` ACK/NAK/CNP frames do not queue behind data (a NIC arbitrates its
    TX per packet; the endpoint model hands the link up to rxe's 128 packets at once, so a FIFO
    would hold an ACK back by up to 128 data packets)."""
    base = LinkConfig(latency_ns=cfg.latency_ns, gbps=cfg.link_gbps, loss=cfg.loss, dup=cfg.dup,
                      reorder=cfg.reorder)
    if not cfg.ack_priority:
        return NetConfig(base)
    ack = replace(base, priority=True)
    return NetConfig(base, overrides={("up", "ack"): ack, ("down", "ack"): ack})


def make_inputs(cfg: SimConfig, seed_offset: int = 0) -> list[np.ndarray]:
    """Seeded per-rank inputs: int32 uniform over the whole range (the sum wraps); float32
    gradients with per-rank magnitudes spanning 6 decades (as ``netreduce demo``)."""
    rng = np.random.default_rng([cfg.seed, seed_offset])
    n = cfg.size // 4
    if cfg.dtype == "int32":
        return [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
                for _ in range(cfg.workers)]
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
            for _ in range(cfg.workers)]


@dataclass
class FlowInfo:
    """One registered flow (rank r of a pass): keys as the engine sees them, for the analysis."""

    pass_id: str  # "g<group>.<tag>": one engine job (tag "sum", or "exp": the float MAX pass)
    op: str
    rank: int
    src_ip: str
    dqpn: int  # forward key: source IPv4 of r, DestQP of the successor's receive QP
    rev_ip: str
    rev_qpn: int  # reverse key: source IPv4 of the successor, DestQP of r's send QP
    start_psn: int
    port: int
    packets: int
    group: int = 0  # which concurrent all-reduce (--jobs)


@dataclass
class SimRun:
    cfg: SimConfig
    ok: bool = False
    error: str | None = None  # hang / RC error message (one line)
    error_kind: str | None = None
    sim_ns: int = 0
    wall_s: float = 0.0
    checks: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)  # driver stats summed over groups
    engine_counters: dict = field(default_factory=dict)  # engine-wide counters
    job_counters: dict = field(default_factory=dict)  # summed per-job counters of every pass
    slots_left: int = 0
    link_stats: dict = field(default_factory=dict)
    flows: list[FlowInfo] = field(default_factory=list)
    capture: Capture | None = None
    frames_per_s: float = 0.0

    @property
    def cycles(self) -> int:
        return self.sim_ns * CLOCK_HZ // 1_000_000_000

    def config_dict(self) -> dict:
        return asdict(self.cfg)


def _check(cfg: SimConfig, xs: list[np.ndarray], res, group: int) -> dict:
    if cfg.dtype == "int32":
        ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
        bad = [r for r, y in enumerate(res.results) if not np.array_equal(y, ref)]
        nbad = max((int(np.count_nonzero(y != ref)) for y in res.results), default=0)
        return {"group": group, "kind": "int32 bit-exact vs integer sum (two's complement)",
                "ok": not bad, "mismatched_ranks": bad, "mismatched_elements": nbad}
    ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
    bound = res.error_bound()
    err = [np.abs(y.astype(np.float64) - ref) for y in res.results]
    worst = max(float(np.max(e / bound)) for e in err)
    same = all(np.array_equal(y, res.results[0]) for y in res.results)
    return {"group": group, "kind": "float32 vs float64 sum, error within the quantisation bound",
            "ok": bool(worst <= 1.0 and same), "max_abs_error": max(float(np.max(e)) for e in err),
            "max_bound": float(np.max(bound)), "worst_error_over_bound": worst,
            "ranks_identical": same}


def run_sim(cfg: SimConfig, pcap: str | Path | None = None,
            progress: Callable[[float], None] | None = None) -> SimRun:
    """Run one all-reduce per group (``cfg.jobs`` concurrent groups of ``cfg.workers`` ranks,
    each its own engine job) and check it; see the module docstring."""
    from netreduce.sim.net.collective import run as run_ops

    backend = get_backend(cfg.backend)
    backend.probe()
    net = net_config(cfg)
    out = SimRun(cfg)
    cap = Capture(pcap)
    out.capture = cap
    try:
        fab = backend.make(cfg, net, cap)
    except BaseException:
        cap.close()
        raise
    ccfg = CollectiveConfig(pmtu=cfg.pmtu, sim_timeout_ns=cfg.timeout_ns, timeout=cfg.qp_timeout)
    comms, ops, inputs = [], [], []
    for g in range(cfg.jobs):
        comm = Communicator(fab, cfg.workers, ccfg, seed=cfg.seed, name=f"g{g}")
        for r, rn in enumerate(comm.rnics):
            if hasattr(fab, "rank_of_mac"):
                fab.rank_of_mac[rn.mac] = r
        comms.append(comm)
        inputs.append(make_inputs(cfg, g))
    t0 = time.perf_counter()
    try:
        from .stripe import striped_allreduce_async

        buses = getattr(fab, "buses", None) if cfg.engines > 1 else None
        ops = [striped_allreduce_async(c, x, cfg.stripes, buses=buses)
               for c, x in zip(comms, inputs, strict=True)]
        run_ops(fab, ops, timeout_ns=cfg.timeout_ns, progress=progress)
    except SimulationHang as e:
        out.error, out.error_kind = f"watchdog: {e}", "hang"
    except RCError as e:
        out.error, out.error_kind = f"RC error: {e}", "rc_error"
    finally:
        cap.close()
    out.wall_s = time.perf_counter() - t0
    out.sim_ns = fab.now()
    nframes = len(cap.ins) + len(cap.outs) + cap.other_in + cap.other_out
    out.frames_per_s = nframes / out.wall_s if out.wall_s > 0 else 0.0
    out.link_stats = {d: dict(c) for d, c in fab.link_stats().items()}
    ctrls = [EngineControl(b) for b in getattr(fab, "buses", [fab.bus])]
    counters: dict = {}
    for c in ctrls:  # summed over the engines (one in all but multi-engine runs)
        for k, v in c.counters().items():
            counters[k] = counters.get(k, 0) + v
    out.engine_counters = counters
    # flows of every pass (also of failed runs: the passes that started)
    nports = cfg.nports
    steered = hasattr(fab, "steer_flows")  # a stripe's port is real only behind the ToR
    for g, op in enumerate(ops):
        rn = op.comm.rnics
        n = cfg.workers
        for p in op.passes:
            for r in range(min(n, len(p.sq))):
                if len(p.rq) < n:
                    continue
                out.flows.append(FlowInfo(
                    pass_id=f"g{g}.{p.tag}", op=p.op.name, rank=r,
                    src_ip=_ip(rn[r].ip), dqpn=p.rq[(r + 1) % n].qpn,
                    rev_ip=_ip(rn[(r + 1) % n].ip), rev_qpn=p.sq[r].qpn,
                    start_psn=p.sq[r].start_psn,
                    port=(p.port if steered and getattr(p, "port", None) is not None
                          else r) % nports,
                    packets=p.total_pkts,
                    group=g))
    if out.error is None:
        stats: dict = {}
        eng: dict = {}
        for g, (op, xs) in enumerate(zip(ops, inputs, strict=True)):
            res = op.result()
            out.checks.append(_check(cfg, xs, res, g))
            for k, v in res.stats.items():
                if isinstance(v, int):
                    stats[k] = stats.get(k, 0) + v
            for k, v in res.stats["engine"].items():
                eng[k] = eng.get(k, 0) + v
        out.stats, out.job_counters = stats, eng
        out.slots_left = stats.get("slots_left", 0) + sum(c.slots_in_use() for c in ctrls)
    else:
        for op in ops:
            op.abort()
        out.slots_left = sum(c.slots_in_use() for c in ctrls)
    out.ok = (out.error is None and out.slots_left == 0 and bool(out.checks)
              and all(c["ok"] for c in out.checks))
    return out


def _ip(v: int) -> str:
    return ".".join(str((v >> s) & 0xFF) for s in (24, 16, 8, 0))
