"""``netreduce replay``'s logic: program jobs from a TOML file, replay a pcap through an engine.

:func:`load_config` parses and validates the configuration (format: docs/replay.md),
:func:`read_capture` reads the input frames, :func:`run_replay` opens an engine backend of the
one registry (:mod:`netreduce.sim.backend`), programs the jobs through
:class:`~netreduce.sw_driver.control.EngineControl` over the engine's register bus, feeds the
frames in capture order and returns a :class:`ReplayRun` with every emitted frame and the
counters read back through the bus.

Errors
    Every problem with the user's input is a :class:`ReplayError` whose message is one line
    naming the file, the key (``job[0].flow[2].fwd_ip``) or record, and the offending value; an
    unusable backend is :class:`~netreduce.sim.backend.BackendUnavailable` (one line). Job rules
    are not restated here: each job is checked by ``EngineControl.add_job`` on a throw-away
    reference model with the file's engine parameters (so cross-job conflicts such as
    overlapping slots or keys used twice are found before a slow RTL build), then again by the
    real engine.

Time
    Input record i at ``t_i`` ns enters at cycle ``ceil(t_i * f / 1e9) - ceil(t_0 * f / 1e9)``
    (f = :data:`~netreduce.regmap.CLOCK_HZ`), made non-decreasing (records whose timestamp goes
    backwards keep their capture position and enter with the previous frame's cycle; they are
    counted). The ceiling makes the conversion exact for captures written by ``netreduce sim``,
    whose timestamps are ``floor(cycle * 1e9 / f)``. An emitted frame at engine cycle c gets the
    timestamp ``floor((ceil(t_0 * f / 1e9) + c) * 1e9 / f)`` ns, so input and output captures
    share one time base. For the model only the CNP limiter looks at time.

Engines (the backends of :mod:`netreduce.sim.backend`, plus variants in :data:`ENGINES`)
    ``factory(params) -> ReplayEngine`` where ``params`` are the build parameters
    (:class:`EngineParams` as a dict). A :class:`ReplayEngine` has ``bus`` (the AXI4-Lite
    register bus), ``replay(frames) -> Iterable[Emit]`` (``frames``: ``(port, frame, cycle)``
    in order, cycles relative to the first frame; the emits' ``time`` on the same base,
    non-decreasing) and ``close()``. ``model`` wraps :class:`netreduce.sim.model.Engine`
    (untimed: an emit carries its input's cycle). ``verilator`` / ``icarus`` run the engine top
    built for ``params`` (:func:`netreduce.sim.rtl.backend.engine_top`) in the frame-level
    harness (FastSim / IcarusSim) through :class:`HarnessEngine`: frames are queued at their
    cycle, emits carry the cycle of their last beat. Their factories carry ``probe()``, which
    raises ``BackendUnavailable`` (one line) if the simulator, the harness or the engine top is
    missing.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol

from netreduce.sw_driver.control import ConfigError, EngineControl, FlowConfig, JobConfig

from netreduce.regmap import (
    ALL_GLOBAL_COUNTERS,
    CLOCK_HZ,
    DEFAULT_CNP_INTERVAL,
    DEFAULT_PARAMS,
    JOB_COUNTERS,
    Op,
    RegisterBus,
)
from netreduce.regmap.clock import cycles_to_ns
from netreduce.wire.fields import DOT1Q, ETHERTYPE_QINQ, ETHERTYPE_VLAN
from netreduce.wire.pcap import iter_pcap
from netreduce.wire.view import ETHERTYPE_IPV4_BYTES, ETHERTYPE_OFF, SRC_IP_AT, src_ip, src_mac

from .. import backend as engines
from ..model import Emit
from ..rtl.backend import HarnessBus

__all__ = ["ReplayError", "EngineParams", "ReplayConfig", "ReplayEngine", "ENGINES",
           "InputFrame", "Capture", "ReplayRun", "load_config", "parse_config", "read_capture",
           "parse_port_map", "assign_ports", "probe_backend", "open_engine", "run_replay",
           "ns_to_cycle_ceil", "config_toml_from_sim_report", "OPS", "HarnessEngine",
           "rtl_factory", "counter_rows", "program"]

#: ``op`` values in the config file.
OPS = {"sum_wrap": Op.SUM_WRAP, "sum_sat": Op.SUM_SAT, "max": Op.MAX}
_PARAM_KEYS = tuple(k for k in DEFAULT_PARAMS if k != "clock_hz")
_JOB_KEYS = {"id", "world", "window", "slot_base", "pmtu", "op", "cnp_interval", "flow"}
_JOB_REQUIRED = ("id", "world", "window", "pmtu", "op", "flow")
_FLOW_KEYS = ("rank", "fwd_ip", "fwd_qpn", "rev_ip", "rev_qpn", "start_psn")
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"


class ReplayError(ValueError):
    """Bad configuration, capture or option; the message is one line naming the value."""


# ---------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class EngineParams:
    """Build parameters of the replay engine (``[engine]`` table; defaults = the regmap's)."""

    ports: int = 1
    jobs: int = DEFAULT_PARAMS["jobs"]
    flows: int = DEFAULT_PARAMS["flows"]
    slots: int = DEFAULT_PARAMS["slots"]
    pmtu_max: int = DEFAULT_PARAMS["pmtu_max"]
    data_width: int = DEFAULT_PARAMS["data_width"]
    max_world: int = DEFAULT_PARAMS["max_world"]


@dataclass
class ReplayConfig:
    """A parsed configuration file. Jobs whose ``slot_base`` the file leaves out are listed in
    ``auto_slots``; :func:`program` allocates them (``EngineControl.alloc_slots``, file order)
    on every engine it programs, and ``slot_base`` holds the last allocation."""

    path: str
    engine: EngineParams
    jobs: list[JobConfig] = field(default_factory=list)
    auto_slots: set[int] = field(default_factory=set)  # job ids whose slot_base was allocated


def _show(v) -> str:
    if isinstance(v, bool):  # as written in TOML
        return "true" if v else "false"
    return repr(v)


def _int(where: str, key: str, v, *, hex_ok: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str) or (isinstance(v, str) and not hex_ok):
        kind = "an integer or a hex string" if hex_ok else "an integer"
        raise ReplayError(f"{where}.{key} = {_show(v)} must be {kind}")
    if isinstance(v, str):
        s = v.strip().lower()
        try:
            if not s.startswith("0x"):
                raise ValueError
            return int(s, 16)
        except ValueError:
            raise ReplayError(f"{where}.{key} = {_show(v)} is not a hex string like "
                              "'0x12ab' (or write an integer)") from None
    return v


def _ip(where: str, key: str, v) -> int:
    if not isinstance(v, str):
        raise ReplayError(f"{where}.{key} = {_show(v)} must be a dotted IPv4 string like "
                          "'10.0.0.1'")
    try:
        return int(ipaddress.IPv4Address(v.strip()))
    except ValueError:
        raise ReplayError(f"{where}.{key} = {_show(v)} is not a dotted IPv4 address") from None


def _unknown(where: str, table: dict, known) -> None:
    extra = [k for k in table if k not in known]
    if extra:
        raise ReplayError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")


def _need(where: str, table: dict, keys) -> None:
    for k in keys:
        if k not in table:
            raise ReplayError(f"{where}: missing key {k!r}")


def _flow(where: str, t, index: int) -> FlowConfig:
    if not isinstance(t, dict):
        raise ReplayError(f"{where} = {_show(t)} must be a [[job.flow]] table")
    _unknown(where, t, _FLOW_KEYS)
    _need(where, t, [k for k in _FLOW_KEYS if k != "rank"])
    return FlowConfig(
        rank=_int(where, "rank", t["rank"]) if "rank" in t else index,
        fwd_ip=_ip(where, "fwd_ip", t["fwd_ip"]),
        fwd_qpn=_int(where, "fwd_qpn", t["fwd_qpn"], hex_ok=True),
        rev_ip=_ip(where, "rev_ip", t["rev_ip"]),
        rev_qpn=_int(where, "rev_qpn", t["rev_qpn"], hex_ok=True),
        start_psn=_int(where, "start_psn", t["start_psn"], hex_ok=True))


def _job(where: str, t) -> tuple[JobConfig, bool]:
    if not isinstance(t, dict):
        raise ReplayError(f"{where} = {_show(t)} must be a [[job]] table")
    _unknown(where, t, _JOB_KEYS)
    _need(where, t, _JOB_REQUIRED)
    op = t["op"]
    if not isinstance(op, str) or op.lower() not in OPS:
        raise ReplayError(f"{where}.op = {_show(op)} is not one of {', '.join(OPS)}")
    flows = t["flow"]
    if not isinstance(flows, list):
        raise ReplayError(f"{where}.flow = {_show(flows)} must be an array of [[job.flow]] "
                          "tables")
    job = JobConfig(
        job=_int(where, "id", t["id"]),
        world=_int(where, "world", t["world"]),
        window=_int(where, "window", t["window"]),
        slot_base=_int(where, "slot_base", t["slot_base"]) if "slot_base" in t else 0,
        pmtu=_int(where, "pmtu", t["pmtu"]),
        op=OPS[op.lower()],
        flows=[_flow(f"{where}.flow[{k}]", f, k) for k, f in enumerate(flows)],
        cnp_interval=(_int(where, "cnp_interval", t["cnp_interval"])
                      if "cnp_interval" in t else DEFAULT_CNP_INTERVAL))
    if len(job.flows) != job.world:
        raise ReplayError(f"{where}: world = {job.world} but {len(job.flows)} [[job.flow]] "
                          f"table(s) given (one per rank)")
    return job, "slot_base" not in t


def parse_config(data: dict, path: str = "<config>") -> ReplayConfig:
    """Validate a decoded TOML document (see the module doc); :class:`ReplayError` names
    ``path``, the key and the value."""
    where = str(path)
    try:
        _unknown("top level", data, ("engine", "job"))
        eng = data.get("engine", {})
        if not isinstance(eng, dict):
            raise ReplayError(f"engine = {_show(eng)} must be an [engine] table")
        _unknown("engine", eng, _PARAM_KEYS)
        params = {k: _int("engine", k, v) for k, v in eng.items()}
        for k, v in params.items():
            if v < 1:
                raise ReplayError(f"engine.{k} = {v} must be >= 1")
        ep = EngineParams(**params)
        jobs_t = data.get("job")
        if jobs_t is None:
            raise ReplayError("no [[job]] table (at least one job is needed)")
        if not isinstance(jobs_t, list):
            raise ReplayError(f"job = {_show(jobs_t)} must be an array of [[job]] tables")
        cfg = ReplayConfig(where, ep)
        seen: dict[int, int] = {}
        for i, t in enumerate(jobs_t):
            job, auto = _job(f"job[{i}]", t)
            if not 0 <= job.job < ep.jobs:
                raise ReplayError(f"job[{i}].id = {job.job} outside 0..{ep.jobs - 1} "
                                  f"(engine.jobs = {ep.jobs})")
            if job.job in seen:
                raise ReplayError(f"job[{i}].id = {job.job} already used by job[{seen[job.job]}]")
            seen[job.job] = i
            cfg.jobs.append(job)
            if auto:
                cfg.auto_slots.add(job.job)
        _dry_run(cfg)
    except ReplayError as e:
        raise ReplayError(f"{where}: {e}") from None
    return cfg


def _dry_run(cfg: ReplayConfig) -> None:
    """Program every job into a reference model with the file's parameters: the driver's own
    checks (ranges, keys, slot overlap, flow-table room) with their messages."""
    from ..model import Engine

    try:
        eng = Engine(**asdict(cfg.engine))
    except (ValueError, TypeError) as e:
        raise ReplayError(f"engine: {e}") from None
    program(EngineControl(eng.bus), cfg)


def program(ctrl: EngineControl, cfg: ReplayConfig) -> None:
    """Add every job of ``cfg`` in file order (allocating the slot bases left open)."""
    for i, job in enumerate(cfg.jobs):
        try:
            if job.job in cfg.auto_slots:
                job.slot_base = ctrl.alloc_slots(job.window)
            ctrl.add_job(job)
        except ConfigError as e:
            msg, own = str(e), f"job {job.job}"
            if msg.startswith(own + " ") or msg.startswith(own + ":"):
                msg = msg[len(own):].lstrip(":")  # the driver's "job 0: ..." names the id
                raise ReplayError(f"job[{i}] (id {job.job}){':' if msg[0] == ' ' else ''}"
                                  f"{msg}") from None
            raise ReplayError(f"job[{i}] (id {job.job}): {msg}") from None


def load_config(path) -> ReplayConfig:
    """Read and validate a configuration file (TOML)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ReplayError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ReplayError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ReplayError(f"{path}: not valid TOML: {e}") from None
    return parse_config(data, str(path))


# ---------------------------------------------------------------------------------- capture
def ns_to_cycle_ceil(ns: int) -> int:
    """The first cycle whose floor-converted timestamp is ``ns`` (inverse of cycles_to_ns)."""
    return -(-ns * CLOCK_HZ // 1_000_000_000)


@dataclass(frozen=True)
class InputFrame:
    record: int
    time_ns: int
    cycle: int  # relative to the first record's cycle
    data: bytes


@dataclass
class Capture:
    path: str
    frames: list[InputFrame]
    base_cycle: int  # absolute cycle of the first record's timestamp
    backwards: int  # records whose timestamp went backwards (entered with the previous cycle)
    removed: int = 0  # idle cycles taken out by max_gap


def read_capture(path, max_gap: int | None = None) -> Capture:
    """Every record of a classic libpcap file (Ethernet). pcapng, other link types, records
    cut short, frames cut by the snap length and empty records are :class:`ReplayError`.
    ``max_gap``: idle gaps between consecutive frames longer than this many cycles are shortened
    to it (all later frames move earlier; ``Capture.removed`` counts the cycles taken out)."""
    if max_gap is not None and (isinstance(max_gap, bool) or not isinstance(max_gap, int)
                                or max_gap < 0):
        raise ReplayError(f"--max-gap {max_gap!r} must be a cycle count >= 0")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ReplayError(f"{path}: cannot read: {e.strerror}") from None
    if magic == _PCAPNG_MAGIC:
        raise ReplayError(f"{path}: pcapng is not supported; convert it with "
                          f"'editcap -F pcap {path} OUT.pcap'")
    frames: list[InputFrame] = []
    base = last = 0
    backwards = removed = 0
    try:
        for n, rec in enumerate(iter_pcap(path)):
            if len(rec.data) < rec.orig_len:
                raise ReplayError(f"{path}: record {n} was cut by the capture's snap length "
                                  f"({len(rec.data)} of {rec.orig_len} B); capture with -s 0")
            if not rec.data:
                raise ReplayError(f"{path}: record {n} is empty (0 B)")
            c = ns_to_cycle_ceil(rec.time_ns)
            if n == 0:
                base = last = c
            if c < last:
                backwards += 1
                c = last
            if max_gap is not None and c - last > max_gap:
                removed += c - last - max_gap
            last = c
            frames.append(InputFrame(n, rec.time_ns, c - base - removed, rec.data))
    except ReplayError:
        raise
    except ValueError as e:  # iter_pcap: header, magic, link type, cut record
        raise ReplayError(str(e)) from None
    except OSError as e:
        raise ReplayError(f"{path}: cannot read: {e.strerror}") from None
    return Capture(str(path), frames, base, backwards, removed)


# ---------------------------------------------------------------------------------- ports
def parse_port_map(specs: Iterable[str]) -> tuple[dict[bytes, int], int]:
    """``--port-map`` values (``SRC=PORT``, comma-separated or repeated; SRC a dotted IPv4
    source address, a MAC source address ``aa:bb:cc:dd:ee:ff`` or ``*`` for frames nothing else
    matches) -> ({key: port}, default port). Keys: 4-byte IPv4 or 6-byte MAC."""
    mapping: dict[bytes, int] = {}
    default = 0
    for spec in specs:
        for item in str(spec).split(","):
            item = item.strip()
            if not item:
                continue
            src, sep, port_s = item.partition("=")
            src, port_s = src.strip(), port_s.strip()
            if not sep or not port_s.isdigit():
                raise ReplayError(f"--port-map {item!r}: expected SRC=PORT with SRC an IPv4 "
                                  "address, a MAC address or '*', and PORT a number")
            port = int(port_s)
            if src == "*":
                default = port
                continue
            try:
                key = ipaddress.IPv4Address(src).packed
            except ValueError:
                parts = src.replace("-", ":").split(":")
                if len(parts) != 6 or not all(len(p) == 2 for p in parts):
                    raise ReplayError(f"--port-map {item!r}: {src!r} is neither an IPv4 nor a "
                                      "MAC address") from None
                try:
                    key = bytes(int(p, 16) for p in parts)
                except ValueError:
                    raise ReplayError(f"--port-map {item!r}: {src!r} is not a MAC "
                                      "address") from None
            mapping[key] = port
    return mapping, default


_TAGS = (ETHERTYPE_VLAN.to_bytes(2, "big"), ETHERTYPE_QINQ.to_bytes(2, "big"))


def _ipv4_src(f: bytes) -> bytes | None:
    """The IPv4 source of a frame behind any number of VLAN tags (802.1Q, 802.1ad), else None."""
    et = ETHERTYPE_OFF
    while len(f) >= et + 2 and f[et:et + 2] in _TAGS:
        et += DOT1Q.size
    l3 = et + 2
    if len(f) < l3 + SRC_IP_AT + 4 or f[et:l3] != ETHERTYPE_IPV4_BYTES:
        return None
    return src_ip(f, l3)


def assign_ports(frames: list[InputFrame], mapping: dict[bytes, int], default: int,
                 ports: int) -> list[int]:
    """The engine port of every frame: its IPv4 source if mapped, else its MAC source, else
    ``default``. Ports must lie in 0..ports-1."""
    for key, p in [*mapping.items(), (b"*", default)]:
        if not 0 <= p < ports:
            name = "*" if key == b"*" else (str(ipaddress.IPv4Address(key)) if len(key) == 4
                                            else key.hex(":"))
            raise ReplayError(f"--port-map {name}={p}: port outside 0..{ports - 1} "
                              f"(engine.ports = {ports})")
    if not mapping:
        return [default] * len(frames)
    out = []
    for fr in frames:
        ip = _ipv4_src(fr.data)
        p = mapping.get(ip) if ip is not None else None
        if p is None:
            p = mapping.get(src_mac(fr.data), default)
        out.append(p)
    return out


# ---------------------------------------------------------------------------------- engines
class ReplayEngine(Protocol):
    bus: RegisterBus

    def replay(self, frames: Iterable[tuple[int, bytes, int]]) -> Iterable[Emit]: ...

    def close(self) -> None: ...


class _ModelEngine:
    """The reference model: untimed, every emit carries its input's cycle."""

    def __init__(self, params: dict):
        self.engine = engines.open_engine("model", params)
        self.bus = self.engine.bus

    def replay(self, frames):
        rx = self.engine.receive
        for port, data, cycle in frames:
            yield from rx(port, data, cycle)

    def close(self) -> None:
        pass


class HarnessEngine:
    """A :class:`ReplayEngine` over a frame-level RTL harness: :class:`~netreduce.sim.rtl.
    fastsim.FastSim` (Verilator) or :class:`~netreduce.sim.rtl.icarus.IcarusSim` (same API)
    running a top with the engine's ports (input k = ``s_axis_p<k>``, output k =
    ``m_axis_p<k>``, ``s_axil``).

    Cycle 0 of the replay is the harness cycle in which the first frame is queued (after the
    register programming); frame i is queued once the harness reaches cycle ``c0 + cycle_i``
    (it then enters as soon as its port is free: the harness drives queued frames back to back
    and honours ``tready``). Emits carry the cycle of their last beat minus ``c0``. After the
    last frame the harness runs until nothing moved for ``quiet`` cycles (at most
    ``drain_limit`` cycles; a still-busy engine then raises ``RuntimeError``). Output frames
    flagged with ``tuser.error`` are kept and counted in :attr:`error_frames`.
    """

    def __init__(self, sim, *, quiet: int = 2000, drain_limit: int = 10_000_000):
        self.sim = sim
        self.bus = HarnessBus(sim)
        self.quiet, self.drain_limit = quiet, drain_limit
        self.error_frames = 0

    def _emit(self, rx, c0: int) -> Emit:
        self.error_frames += rx.error
        return Emit(rx.port, rx.frame, rx.cycle - c0)

    def replay(self, frames):
        sim = self.sim
        c0 = None
        for port, data, cycle in frames:
            if c0 is None:
                c0 = sim.cycle
            if c0 + cycle > sim.cycle:
                for rx in sim.run_until(c0 + cycle):
                    yield self._emit(rx, c0)
            sim.send(port, data)
        if c0 is None:
            c0 = sim.cycle
        for rx in sim.run(self.drain_limit, until_idle=True, quiet=self.quiet):
            yield self._emit(rx, c0)
        if not sim.idle():
            raise RuntimeError(f"engine still busy {self.drain_limit} cycles after the last "
                               f"frame (harness stats {sim.stats()})")

    def close(self) -> None:
        self.sim.close()


def rtl_factory(simulator: str, top_factory: Callable | None = None,
                ) -> Callable[[dict], ReplayEngine]:
    """Factory of a :class:`HarnessEngine` under ``simulator`` (``verilator``: FastSim,
    ``icarus``: IcarusSim) running ``top_factory(params) -> AxisTop``; default: the engine top
    for ``params`` (:func:`netreduce.sim.rtl.backend.engine_top`, elaboration cached). The
    factory's ``probe()`` raises ``BackendUnavailable`` (one line) if the simulator, the harness
    or (by default) the engine top is missing."""
    def probe() -> None:
        engines.probe_backend(simulator, need_engine=top_factory is None)

    def factory(params: dict) -> ReplayEngine:
        probe()
        top = None if top_factory is None else top_factory(params)
        sim = engines.open_engine(simulator, params, top=top)
        return HarnessEngine(sim)
    factory.probe = probe
    return factory


#: Variants on top of the engine registry: name -> factory(params dict) -> ReplayEngine (see the
#: module doc); every backend of :data:`netreduce.sim.backend.BACKENDS` is available by its name
#: without an entry here. A factory raises BackendUnavailable (one line) if it cannot run here.
ENGINES: dict[str, Callable[[dict], ReplayEngine]] = {}


def _factory(backend: str):
    f = ENGINES.get(backend)
    if f is not None:
        return f
    try:
        kind = engines.get_backend(backend)
    except ValueError:
        known = ", ".join(dict.fromkeys([*engines.BACKENDS, *ENGINES]))
        raise ReplayError(f"unknown backend {backend!r} (known: {known})") from None
    return _ModelEngine if kind.simulator is None else rtl_factory(backend)


def probe_backend(backend: str) -> None:
    """Raise ``BackendUnavailable`` (one line) early if ``backend`` cannot run here (a factory
    may carry a ``probe()``), ``ReplayError`` if it is not registered."""
    probe = getattr(_factory(backend), "probe", None)
    if probe is not None:
        probe()


def open_engine(backend: str, params: EngineParams) -> ReplayEngine:
    return _factory(backend)(asdict(params))


# ---------------------------------------------------------------------------------- the run
@dataclass
class ReplayRun:
    config: ReplayConfig
    capture: Capture
    backend: str
    emits: list[Emit] = field(default_factory=list)
    in_ports: list[int] = field(default_factory=list)
    engine_counters: dict[str, int] = field(default_factory=dict)
    port_counters: dict[int, dict] = field(default_factory=dict)
    job_counters: dict[int, dict[str, int]] = field(default_factory=dict)
    job_status: dict[int, dict] = field(default_factory=dict)
    last_cycle: int = 0

    def out_time_ns(self, cycle: int) -> int:
        """Timestamp of an engine cycle, on the input capture's time base."""
        return cycles_to_ns(self.capture.base_cycle + cycle)

    def to_json(self, command: str = "", out_path: str | None = None) -> dict:
        per_port: dict[int, int] = {}
        for e in self.emits:
            per_port[e.port] = per_port.get(e.port, 0) + 1
        in_port: dict[int, int] = {}
        for p in self.in_ports:
            in_port[p] = in_port.get(p, 0) + 1
        return {
            "schema": "netreduce-replay/1", "command": command, "backend": self.backend,
            "clock_hz": CLOCK_HZ, "config": self.config.path,
            "engine": asdict(self.config.engine),
            "jobs": [{"id": j.job, "world": j.world, "window": j.window,
                      "slot_base": j.slot_base, "pmtu": j.pmtu, "op": Op(j.op).name.lower(),
                      "cnp_interval": j.cnp_interval} for j in self.config.jobs],
            "input": {"path": self.capture.path, "frames": len(self.capture.frames),
                      "per_port": {str(k): v for k, v in sorted(in_port.items())},
                      "timestamps_backwards": self.capture.backwards,
                      "idle_cycles_removed": self.capture.removed},
            "output": {"path": out_path, "frames": len(self.emits),
                       "per_port": {str(k): v for k, v in sorted(per_port.items())}},
            "cycles": self.last_cycle,
            "engine_counters": self.engine_counters,
            "port_counters": {str(k): v for k, v in self.port_counters.items()},
            "job_counters": {str(k): v for k, v in self.job_counters.items()},
            "job_status": {str(k): v for k, v in self.job_status.items()},
        }


def run_replay(cfg: ReplayConfig, cap: Capture, backend: str = "model",
               ports: list[int] | None = None,
               on_emit: Callable[[Emit], None] | None = None,
               progress: Callable[[int], None] | None = None) -> ReplayRun:
    """Open the engine, program ``cfg``'s jobs, feed ``cap`` (frame i on ``ports[i]``, default
    port 0), collect the emits (each also passed to ``on_emit``) and read the counters.
    ``progress(n)`` is called with the number of frames fed so far, every 256 frames."""
    if ports is None:
        ports = [0] * len(cap.frames)
    eng = open_engine(backend, cfg.engine)
    run = ReplayRun(cfg, cap, backend, in_ports=list(ports))
    try:
        ctrl = EngineControl(eng.bus)
        try:
            ctrl.identify()
        except ConfigError as e:
            raise ReplayError(f"backend {backend!r}: {e}") from None
        try:
            program(ctrl, cfg)
        except ReplayError as e:
            raise ReplayError(f"{cfg.path}: on backend {backend!r}: {e}") from None

        def feed() -> Iterator[tuple[int, bytes, int]]:
            for i, (fr, p) in enumerate(zip(cap.frames, ports, strict=True)):
                if progress is not None and i % 256 == 0:
                    progress(i)
                yield p, fr.data, fr.cycle
            if progress is not None:
                progress(len(cap.frames))

        last = cap.frames[-1].cycle if cap.frames else 0
        for e in eng.replay(feed()):
            run.emits.append(e)
            last = max(last, e.time)
            if on_emit is not None:
                on_emit(e)
        run.last_cycle = last
        run.engine_counters = dict(ctrl.counters())
        run.port_counters = {k: ctrl.port_status(k) for k in range(cfg.engine.ports)}
        for j in cfg.jobs:
            run.job_counters[j.job] = dict(ctrl.counters(j.job))
            st = ctrl.job_status(j.job)
            run.job_status[j.job] = {"enabled": st.enabled, "error": st.error.name,
                                     "mismatch": st.mismatch, "saturated": st.saturated,
                                     "free_ptr": st.free_ptr, "release_ptr": st.release_ptr,
                                     "slots_busy": st.slots_busy}
    finally:
        eng.close()
    return run


def counter_rows(run: ReplayRun, show_all: bool = False) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the counter table: engine-wide and one column per job; all-zero rows
    only with ``show_all``."""
    jobs = [j.job for j in run.config.jobs]
    head = ["counter", "engine"] + [f"job {j}" for j in jobs]
    per_job = {c.name for c in JOB_COUNTERS}
    rows = []
    for c in ALL_GLOBAL_COUNTERS:
        vals = [run.engine_counters.get(c.name, 0)]
        vals += [run.job_counters[j].get(c.name, 0) if c.name in per_job else None for j in jobs]
        if not show_all and not any(vals) and c.name not in ("rx_frames", "tx_frames"):
            continue
        rows.append([c.name] + ["" if v is None else str(v) for v in vals])
    return head, rows


# ---------------------------------------------------------------------------------- helpers
def config_toml_from_sim_report(rep: dict, ports: int = 1) -> str:
    """A replay configuration for the capture of a ``netreduce sim --json`` run: one [[job]]
    per pass (job ids and slot bases as the driver allocates them for concurrent groups of one
    pass each, i.e. int32 runs; a float32 run's two passes per group reuse job ids over time and
    cannot be replayed as one configuration)."""
    from netreduce.sim.net.collective import CollectiveConfig

    cfg = rep["config"]
    if cfg["dtype"] != "int32":
        raise ReplayError("only int32 sim runs (one pass per group) map to one replay config")
    window = CollectiveConfig(pmtu=cfg["pmtu"]).window
    passes: dict[str, list[dict]] = {}
    for f in rep["flows"]:
        passes.setdefault(f["pass_id"], []).append(f)
    lines = ["# replay configuration of: " + rep.get("command", "netreduce sim"), "",
             "[engine]", f"ports = {ports}", ""]
    for j, (pid, flows) in enumerate(sorted(passes.items(), key=lambda kv: kv[1][0]["group"])):
        op = flows[0]["op"].lower()
        lines += [f"[[job]]  # {pid}", f"id = {j}", f"world = {len(flows)}",
                  f"window = {window}", f"slot_base = {j * window}", f"pmtu = {cfg['pmtu']}",
                  f'op = "{op}"', ""]
        for f in sorted(flows, key=lambda f: f["rank"]):
            lines += ["[[job.flow]]", f"rank = {f['rank']}", f'fwd_ip = "{f["src_ip"]}"',
                      f"fwd_qpn = 0x{f['dqpn']:x}", f'rev_ip = "{f["rev_ip"]}"',
                      f"rev_qpn = 0x{f['rev_qpn']:x}", f"start_psn = {f['start_psn']}", ""]
    return "\n".join(lines)
