"""The topology users build: workers on a top-of-rack switch, the engine hanging off it by P ports.

::

    worker --B--> ToR --C--> engine port p -(pipeline)-> engine port q --C--> ToR --B--> worker

* Every worker has an up and a down link of rate ``link_gbps`` (B) to the switch (the faults of
  the run: loss, duplication, reordering, on these links only).
* The engine is attached by ``ports`` (P) links of ``port_gbps`` (C) each way, lossless, with the
  same propagation latency as a worker's link (``latency_ns`` per hop).
* The switch is non-blocking (a frame leaves on its output link as soon as that link is free;
  its queues are unbounded: this measures capacity, not buffer sizing).

Steering (the rule a real switch needs)
    Per-flow policy routing, installed by the control plane together with the engine job
    (:meth:`TorSwitch.steer_flows`, called by the driver right after it registers a job): a frame
    whose (source IPv4, BTH DestQP) is one of a registered flow's two keys, forward (rank r's
    data to its successor's receive QP) or reverse (the successor's ACK/NAK to r's send QP), is
    redirected to the engine port chosen for that flow; every other frame is L2-forwarded by
    destination MAC and never sees the engine. On a switch ASIC that is an ingress ACL on
    ``ip.src`` plus a user-defined field at UDP payload offset 5..7 (the BTH DestQP; RoCEv2
    packets are identified by UDP destination port 4791), action "redirect to port"; the rule
    count is 2 per flow. The engine port of a flow is the job's stripe port (striping, see
    :mod:`netreduce.sim.net.stripe`) or else rank r mod P. What the engine emits leaves on the
    engine port it chooses (the flow's ingress port) and is L2-forwarded to its worker.

Engine timing (model backend)
    :class:`EngineTiming` reads the RTL's measured figures from
    ``bench/results/engine_512_p1.json`` (``bench/engine.py --ports 1``: the one-port 512-bit
    engine on Verilator, every cell sustained over 4096 indices per flow, outputs equal to the
    model's; cycles at :data:`~netreduce.regmap.CLOCK_HZ`): ingress beats per cycle (the minimum
    over the measured rows) and the unloaded release latency, fitted as ``base + beats`` of the
    contribution (last beat of the completing contribution in -> first beat of the first result
    out; the fit's residual is checked). Each engine port accepts one frame's beats at a
    time (a frame is processed once its last beat is in) and emits one frame's beats at a time
    (a result's first beat leaves ``base + beats`` cycles after its completing contribution's
    last beat, or when the output port is free, which a frame holds for its beats or its wire
    time at C, whichever is longer: the port's MAC sends at C); the port's link carries it at C.
    So a port carries at most min(C, datapath) in each direction. On ``--backend verilator`` /
    ``icarus`` the RTL itself does this (its cycles are simulated), behind the same C-rate links.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from netreduce.regmap import CLOCK_HZ
from netreduce.wire import ICRC_BYTES, view
from netreduce.wire.fields import BTH, ETH, IPV4, RETH, UDP

from .model_fabric import cycles_to_ns, ns_to_cycles
from .network import Link, LinkConfig, NetConfig, NetworkFabric

__all__ = ["LINK_RATES", "EngineTiming", "engine_timing", "TorSwitch", "TorFabric",
           "engine_net", "lower_bound_ns", "make_tor_model", "tor_rtl_class"]

#: Worker link rates a user may pick (Gb/s): the Ethernet rates of NICs in the field.
LINK_RATES = (10, 25, 40, 50, 100, 200, 400)

_ENGINE_JSON = ("bench", "results", "engine_512_p1.json")
#: frame bytes of a WRITE ONLY contribution besides its payload (no VLAN tag, no pad)
CONTRIBUTION_OVERHEAD = ETH.size + IPV4.size + UDP.size + BTH.size + RETH.size + ICRC_BYTES
_WIRE_EXTRA = 24  # preamble+SFD, FCS, inter-frame gap: wire bytes besides the frame


def _find_engine_json() -> Path:
    here = Path(__file__).resolve()
    for d in here.parents:
        p = d.joinpath(*_ENGINE_JSON)
        if p.exists():
            return p
    raise FileNotFoundError(f"{'/'.join(_ENGINE_JSON)} not found above {here.parent} "
                            "(run bench/engine.py --ports 1 --out "
                            "bench/results/engine_512_p1.json: the timed model reads the RTL's "
                            "figures)")


@dataclass(frozen=True)
class EngineTiming:
    """The engine datapath's measured figures (see the module docstring)."""

    data_width: int  # bits per beat
    beats_per_cycle: float  # sustained ingress per port (measured minimum)
    latency_base: int  # cycles: release latency = latency_base + beats of the frame
    source: str  # where the figures came from

    @property
    def port_gbps(self) -> float:
        """Datapath throughput of one port (raw beats, header bytes included)."""
        return self.data_width * self.beats_per_cycle * CLOCK_HZ / 1e9

    def beats(self, nbytes: int) -> int:
        return max(1, math.ceil(nbytes * 8 / self.data_width / self.beats_per_cycle))

    @classmethod
    def from_json(cls, path: str | Path) -> EngineTiming:
        d = json.loads(Path(path).read_text())
        rows = d.get("rows") or []
        if not rows:
            raise ValueError(f"{path}: no measured rows")
        dw = int(d["params"]["1"]["data_width"])
        bpc = min(min(r["in_beats_per_cycle_per_port"]) for r in rows)
        bases = []
        for r in rows:
            # a contribution: a full-PMTU WRITE ONLY frame (the bench's), in beats of dw bits:
            # as the bench built it (its header_law's data_beats), else from the header sizes
            beats = r.get("header_law", {}).get("data_beats")
            if beats is None:
                beats = -(-(r["pmtu"] + CONTRIBUTION_OVERHEAD) * 8 // dw)
            bases.append(r["release_latency_unloaded_cycles"]["median"] - beats)
        base = round(sum(bases) / len(bases))
        worst = max(abs(b - base) for b in bases)
        if worst > 4:
            raise ValueError(f"{path}: release latency is not base + beats (residual {worst} "
                             "cycles); the timed model's fit does not hold")
        return cls(dw, bpc, int(base), f"{path.name if isinstance(path, Path) else path} "
                   f"({d.get('command', '?')})")


@lru_cache(maxsize=1)
def engine_timing() -> EngineTiming:
    return EngineTiming.from_json(_find_engine_json())


def lower_bound_ns(workers: int, size: int, ports: int, port_gbps: float) -> float:
    """N x S / (P x C): the engine's ports must carry every rank's contribution in (and every
    result out), whatever else happens."""
    return workers * size * 8 / (ports * port_gbps)


def engine_net(net: NetConfig, port_gbps: float) -> NetConfig:
    """The engine port links: the workers' link parameters at rate C, without faults."""
    def clean(c: LinkConfig) -> LinkConfig:
        return replace(c, gbps=port_gbps, loss=0.0, dup=0.0, reorder=0.0, ce=0.0)
    over = {k: clean(v) for k, v in net.overrides.items()}
    return NetConfig(clean(net.default), over)


def _flow_key(frame) -> tuple[int, int] | None:
    """(source IPv4, BTH DestQP) of an untagged RoCEv2 frame, else None."""
    if not view.is_roce(frame):
        return None
    return int.from_bytes(view.src_ip(frame), "big"), view.dqpn(frame)


class TorSwitch:
    """The switch part of a ToR fabric (a mixin over a :class:`NetworkFabric`): engine port links,
    the steering table and the L2 path. Subclasses implement ``_engine_in(port, frame)``."""

    def _setup_tor(self, ports: int, port_gbps: float) -> None:
        if not isinstance(ports, int) or ports < 1:
            raise ValueError(f"engine ports must be >= 1, got {ports!r}")
        if not (isinstance(port_gbps, int | float) and port_gbps > 0):
            raise ValueError(f"engine port rate must be > 0 Gb/s, got {port_gbps!r}")
        self.engine_ports, self.port_gbps = ports, float(port_gbps)
        self.rank_of_mac: dict[bytes, int] = {}
        self.steering: dict[tuple[int, int], int] = {}
        enet = engine_net(self.net, port_gbps)
        self.ein = [Link(self.sched, f"engine{p}/in", "up", enet, self.seed,
                         lambda fr, p=p: self._engine_in(p, fr)) for p in range(ports)]
        self.eout = [Link(self.sched, f"engine{p}/out", "down", enet, self.seed, self._l2)
                     for p in range(ports)]

    def steer_flows(self, flows, port: int | None = None) -> None:
        """Install the steering rules of one job: ``flows`` are ``(rank, src_ip, dqpn, rev_ip,
        rev_qpn)`` (forward and reverse key); ``port``: the job's engine port (taken mod P), or
        None: rank r's flow uses port r mod P."""
        P = self.engine_ports
        for rank, ip, dqpn, rev_ip, rev_qpn in flows:
            p = (rank if port is None else port) % P
            self.steering[(ip, dqpn)] = p
            self.steering[(rev_ip, rev_qpn)] = p

    def _at_middle(self, src_mac: bytes, frame: bytes) -> None:
        key = _flow_key(frame)
        p = self.steering.get(key) if key is not None else None
        if p is None:
            self.stats["l2_forwarded"] += 1
            self._l2(frame)
        else:
            self.ein[p].send(frame)

    def _l2(self, frame: bytes) -> None:
        link = self.down.get(view.dst_mac(frame))
        if link is None:
            self.stats["unroutable"] += 1
            return
        link.send(frame)

    def engine_link_stats(self) -> dict:
        return {"in": [dict(lk.stats) for lk in self.ein],
                "out": [dict(lk.stats) for lk in self.eout]}


class TorFabric(TorSwitch, NetworkFabric):
    """The ToR topology around the reference engine model, timed by :class:`EngineTiming`.

    ``engine`` is one engine model or a list of them (several engines on the same switch, each
    with ``ports`` ports; engine k's ports are numbered k x ports ..., its register bus is
    ``buses[k]``; ``bus`` is engine 0's)."""

    def __init__(self, engine, ports: int, port_gbps: float, net: NetConfig | None = None,
                 seed: int = 0, capture=None, timing: EngineTiming | None = None):
        NetworkFabric.__init__(self, net, seed)
        self.engines = list(engine) if isinstance(engine, list | tuple) else [engine]
        self.engine = self.engines[0]
        self.per_engine = ports
        self.capture = capture
        self.timing = timing or engine_timing()
        total = ports * len(self.engines)
        self._setup_tor(total, port_gbps)
        self._in_free = [0] * total  # cycle each engine port's ingress is free again
        self._out_free = [0] * total

    @property
    def bus(self):
        return self.engine.bus

    def _wire_cycles(self, nbytes: int) -> int:
        return math.ceil((nbytes + _WIRE_EXTRA) * 8 / self.port_gbps * CLOCK_HZ / 1e9)

    @property
    def buses(self) -> list:
        return [e.bus for e in self.engines]

    def _engine_in(self, p: int, frame: bytes) -> None:
        tm = self.timing
        now_c = ns_to_cycles(self.sched.now())
        done = max(now_c, self._in_free[p] + tm.beats(len(frame)))
        self._in_free[p] = done
        t = cycles_to_ns(done)
        if t <= self.sched.now():
            self._process(p, frame, done)
        else:
            self.sched.call_at(t, self._process, p, frame, done)

    def _process(self, p: int, frame: bytes, cycle: int) -> None:
        tm = self.timing
        self.stats["engine_in"] += 1
        if self.capture is not None:
            self.capture.frame_in(p, frame, cycle)
        k, local = divmod(p, self.per_engine)
        for e in self.engines[k].receive(local, frame, cycle):
            q = k * self.per_engine + e.port
            b = tm.beats(len(e.frame))
            first = max(cycle + tm.latency_base + b, self._out_free[q])
            # the port's MAC sends at C: a frame holds the output for its beats or its wire
            # time, whichever is longer (so the engine never emits faster than its link)
            self._out_free[q] = first + max(b, self._wire_cycles(len(e.frame)))
            self.stats["engine_out"] += 1
            if self.capture is not None:
                self.capture.frame_out(q, e.frame, first)
            self.sched.call_at(cycles_to_ns(first), self.eout[q].send, bytes(e.frame))

    def link_stats(self):
        return _tor_link_stats(self, NetworkFabric.link_stats(self))


def _tor_link_stats(fab, out: dict) -> dict:
    """Worker link counters plus the engine port links' (``engine_in``, ``engine_out``)."""
    for d, links in (("engine_in", fab.ein), ("engine_out", fab.eout)):
        c = type(out["up"])()
        for lk in links:
            c.update(lk.stats)
        out[d] = c
    return out


def make_tor_model(cfg, net: NetConfig, capture) -> TorFabric:
    """The model backend's fabric for a ``SimConfig`` with ``port_gbps`` > 0."""
    from ..model import Engine

    # as many jobs and slots as the run's concurrent passes need (every stripe of every group:
    # a SUM job of window 256 and an exponent job of 64), at least the model's defaults
    par = cfg.jobs * cfg.stripes
    per = cfg.nports // cfg.engines
    engs = [Engine(ports=per, jobs=max(8, 2 * par), slots=max(1024, 512 * par),
                   flows=max(256, 4 * cfg.workers * par)) for _ in range(cfg.engines)]
    return TorFabric(engs, per, cfg.port_gbps, net, cfg.seed, capture)


def tor_rtl_class(RtlFabric):  # noqa: N803 - the class to extend
    """``RtlFabric`` (:class:`netreduce.sim.rtl.fabric.RtlFabric`, passed in: the RTL layer
    builds on this one, not the other way) behind the ToR switch: frames steered to engine port
    p cross that port's C-rate link and enter the RTL on port p; the RTL's outputs cross the
    link of the port they leave on. Call ``_setup_tor(P, C)`` after construction."""

    class TorRtlFabric(TorSwitch, RtlFabric):
        def _setup_tor(self, ports, port_gbps):
            TorSwitch._setup_tor(self, ports, port_gbps)
            self.port_of = lambda token: token  # _engine_in hands the RTL the port itself
            self._out_port = 0

        def _engine_in(self, p, frame):
            RtlFabric._at_middle(self, p, frame)

        def _emit(self, frames):
            for f in frames:  # one by one: each output's port chooses its link
                self._out_port = f.port
                RtlFabric._emit(self, [f])

        def _forward(self, frame, at=None):
            link = self.eout[self._out_port]
            if at is None:
                link.send(frame)
            else:
                link.send(frame, at=at)

        def link_stats(self):
            return _tor_link_stats(self, RtlFabric.link_stats(self))

    return TorRtlFabric

