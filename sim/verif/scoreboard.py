"""Whole-engine scoreboard: an engine's output frames and registers against the reference model.

Input
    An :class:`EventLog`: what entered the engine, in the order the engine *processed* it, each
    event with its cycle: ``("write", addr, value, cycle)`` register writes, ``("read", addr,
    value, cycle)`` register reads (ignored by the replay; kept so a harness can poll as the driver
    did), ``("frame", port, bytes, cycle)`` input frames. The outputs of the engine under test:
    ``(port, frame, cycle)`` tuples in the order they left (any iterable; each port's frames in
    their order on that port).

Method
    :func:`replay` feeds the log into a fresh :class:`netreduce.sim.model.Engine` built with the
    same parameters (writes through ``Engine.bus``, frames through ``Engine.receive(port, frame,
    cycle)``). :func:`compare` groups both output lists by :func:`flow_of` and requires each flow's
    sequence to be identical, byte for byte. :func:`check` does both and also compares the
    register state (every counter, the job table's state registers, the flow table's ACKED/STATUS:
    :func:`snapshot`) and, optionally, the end-of-run identities of :func:`end_state_problems`.

What is compared in order (the contract, engine module docstring)
    The model promises order per output port and per flow; the interleaving of different flows
    and of different kinds of traffic is open. A flow here is :func:`flow_of`: for RoCEv2 frames
    ``(port, source IPv4, destination IPv4, BTH DestQP, kind)`` with kind ``"data"`` (results,
    re-emits, duplicate probes, forwarded data), ``"ack"`` (ACK/NAK) or ``"cnp"``; for everything
    else ``(port, "other")``. The source IPv4 separates a worker's results from forged or
    unregistered frames to the same QP, which travel on the bypass path and may overtake.

Assumptions (a harness must meet them, or the comparison is meaningless)
    * The log's frame order is the engine's processing order. Frames on one port are processed
      in arrival order; frames on different ports that overlap in time may be processed in either
      order, so an RTL harness must either feed one frame at a time (start the next frame, on any
      port, only after the previous one's last beat was accepted) or record the order in which the
      engine actually took them, and pass that order here.
    * A frame's cycle is the cycle its last beat was accepted (``tlast & tvalid & tready``). CNP
      rate limiting (D8) compares cycle differences with ``JOB.CNP_INTERVAL``; the gateware
      timestamps some fixed number of cycles later, which leaves the differences unchanged, but a
      decision within a few cycles of the interval can differ under backpressure. Scenarios that
      need robust CNP decisions use interval 0 or one far longer than the run
      (:func:`set_cnp_interval`). A CNP-only first mismatch is labelled as such in the report.
    * Register writes happen while no frame is in flight (the driver enables a job before traffic
      and removes it after its last ACK), so their position in the log is exact.

Errors
    :func:`check` never raises on a mismatch: it returns a :class:`ScoreReport` (``ok``,
    ``summary()``, ``assert_ok()`` raises :class:`ScoreboardMismatch` with the summary). Malformed
    logs (unknown event kind, port out of range) raise ``ValueError`` naming the event.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from netreduce.regmap import (
    ALL_GLOBAL_COUNTERS,
    DISPOSITIONS,
    JOB_COUNTERS,
    PORT_COUNTERS,
    build_regmap,
)
from netreduce.wire import (
    AETH,
    BTH,
    DOT1Q,
    ETH,
    IMMDT,
    IPV4,
    OPCODES,
    RETH,
    UDP,
    WireError,
    ip_str,
    parse,
)
from netreduce.wire.view import (
    BTH_AT,
    ETHERTYPE_OFF,
    IPV4_OFF,
    OP_ACK,
    OP_CNP,
    dqpn,
    dst_ip,
    l3_offset,
    opcode,
    roce_l3,
    src_ip,
)

from ..backend import open_engine
from ..model import Engine

__all__ = ["Event", "EventLog", "Out", "Replay", "FlowMismatch", "ScoreReport",
           "ScoreboardMismatch", "replay", "flow_of", "compare", "check", "snapshot",
           "state_registers", "frame_diff", "end_state_problems", "set_cnp_interval",
           "RecordingEngine", "FORWARDED", "MGMT_ANSWERED"]

_U32 = 0xFFFFFFFF
# Dispositions whose frame leaves the engine (unchanged, or as a behind-window probe).
FORWARDED = ("fwd_not_roce", "fwd_unregistered", "fwd_ack", "fwd_nak", "fwd_cnp",
             "fwd_ctrl_invalid", "behind_window")
MGMT_ANSWERED = ("mgmt_accepted", "mgmt_reject_replay", "mgmt_reject_opcode",
                 "mgmt_reject_addr", "mgmt_reject_denied")


# ================================================================================== event log
class Event(NamedTuple):
    """``kind`` "write"/"read": ``a`` = byte address, ``b`` = value; "frame": ``a`` = port,
    ``b`` = the frame's bytes (Ethernet header first, no FCS)."""

    kind: str
    a: int
    b: int | bytes
    cycle: int


class Out(NamedTuple):
    """A frame leaving the engine; ``src`` is the index of the input event that caused it
    (model replays only; -1 when unknown)."""

    port: int
    frame: bytes
    cycle: int
    src: int = -1


@dataclass
class EventLog:
    """What entered an engine, in processing order, plus the build parameters it needs."""

    params: dict
    events: list[Event] = field(default_factory=list)
    name: str = ""

    def write(self, addr: int, value: int, cycle: int = 0) -> None:
        self.events.append(Event("write", addr, value, cycle))

    def read(self, addr: int, value: int, cycle: int = 0) -> None:
        self.events.append(Event("read", addr, value, cycle))

    def frame(self, port: int, data: bytes, cycle: int = 0) -> None:
        self.events.append(Event("frame", port, bytes(data), cycle))

    @property
    def frames(self) -> list[Event]:
        return [e for e in self.events if e.kind == "frame"]

    def __len__(self) -> int:
        return len(self.events)

    # ---------------------------------------------------------------- files (reproducers)
    def save(self, path: str | Path) -> None:
        """JSON lines: a header ``{"name", "params"}``, then one ``[kind, a, b, cycle]`` per event
        (frames as hex)."""
        with open(path, "w") as f:
            f.write(json.dumps({"name": self.name, "params": self.params}) + "\n")
            for e in self.events:
                b = e.b.hex() if isinstance(e.b, bytes) else e.b
                f.write(json.dumps([e.kind, e.a, b, e.cycle]) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EventLog:
        with open(path) as f:
            head = json.loads(f.readline())
            log = cls(head["params"], name=head.get("name", ""))
            for line in f:
                k, a, b, c = json.loads(line)
                log.events.append(Event(k, a, bytes.fromhex(b) if k == "frame" else b, c))
        return log


def set_cnp_interval(log: EventLog, cycles: int) -> EventLog:
    """A copy of ``log`` whose JOB.CNP_INTERVAL writes all write ``cycles`` (robust CNP
    decisions on a timed engine: 0 answers every CE mark, 2^32-1 only the first per flow)."""
    rm = build_regmap(**log.params)
    addrs = {rm.addr("JOB.CNP_INTERVAL", j) for j in range(rm.params["jobs"])}
    ev = [Event(e.kind, e.a, cycles, e.cycle) if e.kind == "write" and e.a in addrs else e
          for e in log.events]
    return EventLog(dict(log.params), ev, log.name)


class RecordingEngine:
    """Wraps an engine (``receive(port, frame, time)``, ``bus``) and records an
    :class:`EventLog` of everything that entered it (and, in ``outs``, what it emitted).

    Register accesses are stamped with the cycle of the last frame (the bus has no clock)."""

    def __init__(self, engine, params: dict, name: str = ""):
        self.engine = engine
        self.log = EventLog(dict(params), name=name)
        self.outs: list[Out] = []
        self._cycle = 0
        self.bus = _RecordingBus(self)

    def receive(self, port: int, frame: bytes, time: int):
        self._cycle = max(self._cycle, time)
        src = len(self.log.events)
        self.log.frame(port, frame, time)
        emits = self.engine.receive(port, frame, time)
        self.outs += [Out(e.port, bytes(e.frame), e.time, src) for e in emits]
        return emits

    def __getattr__(self, name):
        return getattr(self.engine, name)


class WriteRecorder:
    """A register bus that passes reads and writes to ``bus`` and appends every write to ``ops``
    as ``(addr, value)``: a model's configuration, to be replayed on the RTL."""

    def __init__(self, bus, ops: list):
        self.bus, self.ops = bus, ops

    def read(self, addr: int) -> int:
        return self.bus.read(addr)

    def write(self, addr: int, value: int) -> None:
        self.bus.write(addr, value)
        self.ops.append((addr, value))


class _RecordingBus:
    def __init__(self, rec: RecordingEngine):
        self._rec = rec

    def read(self, addr: int) -> int:
        v = self._rec.engine.bus.read(addr)
        self._rec.log.read(addr, v, self._rec._cycle)
        return v

    def write(self, addr: int, value: int) -> None:
        self._rec.log.write(addr, value, self._rec._cycle)
        self._rec.engine.bus.write(addr, value)


# ================================================================================== replay
@dataclass
class Replay:
    engine: Engine
    outs: list[Out]


def replay(log: EventLog | Iterable, params: dict | None = None) -> Replay:
    """Feed ``log`` into a fresh model engine; returns it and every frame it emitted."""
    if isinstance(log, EventLog):
        params = log.params if params is None else params
        events = log.events
    else:
        events = list(log)
    if params is None:
        raise ValueError("replay needs the engine's build parameters")
    eng = open_engine("model", params)
    outs: list[Out] = []
    for i, ev in enumerate(events):
        kind, a, b, cycle = ev
        if kind == "write":
            eng.bus.write(a, b)
        elif kind == "read":
            continue
        elif kind == "frame":
            if not isinstance(a, int) or not 0 <= a < eng.ports:
                raise ValueError(f"event {i}: frame on port {a!r}, engine has {eng.ports} ports")
            for e in eng.receive(a, b, cycle):
                outs.append(Out(e.port, bytes(e.frame), e.time, i))
        else:
            raise ValueError(f"event {i}: unknown kind {kind!r} (write/read/frame)")
    return Replay(eng, outs)


# ================================================================================== flows
_l3 = l3_offset


def flow_of(port: int, frame: bytes) -> tuple:
    """The ordering domain of an output frame (see the module docstring).

    Classified positionally, as the engine classifies (no checksum/ICRC checks), so a malformed
    frame forwarded unchanged lands in the same flow as its well-formed neighbours."""
    l3 = roce_l3(frame)
    if l3 <= 0:
        return (port, "other")
    op = opcode(frame, l3)
    kind = "ack" if op == OP_ACK else "cnp" if op == OP_CNP else "data"
    return (port, ip_str(int.from_bytes(src_ip(frame, l3), "big")),
            ip_str(int.from_bytes(dst_ip(frame, l3), "big")), dqpn(frame, l3), kind)


def _flow_str(key: tuple) -> str:
    if key[1] == "other":
        return f"port {key[0]} non-RoCE"
    return f"port {key[0]} {key[4]} {key[1]} -> {key[2]} QP 0x{key[3]:06x}"


# ================================================================================== diffs
def _layout(frame: bytes) -> list[tuple[int, int, str]]:
    """(start, end, "HEADER.field") spans of a frame, as far as its headers can be located."""
    spans: list[tuple[int, int, str]] = []

    def add(hdr, base):
        for f in hdr.fields:
            spans.append((base + f.offset, base + f.offset + f.size, f"{hdr.name}.{f.name}"))

    add(ETH, 0)
    l3 = _l3(frame)
    if l3 != IPV4_OFF:
        spans = [s for s in spans if s[2] != "ETH.ethertype"]
        add(DOT1Q, ETHERTYPE_OFF)
        spans.append((l3 - 2, l3, "ETH.ethertype"))
    add(IPV4, l3)
    add(UDP, l3 + IPV4.size)
    b = l3 + BTH_AT
    add(BTH, b)
    x = b + BTH.size
    info = OPCODES.get(frame[b]) if len(frame) > b else None
    if info is not None:
        for hdr, on in ((RETH, info.reth), (IMMDT, info.immdt), (AETH, info.aeth)):
            if on:
                add(hdr, x)
                x += hdr.size
    t = IPV4.total_length
    total = t.get(frame, l3) if len(frame) >= l3 + t.offset + t.size else 0
    icrc = 4
    end = l3 + total if BTH_AT + BTH.size + icrc <= total <= len(frame) - l3 else len(frame)
    spans.append((x, max(x, end - icrc), "payload"))
    spans.append((max(x, end - icrc), end, "ICRC"))
    spans.append((end, 1 << 30, "Ethernet pad / trailing bytes"))
    return spans


def _where(frame: bytes, off: int) -> str:
    best = None
    for s, e, name in _layout(frame):
        if s <= off < e and (best is None or e - s < best[1] - best[0]):
            best = (s, e, name)
    if best is None:
        return "?"
    if best[2] == "payload":
        return f"payload byte {off - best[0]} (int32 lane {(off - best[0]) // 4})"
    return best[2]


def frame_diff(want: bytes, got: bytes, limit: int = 8) -> str:
    """A readable difference of two frames: decoded header fields (via netreduce.wire.parse)
    and the first differing payload lanes; falls back to located bytes if a frame is no
    RoCEv2 frame."""
    if want == got:
        return "identical"
    lines = []
    if len(want) != len(got):
        lines.append(f"length: expected {len(want)} B, got {len(got)} B")
    try:
        fw, fg = parse(want, check=False), parse(got, check=False)
    except WireError:
        fw = fg = None
    if fw is not None:
        for f in dataclasses.fields(fw):
            if f.name == "payload":
                continue
            a, b = getattr(fw, f.name), getattr(fg, f.name)
            if a != b:
                fa = a.hex() if isinstance(a, bytes) else hex(a) if isinstance(a, int) else a
                fb = b.hex() if isinstance(b, bytes) else hex(b) if isinstance(b, int) else b
                lines.append(f"{f.name}: expected {fa}, got {fb}")
        pw, pg = fw.payload, fg.payload
        if pw != pg:
            if len(pw) != len(pg):
                lines.append(f"payload length: expected {len(pw)}, got {len(pg)}")
            lanes = [i for i in range(0, min(len(pw), len(pg)), 4) if pw[i:i + 4] != pg[i:i + 4]]
            if lanes:
                lines.append(f"payload: {len(lanes)} int32 lanes differ, first at byte "
                             f"{lanes[0]}")
            for i in lanes[:limit]:
                a = int.from_bytes(pw[i:i + 4], "little", signed=True)
                b = int.from_bytes(pg[i:i + 4], "little", signed=True)
                lines.append(f"  lane {i // 4} (payload byte {i}): expected {a} "
                             f"(0x{a & _U32:08x}), got {b} (0x{b & _U32:08x})")
        for name, fr in (("expected", want), ("got", got)):
            try:
                parse(fr)
            except WireError as e:
                lines.append(f"{name} frame fails wire checks: {e}")
    diffs = [i for i in range(min(len(want), len(got))) if want[i] != got[i]]
    if diffs and (fw is None or len(lines) == 0):
        for i in diffs[:limit]:
            lines.append(f"byte {i} ({_where(want, i)}): expected 0x{want[i]:02x}, "
                         f"got 0x{got[i]:02x}")
        if len(diffs) > limit:
            lines.append(f"... {len(diffs)} bytes differ in all")
    if not lines:
        lines.append(f"first differing byte {diffs[0] if diffs else min(len(want), len(got))}")
    return "\n".join(lines)


def _describe(frame: bytes) -> str:
    try:
        f = parse(frame, check=False)
    except WireError:
        return f"{len(frame)} B non-RoCE frame {frame[:16].hex()}..."
    info = OPCODES.get(f.opcode)
    op = info.opcode.name if info is not None else f"0x{f.opcode:02x}"
    return (f"{op} {ip_str(f.src_ip)} -> {ip_str(f.dst_ip)} QP 0x{f.dqpn:06x} PSN {f.psn} "
            f"{len(f.payload)} B payload, {len(frame)} B")


# ================================================================================== compare
@dataclass
class FlowMismatch:
    flow: tuple
    index: int  # first position in the flow's sequence where expected and got differ
    expected: Out | None
    got: Out | None
    n_expected: int
    n_got: int
    missing: int  # expected frames not found anywhere in the flow's output (multiset)
    extra: int  # output frames not expected (multiset)

    def describe(self, log: EventLog | None = None) -> str:
        s = [f"flow {_flow_str(self.flow)}: first difference at position {self.index} "
             f"(expected {self.n_expected} frames, got {self.n_got}; {self.missing} missing, "
             f"{self.extra} extra)"]
        if self.missing == 0 and self.extra == 0:
            s.append("  same frames, different order")
        if self.expected is not None:
            src = self.expected.src
            cause = ""
            if src >= 0 and log is not None:
                ev = log.events[src]
                cause = f", caused by input event {src} (port {ev.a}, cycle {ev.cycle}: " \
                        f"{_describe(ev.b)})"
            s.append(f"  expected: {_describe(self.expected.frame)}{cause}")
        else:
            s.append("  expected: nothing more")
        if self.got is not None:
            s.append(f"  got:      {_describe(self.got.frame)} at cycle {self.got.cycle}")
        else:
            s.append("  got:      nothing (frame missing)")
        if self.expected is not None and self.got is not None:
            s.append("  " + frame_diff(self.expected.frame, self.got.frame).replace(
                "\n", "\n  "))
        if self.flow[-1] == "cnp":
            s.append("  (CNP flow: the decision depends on cycle differences vs "
                     "JOB.CNP_INTERVAL, see the scoreboard's timing assumption)")
        return "\n".join(s)


def compare(expected: Iterable, got: Iterable,
            key: Callable[[int, bytes], tuple] = flow_of) -> list[FlowMismatch]:
    """Per-flow exact comparison. Returns the mismatching flows, ordered by the position of their
    first differing expected frame in the expected output (the first is the earliest)."""
    exp = [o if isinstance(o, Out) else Out(*o) for o in expected]
    act = [o if isinstance(o, Out) else Out(*o) for o in got]
    fe: dict[tuple, list[tuple[int, Out]]] = defaultdict(list)
    fa: dict[tuple, list[Out]] = defaultdict(list)
    for i, o in enumerate(exp):
        fe[key(o.port, o.frame)].append((i, o))
    for o in act:
        fa[key(o.port, o.frame)].append(o)
    bad = []
    for k in set(fe) | set(fa):
        e, a = fe.get(k, []), fa.get(k, [])
        ef, af = [o.frame for _, o in e], [o.frame for o in a]
        if ef == af:
            continue
        idx = next((i for i, (x, y) in enumerate(zip(ef, af, strict=False)) if x != y),
                   min(len(ef), len(af)))
        ce, ca = Counter(ef), Counter(af)
        missing = sum((ce - ca).values())
        extra = sum((ca - ce).values())
        order = e[idx][0] if idx < len(e) else len(exp) + (a[idx].cycle if idx < len(a) else 0)
        bad.append((order, FlowMismatch(k, idx, e[idx][1] if idx < len(e) else None,
                                        a[idx] if idx < len(a) else None, len(e), len(a),
                                        missing, extra)))
    bad.sort(key=lambda t: t[0])
    return [m for _, m in bad]


# ================================================================================== registers
def state_registers(params: dict) -> list[tuple[str, int]]:
    """(name, address) of every register compared after a run: all counters (CNT, JOB_CNT), the
    job table's STATUS/FREE_PTR/RELEASE_PTR/SLOTS_BUSY/PARTIAL_PTR, the flow table's ACKED/STATUS
    and the engine-side port counters (PORT: frames and bytes in and out, PAUSE/PFC acted on)."""
    rm = build_regmap(**params)
    keep = {"CNT": None, "JOB_CNT": None,
            "JOB": {"STATUS", "FREE_PTR", "RELEASE_PTR", "SLOTS_BUSY", "PARTIAL_PTR"},
            "FLOW": {"ACKED", "STATUS"},
            "PORT": {n.upper() for n, src, _ in PORT_COUNTERS if src == "engine"}}
    out = []
    for inst in rm.instances():
        regs = keep.get(inst.table.name, ())
        if regs is None or (regs and inst.reg.name in regs):
            out.append((inst.name, inst.addr))
    return out


def snapshot(bus, params: dict) -> dict[str, int]:
    """Read :func:`state_registers` over ``bus`` (any ``read(addr) -> int``)."""
    return {name: bus.read(addr) & _U32 for name, addr in state_registers(params)}


def _counter_name(reg: str) -> str:
    """"CNT.RX_FRAMES" -> "rx_frames", "JOB_CNT[2].FREED" -> "job 2 freed"."""
    t, r = reg.rsplit(".", 1)
    if t.startswith("JOB_CNT["):
        return f"job {t[8:-1]} {r.lower()}"
    if t == "CNT":
        return r.lower()
    return reg


def end_state_problems(state: dict[str, int], params: dict) -> list[str]:
    """The identities that hold after a run in which every job finished or was removed: no busy
    slot, rx = sum of dispositions, tx = forwarded + results + re-emits + CNPs (+ management
    answers, + a leaf's partials and forwarded totals), contributions = results sent (+ a
    leaf's partials: its UP flow's contribution goes up, not back), released = freed."""
    c = {cn.name: state.get(f"CNT.{cn.name.upper()}", 0) for cn in ALL_GLOBAL_COUNTERS}
    bad = []
    jobs = build_regmap(**params).params["jobs"]
    busy = {j: state.get(f"JOB[{j}].SLOTS_BUSY", 0) for j in range(jobs)}
    if any(busy.values()):
        bad.append(f"slots still busy: {({j: b for j, b in busy.items() if b})}")
    disp = sum(c[d] for d in DISPOSITIONS) & _U32
    if c["rx_frames"] != disp:
        bad.append(f"rx_frames {c['rx_frames']} != sum of dispositions {disp}")
    for d in ("rx_frames", "tx_frames"):   # the engine-wide count is the ports' sum
        per_port = [v for k, v in state.items()
                    if k.startswith("PORT") and k.endswith(f".{d.upper()}")]
        if per_port and sum(per_port) & _U32 != c[d]:
            bad.append(f"{d} {c[d]} != sum over PORT {sum(per_port) & _U32}")
    tx = (sum(c[d] for d in FORWARDED) + c["results_sent"] + c["reemits"] + c["cnp_sent"]
          + sum(c[d] for d in MGMT_ANSWERED) + c["partials_up"] + c["totals"]) & _U32
    if c["tx_frames"] != tx:
        bad.append(f"tx_frames {c['tx_frames']} != forwarded + results + re-emits + CNPs "
                   f"(+ partials, totals) = {tx}")
    if c["contributions"] != (c["results_sent"] + c["partials_up"]) & _U32:
        bad.append(f"contributions {c['contributions']} != results_sent {c['results_sent']} "
                   f"+ partials_up {c['partials_up']}")
    if c["released"] != c["freed"]:
        bad.append(f"released {c['released']} != freed {c['freed']}")
    for j in range(jobs):
        jc = {cn.name: state.get(f"JOB_CNT[{j}].{cn.name.upper()}", 0) for cn in JOB_COUNTERS}
        if jc["contributions"] != jc["results_sent"] + jc["partials_up"]:
            bad.append(f"job {j}: contributions {jc['contributions']} != results_sent "
                       f"{jc['results_sent']} + partials_up {jc['partials_up']}")
    return bad


# ================================================================================== report
class ScoreboardMismatch(AssertionError):
    """The engine under test differs from the reference model (message: the report summary)."""


@dataclass
class ScoreReport:
    name: str
    inputs: int
    expected: int
    got: int
    flows: int
    mismatches: list[FlowMismatch]
    register_diffs: dict[str, tuple[int, int]]  # name -> (model, dut)
    end_state: list[str]
    log: EventLog | None = None

    @property
    def missing(self) -> int:
        return sum(m.missing for m in self.mismatches)

    @property
    def extra(self) -> int:
        return sum(m.extra for m in self.mismatches)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.register_diffs and not self.end_state

    def summary(self, max_flows: int = 3, max_regs: int = 12) -> str:
        head = (f"scoreboard {self.name or ''}: {self.inputs} input frames, {self.expected} "
                f"expected / {self.got} emitted frames in {self.flows} flows")
        if self.ok:
            return head + ": OK"
        s = [head + f": {len(self.mismatches)} flows differ ({self.missing} frames missing, "
                    f"{self.extra} extra), {len(self.register_diffs)} registers differ"]
        for m in self.mismatches[:max_flows]:
            s.append(m.describe(self.log))
        if len(self.mismatches) > max_flows:
            s.append(f"... and {len(self.mismatches) - max_flows} more flows")
        for name, (a, b) in list(self.register_diffs.items())[:max_regs]:
            s.append(f"register {name} ({_counter_name(name)}): model {a}, engine {b}")
        if len(self.register_diffs) > max_regs:
            s.append(f"... and {len(self.register_diffs) - max_regs} more registers")
        for p in self.end_state:
            s.append(f"end state: {p}")
        return "\n".join(s)

    def assert_ok(self) -> None:
        if not self.ok:
            raise ScoreboardMismatch(self.summary())


def check(log: EventLog, outputs: Iterable, state: dict[str, int] | None = None, *,
          counters: dict[str, int] | None = None,
          job_counters: dict[int, dict[str, int]] | None = None,
          end_state: bool = False, key: Callable[[int, bytes], tuple] = flow_of) -> ScoreReport:
    """Replay ``log`` on the model and compare with the engine's ``outputs`` ((port, frame,
    cycle) tuples) and, where given, its registers: ``state`` (a :func:`snapshot` of the engine),
    or just ``counters`` (engine-wide, by counter name, e.g. ``EngineControl.counters()``) and
    ``job_counters`` ({job: counters}). ``end_state``: also require
    :func:`end_state_problems` to be empty (on the engine's state, or the model's)."""
    rep = replay(log)
    exp = rep.outs
    act = [o if isinstance(o, Out) else Out(*o) for o in outputs]
    mism = compare(exp, act, key)
    model_state = snapshot(rep.engine.bus, log.params)
    dut: dict[str, int] = {}
    if state is not None:
        dut.update(state)
    if counters is not None:
        dut.update({f"CNT.{k.upper()}": v for k, v in counters.items()})
    for j, cs in (job_counters or {}).items():
        dut.update({f"JOB_CNT[{j}].{k.upper()}": v for k, v in cs.items()})
    diffs = {}
    for name, v in dut.items():
        if name not in model_state:
            raise ValueError(f"register {name!r} is not in the compared state (see "
                             "state_registers)")
        if model_state[name] != v & _U32:
            diffs[name] = (model_state[name], v & _U32)
    problems = end_state_problems(dut if state is not None else model_state, log.params) \
        if end_state else []
    flows = len({key(o.port, o.frame) for o in exp} | {key(o.port, o.frame) for o in act})
    return ScoreReport(log.name, len(log.frames), len(exp), len(act), flows, mism, diffs,
                       problems, log)
