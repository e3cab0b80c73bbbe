"""Soak scenarios: long seeded all-reduce runs through an engine on a faulty network (issue 9).

A :class:`Scenario` is a pure description (seed, link faults per direction and kind of traffic,
link outages, concurrent jobs of different N / PMTU / window / start PSN, several all-reduce rounds
per job, an optional adversary injecting spoofed frames). :func:`run_scenario` runs it and returns
a :class:`SoakReport` whose ``violations`` list is empty when every guarantee held:

* every all-reduce of every job completes, int32 bit-exact against numpy (float32: identical on
  every rank and within the quantisation bound of :mod:`netreduce.sw_driver.quant`);
* every slot is freed: each pass leaves 0 busy slots, no job stays enabled, ``SLOTS_BUSY`` = 0;
* the counters balance, read through the register bus only (so an RTL backend is checked the same
  way): ``rx_frames`` = the sum of the disposition counters; ``tx_frames`` = frames forwarded
  (bypass, ACK/NAK/CNP, behind-window probes) + results + re-emits + CNPs + management answers;
  ``contributions`` = ``results_sent`` and ``released`` = ``freed`` once everything is acked;
  the fabric's frames into / out of the engine equal ``rx_frames`` / ``tx_frames``; every link
  conserves frames (sent - lost + duplicated = delivered, nothing left in flight).

Backends: ``run_scenario(sc, backend)`` takes any callable ``backend(sc, net) -> fabric`` returning
a :class:`~netreduce.sim.net.network.NetworkFabric` subclass whose middle is the engine, with
``bus`` (the engine's register bus), ``stats["engine_in"/"engine_out"]`` and the ``up``/``down``
link dicts, and ``inject(frame)`` to put a frame straight into the engine; optional
``backend_stats()`` (copied into ``SoakReport.backend``) and ``close()`` (called at the end).
:func:`model_backend` (the reference model through
:class:`~netreduce.sim.net.model_fabric.ModelFabric`) is the default;
:func:`netreduce.sim.rtl.soak_rtl.rtl_backend` runs the engine RTL (Verilator) the same way.

Scenario sets: :func:`random_scenario` (profiles "ci" and "soak" for the model; "rtl" sized for
the RTL soak build: 2 jobs, N <= 8, PMTU <= 1024, short QP timeouts and outages, since the RTL
simulates every cycle) and :func:`rtl_ci_scenarios` (the named RTL CI set).

Determinism: a scenario is a pure function of its seed and profile (``random_scenario``), and a
run is a pure function of the scenario.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from netreduce.sim.net.collective import AllReduce, CollectiveConfig, Communicator
from netreduce.sim.net.rnic import RCError
from netreduce.sim.net.scheduler import SimulationHang
from netreduce.sw_driver import quant
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import DISPOSITIONS
from netreduce.wire import PSN_MOD, WireError, parse

from ..backend import open_engine
from ..net.model_fabric import ModelFabric
from ..net.network import DIRECTIONS, KINDS, LinkConfig, NetConfig

__all__ = ["JobSpec", "Outage", "Scenario", "SoakReport", "random_scenario", "run_scenario",
           "model_backend", "FORWARDED", "balance", "rtl_ci_scenarios", "PROFILES", "STYLES",
           "RTL_ENGINE"]

# Dispositions whose frame leaves the engine (unchanged, or as a behind-window probe).
FORWARDED = ("fwd_not_roce", "fwd_unregistered", "fwd_ack", "fwd_nak", "fwd_cnp",
             "fwd_ctrl_invalid", "behind_window")
# Management dispositions that are answered with exactly one response frame.
MGMT_ANSWERED = ("mgmt_accepted", "mgmt_reject_replay", "mgmt_reject_opcode",
                 "mgmt_reject_addr", "mgmt_reject_denied")
_ATTACKER_MAC = b"\x02\xad\xad\xad\xad\x01"
_SINK_MAC = b"\x02\xad\xad\xad\xad\x02"  # attached to nothing: the fabric drops it (unroutable)


@dataclass(frozen=True)
class JobSpec:
    """One communicator: ``world`` ranks running ``rounds`` all-reduces of ``elems`` elements."""

    world: int
    elems: int
    pmtu: int = 1024
    window: int = 64
    msg_packets: int = 8
    dtype: str = "int32"
    rounds: int = 1
    timeout: int = 8
    ecn: bool = False
    wrap: bool = False  # start PSNs just below 2^24: PSNs wrap inside the first message

    def collective(self, rng: random.Random) -> CollectiveConfig:
        psns = (tuple(PSN_MOD - rng.randint(1, 3 * self.msg_packets) for _ in range(self.world))
                if self.wrap else None)
        return CollectiveConfig(pmtu=self.pmtu, msg_packets=self.msg_packets, window=self.window,
                                margin=max(self.msg_packets, self.window // 4),
                                timeout=self.timeout, ecn=self.ecn, start_psns=psns)


@dataclass(frozen=True)
class Outage:
    """Endpoint ``host`` (index in attach order) loses its ``direction`` link completely from
    ``start_ns`` for ``duration_ns``: a cable pulled, every frame dropped (burst loss)."""

    host: int
    direction: str
    start_ns: int
    duration_ns: int


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    net: NetConfig
    jobs: tuple[JobSpec, ...]
    outages: tuple[Outage, ...] = ()
    adversary_every_ns: int = 0  # 0: no adversary; else one spoofed frame per period
    engine: dict = field(default_factory=lambda: dict(ports=1, jobs=8, flows=256, slots=4096))
    timeout_ns: int = 200 * 10**9

    def describe(self) -> dict:
        return {"name": self.name, "seed": self.seed,
                "jobs": [asdict(j) for j in self.jobs],
                "outages": [asdict(o) for o in self.outages],
                "adversary_every_ns": self.adversary_every_ns,
                "faults": {f"{d}/{k}": {"loss": c.loss, "dup": c.dup, "reorder": c.reorder,
                                        "ce": c.ce}
                           for d in DIRECTIONS for k in KINDS
                           for c in [self.net.get(d, k)]}}


@dataclass
class SoakReport:
    scenario: dict
    ok: bool = False
    violations: list[str] = field(default_factory=list)
    allreduces: int = 0
    bytes_reduced: int = 0
    sim_time_ns: int = 0
    wall_s: float = 0.0
    counters: dict = field(default_factory=dict)  # engine-wide, from the registers
    endpoint: dict = field(default_factory=dict)  # QP statistics summed over every pass
    links: dict = field(default_factory=dict)
    adversary: dict = field(default_factory=dict)
    backend: dict = field(default_factory=dict)  # the fabric's backend_stats(), if it has one

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------ scenarios
def _faults(r: random.Random, max_p: float) -> LinkConfig:
    return LinkConfig(loss=r.uniform(0, max_p), dup=r.uniform(0, max_p),
                      reorder=r.uniform(0, max_p), jitter_ns=r.choice([0, 100, 300]))


PROFILES = ("ci", "soak", "rtl")
STYLES = ("uniform", "per_kind", "ack_only", "burst", "ce")
#: The engine build the "rtl" profile fits (netreduce.sim.rtl.soak_rtl.soak_params(): 4 ports,
#: 2 jobs, 16 flows, 512 slots, N <= 8, PMTU <= 1024, 64-bit datapath).
RTL_ENGINE = dict(ports=4, jobs=2, flows=16, slots=512, pmtu_max=1024, data_width=64,
                  max_world=8)


def random_scenario(seed: int, profile: str = "ci") -> Scenario:
    """A seeded scenario. ``profile``: "ci" (seconds on the model), "soak" (longer jobs, more
    rounds) or "rtl" (sized for the RTL build :data:`RTL_ENGINE`: 2 jobs, short timers).

    The seed picks one of five fault styles: uniform (the same faults everywhere), per-direction
    and per-kind faults, ACK-only loss, burst loss (link outages), and CE marking with DCQCN.
    Every scenario runs 2-4 concurrent jobs ("rtl": 2) of different N, PMTU and window; some wrap
    the PSN; odd seeds add an adversary injecting spoofed frames.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    r = random.Random(f"netreduce-soak/{profile}/{seed}")
    style = STYLES[seed % 5]
    if profile == "rtl":
        return _rtl_scenario(r, seed, style)
    net = _style_net(r, style)
    ce = style == "ce"
    big = profile == "soak"
    jobs = []
    for _ in range(r.randint(2, 4)):
        world = r.choice([2, 3, 4, 5, 8] + ([16, 32] if big else [r.randint(2, 12)]))
        pmtu = r.choice([256, 512, 1024, 2048, 4096] if big else [256, 512, 1024])
        window = r.choice([32, 64, 128, 256])
        msg = r.randint(1, min(32, window // 2))
        budget = (600 if big else 90) // max(1, world // 4)  # packets per rank per round
        elems = r.randint(1, budget * pmtu // 4)
        jobs.append(JobSpec(world=world, elems=elems, pmtu=pmtu, window=window,
                            msg_packets=msg, dtype="float32" if r.random() < 0.2 else "int32",
                            rounds=r.randint(1, 4 if big else 2), timeout=r.choice([5, 6, 8]),
                            ecn=ce, wrap=r.random() < 0.5))
    outages = []
    if style == "burst":
        nhosts = sum(j.world for j in jobs)
        for _ in range(r.randint(1, 4)):
            outages.append(Outage(r.randrange(nhosts), r.choice(DIRECTIONS),
                                  r.randint(0, 60_000), r.randint(50_000, 500_000)))
    adv = r.choice([2_000, 10_000]) if seed % 2 else 0
    return Scenario(f"{profile}-{seed}-{style}", seed, net, tuple(jobs), tuple(outages), adv)


def _style_net(r: random.Random, style: str, max_p: float = 0.05) -> NetConfig:
    if style == "uniform":
        return NetConfig(_faults(r, max_p))
    if style == "per_kind":
        return NetConfig(_faults(r, max_p), {(d, k): _faults(r, max_p)
                                             for d in DIRECTIONS for k in KINDS})
    if style == "ack_only":
        ack = LinkConfig(loss=r.uniform(0.05, 0.25), dup=r.uniform(0, max_p),
                         reorder=r.uniform(0, max_p))
        return NetConfig(LinkConfig(), {(d, "ack"): ack for d in DIRECTIONS})
    if style == "burst":
        return NetConfig(_faults(r, 0.01))
    return NetConfig(replace(_faults(r, 0.02), ce=r.uniform(0.05, 0.5)))


def _rtl_scenario(r: random.Random, seed: int, style: str) -> Scenario:
    """Profile "rtl": two jobs on :data:`RTL_ENGINE`, a few dozen packets per rank and round, QP
    timeouts of 65-131 us and outages of 10-60 us (the RTL simulates every cycle)."""
    net = _style_net(r, style)
    jobs = []
    flows = RTL_ENGINE["flows"]
    for i in range(2):
        world = r.randint(2, min(RTL_ENGINE["max_world"], flows - 2 * (1 - i)))
        flows -= world
        pmtu = r.choice([256, 512, 1024])
        window = r.choice([16, 32, 64])
        msg = r.randint(1, window // 4)
        budget = 24 // max(1, world // 4)
        jobs.append(JobSpec(world=world, elems=r.randint(1, budget * pmtu // 4), pmtu=pmtu,
                            window=window, msg_packets=msg,
                            dtype="float32" if r.random() < 0.2 else "int32",
                            rounds=r.randint(1, 2), timeout=r.choice([4, 5]),
                            ecn=style == "ce", wrap=r.random() < 0.5))
    outages = []
    if style == "burst":
        nhosts = sum(j.world for j in jobs)
        for _ in range(r.randint(1, 2)):
            outages.append(Outage(r.randrange(nhosts), r.choice(DIRECTIONS),
                                  r.randint(0, 20_000), r.randint(10_000, 60_000)))
    adv = r.choice([1_000, 3_000]) if seed % 2 else 0
    # watchdog: ~20x the longest run seen (a hang costs minutes of RTL, not hours)
    return Scenario(f"rtl-{seed}-{style}", seed, net, tuple(jobs), tuple(outages), adv,
                    dict(RTL_ENGINE), 20 * 10**6)


def rtl_ci_scenarios() -> dict[str, Scenario]:
    """The named RTL CI set (tests/sim/test_soak_rtl.py), each small enough for seconds to a
    minute of Verilator on the :data:`RTL_ENGINE` build, together covering issue 9's list:
    loss/dup/reorder on every direction and kind, a burst outage, ACK-only loss, PSN wrap, two
    concurrent jobs of different N and PMTU (in every scenario), CE marks, the adversary."""
    def sc(name, seed, net, jobs, outages=(), adv=0):
        # watchdog: 5 ms simulated, >10x what each needs (a hang fails in about a minute)
        return Scenario(name, seed, net, tuple(jobs), tuple(outages), adv, dict(RTL_ENGINE),
                        5 * 10**6)

    def job(world, elems, pmtu, window=16, msg=4, **kw):
        return JobSpec(world=world, elems=elems, pmtu=pmtu, window=window, msg_packets=msg,
                       timeout=kw.pop("timeout", 4), **kw)

    r = random.Random("netreduce-soak/rtl-ci")
    every = NetConfig(LinkConfig(), {(d, k): LinkConfig(loss=r.uniform(0.01, 0.05),
                                                         dup=r.uniform(0.01, 0.05),
                                                         reorder=r.uniform(0.01, 0.05))
                                     for d in DIRECTIONS for k in KINDS})
    ack = LinkConfig(loss=0.2, dup=0.03, reorder=0.03)
    out = [
        sc("rtl-every-direction", 101, every,
           [job(3, 1500, 256, wrap=True), job(5, 2000, 1024, window=32, msg=2)]),
        sc("rtl-burst-outage", 102, NetConfig.faulty(loss=0.005),
           [job(4, 1200, 512), job(2, 2500, 1024)],
           [Outage(1, "up", 500, 30_000), Outage(4, "down", 1_000, 20_000)]),
        sc("rtl-ack-only-loss", 103, NetConfig(LinkConfig(), {(d, "ack"): ack
                                                                for d in DIRECTIONS}),
           [job(6, 1000, 256, window=32, msg=8), job(2, 3000, 1024, rounds=2)]),
        sc("rtl-psn-wrap", 104, NetConfig.faulty(loss=0.02, dup=0.02, reorder=0.02),
           [job(2, 2000, 256, rounds=2, wrap=True), job(3, 1500, 512, wrap=True,
                                                        dtype="float32")]),
        sc("rtl-ce-marks", 105, NetConfig(LinkConfig(loss=0.01, ce=0.3)),
           [job(8, 600, 256, ecn=True), job(4, 1000, 1024, ecn=True)]),
        sc("rtl-adversary", 106, NetConfig.faulty(loss=0.01, reorder=0.01),
           [job(3, 1200, 512), job(4, 900, 256)], adv=300),
    ]
    return {s.name: s for s in out}


# ------------------------------------------------------------------------------ backends
class _SoakModelFabric(ModelFabric):
    def inject(self, frame: bytes) -> None:
        """A frame entering the engine from nowhere (the adversary)."""
        self.stats["injected"] += 1
        self._at_middle(_ATTACKER_MAC, frame)


def model_backend(sc: Scenario, net: NetConfig):
    """The reference engine in the middle of the network."""
    return _SoakModelFabric(open_engine("model", sc.engine), net=net, seed=sc.seed)


# ------------------------------------------------------------------------------ faults
class _Outages:
    """Wraps the ``send`` of the links named by the outages: frames sent while the link is down
    are dropped (counted per direction in ``drops``)."""

    def __init__(self, fab, outages, macs: list[bytes]):
        self.drops: Counter = Counter()
        for o in outages:
            if not 0 <= o.host < len(macs):
                continue
            links = fab.up if o.direction == "up" else fab.down
            link = links[macs[o.host]]
            self._wrap(fab, link, o)

    def _wrap(self, fab, link, o: Outage) -> None:
        inner = link.send

        def send(frame, at=None, inner=inner, o=o):
            t = fab.now() if at is None else at  # the RTL fabric hands frames over late
            if o.start_ns <= t < o.start_ns + o.duration_ns:
                self.drops[o.direction] += 1
                return
            inner(frame, at)
        link.send = send


class _Adversary:
    """Every ``period`` ns, injects one spoofed frame built from traffic it has observed: a
    registered QPN from the wrong source IP, another job's QPN, an unregistered key, a PSN far
    ahead of the window, an exact replay of an old frame (data or ACK), or a corrupted copy.
    Nothing it sends may change any result (docs/guarantees.md).

    Threat model: the adversary attacks the engine. It never forges a frame on a registered
    forward key with a valid ICRC other than far ahead of the window: such a frame is exactly what
    the worker would send, and the engine trusts the switch to admit a worker's source IPv4 only
    from that worker's port (docs/guarantees.md, assumption A1). Rewritten frames are addressed to
    a MAC nobody owns, so the engine handles them but no endpoint sees them: a frame that
    impersonates a worker's source IP towards that worker's peer attacks the peer's RC connection
    directly, with or without an engine, and is outside NetReduce's guarantees. Replays and
    corrupted copies keep their destination: endpoints must (and do) treat them as duplicates or
    drop them."""

    KINDS = ("wrong_src_ip", "other_jobs_qpn", "unregistered", "psn_far_ahead", "replay",
             "corrupt")

    def __init__(self, fab, period: int, seed: int,
                 keys: Callable[[], list[tuple[int, int, int]]]):
        self.fab, self.period = fab, period
        self.rng = random.Random(f"netreduce-soak-adversary/{seed}")
        self.seen: list[bytes] = []
        self.keys = keys  # registered forward keys now: (job, source IPv4, DestQP)
        self.sent: Counter = Counter()
        self.stopped = False
        inner = fab._at_middle

        def observe(mac, frame, inner=inner):
            if mac != _ATTACKER_MAC and (len(self.seen) < 512 or self.rng.random() < 0.05):
                if len(self.seen) >= 512:
                    self.seen[self.rng.randrange(512)] = frame
                else:
                    self.seen.append(frame)
            inner(mac, frame)
        fab._at_middle = observe
        fab.call_at(period, self._tick)

    def _tick(self) -> None:
        if self.stopped:
            return
        if self.seen:
            f = self._forge()
            if f is not None:
                self.fab.inject(f)
        self.fab.call_at(self.fab.now() + self.period, self._tick)

    def _forge(self) -> bytes | None:
        rng = self.rng
        src = rng.choice(self.seen)
        kind = rng.choice(self.KINDS)
        if kind == "replay":
            self.sent[kind] += 1
            return src
        if kind == "corrupt":
            b = bytearray(src)
            b[rng.randrange(14, len(b))] ^= 1 << rng.randrange(8)
            self.sent[kind] += 1
            return bytes(b)
        try:
            f = parse(src)
        except WireError:
            return None
        if kind == "wrong_src_ip":
            g = f.copy(src_ip=f.src_ip ^ (1 + rng.randrange(255)) << 8)
        elif kind == "other_jobs_qpn":
            # another job's registered QPN from this frame's own source: never a registered key
            keys = self.keys()
            own = {j for j, ip, _ in keys if ip == f.src_ip}
            qpns = [q for j, _, q in keys if j not in own and (f.src_ip, q) not in
                    {(ip, q2) for _, ip, q2 in keys}]
            if not qpns:
                return None
            g = f.copy(dqpn=rng.choice(qpns))
        elif kind == "unregistered":
            g = f.copy(dqpn=(f.dqpn + 0x5000) & 0xFFFFFF, src_ip=0x0AFE0001)
        else:
            g = f.copy(psn=(f.psn + (1 << 22) + rng.randrange(1 << 20)) % PSN_MOD)
        self.sent[kind] += 1
        return g.copy(dmac=_SINK_MAC).pack()


# ------------------------------------------------------------------------------ checks
def _inputs(rng: np.random.Generator, spec: JobSpec) -> list[np.ndarray]:
    if spec.dtype == "int32":
        return [rng.integers(-2**31, 2**31, spec.elems, dtype=np.int64).astype(np.int32)
                for _ in range(spec.world)]
    scale = 10.0 ** rng.uniform(-3, 3)
    return [(rng.standard_normal(spec.elems) * scale).astype(np.float32)
            for _ in range(spec.world)]


def _check_result(xs, res, tag: str) -> list[str]:
    bad = []
    if xs[0].dtype == np.int32:
        ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
        for r, y in enumerate(res.results):
            if not np.array_equal(y, ref):
                bad.append(f"{tag}: rank {r} result differs from numpy in "
                           f"{int(np.count_nonzero(y != ref))} of {ref.size} elements")
    else:
        ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
        bound = quant.error_bound(res.results[0], res.exponents, res.chunk, len(xs))
        for r, y in enumerate(res.results):
            if not np.array_equal(y.view(np.int32), res.results[0].view(np.int32)):
                bad.append(f"{tag}: rank {r} differs from rank 0 (float32 path)")
        if not (np.abs(res.results[0].astype(np.float64) - ref) <= bound).all():
            bad.append(f"{tag}: float32 result outside the quantisation bound")
    if res.stats["slots_left"]:
        bad.append(f"{tag}: {res.stats['slots_left']} slots still busy at teardown")
    return bad


def balance(c: dict) -> list[str]:
    """The counter identities that hold once every job finished and everything was acked."""
    bad = []
    disp = sum(c[d] for d in DISPOSITIONS)
    if c["rx_frames"] != disp:
        bad.append(f"rx_frames {c['rx_frames']} != sum of dispositions {disp}")
    tx = (sum(c[d] for d in FORWARDED) + c["results_sent"] + c["reemits"] + c["cnp_sent"]
          + sum(c[d] for d in MGMT_ANSWERED))
    if c["tx_frames"] != tx:
        bad.append(f"tx_frames {c['tx_frames']} != forwarded + results + re-emits + CNPs + "
                   f"management answers = {tx}")
    if c["contributions"] != c["results_sent"]:
        bad.append(f"contributions {c['contributions']} != results_sent {c['results_sent']}")
    if c["released"] != c["freed"]:
        bad.append(f"released {c['released']} != freed {c['freed']}")
    return bad


# ------------------------------------------------------------------------------ runner
def run_scenario(sc: Scenario, backend=model_backend, *, max_events: int | None = None
                 ) -> SoakReport:
    """Run ``sc`` to the end; never raises on a broken guarantee (see ``report.violations``)."""
    t0 = time.perf_counter()
    rep = SoakReport(sc.describe())
    v = rep.violations
    fab = backend(sc, sc.net)
    rng = random.Random(f"netreduce-soak-run/{sc.seed}")
    nrng = np.random.default_rng(sc.seed)
    comms = [Communicator(fab, spec.world, spec.collective(rng), seed=sc.seed, name=f"job{i}")
             for i, spec in enumerate(sc.jobs)]
    macs = [rn.mac for c in comms for rn in c.rnics]
    outages = _Outages(fab, sc.outages, macs)
    active: dict[int, tuple[AllReduce, list]] = {}
    rounds = [spec.rounds for spec in sc.jobs]

    def keys():
        out = []
        for i, (op, _) in active.items():
            p = op.cur
            if p is not None and len(p.rq) == comms[i].world:
                n = comms[i].world
                out += [(i, comms[i].rnics[r].ip, p.rq[(r + 1) % n].qpn) for r in range(n)]
        return out

    adv = (_Adversary(fab, sc.adversary_every_ns, sc.seed, keys)
           if sc.adversary_every_ns else None)
    endpoint: Counter = Counter()
    engine_passes: Counter = Counter()

    def start(i: int) -> None:
        xs = _inputs(nrng, sc.jobs[i])
        active[i] = (comms[i].allreduce_async(xs), xs)
        rounds[i] -= 1

    for i in range(len(sc.jobs)):
        start(i)
    deadline = fab.now() + sc.timeout_ns
    try:
        while active:
            ops = [op for op, _ in active.values()]
            fab.run_until(lambda ops=ops: any(o.done or o.poll_error() is not None
                                              for o in ops),
                          max(1, deadline - fab.now()), max_events=max_events,
                          describe=lambda ops=ops: "; ".join(o.describe() for o in ops
                                                             if not o.done))
            for i, (op, xs) in list(active.items()):
                if op.poll_error() is not None:
                    raise op.error
                if op.done:
                    res = op.result()
                    v += _check_result(xs, res, f"job {i} ({sc.jobs[i].world} ranks) round "
                                                f"{sc.jobs[i].rounds - rounds[i]}")
                    rep.allreduces += 1
                    rep.bytes_reduced += int(xs[0].nbytes)
                    endpoint.update({k: x for k, x in res.stats.items()
                                     if isinstance(x, int)})
                    engine_passes.update(res.stats["engine"])
                    del active[i]
                    if rounds[i] > 0:
                        start(i)
    except (RCError, SimulationHang) as e:
        v.append(f"{type(e).__name__}: {e}")
        for op, _ in active.values():
            op.abort()
    if adv is not None:
        adv.stopped = True
        rep.adversary = dict(adv.sent)
    try:
        fab.run_all(10**10)  # drain: every frame still in flight is delivered or dropped
    except SimulationHang as e:
        v.append(f"network did not drain: {e}")
    rep.sim_time_ns = fab.now()
    ctrl = EngineControl(fab.bus)
    c = ctrl.counters()
    rep.counters = c
    rep.endpoint = dict(endpoint)
    if ctrl.enabled_jobs():
        v.append(f"jobs still enabled after the run: {ctrl.enabled_jobs()}")
    if ctrl.slots_in_use():
        v.append(f"{ctrl.slots_in_use()} slots busy after the run")
    if not v or not any(x.startswith(("RCError", "SimulationHang")) for x in v):
        v += balance(c)
    # the fabric and the links agree with the engine's counters
    st = fab.stats
    if st["engine_in"] != c["rx_frames"] or st["engine_out"] != c["tx_frames"]:
        v.append(f"fabric saw {st['engine_in']} frames in / {st['engine_out']} out, engine "
                 f"counted rx {c['rx_frames']} / tx {c['tx_frames']}")
    links = fab.link_stats()
    up, down = links["up"], links["down"]
    up_delivered = up["frames"] - up["lost"] + up["duplicated"]
    if up_delivered + st["injected"] != st["engine_in"]:
        v.append(f"up links delivered {up_delivered} + injected {st['injected']} != "
                 f"engine_in {st['engine_in']}")
    if down["frames"] + st["unroutable"] + outages.drops["down"] != st["engine_out"]:
        v.append(f"down links took {down['frames']} + unroutable {st['unroutable']} + outage "
                 f"drops {outages.drops['down']} != engine_out {st['engine_out']}")
    if fab.sched.pending():
        v.append(f"{fab.sched.pending()} events still pending after the drain")
    rep.links = {"up": dict(up), "down": dict(down), "outage_drops": dict(outages.drops),
                 "unroutable": st["unroutable"], "injected": st["injected"]}
    rep.ok = not v and rep.allreduces == sum(j.rounds for j in sc.jobs)
    if not v and not rep.ok:
        v.append(f"only {rep.allreduces} of {sum(j.rounds for j in sc.jobs)} all-reduces ran")
    stats = getattr(fab, "backend_stats", None)
    if stats is not None:
        rep.backend = stats()
    close = getattr(fab, "close", None)
    if close is not None:
        close()
    rep.wall_s = time.perf_counter() - t0
    return rep
