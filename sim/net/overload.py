"""An engine whose own input buffer overflows: PFC from its RX FIFO, ECN/CNP (D19), drops counted.

The ToR topology (:mod:`.topology`) feeds each engine port at its link rate C and lets the
engine's datapath take every frame at once. :class:`OverloadFabric` adds what fills when the
datapath takes less than the port brings in (the shared dispatcher of a multi-port engine, or a
2:1 overloaded port): per engine port p

* an **input buffer** of ``buffer_bytes`` (the shell's RX FIFO, 512 beats = 32 KiB) filled by
  the link from the switch and drained by the port's datapath share at ``drain_gbps``
  (a frame reaches the engine model once it is drained). A frame that finds it full is dropped
  whole and counted (``rx_drop_full[p]``, the shell's ``PORT.RX_DROP_FULL``), never silently.
* **PFC** (``pfc=True``): when the buffer reaches ``xoff_bytes`` the port sends an XOFF for the
  RoCE priority; the switch stops starting frames towards p one link latency later (the PFC
  frame's flight), frames already on the wire still arrive. When it falls to ``xon_bytes`` the
  port sends XON; the switch resumes one latency later. The switch is lossless for the class
  (it holds the frames: its own PFC towards the workers is its business, not modelled).
  ``pfc_tx[p]`` counts the PFC frames sent (XOFF and XON), as the gateware's
  :class:`netreduce.hw.boards.pfcgen.PfcGenerator` sends them.
* **ECN** (``ecn_bytes`` > 0): while a frame is taken from a buffer holding at least
  ``ecn_bytes`` (itself included), the port is congested for the engine model
  (``Engine.congested[p]``, decision D19): forwarded ECT frames leave CE-marked and
  contributions are answered with CNPs, which the workers' RNICs react to
  (``CollectiveConfig.dcqcn``, :mod:`.dcqcn`).

The switch queue towards the engine port is the port's ``ein`` link (unbounded: the switch is
non-blocking and lossless here). Everything else is :class:`~.topology.TorFabric`'s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from netreduce.regmap import FC_RESETS
from netreduce.regmap.clock import ns_to_cycles

from .topology import TorFabric, engine_timing

__all__ = ["BufferConfig", "OverloadFabric", "make_overload_model", "pfc_thresholds"]

_WIRE_EXTRA = 24


@dataclass(frozen=True)
class BufferConfig:
    """Per engine port input buffer; watermarks in bytes, by default the reset values of
    ``PORT.FC_XOFF`` / ``FC_XON`` / ``FC_ECN`` (:data:`netreduce.regmap.FC_RESETS`)."""

    buffer_bytes: int = 32 * 1024  # the shell's RX FIFO: 512 beats of 64 bytes
    drain_gbps: float = 50.0
    pfc: bool = False
    xoff_bytes: int = FC_RESETS["xoff"]
    xon_bytes: int = FC_RESETS["xon"]
    ecn_bytes: int = FC_RESETS["ecn"]  # 0: no congestion signalling

    def __post_init__(self):
        if not (isinstance(self.buffer_bytes, int) and self.buffer_bytes >= 9216):
            raise ValueError(f"buffer_bytes {self.buffer_bytes!r} must hold a largest frame "
                             "(>= 9216)")
        if not (self.drain_gbps > 0 and math.isfinite(self.drain_gbps)):
            raise ValueError(f"drain_gbps must be > 0, got {self.drain_gbps!r}")
        if not 0 < self.xon_bytes < self.xoff_bytes <= self.buffer_bytes:
            raise ValueError(f"need 0 < xon_bytes {self.xon_bytes} < xoff_bytes "
                             f"{self.xoff_bytes} <= buffer_bytes {self.buffer_bytes}")
        if not 0 <= self.ecn_bytes <= self.buffer_bytes:
            raise ValueError(f"ecn_bytes {self.ecn_bytes} outside 0..{self.buffer_bytes}")


def pfc_thresholds(buffer_bytes: int, port_gbps: float, drain_gbps: float, latency_ns: int,
                   max_frame: int = 9216) -> tuple[int, int]:
    """(XOFF, XON) in bytes for a lossless port: after XOFF the buffer still takes what the
    switch sends until the PFC frame arrives plus what is on the wire (a round trip at the port
    rate, less what the datapath drains meanwhile), one frame the switch is sending and one the
    engine's own MAC is sending before the PFC frame can leave: headroom = 2 x latency x
    (C - D) / 8 + 2 x max_frame. XOFF = buffer - headroom, XON = XOFF / 2."""
    head = 2 * latency_ns * max(0.0, port_gbps - drain_gbps) / 8 + 2 * max_frame
    xoff = int(buffer_bytes - head)
    if xoff < 2:
        raise ValueError(f"buffer {buffer_bytes} B cannot be lossless at {latency_ns} ns per hop: "
                         f"headroom {head:.0f} B")
    return xoff, xoff // 2


class OverloadFabric(TorFabric):
    """:class:`~.topology.TorFabric` with a bounded input buffer per engine port (module doc)."""

    def __init__(self, engine, ports: int, port_gbps: float, buf: BufferConfig, net=None,
                 seed: int = 0, capture=None, timing=None):
        super().__init__(engine, ports, port_gbps, net, seed, capture, timing)
        n = len(self.ein)
        self.buf = buf
        self.level = [0] * n  # bytes in the input buffer
        self.held = [0] * n  # frames in the input buffer
        self._drain_free = [0] * n  # ns: the datapath share is free again
        self._q: list[deque] = [deque() for _ in range(n)]  # switch queue towards the port
        self._link_free = [0] * n  # ns: the switch's egress to the port is free again
        self._paused_at: list[int | None] = [None] * n  # switch holds frames from then on
        self._xoff = [False] * n
        self._kick_pending = [False] * n
        self.rx_drop_full = [0] * n
        self.pfc_tx = [0] * n
        self.ce_frames = [0] * n  # frames taken while congested
        self.max_level = [0] * n
        self._lat = self.net.default.latency_ns

    # ---- switch side: the egress queue towards engine port p, paused by PFC
    def _at_middle(self, src_mac: bytes, frame: bytes) -> None:
        from .topology import _flow_key

        key = _flow_key(frame)
        p = self.steering.get(key) if key is not None else None
        if p is None:
            self.stats["l2_forwarded"] += 1
            self._l2(frame)
            return
        self._q[p].append(frame)
        self._kick(p)

    def _paused(self, p: int, now: int) -> bool:
        t = self._paused_at[p]
        return t is not None and now >= t

    def _kick(self, p: int) -> None:
        now = self.sched.now()
        q = self._q[p]
        while q and now >= self._link_free[p] and not self._paused(p, now):
            frame = q.popleft()
            self._link_free[p] = now + math.ceil((len(frame) + _WIRE_EXTRA) * 8 / self.port_gbps)
            self.ein[p].send(frame)
        if q and not self._kick_pending[p] and not self._paused(p, now):  # paused: XON kicks
            self._kick_pending[p] = True
            self.sched.call_at(self._link_free[p], self._kicked, p)

    def _kicked(self, p: int) -> None:
        self._kick_pending[p] = False
        self._kick(p)

    # ---- engine side: the port's input buffer, drained by its datapath share
    def _engine_in(self, p: int, frame: bytes) -> None:
        b = self.buf
        n = len(frame)
        if self.level[p] + n > b.buffer_bytes:
            self.rx_drop_full[p] += 1
            self.stats["rx_drop_full"] += 1
            return
        self.level[p] += n
        self.held[p] += 1
        self.max_level[p] = max(self.max_level[p], self.level[p])
        now = self.sched.now()
        done = max(now, self._drain_free[p]) + math.ceil((n + _WIRE_EXTRA) * 8 / b.drain_gbps)
        self._drain_free[p] = done
        self.sched.call_at(done, self._drained, p, frame)
        if b.pfc and not self._xoff[p] and self.level[p] >= b.xoff_bytes:
            self._xoff[p] = True
            self.pfc_tx[p] += 1
            if self._paused_at[p] is None:  # else still paused: the XON in flight is void
                self._paused_at[p] = now + self._lat

    def _drained(self, p: int, frame: bytes) -> None:
        b = self.buf
        cong = bool(b.ecn_bytes) and self.level[p] >= b.ecn_bytes
        self.level[p] -= len(frame)
        self.held[p] -= 1
        k, local = divmod(p, self.per_engine)
        eng = self.engines[k]
        eng.congested[local] = cong
        self.ce_frames[p] += cong
        self._process(p, frame, ns_to_cycles(self.sched.now()))
        eng.congested[local] = False
        if self._xoff[p] and self.level[p] <= b.xon_bytes:
            self._xoff[p] = False
            self.pfc_tx[p] += 1
            self.sched.call_at(self.sched.now() + self._lat, self._resume, p)

    def _resume(self, p: int) -> None:
        if not self._xoff[p]:  # no XOFF since this XON was sent
            self._paused_at[p] = None
            self._kick(p)

    def link_stats(self):
        """:class:`~.topology.TorFabric`'s, with the input buffers' drops as ``lost`` of
        ``engine_in`` (and ``rx_drop_full``, ``pfc_tx``, ``congested_frames``)."""
        out = super().link_stats()
        ein = out["engine_in"]
        ein["lost"] += sum(self.rx_drop_full)
        ein["rx_drop_full"] = sum(self.rx_drop_full)
        ein["pfc_tx"] = sum(self.pfc_tx)
        ein["congested_frames"] = sum(self.ce_frames)
        return out

    def buffer_stats(self) -> dict:
        return {"rx_drop_full": list(self.rx_drop_full), "pfc_tx": list(self.pfc_tx),
                "congested_frames": list(self.ce_frames), "max_level": list(self.max_level)}


def make_overload_model(cfg, net, capture, buf: BufferConfig) -> OverloadFabric:
    """The model backend's ToR fabric (as :func:`.topology.make_tor_model`) with input
    buffers: a ``make_fabric`` for :func:`netreduce.sim.net.simrun.run_sim`."""
    from ..model import Engine

    par = cfg.jobs * cfg.stripes
    per = cfg.nports // cfg.engines
    engs = [Engine(ports=per, jobs=max(8, 2 * par), slots=max(1024, 512 * par),
                   flows=max(256, 4 * cfg.workers * par)) for _ in range(cfg.engines)]
    return OverloadFabric(engs, per, cfg.port_gbps, buf, net, cfg.seed, capture,
                          engine_timing())
