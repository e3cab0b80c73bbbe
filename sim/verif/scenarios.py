"""Scoreboard scenarios: named, seeded closed-loop traffic recorded as engine event logs, and a
runner that plays a log into any engine backend and scoreboards it against the model.

Recording
    :func:`record` runs a :class:`~netreduce.sim.verif.soak.Scenario` closed loop (RC endpoint
    models, the collective driver programming the engine through :class:`EngineControl`, the seeded
    network model with loss/dup/reorder/CE per direction and kind of traffic, the soak adversary's
    spoofed, replayed and corrupted frames, plus :class:`_Junk`'s non-RoCE and malformed frames)
    around an engine wrapped in :class:`~netreduce.sim.verif.scoreboard.RecordingEngine`, and
    returns the :class:`~netreduce.sim.verif.scoreboard.EventLog` of everything that entered the
    engine (register writes/reads and frames with their cycles) plus what the engine emitted. The
    engine in the loop is the model by default; ``engine=`` puts any object with ``receive(port,
    frame, time)`` and ``bus`` there (for instance :class:`EngineAdapter` around an RTL backend), so
    the RTL can also run closed loop.

    Endpoints map to engine ports by a hash of their MAC (every port gets traffic; results leave
    on the port their rank's frame came in, D13).

Library
    :data:`SCENARIOS` (name -> :class:`~netreduce.sim.verif.soak.Scenario`) covers N 2..32, PMTU
    256, 1024 and 4096, message sizes that are not multiples of the PMTU, loss/dup/reorder on every
    direction and kind, 2-4 concurrent jobs, CE marks with CNPs, PSN wrap, float32 (MAX + SUM_SAT
    passes), ACK-only loss and junk/spoofed frames. All use :data:`ENGINE_PARAMS`, so one RTL build
    runs them all. Sizes are kept small (hundreds to a few thousand frames), so each runs in seconds
    on the model and in minutes at most on Verilator. :func:`random_scenario` makes more from a
    seed.

Playing a log into a backend (open loop)
    :func:`run_log` feeds a recorded log into a :class:`FrameBackend`: register writes as
    recorded (after an enable write it polls ``JOB.STATUS`` as :class:`EngineControl` does, since
    the gateware takes cycles to enable), frames one at a time, in log order (so the processing
    order is the log's, see the scoreboard's assumptions), and returns the log *as fed* (frame
    cycles as the backend accepted them), the outputs and the final register snapshot for
    :func:`netreduce.sim.verif.scoreboard.check`. :class:`ModelBackend` implements the protocol on
    the reference model (the scoreboard must pass: that is the self-test).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, replace
from typing import Protocol

from netreduce.regmap import build_regmap
from netreduce.wire import Opcode, WireError, parse
from netreduce.wire.fields import ETH, ETHERTYPE_VLAN, IPV4, UDP
from netreduce.wire.icrc import icrc_bytes
from netreduce.wire.view import BTH_AT, CONTROL_OPCODES, IPV4_OFF, ROCEV2_PORT_BYTES, l3_offset

from ..backend import open_engine
from ..model import Emit
from ..net.network import DIRECTIONS, KINDS, LinkConfig, NetConfig
from ..rtl.backend import HarnessBus
from .scoreboard import EventLog, Out, RecordingEngine, ScoreReport, check, snapshot
from .soak import _ATTACKER_MAC, _SINK_MAC, JobSpec, Scenario, _SoakModelFabric, run_scenario

# bytes of the IPv4/UDP headers (from the IPv4 header) the ICRC masks: TOS, TTL, IPv4 and UDP
# checksums; a bit flipped there changes no check
_ICRC_MASKED = (IPV4.tos.offset, IPV4.ttl.offset, IPV4.checksum.offset, IPV4.checksum.offset + 1,
                IPV4.size + UDP.checksum.offset, IPV4.size + UDP.checksum.offset + 1)
_UC = int(Opcode.UC_SEND_FIRST)  # the UC opcode block (0x20 + the RC opcode's low bits)
_RDMA_READ_REQUEST = 0x0C  # an RC opcode the wire format does not know
_ETHERTYPE_IPV6, _ETHERTYPE_LLDP = 0x86DD, 0x88CC

__all__ = ["ENGINE_PARAMS", "SCENARIOS", "Recording", "record", "random_scenario",
           "FrameBackend", "ModelBackend", "FastSimBackend", "EngineAdapter", "run_log",
           "score_backend", "scenario_names", "UnitLog", "unit_logs"]

#: Build parameters every library scenario fits (one RTL build runs them all).
ENGINE_PARAMS = dict(ports=2, jobs=4, flows=32, slots=64, pmtu_max=4096, data_width=512,
                     max_world=32)
_JUNK_MAC = b"\x02\xad\xad\xad\xad\x03"


# ================================================================================== recording
class _Fabric(_SoakModelFabric):
    """The soak's model fabric, with endpoints spread over the engine's ports and an optional
    junk injector."""

    def __init__(self, engine, net, seed, ports):
        super().__init__(engine, net=net, seed=seed)
        self.port_of = lambda mac: zlib.crc32(bytes(mac)) % ports


class _Junk:
    """Every ``period`` ns one frame the engine must forward or drop without any state change:
    non-RoCE traffic (ARP, IPv6/UDP, IPv4/TCP, UDP to another port, runts, VLAN-tagged
    non-IP) or a malformed copy of observed RoCE traffic (bit flip outside the payload with the
    ICRC left stale, truncation, trailing bytes, a bad IPv4 checksum, an opcode the flow may not
    carry). Sent towards a MAC nobody owns, so only the engine sees them."""

    def __init__(self, fab, period: int, seed: int):
        self.fab, self.period = fab, period
        self.rng = random.Random(f"netreduce-scoreboard-junk/{seed}")
        self.seen: list[bytes] = []
        self.stopped = False
        self.sent = 0
        inner = fab._at_middle

        self.last_real = 0

        def observe(mac, frame, inner=inner):
            if mac not in (_ATTACKER_MAC, _JUNK_MAC):
                self.last_real = fab.now()
                if len(self.seen) < 256:
                    self.seen.append(frame)
            inner(mac, frame)
        fab._at_middle = observe
        fab.call_at(period, self._tick)

    def _tick(self) -> None:
        # stop once the endpoints have gone quiet (the run is over and the network drains)
        if self.stopped or self.fab.now() - self.last_real > 20 * self.period:
            self.stopped = True
            return
        f = self.make()
        if f is not None:
            self.sent += 1
            self.fab.stats["injected"] += 1
            self.fab._at_middle(_JUNK_MAC, f)
        self.fab.call_at(self.fab.now() + self.period, self._tick)

    def make(self) -> bytes | None:
        r = self.rng
        hdr = _SINK_MAC + _JUNK_MAC
        kind = r.choice(("arp", "ipv6", "tcp", "udp", "runt", "vlan", "flip", "trunc",
                         "extend", "ipsum", "opcode") if self.seen else ("arp", "runt"))
        pad = bytes(r.randrange(256) for _ in range(r.randrange(20, 80)))
        if kind == "arp":
            return hdr + b"\x08\x06" + bytes(28) + bytes(18)
        if kind == "ipv6":
            return hdr + b"\x86\xdd\x60" + bytes(5) + b"\x11\x40" + bytes(32) \
                + ROCEV2_PORT_BYTES * 2 + pad
        if kind == "tcp":
            return hdr + b"\x08\x00\x45\x00\x00\x40" + bytes(3) + b"\x06" + bytes(10) + pad
        if kind == "udp":
            return hdr + b"\x08\x00\x45\x00\x00\x40" + bytes(3) + b"\x11" + bytes(10) \
                + ROCEV2_PORT_BYTES + b"\x00\x35" + pad
        if kind == "runt":
            return hdr[:r.randrange(1, 12)]
        if kind == "vlan":
            return hdr + ETHERTYPE_VLAN.to_bytes(2, "big") + (5).to_bytes(2, "big") \
                + _ETHERTYPE_LLDP.to_bytes(2, "big") + pad  # VLAN 5, LLDP inside
        b = bytearray(r.choice(self.seen))
        try:
            f = parse(bytes(b))
        except WireError:
            f = None
        b[:ETH.src.offset] = _SINK_MAC
        l3 = l3_offset(b)
        if kind == "flip":
            # anywhere from the IPv4 header on, but never TOS/TTL/checksums (fields the ICRC
            # masks): the ICRC or a structural check then fails
            while True:
                i = r.randrange(l3, len(b))
                if i - l3 not in _ICRC_MASKED:
                    break
            b[i] ^= 1 << r.randrange(8)
        elif kind == "trunc":
            b = b[:r.randrange(1, len(b))]
        elif kind == "extend":
            b += bytes(r.randrange(1, 9))
            if len(b) <= 60:
                b += bytes(61 - len(b))
        elif kind == "ipsum":
            b[l3 + IPV4.checksum.offset] ^= 0x5A
        elif kind == "opcode":
            if f is None or f.opcode in CONTROL_OPCODES:
                return None
            # a UC packet (well-formed, but not what a flow carries) or an opcode the wire
            # format does not know (RDMA READ request, 0x0C), ICRC recomputed
            if r.random() < 0.5 and f.info.has_payload:
                return f.copy(opcode=_UC + (f.opcode & 0x1F), dmac=_SINK_MAC).pack()
            b[l3 + BTH_AT] = _RDMA_READ_REQUEST
            end = l3 + IPV4.total_length.get(b, l3)
            b[end - 4:end] = icrc_bytes(bytes(b[l3:end - 4]))
        return bytes(b)


@dataclass
class Recording:
    """A recorded closed-loop run: the log, the outputs of the engine in the loop, the soak
    report (every guarantee checked) and the number of junk frames injected."""

    log: EventLog
    outs: list[Out]
    report: object
    junk: int


def record(sc: Scenario, *, junk_every_ns: int = 0, engine=None,
           params: dict | None = None) -> Recording:
    """Run ``sc`` closed loop and record the engine's event log (see the module docstring)."""
    params = dict(params or sc.engine)
    eng = engine if engine is not None else open_engine("model", params)
    rec = RecordingEngine(eng, params, sc.name)
    box: dict = {}

    def backend(sc_, net):
        fab = _Fabric(rec, net, sc_.seed, params["ports"])
        if junk_every_ns:
            box["junk"] = _Junk(fab, junk_every_ns, sc_.seed)
        box["fab"] = fab
        return fab

    rep = run_scenario(replace(sc, engine=params), backend)
    j = box.get("junk")
    if j is not None:
        j.stopped = True
    return Recording(rec.log, rec.outs, rep, j.sent if j is not None else 0)


# ================================================================================== library
def _net(loss=0.0, dup=0.0, reorder=0.0, ce=0.0, jitter=0, overrides=None) -> NetConfig:
    base = LinkConfig(loss=loss, dup=dup, reorder=reorder, ce=ce, jitter_ns=jitter,
                      reorder_ns=3000)
    ack = replace(base, priority=True)
    ov = {("up", "ack"): ack, ("down", "ack"): ack}
    ov.update(overrides or {})
    return NetConfig(base, ov)


def _per_direction(seed: int, p: float) -> NetConfig:
    """Different loss/dup/reorder on each (direction, kind)."""
    r = random.Random(f"netreduce-scoreboard-net/{seed}")
    ov = {(d, k): LinkConfig(loss=r.uniform(0, p), dup=r.uniform(0, p), reorder=r.uniform(0, p),
                             reorder_ns=3000, priority=(k == "ack"))
          for d in DIRECTIONS for k in KINDS}
    return NetConfig(LinkConfig(), ov)


def _sc(name, seed, net, *jobs, adversary=0, timeout_ns=20 * 10**9) -> Scenario:
    return Scenario(name, seed, net, tuple(jobs), (), adversary, dict(ENGINE_PARAMS),
                    timeout_ns)


@dataclass(frozen=True)
class _Job(JobSpec):
    """A soak job whose float32 exponent pass uses the job's own window (the driver's default,
    64 slots, would need the whole pool of :data:`ENGINE_PARAMS`)."""

    def collective(self, rng: random.Random):
        return replace(super().collective(rng), exp_window=min(16, self.window))


def _j(world, elems, pmtu, window=32, msg=4, **kw) -> JobSpec:
    return _Job(world=world, elems=elems, pmtu=pmtu, window=window, msg_packets=msg,
                   timeout=kw.pop("timeout", 5), **kw)


#: name -> (scenario, junk injection period in ns or 0). Sizes: elems * 4 bytes per rank,
#: deliberately not multiples of the PMTU.
SCENARIOS: dict[str, tuple[Scenario, int]] = {
    "n2_pmtu256_clean": (_sc("n2_pmtu256_clean", 1, _net(), _j(2, 1000, 256),
                             _j(3, 333, 256, window=16)), 0),
    "n4_pmtu1024_loss": (_sc("n4_pmtu1024_loss", 2, _net(loss=0.03),
                             _j(4, 2500, 1024), _j(2, 700, 1024, window=16)), 0),
    "pmtu4096_dup_reorder": (_sc("pmtu4096_dup_reorder", 3, _net(dup=0.05, reorder=0.05),
                                 _j(3, 5000, 4096, window=16), _j(2, 1111, 4096, window=8)), 0),
    "four_jobs_per_direction": (_sc("four_jobs_per_direction", 4, _per_direction(4, 0.04),
                                    _j(2, 900, 256, window=16), _j(3, 1500, 1024, window=16),
                                    _j(5, 2100, 4096, window=16),
                                    _j(8, 300, 512, window=16)), 0),
    "n32_pmtu256": (_sc("n32_pmtu256", 5, _net(loss=0.01, reorder=0.02),
                        _j(32, 200, 256, window=32, msg=4)), 0),
    "n16_ce_marks": (_sc("n16_ce_marks", 6, _net(ce=0.3, loss=0.01),
                         _j(16, 600, 1024, window=16, ecn=True),
                         _j(4, 900, 256, window=16, ecn=True)), 0),
    "psn_wrap_faults": (_sc("psn_wrap_faults", 7, _net(loss=0.02, dup=0.02, reorder=0.02),
                     _j(5, 1900, 256, wrap=True), _j(3, 1300, 1024, window=16, wrap=True),
                     _j(2, 800, 4096, window=8, wrap=True)), 0),
    "ack_loss": (_sc("ack_loss", 8, _net(overrides={(d, "ack"): LinkConfig(loss=0.2, priority=True)
                                                   for d in DIRECTIONS}),
                     _j(4, 1500, 512), _j(6, 700, 256, window=16)), 0),
    "float32_max_sat": (_sc("float32_max_sat", 9, _net(loss=0.01),
                            _j(4, 1200, 1024, window=16, dtype="float32"),
                            _j(3, 500, 256, window=16, dtype="float32")), 0),
    "junk_and_spoofs": (_sc("junk_and_spoofs", 10, _net(loss=0.02, reorder=0.02),
                            _j(3, 1500, 1024, window=16), _j(2, 900, 256, window=16),
                            adversary=3000), 1500),
}


def scenario_names() -> list[str]:
    return list(SCENARIOS)


def random_scenario(seed: int, max_world: int = 8) -> tuple[Scenario, int]:
    """A seeded scenario from the same space (2-4 jobs, N 2..``max_world``, PMTU 256..4096,
    faults per direction and kind, CE, wrap, junk on odd seeds), sized for the scoreboard."""
    r = random.Random(f"netreduce-scoreboard/{seed}")
    jobs = []
    budget_flows = ENGINE_PARAMS["flows"]
    budget_slots = ENGINE_PARAMS["slots"]
    for _ in range(r.randint(2, 4)):
        world = min(r.randint(2, max_world), budget_flows)
        window = min(r.choice([8, 16, 32, 64]), budget_slots)
        if world < 2 or window < 8:
            break
        budget_flows -= world
        budget_slots -= window
        pmtu = r.choice([256, 512, 1024, 2048, 4096])
        pkts = max(1, r.randint(3, 40) // max(1, world // 4))
        elems = max(1, pkts * pmtu // 4 - r.randrange(1, pmtu // 4))
        jobs.append(_j(world, elems, pmtu, window=window, msg=r.randint(1, window // 4),
                       ecn=r.random() < 0.3, wrap=r.random() < 0.4,
                       dtype="float32" if r.random() < 0.15 else "int32"))
    ce = 0.2 if any(j.ecn for j in jobs) else 0.0
    net = _per_direction(seed, 0.04) if seed % 2 else _net(r.uniform(0, 0.03),
                                                            r.uniform(0, 0.03),
                                                            r.uniform(0, 0.03), ce)
    return (_sc(f"random_{seed}", seed, net, *jobs, adversary=4000 if seed % 3 == 0 else 0),
            2000 if seed % 2 else 0)


# ================================================================================== backends
class FrameBackend(Protocol):
    """An engine a recorded log can be played into (model, Verilator, cocotb...).

    ``params``: its build parameters. ``read``/``write``: one AXI4-Lite access each.
    ``feed(port, frame)``: put one frame into ``port`` and return the cycle its last beat was
    accepted; the engine must have taken the whole frame when it returns (backpressure is the
    backend's business). ``outputs()``: every frame emitted since the last call, as
    ``(port, frame, cycle)`` in emission order. ``settle()``: run until the engine is idle
    (nothing in flight, outputs drained)."""

    params: dict

    def read(self, addr: int) -> int: ...

    def write(self, addr: int, value: int) -> None: ...

    def feed(self, port: int, frame: bytes) -> int: ...

    def outputs(self) -> list[tuple[int, bytes, int]]: ...

    def settle(self) -> None: ...


class ModelBackend:
    """:class:`FrameBackend` on the reference model: frames take one cycle per 64-byte beat plus
    a gap of ``gap`` cycles, so CNP timing is exercised like a timed engine's."""

    def __init__(self, params: dict, gap: int = 4):
        self.params = dict(params)
        self.engine = open_engine("model", params)
        self.cycle = 0
        self.gap = gap
        self._outs: list[tuple[int, bytes, int]] = []

    def read(self, addr: int) -> int:
        return self.engine.bus.read(addr)

    def write(self, addr: int, value: int) -> None:
        self.engine.bus.write(addr, value)

    def feed(self, port: int, frame: bytes) -> int:
        self.cycle += (len(frame) + 63) // 64 + self.gap
        self._outs += [(e.port, e.frame, e.time) for e in
                       self.engine.receive(port, frame, self.cycle)]
        return self.cycle

    def outputs(self) -> list[tuple[int, bytes, int]]:
        o, self._outs = self._outs, []
        return o

    def settle(self) -> None:
        pass


class FastSimBackend:
    """:class:`FrameBackend` on a :class:`netreduce.sim.rtl.fastsim.FastSim` of the engine top
    (Verilator, frame-level harness). ``feed`` queues the frame and runs until its last beat was
    accepted (the cycle returned is the one after that handshake: a constant offset, which the
    CNP limiter's differences do not see); ``settle`` runs until the engine has been quiet
    (no beat on any port) for ``quiet`` cycles. Backpressure longer than ``limit`` cycles
    raises ``TimeoutError``."""

    def __init__(self, sim, params: dict, *, quiet: int = 256, limit: int = 200_000):
        self.sim = sim
        self.params = dict(params)
        self.quiet = quiet
        self.limit = limit
        self.errors: list[str] = []  # error-flagged outputs (they are scoreboarded too)
        self._outs: list[tuple[int, bytes, int]] = []
        self._bus = HarnessBus(sim, after=lambda: self._take(sim.collect()))

    def _take(self, frames) -> None:
        for f in frames:
            if f.error:
                self.errors.append(f"error-flagged output frame on port {f.port} at cycle "
                                   f"{f.cycle}: {f.frame[:32].hex()}...")
            self._outs.append((f.port, f.frame, f.cycle))

    def read(self, addr: int) -> int:
        return self._bus.read(addr)

    def write(self, addr: int, value: int) -> None:
        self._bus.write(addr, value)

    def feed(self, port: int, frame: bytes) -> int:
        sim = self.sim
        sim.send(port, frame)
        beats = -(-len(frame) // sim.bytes_per_beat)
        self._take(sim.run(beats))
        start = sim.cycle
        while sim.pending(port):
            if sim.cycle - start > self.limit:
                raise TimeoutError(f"port {port}: frame of {len(frame)} B not accepted after "
                                   f"{self.limit} cycles (tready low)")
            self._take(sim.run(1))
        return sim.cycle

    def outputs(self) -> list[tuple[int, bytes, int]]:
        self._take(self.sim.collect())
        o, self._outs = self._outs, []
        return o

    def settle(self) -> None:
        sim = self.sim
        start = sim.cycle
        while True:
            self._take(sim.run(self.limit, until_idle=True, quiet=self.quiet))
            if sim.idle() and sim.cycle - sim.last_activity > self.quiet:
                return
            if sim.cycle - start > self.limit:
                raise TimeoutError(f"engine not idle after {self.limit} cycles")


class EngineAdapter:
    """Makes a :class:`FrameBackend` look like the model's ``Engine`` (``receive(port, frame,
    time) -> [Emit]``, ``bus``) so it can sit in the closed loop of :func:`record`: each frame is
    fed, the engine is run until idle, and its outputs are returned as emits at the input time.
    JOB.CTRL enables are polled until done."""

    def __init__(self, backend: FrameBackend):
        self.backend = backend
        self.ports = backend.params["ports"]
        self.bus = _PollingBus(backend)

    def receive(self, port: int, frame: bytes, time: int) -> list[Emit]:
        self.backend.feed(port, frame)
        self.backend.settle()
        return [Emit(p, bytes(f), time) for p, f, _ in self.backend.outputs()]


class _PollingBus:
    def __init__(self, backend: FrameBackend, limit: int = 10_000):
        self.b = backend
        rm = build_regmap(**backend.params)
        self.ctrl = {rm.addr("JOB.CTRL", j): j for j in range(rm.params["jobs"])}
        self.status = [rm.addr("JOB.STATUS", j) for j in range(rm.params["jobs"])]
        self.en = rm.field("JOB.STATUS.enabled")
        self.err = rm.field("JOB.STATUS.error")
        self.limit = limit

    def read(self, addr: int) -> int:
        return self.b.read(addr)

    def write(self, addr: int, value: int) -> None:
        self.b.write(addr, value)
        j = self.ctrl.get(addr)
        if j is None:
            return
        want = value & 1
        for _ in range(self.limit):
            st = self.b.read(self.status[j])
            if self.en.get(st) == want or (want and self.err.get(st)):
                return
        raise TimeoutError(f"job {j}: JOB.STATUS 0x{st:08x} still not "
                           f"{'enabled' if want else 'disabled'} after {self.limit} polls")


def run_log(backend: FrameBackend, log: EventLog, *, settle_every: int = 0,
            reads: bool = True, settle_on_port_change: bool = True
            ) -> tuple[EventLog, list[tuple[int, bytes, int]], dict[str, int]]:
    """Play ``log`` into ``backend`` (open loop); see the module docstring. Returns the log as
    fed (frame cycles from ``backend.feed``), the outputs, and the final register snapshot.
    ``settle_every``: also let the engine go idle after every n-th frame (0: only before
    register writes and at the end). ``reads=False`` skips the recorded register reads (the
    driver's table scans and status polls; they change nothing). ``settle_on_port_change``:
    let the engine go idle before a frame on another port than the previous one, so frames
    queued on different ports cannot be taken in another order than the log's (frames of one
    port are processed in order anyway)."""
    bus = _PollingBus(backend)
    fed = EventLog(dict(log.params), name=log.name)
    outs: list[tuple[int, bytes, int]] = []
    pending = False
    n = 0
    last_port = None
    for kind, a, b, cycle in log.events:
        if kind == "frame":
            if settle_on_port_change and last_port is not None and a != last_port:
                backend.settle()
            last_port = a
            c = backend.feed(a, b)
            fed.frame(a, b, c)
            pending = True
            n += 1
            if settle_every and n % settle_every == 0:
                backend.settle()
            continue
        if pending:
            backend.settle()  # register accesses happen with no frame in flight
            pending = False
        if kind == "write":
            bus.write(a, b)
            fed.write(a, b, cycle)
        elif kind == "read" and reads:
            fed.read(a, backend.read(a), cycle)
        outs += backend.outputs()
    backend.settle()
    outs += backend.outputs()
    return fed, outs, snapshot(backend, log.params)


def score_backend(backend: FrameBackend, log: EventLog, *, end_state: bool = True
                  ) -> ScoreReport:
    """:func:`run_log` then :func:`~netreduce.sim.verif.scoreboard.check` (outputs and the whole
    register state against the model)."""
    fed, outs, state = run_log(backend, log)
    rep = check(fed, outs, state, end_state=end_state)
    rep.end_state += list(getattr(backend, "errors", ()))
    return rep


def recorded(name: str) -> Recording:
    """Record library scenario ``name`` on the model."""
    sc, junk = SCENARIOS[name]
    return record(sc, junk_every_ns=junk)


# ================================================================================== unit logs
class _Unit:
    """Builds a unit log: the driver programs a recording model engine, frames go in one by one
    ``gap`` cycles apart."""

    def __init__(self, name: str, params: dict, gap: int = 200):
        from netreduce.sw_driver.control import EngineControl

        self.rec = RecordingEngine(open_engine("model", params), params, name)
        self.ctl = EngineControl(self.rec.bus)
        self.t = 0
        self.gap = gap

    def add(self, *jobs) -> _Unit:
        for j in jobs:
            self.ctl.add_job(j.config())
        return self

    def send(self, frame: bytes, port: int = 0) -> list[Emit]:
        self.t += self.gap
        return self.rec.receive(port, bytes(frame), self.t)

    def contribute(self, job, index: int, xs, ranks=None, port_of=lambda r: r % 2, **kw):
        for r in (range(job.world) if ranks is None else ranks):
            self.send(job.data_bytes(r, index, xs[r], **kw), port_of(r))

    def ack(self, job, index: int, port_of=lambda r: r % 2):
        for r in range(job.world):
            self.send(job.ack(r, index), port_of(r))

    def done(self, *jobs) -> EventLog:
        for j in jobs:
            self.ctl.remove_job(j.job)
        return self.rec.log


def _lanes(rng: random.Random, n: int, lo=-2**31, hi=2**31 - 1) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


@dataclass
class UnitLog:
    """A unit log, the engine-wide counters the model ends with (proof that the log exercises
    its rule), and whether the end-state identities apply (not after a mid-flight disable)."""

    log: EventLog
    expect: dict[str, int]
    end_state: bool = True


def unit_logs(params: dict | None = None) -> dict[str, UnitLog]:
    """One short log per contract rule (see each comment below).

    Every log programs its jobs through :class:`EngineControl` (as the driver does), mixes both
    ports (when the build has two), ends with every index acknowledged and every job removed, so
    the end-state identities hold. The expected counters make sure each log really exercises its
    rule on the model; the RTL is then held to the model byte for byte and register for
    register by :func:`~netreduce.sim.verif.scoreboard.check`."""
    from netreduce.sim.model.kit import RingJob

    from netreduce.regmap import Op
    from netreduce.wire import ECN_CE, ECN_ECT0, Opcode, RoceFrame

    p = dict(params or ENGINE_PARAMS)
    two = p["ports"] > 1

    def port(r):
        return r % 2 if two else 0

    rng = random.Random(5)
    out: dict[str, UnitLog] = {}

    # duplicate: a retransmission into a FILLING and a COMPLETE-but-unreleased slot is dropped
    a = RingJob(job=0, world=3, window=4, pmtu=256)
    u = _Unit("duplicate", p).add(a)
    x = [[_lanes(rng, 16) for _ in range(3)] for _ in range(3)]
    u.contribute(a, 0, x[0], ranks=[0], port_of=port)
    u.send(a.data_bytes(0, 0, x[0][0]), port(0))  # duplicate while FILLING
    u.contribute(a, 1, x[1], port_of=port)  # index 1 complete, not released (0 is not)
    u.send(a.data_bytes(2, 1, x[1][2]), port(2))  # duplicate while COMPLETE
    u.contribute(a, 0, x[0], ranks=[1, 2], port_of=port)  # releases 0 then 1
    for k in (0, 1):
        u.ack(a, k, port)
    out["duplicate"] = UnitLog(u.done(a), {"duplicates": 2, "released": 2, "freed": 2})

    # re-emit: a retransmission into a RELEASED slot is answered with the result, on the
    # retransmission's own port and with its own header; after the free it becomes a probe
    a = RingJob(job=1, world=2, window=8, pmtu=1024, slot_base=8)
    u = _Unit("reemit", p).add(a)
    x = [_lanes(rng, 200) for _ in range(2)]
    u.contribute(a, 0, x, port_of=port)
    u.send(a.data_bytes(1, 0, x[1], ackreq=1), 0)  # re-emit, other port, different header
    u.ack(a, 0, port)
    u.send(a.data_bytes(0, 0, x[0]), port(0))  # behind the window now: duplicate probe
    out["reemit"] = UnitLog(u.done(a), {"reemits": 1, "behind_window": 1, "results_sent": 2})

    # window: ahead of free + W is dropped (the slot still holds an older index), behind is a
    # probe; after the free the same frame is accepted (D14)
    a = RingJob(job=2, world=2, window=4, pmtu=256, slot_base=16)
    u = _Unit("window", p).add(a)
    xs = {k: [_lanes(rng, 8) for _ in range(2)] for k in range(6)}
    u.contribute(a, 0, xs[0], port_of=port)
    u.send(a.data_bytes(0, 4, xs[4][0]), port(0))  # k = free + W: ahead
    u.send(a.data_bytes(1, 1 << 22, xs[4][1]), port(1))  # far ahead
    u.ack(a, 0, port)
    u.send(a.data_bytes(0, 0, xs[0][0]), port(0))  # behind
    u.contribute(a, 5, xs[5], port_of=port)  # free (1) + W: ahead
    for k in (1, 2, 3):
        u.contribute(a, k, xs[k], port_of=port)
        u.ack(a, k, port)
    for k in (4, 5):  # now inside the window
        u.contribute(a, k, xs[k], port_of=port)
        u.ack(a, k, port)
    out["window"] = UnitLog(u.done(a), {"drop_ahead": 4, "behind_window": 1, "released": 6})

    # opcode/length mismatch with the slot's first contribution, then the right frame
    a = RingJob(job=0, world=3, window=4, pmtu=1024)
    u = _Unit("mismatch", p).add(a)
    x = [_lanes(rng, 64) for _ in range(3)]
    u.send(a.data_bytes(0, 0, x[0], opcode=Opcode.WRITE_FIRST), port(0))
    u.send(a.data_bytes(1, 0, x[1][:60], opcode=Opcode.WRITE_FIRST), port(1))  # length
    u.send(a.data_bytes(1, 0, x[1], opcode=Opcode.WRITE_MIDDLE), port(1))  # opcode
    u.contribute(a, 0, x, ranks=[1, 2], port_of=port, opcode=Opcode.WRITE_FIRST)
    u.ack(a, 0, port)
    out["mismatch"] = UnitLog(u.done(a), {"drop_mismatch": 2, "released": 1})

    # job isolation: two jobs at the same indices and PSNs, one of them VLAN-tagged; a frame
    # with the other job's QPN from this job's source is unregistered; one job's ACKs never
    # free the other's slots
    a = RingJob(job=0, world=2, window=4, pmtu=256, start_psns=[7, 7])
    b = RingJob(job=1, world=3, window=4, pmtu=256, slot_base=4, start_psns=[7, 7, 7],
                vlan_tci=0x0123)
    u = _Unit("isolation", p).add(a, b)
    for k in range(3):
        xa = [_lanes(rng, 10) for _ in range(2)]
        xb = [_lanes(rng, 10) for _ in range(3)]
        for r in range(3):
            if r < 2:
                u.send(a.data_bytes(r, k, xa[r]), port(r))
            u.send(b.data_bytes(r, k, xb[r]), port(r + 1))
        f = parse(a.data_bytes(0, k, xa[0]))
        u.send(f.copy(dqpn=b.rq(1)).pack(), 0)  # job b's QPN from job a's source
        u.ack(a, k, port)
    u.ack(b, 2, port)
    out["isolation"] = UnitLog(u.done(a, b), {"fwd_unregistered": 3, "released": 6,
                                              "freed": 6})

    # disable mid-flight: a FILLING and a RELEASED-but-unacked slot are discarded (all slots
    # free, pointers back to 0), the re-enabled job starts at index 0 again
    u = _Unit("disable", p).add(b)
    for k in range(2):
        u.contribute(b, k, [_lanes(rng, 10) for _ in range(3)], port_of=port)
    u.ack(b, 0, port)
    u.send(b.data_bytes(0, 2, _lanes(rng, 10)), 0)
    u.ctl.remove_job(1)
    u.add(b)
    u.contribute(b, 0, [_lanes(rng, 10) for _ in range(3)], port_of=port)
    u.ack(b, 0, port)
    out["disable"] = UnitLog(u.done(b), {"released": 3, "freed": 2, "contributions": 10},
                             end_state=False)

    # SUM_SAT saturating in both directions, MAX with negative lanes
    a = RingJob(job=0, world=3, window=4, pmtu=256, op=Op.SUM_SAT)
    b = RingJob(job=3, world=2, window=4, pmtu=256, slot_base=4, op=Op.MAX)
    u = _Unit("saturation_max", p).add(a, b)
    big, small = 2**31 - 1, -2**31
    u.contribute(a, 0, [[big - 5, small + 5, 1, -1] * 4, [10, -10, 2**30, -2**30] * 4,
                        [10, -10, 2**30, -2**30] * 4], port_of=port)
    u.contribute(a, 1, [[1, 2, 3, 4] * 4, [5, 6, 7, 8] * 4, [-1, -2, -3, -4] * 4],
                 port_of=port)
    u.contribute(b, 0, [[-5, -7, small, big] * 8, [-6, -2, small + 1, 0] * 8], port_of=port)
    for k in (0, 1):
        u.ack(a, k, port)
    u.ack(b, 0, port)
    out["saturation_max"] = UnitLog(u.done(a, b), {"saturations": 2, "released": 3})

    # malformed and unregistered frames on a job's keys and elsewhere: each counted under its
    # reason, none changes a result
    a = RingJob(job=0, world=2, window=4, pmtu=256)
    u = _Unit("malformed", p).add(a)
    x = [_lanes(rng, 32) for _ in range(2)]
    good = a.data_bytes(0, 0, x[0])
    f = parse(good)
    bad = []
    b0 = bytearray(good)
    b0[-1] ^= 1
    bad.append(("drop_icrc", bytes(b0)))
    b0 = bytearray(good)
    b0[IPV4_OFF + IPV4.checksum.offset] ^= 0x40
    bad.append(("drop_ip_checksum", bytes(b0)))
    bad.append(("drop_length", good[:70]))
    bad.append(("drop_opcode", f.copy(opcode=Opcode.UC_WRITE_ONLY).pack()))
    bad.append(("drop_opcode", f.copy(tver=1).pack()))
    bad.append(("drop_pmtu", f.copy(payload=bytes(260), dmalen=260).pack()))
    bad.append(("drop_align", RoceFrame(**{**_fields(f), "payload": bytes(30)}).pack()))
    et = ETH.ethertype.offset
    bad.append(("fwd_not_roce", good[:et] + _ETHERTYPE_IPV6.to_bytes(2, "big") + good[et + 2:]))
    bad.append(("fwd_not_roce", good[:20]))
    bad.append(("fwd_unregistered", f.copy(src_ip=0x0A0A0A0A).pack()))
    bad.append(("fwd_unregistered", good[:50]))
    ack = bytearray(a.ack(0, 0))
    ack[-5] ^= 1  # inside the ICRC
    bad.append(("fwd_ctrl_invalid", bytes(ack)))
    bad.append(("fwd_cnp", a.receiver_cnp(1)))
    for i, (_, fr) in enumerate(bad):
        u.send(fr, port(i))
    u.contribute(a, 0, x, port_of=port)
    for i, (_, fr) in enumerate(bad):
        u.send(fr, port(i + 1))
    u.ack(a, 0, port)
    exp: dict[str, int] = {"released": 1, "contributions": 2}
    for reason, _ in bad:
        exp[reason] = exp.get(reason, 0) + 2
    out["malformed"] = UnitLog(u.done(a), exp)

    # CE marks: CNPs at most every JOB.CNP_INTERVAL cycles per flow; results CE -> ECT(0)
    a = RingJob(job=0, world=2, window=8, pmtu=256, cnp_interval=500)
    u = _Unit("cnp", p, gap=60).add(a)
    for k in range(6):
        xk = [_lanes(rng, 8) for _ in range(2)]
        for r in range(2):
            u.send(a.data_bytes(r, k, xk[r], ecn=ECN_CE if (k + r) % 3 else ECN_ECT0), port(r))
        u.ack(a, k, port)
    out["cnp"] = UnitLog(u.done(a), {"released": 6, "cnp_sent": 4, "cnp_suppressed": 4})

    # PSN wrap inside the window, sizes that are not multiples of the PMTU (FIRST/MIDDLE/LAST)
    a = RingJob(job=2, world=4, window=8, pmtu=1024, slot_base=32,
                start_psns=[(1 << 24) - 2, (1 << 24) - 1, 0, (1 << 24) - 3])
    u = _Unit("psn_wrap", p).add(a)
    ops = [Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_MIDDLE,
           Opcode.WRITE_LAST_IMM]
    for k in range(4):
        n = 256 if k < 3 else 77  # last packet of the message shorter
        xk = [_lanes(rng, n) for _ in range(4)]
        u.contribute(a, k, xk, port_of=port, opcode=ops[k], ackreq=int(k == 3))
    u.ack(a, 3, port)
    out["psn_wrap"] = UnitLog(u.done(a), {"released": 4, "freed": 4})
    return out


def _fields(f) -> dict:
    import dataclasses

    d = {fl.name: getattr(f, fl.name) for fl in dataclasses.fields(f)}
    d.update(padcnt=None, ip_checksum=None, icrc=None)
    return d
