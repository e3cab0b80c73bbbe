"""A real-time loopback tunnel to the switch service: the worker half of its TCP protocol.

The switch service (``netreduce switch``, :mod:`netreduce.sim.emu.switch`) plays a top-of-rack
switch with the engine on its path. Workers reach it over TCP; every frame is a 4-byte big-endian
length followed by the Ethernet frame (QEMU ``-netdev socket`` framing), so a software RNIC here and
a QEMU VM running Linux soft-RoCE connect alike. This module is the worker side; it never imports
netreduce.sim (docs/design.md section 9).

:class:`Tunnel`
    A :class:`~netreduce.sim.net.scheduler.Fabric` in wall-clock time: ``now()`` is monotonic
    nanoseconds since the tunnel opened, timers fire in real time, and :meth:`Tunnel.run_until`
    is the driver loop (``select`` on the socket, non-blocking reads and writes, due timers).
    The :class:`~netreduce.sim.net.rnic.RNIC` runs on it unchanged: its retransmit timers are
    real seconds. Frames are read in large batches and written from one output buffer that is
    flushed once per loop turn. Backpressure: when the switch stops reading, our output buffer
    grows (bounded by the RC windows) while we keep reading, so the two sides never deadlock.
    Errors: the switch closing the connection raises :class:`TunnelClosed` from the loop; a
    ``run_until`` that does not reach its goal in time raises :class:`TunnelTimeout` (a
    :class:`~netreduce.sim.net.scheduler.SimulationHang`, so code that handles hangs of the
    in-process fabrics handles this too).

Management (:meth:`Tunnel.mgmt_bus`)
    The engine's register bus over the same connection, with the in-band management protocol
    (:mod:`netreduce.sw_driver.mgmt`, docs/management.md): UDP requests to the engine's
    management IPv4 (default :data:`DEFAULT_MGMT_IP`, MAC :data:`ENGINE_MAC`) from an allowed
    source (default :data:`DEFAULT_MGMT_CLIENT_IP`, the switch service's default allow-list).
    :class:`TunnelLink` is the :class:`~netreduce.sw_driver.mgmt.FrameLink` it runs on: it
    attaches its own MAC to the tunnel and waits in the tunnel's loop, in wall-clock time.

The one-rank-per-process all-reduce over a tunnel is :mod:`.rank`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import select
import socket
import struct
import time
from collections.abc import Callable

from netreduce.sw_driver.mgmt import MgmtClient, ReadAheadBus

from netreduce.wire.view import dst_mac

from ..net.scheduler import SimulationHang, Timer, mac_str

__all__ = [
    "ENGINE_MAC", "DEFAULT_MGMT_IP", "DEFAULT_MGMT_CLIENT_IP", "MAX_FRAME", "MIN_FRAME",
    "FrameReader", "frame_bytes", "parse_address", "Tunnel", "TunnelLink", "TunnelClosed",
    "ReadAheadBus", "TunnelTimeout",
]

log = logging.getLogger("netreduce.tunnel")

ENGINE_MAC = bytes.fromhex("024e52000000")  # the engine's management MAC (switch default)
DEFAULT_MGMT_IP = (10 << 24) | 0xFFFFFE  # 10.255.255.254: the engine's management IPv4
DEFAULT_MGMT_CLIENT_IP = (10 << 24) | 0xFFFF01  # 10.255.255.1: allowed by the switch by default
MIN_FRAME = 14  # an Ethernet header
MAX_FRAME = 65535  # the largest frame either side accepts (QEMU sends at most 65535 + 4)
RESYNC_LIMIT = 1 << 20  # a longer length prefix means the stream is garbage: give up on it
_LEN = struct.Struct(">I")


# ============================================================================ framing
def frame_bytes(frame) -> bytes:
    """``frame`` with its 4-byte big-endian length prefix."""
    return _LEN.pack(len(frame)) + bytes(frame)


def parse_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """'HOST:PORT' or 'PORT' -> (host, port); ValueError naming the text otherwise."""
    host, sep, port = str(text).rpartition(":")
    if not sep:
        host = default_host
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"cannot read address {text!r} (expected HOST:PORT)") from None
    if not 0 <= p <= 65535:
        raise ValueError(f"port {p} in {text!r} outside 0..65535")
    return host or default_host, p


class FrameReader:
    """Cuts a TCP byte stream into frames (QEMU socket framing).

    :meth:`feed` returns the complete frames (bytes) of everything fed so far. A length below
    :data:`MIN_FRAME` or above :data:`MAX_FRAME` is a bad datagram: its bytes are skipped and
    ``bad`` counts it. A length above :data:`RESYNC_LIMIT` cannot be skipped safely (the stream
    is not framed at all); :attr:`desync` is set and the caller should drop the connection.
    """

    __slots__ = ("_buf", "_skip", "bad", "desync")

    def __init__(self):
        self._buf = bytearray()
        self._skip = 0
        self.bad = 0
        self.desync = False

    def feed(self, data) -> list[bytes]:
        if self.desync:
            return []
        buf = self._buf
        buf += data
        if self._skip:
            k = min(self._skip, len(buf))
            del buf[:k]
            self._skip -= k
            if self._skip:
                return []
        out = []
        pos = 0
        n = len(buf)
        unpack = _LEN.unpack_from
        while n - pos >= 4:
            ln = unpack(buf, pos)[0]
            if ln < MIN_FRAME or ln > MAX_FRAME:
                self.bad += 1
                if ln > RESYNC_LIMIT:
                    self.desync = True
                    buf.clear()
                    return out
                if n - pos - 4 < ln:
                    self._skip = ln - (n - pos - 4)
                    pos = n
                    break
                pos += 4 + ln
                continue
            if n - pos - 4 < ln:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + ln]))
            pos += 4 + ln
        del buf[:pos]
        return out


# ============================================================================ the tunnel
class TunnelClosed(ConnectionError):
    """The switch closed the tunnel (or it could not be opened); the message says which."""


class TunnelTimeout(SimulationHang):
    """The driver loop did not reach its goal within the wall-clock limit."""


class Tunnel:
    """A wall-clock :class:`~netreduce.sim.net.scheduler.Fabric` over one TCP connection.

    ``address`` is (host, port) or 'HOST:PORT'. ``bus`` is the engine's register bus through the
    switch (:meth:`mgmt_bus` with the defaults). ``stats`` counts frames and bytes each way,
    frames for no attached endpoint (``rx_unknown_dst``: the switch floods broadcasts and unknown
    unicast) and bad length prefixes (``rx_bad``). Not thread-safe: one thread drives one tunnel.
    """

    def __init__(self, address, *, connect_timeout_s: float = 10.0, name: str = "tunnel"):
        host, port = parse_address(address) if isinstance(address, str) else address
        self.address = (host, int(port))
        self.name = name
        deadline = time.monotonic() + connect_timeout_s
        while True:  # the service may still be starting: retry until the deadline
            try:
                sock = socket.create_connection(self.address, timeout=max(0.1, deadline
                                                                          - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise TunnelClosed(f"{name}: cannot connect to the switch at {host}:{port}: "
                                       f"{e}") from e
                time.sleep(0.05)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._t0 = time.monotonic_ns()
        self._ends: dict[bytes, Callable[[bytes], None]] = {}
        self._queue: list = []
        self._seq = itertools.count()
        self._out = bytearray()
        self._reader = FrameReader()
        self._closed: str | None = None
        self._bus = None
        self.stats = {"tx_frames": 0, "tx_bytes": 0, "rx_frames": 0, "rx_bytes": 0,
                      "rx_unknown_dst": 0, "rx_bad": 0}
        self.events = 0

    # ------------------------------------------------------------------ Fabric
    def now(self) -> int:
        return time.monotonic_ns() - self._t0

    def attach(self, mac: bytes, deliver: Callable[[bytes], None]) -> None:
        mac = bytes(mac)
        if len(mac) != 6:
            raise ValueError(f"MAC must be 6 bytes, got {mac!r}")
        if mac in self._ends:
            raise ValueError(f"MAC {mac_str(mac)} is already attached")
        self._ends[mac] = deliver

    def is_attached(self, mac: bytes) -> bool:
        return bytes(mac) in self._ends

    def send(self, frame) -> None:
        self._queue_out(frame)

    def call_at(self, t_ns: int, fn: Callable, *args) -> Timer:
        h = Timer(int(t_ns))
        heapq.heappush(self._queue, (h.time, next(self._seq), h, fn, args))
        return h

    def call_later(self, delay_ns: int, fn: Callable, *args) -> Timer:
        return self.call_at(self.now() + int(delay_ns), fn, *args)

    def run_until(self, pred: Callable[[], bool], timeout_ns: int | None = None, *,
                  describe: Callable[[], str] | None = None,
                  progress: Callable[[], None] | None = None, progress_every: int = 2000,
                  max_events: int | None = None) -> int:
        """Drive the loop until ``pred()``; return ``now()``.

        Before returning, timers already due (ACKs scheduled "now") are run and the output is
        flushed, so nothing this process owes its peers waits for the next call. Raises
        :class:`TunnelTimeout` after ``timeout_ns`` of wall-clock time (or ``max_events``
        callbacks), :class:`TunnelClosed` when the switch goes away.
        """
        deadline = None if timeout_ns is None else self.now() + int(timeout_ns)
        start_events = self.events
        last_progress = self.events
        while not pred():
            if self._closed is not None:
                raise TunnelClosed(self._closed)
            now = self.now()
            if deadline is not None and now >= deadline:
                self._hang(f"wall-clock limit of {timeout_ns / 1e9:.3g} s reached", describe)
            if max_events is not None and self.events - start_events >= max_events:
                self._hang(f"event limit of {max_events} reached", describe)
            wait = 0.2
            if self._queue:
                wait = min(wait, max(0.0, (self._queue[0][0] - now) / 1e9))
            if deadline is not None:
                wait = min(wait, max(0.0, (deadline - now) / 1e9))
            self._poll(wait)
            if progress is not None and self.events - last_progress >= progress_every:
                last_progress = self.events
                progress()
        self._fire_due()
        self._flush()
        return self.now()

    def run_for(self, seconds: float) -> None:
        """Serve the tunnel (answer ACKs, timers) for ``seconds`` of wall-clock time."""
        end = self.now() + int(seconds * 1e9)
        self.run_until(lambda: self.now() >= end)

    def _hang(self, why: str, describe) -> None:
        msg = f"{self.name}: {why}"
        if describe is not None:
            msg += f"; {describe()}"
        raise TunnelTimeout(msg)

    # ------------------------------------------------------------------ I/O
    def _queue_out(self, frame) -> None:
        if self._closed is not None:
            return  # the loop raises TunnelClosed
        self._out += _LEN.pack(len(frame))
        self._out += frame
        self.stats["tx_frames"] += 1
        self.stats["tx_bytes"] += len(frame)

    def _flush(self) -> None:
        out = self._out
        while out and self._closed is None:
            try:
                n = self.sock.send(out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._lost(f"send failed: {e}")
                return
            del out[:n]  # O(1) at the front of a bytearray

    def _poll(self, wait_s: float) -> None:
        self._flush()
        try:
            r, w, _ = select.select([self.sock], [self.sock] if self._out else [], [], wait_s)
        except (OSError, ValueError) as e:
            self._lost(f"select failed: {e}")
            return
        if r:
            self._read()
        if w:
            self._flush()
        self._fire_due()

    def _read(self) -> None:
        for _ in range(64):  # bounded, so timers run even under a flood
            try:
                data = self.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._lost(f"receive failed: {e}")
                return
            if not data:
                self._lost(f"the switch at {self.address[0]}:{self.address[1]} closed the "
                           f"connection")
                return
            frames = self._reader.feed(data)
            if self._reader.desync:
                self._lost("the switch sent an unframed stream")
                return
            st = self.stats
            st["rx_bad"] = self._reader.bad
            for f in frames:
                st["rx_frames"] += 1
                st["rx_bytes"] += len(f)
                dst = self._ends.get(dst_mac(f))
                if dst is None:
                    st["rx_unknown_dst"] += 1
                    continue
                self.events += 1
                dst(f)

    def _fire_due(self) -> None:
        q = self._queue
        now = self.now()
        while q and q[0][0] <= now:
            _, _, h, fn, args = heapq.heappop(q)
            if h.cancelled:
                continue
            self.events += 1
            fn(*args)

    def _lost(self, why: str) -> None:
        if self._closed is None:
            self._closed = f"{self.name}: {why}"
            log.debug("%s", self._closed)

    def close(self) -> None:
        """Flush what is queued (best effort) and close the connection."""
        if self._closed is None:
            try:
                self.sock.setblocking(True)
                self.sock.settimeout(1.0)
                if self._out:
                    self.sock.sendall(self._out)
            except OSError:
                pass
            self._closed = f"{self.name}: closed"
        self._out.clear()
        try:
            self.sock.close()
        except OSError:
            pass

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ management
    def mgmt_bus(self, *, engine_ip: int = DEFAULT_MGMT_IP, engine_mac: bytes = ENGINE_MAC,
                 ip: int = DEFAULT_MGMT_CLIENT_IP, mac: bytes | None = None,
                 key: bytes | None = None, timeout_s: float = 0.5, retries: int = 6) -> MgmtClient:
        """A :class:`~netreduce.sw_driver.mgmt.MgmtClient` (a register bus) through this tunnel.
        ``mac`` defaults to a random locally administered MAC, so clients in different processes
        never share one (they may share the allowed source IPv4: the client syncs its sequence
        number with the engine first)."""
        if mac is None:
            mac = bytes((0x02, 0x4E, 0x53)) + random.randbytes(3)
        return MgmtClient(TunnelLink(self, mac), engine_ip=engine_ip, engine_mac=engine_mac,
                          ip=ip, mac=mac, key=key, timeout_s=timeout_s, retries=retries,
                          clock=time.monotonic)

    @property
    def bus(self) -> ReadAheadBus:
        """The default management bus (created on first use; flow-table reads batched by
        :class:`ReadAheadBus`), for the Fabric protocol."""
        if self._bus is None:
            self._bus = ReadAheadBus(self.mgmt_bus())
        return self._bus


class TunnelLink:
    """A :class:`~netreduce.sw_driver.mgmt.FrameLink` on a :class:`Tunnel`: attaches ``mac``;
    :meth:`recv` drives the tunnel's loop (so the RNICs on it keep working) until a frame for
    ``mac`` arrives or ``timeout_s`` of wall-clock time passed."""

    def __init__(self, tunnel: Tunnel, mac: bytes):
        self.tunnel = tunnel
        self.mac = bytes(mac)
        self._q: list[bytes] = []
        tunnel.attach(self.mac, self._q.append)

    def send(self, frame: bytes) -> None:
        self.tunnel.send(frame)

    def recv(self, timeout_s: float) -> bytes | None:
        if not self._q:
            end = self.tunnel.now() + int(timeout_s * 1e9)
            self.tunnel.run_until(lambda: bool(self._q) or self.tunnel.now() >= end)
        return self._q.pop(0) if self._q else None
