"""Network model: seeded lossy links between software endpoints and whatever sits in the middle.

Topology (a star, as a top-of-rack switch with the engine beside it)::

    endpoint --up link--> middle --down link--> endpoint

Every endpoint attached to a :class:`NetworkFabric` gets its own up link (frames it sends) and down
link (frames it receives). The middle of :class:`NetworkFabric` is a plain switch that forwards by
destination MAC; :class:`netreduce.sim.net.model_fabric.ModelFabric` puts the reference engine
there.

A :class:`Link` models, per frame: serialisation at ``gbps`` (FIFO; ``gbps=0``: infinitely fast),
propagation ``latency_ns`` plus uniform ``jitter_ns``, and seeded faults: loss, duplication
(a second copy right behind the first), reordering (extra delay of up to ``reorder_ns``, so later
frames overtake) and CE marking of ECT frames (ICRC unaffected: TOS is masked; the IPv4 checksum
is fixed up). The parameters can differ per direction ("up", "down") and per kind of frame
("data": RC SEND/WRITE, which on a down link of the model fabric are the engine's results;
"ack": ACK/NAK and CNP; "other"): see :class:`NetConfig`.

Determinism: each link draws from its own ``random.Random`` seeded by (seed, link name), and the
scheduler breaks ties in insertion order, so a run is a pure function of its inputs and the seed.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from netreduce.sim.net.scheduler import Scheduler, SchedulerMixin, frame_dmac, frame_smac, mac_str

from netreduce.wire import IP_PROTO_UDP, OPCODES, WireError, parse
from netreduce.wire.rewrite import mark_ce
from netreduce.wire.view import (
    BTH_AT,
    CONTROL_OPCODES,
    DATA_OPCODES,
    DPORT_AT,
    ETHERTYPE_IPV4_BYTES,
    PROTO_AT,
    ROCEV2_PORT_BYTES,
    l3_offset,
)

__all__ = ["LinkConfig", "NetConfig", "Link", "EndpointLinks", "NetworkFabric", "DropOnce",
           "classify", "DIRECTIONS", "KINDS"]

DIRECTIONS = ("up", "down")
KINDS = ("data", "ack", "other")
_DATA_OPCODES = DATA_OPCODES
_CONTROL_OPCODES = CONTROL_OPCODES
# Bytes on the wire besides the frame: preamble+SFD 8, FCS 4, inter-frame gap 12.
_WIRE_OVERHEAD = 24


_l3 = l3_offset


def classify(frame) -> str:
    """"data", "ack" (ACK/NAK/CNP) or "other" (anything that is not RoCEv2 RC data/control)."""
    l3 = _l3(frame)
    b = l3 + BTH_AT
    if (len(frame) <= b or frame[l3 - 2:l3] != ETHERTYPE_IPV4_BYTES
            or frame[l3 + PROTO_AT] != IP_PROTO_UDP
            or frame[l3 + DPORT_AT:l3 + DPORT_AT + 2] != ROCEV2_PORT_BYTES):
        return "other"
    op = frame[b]
    if op in _DATA_OPCODES:
        return "data"
    if op in _CONTROL_OPCODES:
        return "ack"
    return "other"


def _mark_ce(frame: bytes) -> bytes | None:
    """The frame with ECN = CE if it is ECT(0)/ECT(1), else None. The ICRC masks TOS."""
    return mark_ce(frame)


@dataclass(frozen=True)
class LinkConfig:
    """One direction of one kind of traffic on a link. Probabilities are per frame, 0..1.

    ``priority``: frames of this kind do not wait behind the frames already queued for
    serialisation (strict priority, as a NIC's per-packet TX arbitration lets an ACK out between
    two data packets instead of behind its whole send queue); their wire time is charged to the
    frames queued after them. Off by default (one FIFO per link).
    """

    latency_ns: int = 500
    jitter_ns: int = 0
    gbps: float = 100.0
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    reorder_ns: int = 5000
    ce: float = 0.0
    priority: bool = False

    def __post_init__(self):
        for name in ("loss", "dup", "reorder", "ce"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
        if self.loss >= 1.0:
            raise ValueError(f"loss must be < 1 (nothing would ever arrive), got {self.loss}")
        for name in ("latency_ns", "jitter_ns", "reorder_ns"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if not (isinstance(self.gbps, int | float) and self.gbps >= 0 and math.isfinite(self.gbps)):
            raise ValueError(f"gbps must be >= 0 (0: unlimited), got {self.gbps!r}")


@dataclass(frozen=True)
class NetConfig:
    """Link parameters: ``default`` everywhere, ``overrides[(direction, kind)]`` where given."""

    default: LinkConfig = LinkConfig()
    overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        for key, cfg in self.overrides.items():
            if (not isinstance(key, tuple) or len(key) != 2 or key[0] not in DIRECTIONS
                    or key[1] not in KINDS):
                raise ValueError(f"override key must be (direction in {DIRECTIONS}, kind in "
                                 f"{KINDS}), got {key!r}")
            if not isinstance(cfg, LinkConfig):
                raise ValueError(f"override {key} must be a LinkConfig, got {cfg!r}")

    def get(self, direction: str, kind: str) -> LinkConfig:
        return self.overrides.get((direction, kind), self.default)

    @classmethod
    def faulty(cls, loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0,
               **kw) -> NetConfig:
        """The same faults on every direction and kind of traffic."""
        return cls(LinkConfig(loss=loss, dup=dup, reorder=reorder, **kw))

    def with_default(self, **changes) -> NetConfig:
        return replace(self, default=replace(self.default, **changes))


class Link:
    """One direction of one endpoint's cable: frames go in with :meth:`send`, come out at
    ``sink(frame)`` later (never synchronously). ``stats`` counts frames, bytes and faults."""

    def __init__(self, sched: Scheduler, name: str, direction: str, net: NetConfig, seed: int,
                 sink: Callable[[bytes], None]):
        self.sched = sched
        self.name = name
        self.sink = sink
        self._cfg = {k: net.get(direction, k) for k in KINDS}
        self._rng = random.Random(f"netreduce-link/{seed}/{name}")
        self._busy = 0  # time the transmitter is free again
        self.stats: Counter = Counter()

    def send(self, frame: bytes, at: int | None = None) -> None:
        """Put ``frame`` on the link now, or at the earlier time ``at`` (a sender that hands its
        frames over after the fact, e.g. the RTL fabric's windows; its arrival must still lie
        in the future, and the frames of one link must come in ``at`` order)."""
        kind = classify(frame)
        cfg = self._cfg[kind]
        st = self.stats
        st["frames"] += 1
        st[f"{kind}_frames"] += 1
        rnd = self._rng.random
        if cfg.loss and rnd() < cfg.loss:
            st["lost"] += 1
            st[f"{kind}_lost"] += 1
            return
        copies = 1
        if cfg.dup and rnd() < cfg.dup:
            copies = 2
            st["duplicated"] += 1
        now = self.sched.now() if at is None else at
        for _ in range(copies):
            if cfg.gbps:
                ser = math.ceil((len(frame) + _WIRE_OVERHEAD) * 8 / cfg.gbps)
                if cfg.priority:
                    depart = now + ser
                    self._busy = max(now, self._busy) + ser
                else:
                    depart = max(now, self._busy) + ser
                    self._busy = depart
            else:
                depart = now
            t = depart + cfg.latency_ns
            if cfg.jitter_ns:
                t += self._rng.randint(0, cfg.jitter_ns)
            if cfg.reorder and rnd() < cfg.reorder:
                t += self._rng.randint(1, max(1, cfg.reorder_ns))
                st["reordered"] += 1
            out = frame
            if cfg.ce and rnd() < cfg.ce:
                marked = _mark_ce(frame)
                if marked is not None:
                    out = marked
                    st["ce_marked"] += 1
            st["bytes"] += len(out)
            self.sched.call_at(t, self.sink, out)


class DropOnce:
    """A targeted loss for benchmarks and tests: wraps one link's ``send`` and drops the first
    RC data frame with a payload and BTH PSN ``psn`` (its first transmission; retransmissions
    pass), counting it in ``dropped``."""

    def __init__(self, link, psn: int):
        self.psn, self.dropped = psn, 0
        inner = link.send

        def send(frame, *args, inner=inner, **kw):
            if not self.dropped and self._match(frame):
                self.dropped = 1
                return
            inner(frame, *args, **kw)
        link.send = send

    def _match(self, frame: bytes) -> bool:
        try:
            f = parse(frame)
        except WireError:
            return False
        info = OPCODES.get(f.opcode)
        return info is not None and info.rc_data and f.psn == self.psn and bool(f.payload)


class EndpointLinks(SchedulerMixin):
    """Endpoint ports of a fabric: one seeded up/down :class:`Link` pair per attached MAC.

    :meth:`send` takes a frame onto its source MAC's up link; a frame from an unattached MAC is
    counted (``stats["unroutable"]``) and dropped. Subclasses set ``sched``, ``net``, ``seed``,
    ``up``, ``down`` and ``stats``, and attach through :meth:`_new_mac` and :meth:`_add_links`.
    """

    def _new_mac(self, mac: bytes) -> bytes:
        mac = bytes(mac)
        if len(mac) != 6:
            raise ValueError(f"MAC must be 6 bytes, got {mac!r}")
        if mac in self.up:
            raise ValueError(f"MAC {mac_str(mac)} is already attached")
        return mac

    def _add_links(self, mac: bytes, on_up: Callable[[bytes], None],
                   deliver: Callable[[bytes], None]) -> None:
        name = mac_str(mac)
        self.up[mac] = Link(self.sched, f"{name}/up", "up", self.net, self.seed, on_up)
        self.down[mac] = Link(self.sched, f"{name}/down", "down", self.net, self.seed, deliver)

    def is_attached(self, mac: bytes) -> bool:
        return bytes(mac) in self.up

    def send(self, frame: bytes) -> None:
        link = self.up.get(frame_smac(frame))
        if link is None:
            self.stats["unroutable"] += 1
            return
        link.send(bytes(frame))


class NetworkFabric(EndpointLinks):
    """A star of seeded links around a plain switch (forward by destination MAC); no engine.

    Implements :class:`netreduce.sim.net.scheduler.Fabric`. Frames from an unattached source MAC or
    to an unknown destination are counted (``stats["unroutable"]``) and dropped.
    """

    bus = None

    def __init__(self, net: NetConfig | None = None, seed: int = 0,
                 sched: Scheduler | None = None):
        self.net = net or NetConfig()
        self.seed = seed
        self.sched = sched or Scheduler()
        self.up: dict[bytes, Link] = {}
        self.down: dict[bytes, Link] = {}
        self.stats: Counter = Counter()

    def attach(self, mac: bytes, deliver: Callable[[bytes], None]) -> None:
        mac = self._new_mac(mac)
        self._add_links(mac, lambda fr, m=mac: self._at_middle(m, fr), deliver)

    def _at_middle(self, src_mac: bytes, frame: bytes) -> None:
        self._forward(frame)

    def _forward(self, frame: bytes) -> None:
        link = self.down.get(frame_dmac(frame))
        if link is None:
            self.stats["unroutable"] += 1
            return
        link.send(frame)

    def link_stats(self) -> dict[str, Counter]:
        """Fault and traffic counters summed per direction: {"up": ..., "down": ...}."""
        out = {"up": Counter(), "down": Counter()}
        for d, links in (("up", self.up), ("down", self.down)):
            for link in links.values():
                out[d].update(link.stats)
        return out
