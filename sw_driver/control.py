"""Programming a NetReduce engine over any :class:`~netreduce.regmap.RegisterBus`.

Used by the collective driver, the CLI and the RTL testbenches. Imports only netreduce.regmap and
netreduce.wire (layering). Every configuration is validated before the first register write;
:class:`ConfigError` names the offending field and value. The engine re-validates on enable
(``JOB.STATUS.error``), and a refusal there is raised as :class:`ConfigError` too.

Register-access cost: :meth:`EngineControl.add_job` reads the flow table's CFG words and the
enabled jobs' slot ranges (one read per entry) and writes 6 registers per flow plus 8 per job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from netreduce.regmap import (
    ALL_GLOBAL_COUNTERS,
    DEFAULT_CNP_INTERVAL,
    JOB_COUNTERS,
    MAGIC,
    PMTU_VALUES,
    PORT_COUNTERS,
    VERSION,
    JobError,
    Op,
    RegisterBus,
    RegMap,
    Role,
    build_regmap,
)

__all__ = ["Op", "Role", "FlowConfig", "JobConfig", "EngineInfo", "JobStatus", "ConfigError",
           "EngineControl", "DEFAULT_CNP_INTERVAL", "PMTU_VALUES"]

_PSN_MAX = (1 << 24) - 1
_QPN_MAX = (1 << 24) - 1
_IP_MAX = (1 << 32) - 1


class ConfigError(ValueError):
    """A job configuration the engine cannot run (the message names the bad value)."""


@dataclass
class FlowConfig:
    """Rank ``rank``'s flow: forward key (its IPv4, the successor QP), reverse key (the
    successor's IPv4, its own QP) and its start PSN S_r. ``role``: what the flow is to the job
    on this engine (MEMBER on a single engine; leaf and spine roles: docs/spine-leaf.md)."""

    rank: int
    fwd_ip: int
    fwd_qpn: int
    rev_ip: int
    rev_qpn: int
    start_psn: int
    role: Role = Role.MEMBER


@dataclass
class JobConfig:
    job: int
    world: int
    window: int
    slot_base: int
    pmtu: int
    op: Op
    flows: list[FlowConfig] = field(default_factory=list)
    cnp_interval: int = DEFAULT_CNP_INTERVAL
    #: JOB.CTRL.fast_retx: the engine turns a receiver's ACK after a lost contribution into a
    #: NAK-sequence (model D16; docs/engine.md says when it must stay off)
    fast_retx: bool = False


@dataclass(frozen=True)
class EngineInfo:
    magic: int
    version: tuple[int, int]
    ports: int
    jobs: int
    flows: int
    slots: int
    pmtu_max: int
    data_width: int
    max_world: int
    clock_hz: int


@dataclass(frozen=True)
class JobStatus:
    enabled: bool
    error: JobError
    mismatch: bool
    saturated: bool
    free_ptr: int
    release_ptr: int
    slots_busy: int


class EngineControl:
    """High-level control of one engine through its register bus."""

    #: JOB.STATUS reads after an enable before giving up on the engine finishing it
    ENABLE_POLLS = 20_000

    def __init__(self, bus: RegisterBus):
        self.bus = bus
        self._info: EngineInfo | None = None
        self._rm: RegMap | None = None

    # ------------------------------------------------------------------ identity
    def identify(self) -> EngineInfo:
        """Read identity and build parameters; raises :class:`ConfigError` if this is not a
        NetReduce engine or its register-map major version differs from ours."""
        rm0 = build_regmap()  # GLOBAL addresses do not depend on the parameters
        rd = self.bus.read
        magic = rd(rm0.addr("GLOBAL.MAGIC"))
        if magic != MAGIC:
            raise ConfigError(f"no NetReduce engine on this bus: magic 0x{magic:08x}, "
                              f"expected 0x{MAGIC:08x} ('NRDC')")
        ver = rd(rm0.addr("GLOBAL.VERSION"))
        version = (ver >> 16, ver & 0xFFFF)
        if version[0] != VERSION[0]:
            raise ConfigError(f"register map version {version[0]}.{version[1]} not supported "
                              f"(driver speaks {VERSION[0]}.x)")
        p = {k: rd(rm0.addr(f"GLOBAL.{k.upper()}")) for k in
             ("ports", "jobs", "flows", "slots", "pmtu_max", "data_width", "max_world",
              "clock_hz")}
        self._info = EngineInfo(magic, version, **p)
        self._rm = build_regmap(**p)
        return self._info

    @property
    def info(self) -> EngineInfo:
        return self._info or self.identify()

    @property
    def regmap(self) -> RegMap:
        if self._rm is None:
            self.identify()
        return self._rm

    def _rd(self, path: str, index: int = 0) -> int:
        return self.bus.read(self.regmap.addr(path, index))

    def _wr(self, path: str, value: int, index: int = 0) -> None:
        self.bus.write(self.regmap.addr(path, index), value)

    # ------------------------------------------------------------------ tables
    def _check_job_id(self, job: int) -> None:
        if not isinstance(job, int) or not 0 <= job < self.info.jobs:
            raise ConfigError(f"job = {job!r} outside 0..{self.info.jobs - 1}")

    def job_status(self, job: int) -> JobStatus:
        self._check_job_id(job)
        rm = self.regmap
        st = self._rd("JOB.STATUS", job)
        f = rm.reg("JOB.STATUS").field
        return JobStatus(bool(f("enabled").get(st)), JobError(f("error").get(st)),
                         bool(f("mismatch").get(st)), bool(f("saturated").get(st)),
                         self._rd("JOB.FREE_PTR", job), self._rd("JOB.RELEASE_PTR", job),
                         self._rd("JOB.SLOTS_BUSY", job))

    def enabled_jobs(self) -> list[int]:
        en = self.regmap.field("JOB.STATUS.enabled")
        return [j for j in range(self.info.jobs) if en.get(self._rd("JOB.STATUS", j))]

    def _slot_ranges(self, exclude: int | None = None) -> list[tuple[int, int, int]]:
        """(base, end, job) of every enabled job."""
        return [(b, b + self._rd("JOB.WINDOW", j), j) for j in self.enabled_jobs()
                if j != exclude for b in [self._rd("JOB.SLOT_BASE", j)]]

    def _flow_cfgs(self) -> list[int]:
        return [self._rd("FLOW.CFG", e) for e in range(self.info.flows)]

    def free_flow_entries(self) -> list[int]:
        """Flow-table entries with the valid bit clear."""
        valid = self.regmap.field("FLOW.CFG.valid")
        return [e for e, c in enumerate(self._flow_cfgs()) if not valid.get(c)]

    def alloc_slots(self, window: int) -> int:
        """The lowest slot base where ``window`` slots overlap no enabled job's range."""
        slots = self.info.slots
        if not isinstance(window, int) or window < 1 or window > slots:
            raise ConfigError(f"window = {window!r} outside 1..{slots} (the slot pool)")
        base = 0
        for b, e, _ in sorted(self._slot_ranges()):
            if base + window <= b:
                break
            base = max(base, e)
        if base + window > slots:
            raise ConfigError(f"no {window} free consecutive slots left in the pool of {slots} "
                              f"(enabled ranges: {sorted(self._slot_ranges())})")
        return base

    # ------------------------------------------------------------------ jobs
    def validate(self, cfg: JobConfig) -> None:
        """Check ``cfg`` against the build parameters and the jobs already enabled."""
        inf = self.info
        self._check_job_id(cfg.job)
        max_n = min(inf.max_world, inf.flows)
        if not isinstance(cfg.world, int) or not 2 <= cfg.world <= max_n:
            raise ConfigError(f"job {cfg.job}: world = {cfg.world!r} outside 2..{max_n}")
        w = cfg.window
        if not isinstance(w, int) or w < 1 or w & (w - 1):
            raise ConfigError(f"job {cfg.job}: window = {w!r} is not a power of two")
        if not isinstance(cfg.slot_base, int) or cfg.slot_base < 0 \
                or cfg.slot_base + w > inf.slots:
            raise ConfigError(f"job {cfg.job}: slots {cfg.slot_base}..{cfg.slot_base + w - 1} "
                              f"outside the pool 0..{inf.slots - 1}")
        if cfg.pmtu not in PMTU_VALUES or cfg.pmtu > inf.pmtu_max:
            raise ConfigError(f"job {cfg.job}: pmtu = {cfg.pmtu!r} not in "
                              f"{[p for p in PMTU_VALUES if p <= inf.pmtu_max]}")
        try:
            Op(cfg.op)
        except ValueError:
            raise ConfigError(f"job {cfg.job}: op = {cfg.op!r} not one of "
                              f"{[o.name for o in Op]}") from None
        if not isinstance(cfg.cnp_interval, int) or not 0 <= cfg.cnp_interval <= 0xFFFFFFFF:
            raise ConfigError(f"job {cfg.job}: cnp_interval = {cfg.cnp_interval!r} not a "
                              "32-bit cycle count")
        if not isinstance(cfg.fast_retx, bool):
            raise ConfigError(f"job {cfg.job}: fast_retx = {cfg.fast_retx!r} is not a bool")
        ranks = sorted(f.rank for f in cfg.flows)
        if ranks != list(range(cfg.world)):
            raise ConfigError(f"job {cfg.job}: flow ranks {ranks} are not 0..{cfg.world - 1}")
        for f in cfg.flows:
            for name, v, hi in (("fwd_ip", f.fwd_ip, _IP_MAX), ("rev_ip", f.rev_ip, _IP_MAX),
                                ("fwd_qpn", f.fwd_qpn, _QPN_MAX),
                                ("rev_qpn", f.rev_qpn, _QPN_MAX),
                                ("start_psn", f.start_psn, _PSN_MAX)):
                if not isinstance(v, int) or not 0 <= v <= hi:
                    raise ConfigError(f"job {cfg.job} rank {f.rank}: {name} = {v!r} outside "
                                      f"0..0x{hi:x}")
        roles = []
        for f in cfg.flows:
            try:
                roles.append(Role(f.role))
            except ValueError:
                raise ConfigError(f"job {cfg.job} rank {f.rank}: role = {f.role!r} not one of "
                                  f"{[r.name for r in Role]}") from None
        nup, ndown, nrack = (roles.count(r) for r in (Role.UP, Role.DOWN, Role.RACK))
        if (nup or ndown) and (nup, ndown, nrack) != (1, 1, 0):
            raise ConfigError(f"job {cfg.job}: a leaf job needs exactly one UP and one DOWN flow "
                              f"and no RACK flow, got {nup} UP, {ndown} DOWN, {nrack} RACK")
        if nup and cfg.fast_retx:
            raise ConfigError(f"job {cfg.job}: fast_retx is not supported on a leaf job")
        fk = [(f.fwd_ip, f.fwd_qpn) for f in cfg.flows]
        rk = [(f.rev_ip, f.rev_qpn) for f in cfg.flows]
        for keys, what in ((fk, "forward"), (rk, "reverse")):
            dup = {k for k in keys if keys.count(k) > 1}
            if dup:
                raise ConfigError(f"job {cfg.job}: {what} key(s) used twice: "
                                  + ", ".join(f"(0x{i:08x}, qpn 0x{q:x})" for i, q in dup))
        if self.job_status(cfg.job).enabled:
            raise ConfigError(f"job {cfg.job} is already enabled; remove_job({cfg.job}) first")
        for b, e, j in self._slot_ranges(exclude=cfg.job):
            if cfg.slot_base < e and b < cfg.slot_base + w:
                raise ConfigError(f"job {cfg.job}: slots {cfg.slot_base}..{cfg.slot_base + w - 1}"
                                  f" overlap job {j}'s slots {b}..{e - 1}")
        used_f, used_r = self._enabled_keys()
        for k in fk:
            if k in used_f:
                raise ConfigError(f"job {cfg.job}: forward key (0x{k[0]:08x}, qpn 0x{k[1]:x}) "
                                  f"already registered by job {used_f[k]}")
        for k in rk:
            if k in used_r:
                raise ConfigError(f"job {cfg.job}: reverse key (0x{k[0]:08x}, qpn 0x{k[1]:x}) "
                                  f"already registered by job {used_r[k]}")

    def _enabled_keys(self) -> tuple[dict, dict]:
        rm = self.regmap
        valid, jobf = rm.field("FLOW.CFG.valid"), rm.field("FLOW.CFG.job")
        enabled = set(self.enabled_jobs())
        fwd, rev = {}, {}
        for e, c in enumerate(self._flow_cfgs()):
            if valid.get(c) and jobf.get(c) in enabled:
                fwd[(self._rd("FLOW.FWD_IP", e), self._rd("FLOW.FWD_QPN", e))] = jobf.get(c)
                rev[(self._rd("FLOW.REV_IP", e), self._rd("FLOW.REV_QPN", e))] = jobf.get(c)
        return fwd, rev

    def add_job(self, cfg: JobConfig) -> None:
        """Validate, write the flow entries and the job registers, then enable the job.

        Stale flow entries of the same job id (left by a crashed driver) are invalidated first.
        Raises :class:`ConfigError` before any write if ``cfg`` is invalid, and after enabling if
        the engine refuses (then the job's entries are released again).
        """
        self.validate(cfg)
        rm = self.regmap
        self._release_entries(cfg.job)
        free = self.free_flow_entries()
        if len(free) < len(cfg.flows):
            raise ConfigError(f"job {cfg.job}: needs {len(cfg.flows)} flow entries, "
                              f"only {len(free)} free")
        cfg_reg = rm.reg("FLOW.CFG")
        for e, f in zip(free, sorted(cfg.flows, key=lambda f: f.rank), strict=False):
            self._wr("FLOW.FWD_IP", f.fwd_ip, e)
            self._wr("FLOW.FWD_QPN", f.fwd_qpn, e)
            self._wr("FLOW.REV_IP", f.rev_ip, e)
            self._wr("FLOW.REV_QPN", f.rev_qpn, e)
            self._wr("FLOW.START_PSN", f.start_psn, e)
            v = cfg_reg.field("valid").put(0, 1)
            v = cfg_reg.field("job").put(v, cfg.job)
            v = cfg_reg.field("rank").put(v, f.rank)
            v = cfg_reg.field("role").put(v, int(f.role))
            self._wr("FLOW.CFG", v, e)
        j = cfg.job
        self._wr("JOB.CTRL", 0, j)
        self._wr("JOB.WORLD", cfg.world, j)
        self._wr("JOB.WINDOW", cfg.window, j)
        self._wr("JOB.SLOT_BASE", cfg.slot_base, j)
        self._wr("JOB.PMTU", cfg.pmtu, j)
        self._wr("JOB.OP", int(cfg.op), j)
        self._wr("JOB.CNP_INTERVAL", cfg.cnp_interval, j)
        self._wr("JOB.STATUS", rm.reg("JOB.STATUS").w1c_mask, j)  # clear sticky flags
        ctrl = rm.field("JOB.CTRL.enable").mask
        if cfg.fast_retx:
            ctrl |= rm.field("JOB.CTRL.fast_retx").mask
        self._wr("JOB.CTRL", ctrl, j)
        # the gateware checks the job, scans its flows and clears its W slots before it reports
        # enabled (a few thousand cycles at most); the model answers at once
        for _ in range(self.ENABLE_POLLS):
            st = self.job_status(j)
            if st.enabled or st.error != JobError.NONE:
                break
        if not st.enabled:
            self._release_entries(j)
            raise ConfigError(f"job {j}: the engine refused to enable it: {st.error.name}")

    def _release_entries(self, job: int) -> None:
        rm = self.regmap
        valid, jobf = rm.field("FLOW.CFG.valid"), rm.field("FLOW.CFG.job")
        for e, c in enumerate(self._flow_cfgs()):
            if valid.get(c) and jobf.get(c) == job:
                self._wr("FLOW.CFG", 0, e)

    def remove_job(self, job: int) -> None:
        """Disable ``job`` (its in-flight slots are discarded) and free its flow entries.

        The gateware finishes the packet in its pipeline before it reports the job disabled;
        the flow entries are freed only then, so a late packet never meets a half-removed job.
        Raises :class:`ConfigError` if JOB.STATUS still says enabled after ``ENABLE_POLLS``
        reads (the entries are left as they are).
        """
        self._check_job_id(job)
        self._wr("JOB.CTRL", 0, job)
        for _ in range(self.ENABLE_POLLS):
            if not self.job_status(job).enabled:
                break
        else:
            raise ConfigError(f"job {job}: still enabled after {self.ENABLE_POLLS} JOB.STATUS "
                              f"reads following JOB.CTRL=0")
        self._release_entries(job)

    # ------------------------------------------------------------------ monitoring
    def counters(self, job: int | None = None) -> dict[str, int]:
        """Engine-wide counters (``job=None``) or one job's, by name (32-bit register values)."""
        if job is None:
            base = self.regmap.table("CNT").base
            return {c.name: self.bus.read(base + 4 * i)
                    for i, c in enumerate(ALL_GLOBAL_COUNTERS)}
        self._check_job_id(job)
        t = self.regmap.table("JOB_CNT")
        base = t.base + job * t.stride
        return {c.name: self.bus.read(base + 4 * i) for i, c in enumerate(JOB_COUNTERS)}

    def port_status(self, port: int) -> dict[str, int]:
        """One engine port's ``PORT`` registers by name (link_up, rsfec_lock, then the counters
        of :data:`netreduce.regmap.PORT_COUNTERS`), over whatever bus this control uses (PCIe,
        or in band through the management client)."""
        ports = self.regmap.params["ports"]
        if not 0 <= port < ports:
            raise ConfigError(f"port {port} outside 0..{ports - 1}")
        st = self._rd("PORT.STATUS", port)
        reg = next(r for r in self.regmap.table("PORT").registers if r.name == "STATUS")
        out = {f.name: f.get(st) for f in reg.fields}
        for name, _src, _ in PORT_COUNTERS:
            out[name] = self._rd(f"PORT.{name.upper()}", port)
        return out

    def flow_control(self, port: int, **changes) -> dict[str, int]:
        """Read, and with ``changes`` first update, a port's ``PORT.FC_*`` registers (PFC from the
        shell's RX FIFO watermarks and ECN marking while it is congested; docs/fabric.md).
        Keys: ``pfc_enable``, ``ecn_enable``, ``priority`` (0..7), ``quanta`` (0..65535),
        ``xoff``, ``xon``, ``ecn`` (bytes of RX FIFO level). Refused (:class:`ConfigError`,
        nothing written): an unknown key, a value out of range, ``xon >= xoff``, or ECN marking
        from at or above XOFF while both are on."""
        ports = self.regmap.params["ports"]
        if not 0 <= port < ports:
            raise ConfigError(f"port {port} outside 0..{ports - 1}")
        regs = {"xoff": "FC_XOFF", "xon": "FC_XON", "ecn": "FC_ECN"}
        ctrl = self.regmap.reg("PORT.FC_CTRL")
        cur = {f.name: f.get(self._rd("PORT.FC_CTRL", port)) for f in ctrl.fields}
        cur.update({k: self._rd(f"PORT.{r}", port) for k, r in regs.items()})
        for k, v in changes.items():
            if k not in cur:
                raise ConfigError(f"flow control key {k!r}; known: {', '.join(cur)}")
            f = (ctrl.field(k) if k not in regs
                 else self.regmap.field(f"PORT.{regs[k]}.bytes"))
            if not isinstance(v, int) or not 0 <= v <= f.max:
                raise ConfigError(f"flow control {k} = {v!r} outside 0..{f.max}")
        new = {**cur, **changes}
        if new["xon"] >= new["xoff"]:
            raise ConfigError(f"flow control xon = {new['xon']} must be below xoff = "
                              f"{new['xoff']}")
        if new["pfc_enable"] and new["ecn_enable"] and new["ecn"] >= new["xoff"]:
            raise ConfigError(f"flow control ecn = {new['ecn']} must be below xoff = "
                              f"{new['xoff']} (mark before pausing)")
        if changes:
            word = 0
            for f in ctrl.fields:
                word = f.put(word, new[f.name])
            for k, r in regs.items():
                self._wr(f"PORT.{r}", new[k], port)
            self._wr("PORT.FC_CTRL", word, port)
        return new

    def clear_counters(self) -> None:
        self._wr("GLOBAL.CONTROL", self.regmap.field("GLOBAL.CONTROL.clear_counters").mask)

    def slots_in_use(self, job: int | None = None) -> int:
        """Non-EMPTY slots of ``job`` (or of every enabled job), from JOB.SLOTS_BUSY."""
        if job is not None:
            self._check_job_id(job)
            return self._rd("JOB.SLOTS_BUSY", job)
        return sum(self._rd("JOB.SLOTS_BUSY", j) for j in range(self.info.jobs))
