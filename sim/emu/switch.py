"""The switch service: a small L2 switch with the NetReduce engine on its path, over loopback TCP.

Workers connect over TCP; every frame is a 4-byte big-endian length followed by the Ethernet frame
(QEMU ``-netdev socket`` framing), so the software RNIC's :class:`~netreduce.sim.emu.tunnel.
Tunnel` and QEMU VMs running Linux soft-RoCE connect alike. One connection is one switch port.

Path of a frame
    worker --TCP--> [framing] --> management? --> MAC learning --> up faults --> engine
    engine emits --> down faults --> the connection owning the destination MAC (flooded to every
    other connection for broadcast, multicast and unknown unicast, as an L2 switch does).

* Every frame from a worker enters the engine (``Engine.receive(port, frame, cycles)``; the
  engine forwards what is not a registered flow unchanged, so ARP and ordinary traffic pass); every
  frame the engine emits is delivered by destination MAC. Connection i enters engine port
  ``i mod ports``. Time is the wall clock in datapath cycles since the service started.
* Engines: the reference model (default) or the engine RTL under Verilator
  (:class:`~netreduce.sim.rtl.switch_engine.RtlSwitchEngine`, ``netreduce switch --backend
  verilator``). A *batched* engine (``engine.batched``) is fed differently: every frame read in
  one event-loop turn is queued (``engine.send(port, frame)``), then one ``engine.run()`` runs the
  RTL until it is idle and returns what it emitted (the RTL keeps its own time, see there); one
  ``engine.sweep()`` after the traffic stops collects stragglers. Its ``wake`` is set to schedule
  a run (frames completed during a register access). Broadcast and unknown unicast are flooded to
  every connection but the one owning the frame's source MAC (with batching the ingress
  connection of an output is not known; for the model it is the ingress connection).
* Management: jobs and flows are registered through the register map with the in-band
  management protocol (docs/management.md): the service gives the engine its management agent
  (:func:`netreduce.sim.model.mgmt.attach_mgmt`) at ``mgmt_ip`` / :data:`~netreduce.sim.emu.tunnel.
  ENGINE_MAC`, allowing the sources ``mgmt_sources`` (default 10.255.255.1, what
  :meth:`netreduce.sim.emu.tunnel.Tunnel.mgmt_bus` uses), optionally with a SipHash key. An
  engine with ``provision_mgmt(settings)`` (the RTL) gets the same settings written into its
  ``MGMT`` registers instead: its own management path answers. Requests enter the engine like
  every frame; the agent consumes them and its answers are routed back by MAC.
* Faults (seeded, per direction "up" = into the engine, "down" = towards the workers): loss,
  duplication (the copy right behind), reordering (the frame is held back a uniform 0..
  ``reorder_ms`` so later frames overtake it). Management frames (to or from ``mgmt_ip``) are
  never faulted: the faults are for the data path.
* Capture: ``pcap`` PREFIX writes PREFIX.in.pcap (frames entering the engine, after the up
  faults) and PREFIX.out.pcap (frames the engine emits, before the down faults), nanosecond
  wall-clock timestamps.
* Backpressure: TCP's. When a connection's send buffer passes ``high_water`` bytes the service
  stops reading from every connection (the engine port is blocked, like a PFC pause) until it
  drains below the low mark; workers then block in their own send buffers. A worker that never
  reads therefore stalls the switch, as a paused port would.
* Bad datagrams (length prefix below 14 or above 65535 bytes) are counted and skipped; a length
  prefix above 1 MiB means the stream is not framed at all: that connection is counted
  (``bad_streams``) and closed, everything else goes on. Malformed Ethernet/RoCE/management
  frames are the engine's business: it counts and forwards or drops them. Nothing a worker
  sends can stop the service.

:class:`SwitchService` runs on an asyncio loop (``await start()``, ``await stop()``);
:class:`SwitchThread` runs one in a background thread (tests, benchmarks, examples);
``netreduce switch`` (:mod:`netreduce.cli.switch`) is the long-running process.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass

from netreduce.sim.emu.tunnel import (
    DEFAULT_MGMT_CLIENT_IP,
    DEFAULT_MGMT_IP,
    ENGINE_MAC,
    FrameReader,
    frame_bytes,
)
from netreduce.sim.net.scheduler import mac_str
from netreduce.sw_driver.mgmt import MgmtSettings, MgmtSource

from netreduce.wire.pcap import PcapWriter
from netreduce.wire.view import dst_ip, dst_mac, is_ipv4, src_ip, src_mac

from ..model.engine import CLOCK_HZ

__all__ = ["FaultConfig", "SwitchConfig", "SwitchService", "SwitchThread", "RawClient",
           "connect_clients", "COUNTER_HELP"]

log = logging.getLogger("netreduce.switch")

SWEEP_S = 0.05  # batched engines: the straggler sweep runs this long after the last run

COUNTER_HELP = {
    "connections": "worker connections accepted",
    "frames_in": "frames received from workers (well framed)",
    "bytes_in": "bytes of those frames",
    "bad_datagrams": "length prefixes outside 14..65535 bytes: skipped",
    "bad_streams": "connections closed because their stream was not framed",
    "engine_in": "frames into the engine",
    "engine_out": "frames the engine emitted",
    "frames_out": "frames written to workers",
    "bytes_out": "bytes of those frames",
    "flooded": "emitted frames flooded (broadcast/multicast)",
    "unknown_unicast": "emitted frames to an unknown MAC (flooded)",
    "no_port": "emitted frames with no connection to go to",
    "mac_moves": "MACs that moved to another connection",
    "pauses": "times the switch stopped reading (backpressure)",
    "up_lost": "fault injection into the engine: frames dropped",
    "up_duplicated": "fault injection into the engine: frames sent twice",
    "up_reordered": "fault injection into the engine: frames held back",
    "down_lost": "fault injection towards workers: frames dropped",
    "down_duplicated": "fault injection towards workers: frames sent twice",
    "down_reordered": "fault injection towards workers: frames held back",
}


@dataclass(frozen=True)
class FaultConfig:
    """Faults of one direction: per-frame probabilities (0..1) and the reorder hold time."""

    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    reorder_ms: float = 2.0

    def __post_init__(self):
        for name in ("loss", "dup", "reorder"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
        if self.loss >= 1.0:
            raise ValueError(f"loss must be < 1 (nothing would get through), got {self.loss}")
        if not (isinstance(self.reorder_ms, int | float) and 0 <= self.reorder_ms <= 10_000):
            raise ValueError(f"reorder_ms must be 0..10000, got {self.reorder_ms!r}")

    @property
    def active(self) -> bool:
        return bool(self.loss or self.dup or self.reorder)


@dataclass(frozen=True)
class SwitchConfig:
    """Where to listen, faults per direction and their seed, capture prefix, the send-buffer mark
    that triggers backpressure, and the engine's management address, allowed sources and key."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (see SwitchService.address)
    up: FaultConfig = FaultConfig()
    down: FaultConfig = FaultConfig()
    seed: int = 0
    pcap: str | None = None  # PREFIX: PREFIX.in.pcap, PREFIX.out.pcap
    high_water: int = 4 << 20
    mgmt_ip: int = DEFAULT_MGMT_IP
    mgmt_sources: tuple[int, ...] = (DEFAULT_MGMT_CLIENT_IP,)
    mgmt_key: bytes | None = None  # 16 bytes: requests must carry a SipHash tag


class _Faults:
    def __init__(self, cfg: FaultConfig, seed: int, direction: str, counters: Counter):
        self.cfg = cfg
        self.rng = random.Random(f"netreduce-switch/{seed}/{direction}")
        self.dir = direction
        self.c = counters

    def apply(self, frame: bytes, deliver, loop) -> None:
        """Deliver ``frame`` through the faults: ``deliver(frame)`` now, later, twice or never."""
        cfg = self.cfg
        if not cfg.active:
            deliver(frame)
            return
        rnd = self.rng.random
        if cfg.loss and rnd() < cfg.loss:
            self.c[f"{self.dir}_lost"] += 1
            return
        copies = 2 if cfg.dup and rnd() < cfg.dup else 1
        if copies == 2:
            self.c[f"{self.dir}_duplicated"] += 1
        for _ in range(copies):
            if cfg.reorder and rnd() < cfg.reorder:
                self.c[f"{self.dir}_reordered"] += 1
                loop.call_later(self.rng.uniform(0, cfg.reorder_ms) / 1e3, deliver, frame)
            else:
                deliver(frame)


class _Conn(asyncio.Protocol):
    """One worker connection = one switch port."""

    def __init__(self, svc: SwitchService):
        self.svc = svc
        self.reader = FrameReader()
        self.out = bytearray()
        self.transport: asyncio.Transport | None = None
        self.id = -1
        self.port = 0
        self.peer = "?"
        self.macs: set[bytes] = set()
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.svc._connected(self)

    def data_received(self, data: bytes) -> None:
        svc = self.svc
        rd = self.reader
        bad = rd.bad
        frames = rd.feed(data)
        if rd.bad != bad:
            svc.counters["bad_datagrams"] += rd.bad - bad
            log.debug("conn %d (%s): %d bad datagram(s)", self.id, self.peer, rd.bad - bad)
        for f in frames:
            svc._ingress(self, f)
        if rd.desync:
            svc.counters["bad_streams"] += 1
            log.warning("conn %d (%s): stream is not framed (length prefix > 1 MiB); closing it",
                        self.id, self.peer)
            self.transport.close()
        svc._flush()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.svc._disconnected(self, exc)

    def pause_writing(self) -> None:
        self.svc._pause(self)

    def resume_writing(self) -> None:
        self.svc._resume(self)


class SwitchService:
    """The switch service around ``engine``: anything with ``receive(port, frame, cycles)``
    returning records with ``.frame``, a ``bus`` and ``ports`` (default: the reference
    :class:`~netreduce.sim.model.Engine`), or a batched engine (module doc: ``batched``,
    ``send``, ``run``, ``sweep``, ``more``, ``wake``, ``provision_mgmt``). ``counters`` are the
    service's own; :meth:`all_counters` adds the engine's global counters (prefixed ``engine.``)
    and, where the engine has ``stats()``, those (prefixed ``rtl.``)."""

    def __init__(self, engine=None, cfg: SwitchConfig | None = None):
        if engine is None:
            from ..backend import open_engine

            engine = open_engine("model", {})
        self.engine = engine
        self.cfg = cfg = cfg or SwitchConfig()
        settings = MgmtSettings(ip=cfg.mgmt_ip, mac=ENGINE_MAC,
                                sources=[MgmtSource(ip) for ip in cfg.mgmt_sources],
                                key=cfg.mgmt_key)
        if hasattr(engine, "provision_mgmt"):
            engine.provision_mgmt(settings)  # the RTL's own management path
        elif hasattr(engine, "mgmt"):
            from ..model.mgmt import attach_mgmt

            attach_mgmt(engine, settings)
        # batched engines (the RTL): every frame of a loop turn is queued, then one run
        self._batched = bool(getattr(engine, "batched", False))
        self._run_pending = False
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._mgmt_ip = cfg.mgmt_ip.to_bytes(4, "big")
        self.counters: Counter = Counter()
        self._up = _Faults(cfg.up, cfg.seed, "up", self.counters)
        self._down = _Faults(cfg.down, cfg.seed, "down", self.counters)
        self.conns: dict[int, _Conn] = {}
        self.macs: dict[bytes, _Conn] = {}
        self._dirty: list[_Conn] = []
        self._paused: set[_Conn] = set()
        self._next_id = 0
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = time.monotonic_ns()
        self._pcap_in = self._pcap_out = None
        self.address: tuple[str, int] | None = None
        self._flush_pending = False

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> tuple[str, int]:
        """Listen; returns the (host, port) actually bound."""
        self._loop = asyncio.get_running_loop()
        if self._batched:
            self.engine.wake = self._schedule_run
        if self.cfg.pcap:
            self._pcap_in = PcapWriter(f"{self.cfg.pcap}.in.pcap")
            self._pcap_out = PcapWriter(f"{self.cfg.pcap}.out.pcap")
        self._server = await self._loop.create_server(lambda: _Conn(self), self.cfg.host,
                                                      self.cfg.port)
        self.address = self._server.sockets[0].getsockname()[:2]
        log.info("switch listening on %s:%d (engine ports %d, faults up %s down %s, seed %d)",
                 *self.address, self.engine.ports, _fault_str(self.cfg.up),
                 _fault_str(self.cfg.down), self.cfg.seed)
        return self.address

    async def stop(self) -> dict[str, int]:
        """Stop listening, close every connection and the captures; returns all counters."""
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if self._server is not None:
            self._server.close()
            for c in list(self.conns.values()):
                c.transport.close()
            await asyncio.sleep(0)
            await self._server.wait_closed()
            self._server = None
        for w in (self._pcap_in, self._pcap_out):
            if w is not None:
                w.close()
        return self.all_counters()

    def all_counters(self) -> dict[str, int]:
        out = {k: 0 for k in COUNTER_HELP}
        out.update((k, int(v)) for k, v in sorted(self.counters.items()))
        out["connections_open"] = len(self.conns)
        out["macs_learned"] = len(self.macs)
        try:
            for k, v in self.engine.counters().items():
                out[f"engine.{k}"] = int(v)
        except AttributeError:  # a backend without counters()
            pass
        stats = getattr(self.engine, "stats", None)
        if callable(stats):  # the RTL adapter's own counters
            out.update((f"rtl.{k}", int(v)) for k, v in stats().items())
        return out

    # ------------------------------------------------------------------ connections
    def _connected(self, c: _Conn) -> None:
        c.id = self._next_id
        self._next_id += 1
        c.port = c.id % self.engine.ports
        peer = c.transport.get_extra_info("peername")
        c.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        c.transport.set_write_buffer_limits(high=self.cfg.high_water,
                                            low=self.cfg.high_water // 4)
        self.conns[c.id] = c
        self.counters["connections"] += 1
        if self._paused:
            c.transport.pause_reading()
        log.info("conn %d from %s -> engine port %d", c.id, c.peer, c.port)

    def _disconnected(self, c: _Conn, exc) -> None:
        self.conns.pop(c.id, None)
        for m in c.macs:
            if self.macs.get(m) is c:
                del self.macs[m]
        if c in self._paused:
            self._resume(c)
        log.info("conn %d (%s) closed%s", c.id, c.peer, f": {exc}" if exc else "")

    def _pause(self, c: _Conn) -> None:
        if not self._paused:
            self.counters["pauses"] += 1
            for o in self.conns.values():
                if not o.closed:
                    o.transport.pause_reading()
        self._paused.add(c)

    def _resume(self, c: _Conn) -> None:
        self._paused.discard(c)
        if not self._paused:
            for o in self.conns.values():
                if not o.closed and o.transport is not None:
                    o.transport.resume_reading()

    # ------------------------------------------------------------------ data path
    def _cycles(self) -> int:
        return (time.monotonic_ns() - self._t0) * CLOCK_HZ // 1_000_000_000

    def _ingress(self, c: _Conn, f: bytes) -> None:
        cn = self.counters
        cn["frames_in"] += 1
        cn["bytes_in"] += len(f)
        self._learn(c, src_mac(f))
        if self._up.cfg.active and not self._is_mgmt(f, to=True):
            self._up.apply(f, lambda fr: self._to_engine(c, fr), self._loop)
        else:
            self._to_engine(c, f)

    def _is_mgmt(self, f: bytes, to: bool) -> bool:
        """IPv4 (untagged) to (``to``) or from the management address."""
        return is_ipv4(f) and (dst_ip(f) if to else src_ip(f)) == self._mgmt_ip

    def _learn(self, c: _Conn, smac: bytes) -> None:
        if smac[0] & 1:
            return  # multicast sources are bogus: never learn them
        old = self.macs.get(smac)
        if old is not c:
            if old is not None:
                self.counters["mac_moves"] += 1
                old.macs.discard(smac)
                log.info("MAC %s moved from conn %d to conn %d", mac_str(smac), old.id, c.id)
            self.macs[smac] = c
            c.macs.add(smac)

    def _to_engine(self, c: _Conn, f: bytes) -> None:
        if self._pcap_in is not None:
            self._pcap_in.write(f, time.time_ns())
        self.counters["engine_in"] += 1
        if self._batched:
            self.engine.send(c.port, f)
            self._schedule_run()
            return
        emits = self.engine.receive(c.port, f, self._cycles())
        for e in emits:
            self._egress(c, e.frame)

    def _schedule_run(self) -> None:
        """One engine run per loop turn, after every connection's data of the turn is read."""
        if not self._run_pending and self._loop is not None:
            self._run_pending = True
            self._loop.call_soon(self._run_engine)

    def _run_engine(self) -> None:
        self._run_pending = False
        self._egress_batch(self.engine.run())
        if self.engine.more:  # the watchdog stopped a run that still moves: go on next turn
            self._schedule_run()
        # once the traffic stops, one sweep collects stragglers (see RtlSwitchEngine)
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        self._sweep_timer = self._loop.call_later(SWEEP_S, self._sweep)

    def _sweep(self) -> None:
        self._sweep_timer = None
        self._egress_batch(self.engine.sweep())

    def _egress_batch(self, emits) -> None:
        # the ingress connection of an output is unknown here: a flood leaves out the
        # connection owning the frame's source MAC (where the frame or its request came from)
        macs = self.macs
        for e in emits:
            f = e.frame
            self._egress(macs.get(src_mac(f)), f)
        self._flush()

    def _egress(self, ingress: _Conn | None, f: bytes) -> None:
        cn = self.counters
        cn["engine_out"] += 1
        if self._pcap_out is not None:
            self._pcap_out.write(f, time.time_ns())
        dmac = dst_mac(f)
        if dmac[0] & 1:
            cn["flooded"] += 1
            dsts = [o for o in self.conns.values() if o is not ingress]
        else:
            d = self.macs.get(dmac)
            if d is not None:
                dsts = [d]
            else:
                cn["unknown_unicast"] += 1
                dsts = [o for o in self.conns.values() if o is not ingress]
        if not dsts:
            cn["no_port"] += 1
        if self._down.cfg.active and not self._is_mgmt(f, to=False):
            for d in dsts:
                self._down.apply(f, lambda fr, d=d: self._deliver(d, fr), self._loop)
        else:
            for d in dsts:
                self._deliver(d, f)

    def _deliver(self, d: _Conn, f: bytes) -> None:
        if d.closed:
            self.counters["no_port"] += 1
            return
        if not d.out:
            self._dirty.append(d)
            if not self._flush_pending and self._loop is not None:
                # one write per connection per loop turn (batches); data_received flushes sooner
                self._flush_pending = True
                self._loop.call_soon(self._flush)
        d.out += len(f).to_bytes(4, "big")
        d.out += f
        self.counters["frames_out"] += 1
        self.counters["bytes_out"] += len(f)

    def _flush(self) -> None:
        self._flush_pending = False
        dirty, self._dirty = self._dirty, []
        for d in dirty:
            if d.out and not d.closed:
                d.transport.write(bytes(d.out))
            d.out.clear()


def _fault_str(f: FaultConfig) -> str:
    if not f.active:
        return "none"
    return f"loss {f.loss:g} dup {f.dup:g} reorder {f.reorder:g}/{f.reorder_ms:g}ms"


class SwitchThread:
    """A :class:`SwitchService` on its own asyncio loop in a daemon thread.

    ``with SwitchThread(cfg=...) as sw: sw.address`` ... :meth:`stop` (also on exit) returns the
    counters. :meth:`call` runs a function on the service's loop and returns its result (so tests
    can read counters or the engine without racing the loop).
    """

    def __init__(self, engine=None, cfg: SwitchConfig | None = None):
        self.service = SwitchService(engine, cfg)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="netreduce-switch", daemon=True)
        self.address: tuple[str, int] | None = None
        self.final: dict[str, int] | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.address = self._loop.run_until_complete(self.service.start())
        except BaseException as e:  # reported by start()
            self._error = e
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    def start(self) -> SwitchThread:
        self._thread.start()
        self._started.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args):
        fut = asyncio.run_coroutine_threadsafe(_call(fn, *args), self._loop)
        return fut.result(10)

    def counters(self) -> dict[str, int]:
        return self.call(self.service.all_counters)

    def stop(self) -> dict[str, int]:
        if self.final is None and self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self.service.stop(), self._loop)
            self.final = fut.result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        return self.final or {}

    @property
    def url(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def __enter__(self) -> SwitchThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def _call(fn, *args):
    return fn(*args)


class RawClient:
    """A raw worker of the switch service: one TCP connection with QEMU ``-netdev socket``
    framing, blocking calls with timeouts (tests and tools that want to see frames, not RC).
    ``recv_timeout`` and ``quiet_wait``: the defaults of :meth:`recv` and :meth:`quiet` (an RTL
    engine behind the switch is much slower than the model: wait longer)."""

    def __init__(self, addr: tuple[str, int], timeout: float = 5.0, recv_timeout: float = 3.0,
                 quiet_wait: float = 0.2):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.recv_timeout, self.quiet_wait = recv_timeout, quiet_wait
        self.reader = FrameReader()
        self.frames: list[bytes] = []  # every frame received so far

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frame_bytes(f) for f in frames))

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are (no framing): for malformed streams."""
        self.sock.sendall(data)

    def recv(self, n: int, timeout: float | None = None) -> list[bytes]:
        """Wait until ``n`` frames have arrived in total; returns :attr:`frames` (what arrived
        when the time is up, or the connection closed)."""
        end = time.monotonic() + (self.recv_timeout if timeout is None else timeout)
        while len(self.frames) < n and time.monotonic() < end:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            if not data:
                break
            self.frames += self.reader.feed(data)
        return self.frames

    def quiet(self, wait: float | None = None) -> list[bytes]:
        """Whatever arrives within ``wait`` seconds; returns :attr:`frames`."""
        return self.recv(len(self.frames) + 10_000, self.quiet_wait if wait is None else wait)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect_clients(sw: SwitchThread, n: int, timeout: float = 5.0,
                    **client) -> list[RawClient]:
    """``n`` :class:`RawClient` of ``sw`` (``client``: their keyword arguments), returned once
    the switch has accepted all of them (flooding reaches only the connections it knows);
    TimeoutError otherwise."""
    out = [RawClient(sw.address, **client) for _ in range(n)]
    end = time.monotonic() + timeout

    def accepted() -> int:  # not counters(): that reads every engine counter (RTL: the bus)
        return sw.call(lambda: len(sw.service.conns))

    while accepted() < n:
        if time.monotonic() >= end:
            for c in out:
                c.close()
            raise TimeoutError(f"the switch accepted {accepted()} of {n} connections in "
                               f"{timeout} s")
        time.sleep(0.01)
    return out
