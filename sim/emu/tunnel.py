"""A real-time loopback tunnel to the switch service, and a one-rank-per-process all-reduce over it.

The switch service (``netreduce switch``, :mod:`netreduce.sim.emu.switch`) plays a top-of-rack
switch
with the engine on its path. Workers reach it over TCP; every frame is a 4-byte big-endian length
followed by the Ethernet frame (QEMU ``-netdev socket`` framing), so a software RNIC here and a
QEMU VM running Linux soft-RoCE connect alike. This module is the worker side; it never imports
netreduce.sim (DESIGN 9).

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

:class:`RankComm`
    One rank of an N-rank all-reduce in its own process (torchrun): one software RNIC, and one
    persistent RC ring and engine job per operation (op MAX for the exponents of the float path,
    SUM_SAT for the fixed-point values, SUM_WRAP for int32 when asked for). Rendezvous and the
    exchange of QP/buffer information go through an injected ``exchange`` callable (an
    all-gather of small dicts: gloo under torch, a barrier in tests); the gradient data only
    ever crosses the engine. Rank 0 registers the jobs once through the management bus; every
    all-reduce afterwards continues the same QPs, PSNs and engine indices, so an all-reduce costs
    no register traffic. See the class docstring for flow control and errors.
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
from dataclasses import dataclass

import numpy as np
from netreduce.sw_driver import quant
from netreduce.sw_driver.control import EngineControl, FlowConfig, JobConfig, Op
from netreduce.sw_driver.credits import check_ring_knobs
from netreduce.sw_driver.mgmt import MgmtClient, ReadAheadBus

from netreduce.regmap import BusError

from ..net.rnic import RNIC, QPConfig, QueuePair, RCError
from ..net.scheduler import SimulationHang, Timer, mac_str

__all__ = [
    "ENGINE_MAC", "DEFAULT_MGMT_IP", "DEFAULT_MGMT_CLIENT_IP", "MAX_FRAME", "MIN_FRAME",
    "FrameReader", "frame_bytes", "parse_address", "Tunnel", "TunnelLink", "TunnelClosed",
    "ReadAheadBus",
    "TunnelTimeout", "RankCommConfig", "RankComm", "CollectiveError", "thread_exchange",
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
                dst = self._ends.get(f[0:6])
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


# ============================================================================ one rank per process
class CollectiveError(RuntimeError):
    """An all-reduce of this rank failed (RC error, timeout, switch gone); says which and why."""


@dataclass(frozen=True)
class RankCommConfig:
    """Knobs of :class:`RankComm`. Times are wall-clock.

    ``timeout``/``retry_cnt`` are the RC QP attributes: a rank that waits for slower peers burns
    retries, so (retry_cnt + 1) x 4.096 us x 2^timeout (default 8 x 0.54 s = 4.3 s) is both the
    straggler tolerance and the time after which a dead peer is detected. ``max_bytes`` is the
    receive region per ring; larger arrays are reduced in segments of that size.
    ``op_timeout_s`` bounds one all-reduce whatever the RC timers do.
    """

    pmtu: int = 1024
    msg_packets: int = 64
    window: int = 256
    margin: int = 64
    exp_window: int = 64
    timeout: int = 17
    retry_cnt: int = 7
    max_bytes: int = 8 << 20
    int32: bool = False  # also register a SUM_WRAP ring for int32 arrays
    exp_bytes: int = 0  # receive region of the MAX ring beyond the exponents (MAX of arrays)
    op_timeout_s: float = 120.0

    def __post_init__(self):
        check_ring_knobs(self, min_window=4)
        if self.max_bytes < self.msg_bytes or self.max_bytes % 4:
            raise ValueError(f"max_bytes must be a multiple of 4 and >= one message "
                             f"({self.msg_bytes} B), got {self.max_bytes!r}")
        if not isinstance(self.exp_bytes, int) or self.exp_bytes < 0 or self.exp_bytes % 4:
            raise ValueError(f"exp_bytes must be a multiple of 4 and >= 0, got "
                             f"{self.exp_bytes!r}")

    @property
    def msg_bytes(self) -> int:
        return self.msg_packets * self.pmtu

    @property
    def chunk_elems(self) -> int:
        return self.msg_bytes // 4


def _mac(salt: int, rank: int) -> bytes:
    return bytes((0x02, 0x4E, 0x52, 0x80 | (salt >> 8 & 0x7F), salt & 0xFF)) + bytes([rank])


def _ip(salt: int, rank: int) -> int:
    return (10 << 24) | (0x80 | (salt >> 8 & 0x7F)) << 16 | (salt & 0xFF) << 8 | rank


class _Ring:
    """One persistent RC ring + engine job: this rank's send QP to its successor, its receive QP
    from its predecessor, its receive region, and cumulative packet/message accounting."""

    def __init__(self, comm: RankComm, name: str, op: Op, window: int, margin: int,
                 msg_packets: int, region_bytes: int):
        self.comm, self.name, self.op = comm, name, op
        self.window, self.margin, self.msg_packets = window, margin, msg_packets
        cfg = comm.cfg
        qcfg = QPConfig(pmtu=cfg.pmtu, timeout=cfg.timeout, retry_cnt=cfg.retry_cnt)
        rn = comm.rnic
        self.sq: QueuePair = rn.create_qp(qcfg, on_send=self._on_send, on_error=comm._on_error)
        self.rq: QueuePair = rn.create_qp(qcfg, on_recv=self._on_recv, on_error=comm._on_error)
        self.region = np.zeros(region_bytes, np.uint8)
        self.mr = rn.reg_mr(self.region)
        self.remote_va = 0
        self.remote_rkey = 0
        self.job: int | None = None
        # cumulative counters over the ring's life
        self.msgs_posted = 0
        self.msgs_sent = 0  # send completions (ACKed by the successor)
        self.msgs_recvd = 0  # result messages received
        self.pkts_posted = 0
        self.pkt_end: dict[int, int] = {}  # message seq -> cumulative packet end
        self.recvd_pkts = 0
        self.pending: list[tuple[int, int, int]] = []  # (seq, offset, length) not yet posted
        self.send_buf: np.ndarray | None = None

    def info(self) -> dict:
        return {"sq": self.sq.qpn, "sq_psn": self.sq.start_psn, "rq": self.rq.qpn,
                "rq_psn": self.rq.start_psn, "va": self.mr.va, "rkey": self.mr.rkey}

    def _on_send(self, qp, c) -> None:
        self.msgs_sent += 1

    def _on_recv(self, qp, c) -> None:
        want = self.msgs_recvd & 0xFFFFFFFF
        if c.imm != want:
            self.comm._on_error(qp, RCError(qp.name, c.psn, f"{self.name} ring: message "
                                            f"{c.imm} completed, expected {want}"))
            return
        self.recvd_pkts = self.pkt_end.pop(self.msgs_recvd)
        self.msgs_recvd += 1
        self._post()

    def _post(self) -> None:
        """Post pending messages while they stay within the window (message-level credits)."""
        limit = self.recvd_pkts + self.window - self.margin
        pmtu = self.comm.cfg.pmtu
        while self.pending:
            seq, off, ln = self.pending[0]
            end = self.pkts_posted + max(1, -(-ln // pmtu))
            if end > limit:
                return
            self.pending.pop(0)
            self.pkt_end[seq] = end
            self.pkts_posted = end
            self.sq.post_write(self.send_buf[off:off + ln], self.remote_va + off,
                               self.remote_rkey, imm=seq & 0xFFFFFFFF, wr_id=seq)
            self.msgs_posted += 1

    def reduce(self, data: np.ndarray) -> np.ndarray:
        """All-reduce ``data`` (a byte view, at most the region size) through this ring; returns a
        view of the receive region holding the result (valid until the next call)."""
        comm = self.comm
        nbytes = data.nbytes
        mb = self.msg_packets * comm.cfg.pmtu
        self.send_buf = data
        first = self.msgs_posted + len(self.pending)
        offs = list(range(0, nbytes, mb)) or [0]
        for i, o in enumerate(offs):
            self.pending.append((first + i, o, min(mb, nbytes - o)))
        target = first + len(offs)
        self._post()
        comm._wait(lambda: self.msgs_recvd >= target and self.msgs_sent >= target,
                   lambda: self.describe(target))
        self.send_buf = None
        return self.region[:nbytes]

    def describe(self, target: int) -> str:
        return (f"{self.name} ring (job {self.job}): messages posted {self.msgs_posted}, ACKed "
                f"{self.msgs_sent}, results {self.msgs_recvd}, target {target}; {self.sq!r}")


def thread_exchange(world: int):
    """An all-gather for ``world`` threads of one process (tests, benchmarks): returns
    ``exchange(rank, obj) -> list of every rank's obj``; each call is a barrier."""
    import threading

    slots: list = [None] * world
    barrier = threading.Barrier(world, timeout=60)

    def exchange(rank: int, obj):
        barrier.wait()
        slots[rank] = obj
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    return exchange


class RankComm:
    """Rank ``rank`` of ``world`` ranks, each in its own process, all-reducing through the switch.

    ``exchange(obj) -> list`` is an all-gather of small picklable objects among the ranks (it
    must return every rank's object in rank order; it is also the barrier that keeps ranks from
    sending before rank 0 has registered the jobs). Construction: open the tunnel, create the
    RNIC (MAC/IPv4 from a salt of rank 0 and the rank), the rings, exchange QPs and regions,
    rank 0 registers one job per ring, barrier.

    :meth:`allreduce` (float32: exponents through the MAX ring, then the fixed-point sum through
    the SUM_SAT ring, then dequantisation; int32 with ``int32=True``: SUM_WRAP, bit-exact) is
    collective: every rank calls it with arrays of the same size and dtype, in the same order.
    Flow control: a ring posts a message only while its last packet stays below the cumulative
    count of packets whose results have arrived plus W - margin (DESIGN 5), across calls.

    Errors: an RC error on any QP (a peer died, so its results never come and the retries run
    out), no progress within ``op_timeout_s``, or the switch closing the tunnel raise
    :class:`CollectiveError` naming the rank, the call and the ring state; the communicator is
    then broken and every later call raises the same error. :meth:`close` removes the jobs
    (rank 0) and closes the tunnel.
    """

    def __init__(self, address, rank: int, world: int, exchange: Callable[[object], list],
                 cfg: RankCommConfig | None = None, seed: int | None = None,
                 tunnel: Tunnel | None = None, mgmt: dict | None = None):
        if not isinstance(world, int) or not 2 <= world <= 255:
            raise ValueError(f"world must be 2..255, got {world!r}")
        if not isinstance(rank, int) or not 0 <= rank < world:
            raise ValueError(f"rank must be 0..{world - 1}, got {rank!r}")
        self.rank, self.world = rank, world
        self.cfg = cfg = cfg or RankCommConfig()
        self._exchange = exchange
        self.error: CollectiveError | None = None
        self.calls = 0
        self.jobs: list[int] = []
        self.mgmt = dict(mgmt or {})
        self.tunnel = tunnel or Tunnel(address, name=f"rank{rank}")
        try:
            self._setup(seed)
        except BaseException:
            self.tunnel.close()
            raise

    def _setup(self, seed) -> None:
        cfg, rank, world = self.cfg, self.rank, self.world
        rng = random.Random(seed)
        salt = self._exchange(rng.getrandbits(15))[0]
        self.rnic = RNIC(self.tunnel, _mac(salt, rank), _ip(salt, rank), name=f"rank{rank}",
                         seed=rng.getrandbits(32))
        ce = cfg.chunk_elems
        nchunks = -(-(cfg.max_bytes // 4) // ce)
        ew = cfg.exp_window
        exp_msg = min(cfg.msg_packets, ew - ew // 4)
        self.rings = {"exp": _Ring(self, "exp", Op.MAX, ew, ew // 4, exp_msg,
                                   max(4 * nchunks, cfg.exp_bytes)),
                      "sum": _Ring(self, "sum", Op.SUM_SAT, cfg.window, cfg.margin,
                                   cfg.msg_packets, cfg.max_bytes)}
        if cfg.int32:
            self.rings["int"] = _Ring(self, "int", Op.SUM_WRAP, cfg.window, cfg.margin,
                                      cfg.msg_packets, cfg.max_bytes)
        me = {"mac": self.rnic.mac, "ip": self.rnic.ip,
              "rings": {k: r.info() for k, r in self.rings.items()}}
        peers = self._exchange(me)
        succ, pred = peers[(rank + 1) % world], peers[(rank - 1) % world]
        for k, r in self.rings.items():
            s, p = succ["rings"][k], pred["rings"][k]
            r.sq.connect(succ["mac"], succ["ip"], s["rq"], s["rq_psn"])
            r.rq.connect(pred["mac"], pred["ip"], p["sq"], p["sq_psn"])
            r.remote_va, r.remote_rkey = s["va"], s["rkey"]
        status = {"ok": True, "jobs": {}}
        if rank == 0:
            try:
                status["jobs"] = self._register(peers)
            except Exception as e:  # every rank must learn about it, not only rank 0
                status = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        status = self._exchange(status)[0]
        if not status["ok"]:
            raise CollectiveError(f"rank {rank}: rank 0 could not register the engine jobs: "
                                  f"{status['error']}")
        for k, j in status["jobs"].items():
            self.rings[k].job = j
        self.jobs = list(status["jobs"].values())
        log.info("rank %d/%d ready: %s, jobs %s", rank, world, mac_str(self.rnic.mac),
                 status["jobs"])

    def _register(self, peers: list[dict]) -> dict[str, int]:
        ctrl = EngineControl(ReadAheadBus(self.tunnel.mgmt_bus(**self.mgmt)))
        self.ctrl = ctrl
        info = ctrl.identify()
        n = self.world
        if self.cfg.pmtu > info.pmtu_max:
            raise ValueError(f"pmtu {self.cfg.pmtu} exceeds the engine's pmtu_max "
                             f"{info.pmtu_max}")
        jobs: dict[str, int] = {}
        try:
            for k, ring in self.rings.items():
                used = set(ctrl.enabled_jobs())
                free = [j for j in range(info.jobs) if j not in used]
                if not free:
                    raise RuntimeError(f"all {info.jobs} engine jobs are in use (jobs of a "
                                       f"crashed run? restart the switch)")
                flows = []
                for r in range(n):
                    s = (r + 1) % n
                    me, nx = peers[r], peers[s]
                    flows.append(FlowConfig(rank=r, fwd_ip=me["ip"], fwd_qpn=nx["rings"][k]["rq"],
                                            rev_ip=nx["ip"], rev_qpn=me["rings"][k]["sq"],
                                            start_psn=me["rings"][k]["sq_psn"]))
                ctrl.add_job(JobConfig(job=free[0], world=n, window=ring.window,
                                       slot_base=ctrl.alloc_slots(ring.window),
                                       pmtu=self.cfg.pmtu, op=ring.op, flows=flows))
                jobs[k] = free[0]
        except BaseException:
            for j in jobs.values():
                ctrl.remove_job(j)
            raise
        return jobs

    # ------------------------------------------------------------------ errors and waiting
    def _on_error(self, qp, err: RCError) -> None:
        if self.error is None:
            self.error = CollectiveError(
                f"rank {self.rank}: all-reduce #{self.calls} failed: {err} (a peer rank died, "
                f"stalled longer than the RC retries allow, or the switch lost frames)")

    def _wait(self, pred: Callable[[], bool], describe: Callable[[], str]) -> None:
        try:
            self.tunnel.run_until(lambda: self.error is not None or pred(),
                                  int(self.cfg.op_timeout_s * 1e9), describe=describe)
        except TunnelTimeout as e:
            self.error = CollectiveError(f"rank {self.rank}: all-reduce #{self.calls} made no "
                                         f"progress: {e}")
        except TunnelClosed as e:
            self.error = CollectiveError(f"rank {self.rank}: all-reduce #{self.calls}: {e}")
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------------ all-reduce
    def allreduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The element-wise sum of ``x`` over all ranks (float32 within the bound of
        :func:`netreduce.sw_driver.quant.error_bound`; int32 bit-exact, wrapping)."""
        if self.error is not None:
            raise self.error
        if self.tunnel.closed:
            raise CollectiveError(f"rank {self.rank}: communicator is closed")
        a = np.ascontiguousarray(x).reshape(-1)
        if a.dtype == np.int32 and "int" not in self.rings:
            raise TypeError("int32 all-reduce needs RankCommConfig(int32=True)")
        if a.dtype not in (np.float32, np.int32):
            raise TypeError(f"dtype {a.dtype} not supported (float32 or int32)")
        if out is None:
            out = np.empty_like(a)
        o = out.reshape(-1)
        if o.shape != a.shape or o.dtype != a.dtype:
            raise ValueError(f"out is {o.dtype}{list(o.shape)}, need {a.dtype}{list(a.shape)}")
        self.calls += 1
        if a.size == 0:
            return out
        seg = self.cfg.max_bytes // 4
        for s in range(0, a.size, seg):
            part = a[s:s + seg]
            if a.dtype == np.int32:
                o[s:s + seg] = self.rings["int"].reduce(part.view(np.uint8)).view(np.int32)
            else:
                self._reduce_float(part, o[s:s + seg])
        return out

    def _reduce_float(self, x: np.ndarray, out: np.ndarray) -> None:
        ce = self.cfg.chunk_elems
        exps = quant.chunk_exponents(x, ce)
        gexp = self.rings["exp"].reduce(exps.view(np.uint8)).view(np.int32)
        e = quant.scales(gexp, self.world)
        self.last_exponents = e
        q = quant.quantize(x, e, ce)
        res = self.rings["sum"].reduce(q.view(np.uint8)).view(np.int32)
        quant.dequantize(res, e, ce, out=out)

    def error_bound(self, y: np.ndarray) -> np.ndarray:
        """Per-element bound of the last float all-reduce (one segment) against the exact sum."""
        return quant.error_bound(y, self.last_exponents, self.cfg.chunk_elems, self.world)

    def barrier(self) -> None:
        self._exchange(None)

    def engine_counters(self) -> dict[str, dict[str, int]]:
        """Rank 0 only: each ring's job counters, read through the switch."""
        if self.rank != 0:
            raise RuntimeError("engine_counters() is for rank 0 (it registered the jobs)")
        return {k: self.ctrl.counters(r.job) for k, r in self.rings.items()}

    def qp_stats(self) -> dict[str, int]:
        tot: dict[str, int] = {}
        for r in self.rings.values():
            for qp in (r.sq, r.rq):
                for k, v in qp.stats.as_dict().items():
                    tot[k] = tot.get(k, 0) + v
        return tot

    def close(self, barrier: bool = True) -> None:
        """Collective when ``barrier``: wait for every rank, then rank 0 removes the jobs."""
        if self.tunnel.closed:
            return
        try:
            if barrier and self.error is None:
                self._exchange(None)
            if self.rank == 0 and self.jobs:
                for j in self.jobs:
                    try:
                        self.ctrl.remove_job(j)
                    except (OSError, BusError, SimulationHang) as e:
                        log.warning("rank 0: could not remove job %d: %s", j, e)
                self.jobs = []
        finally:
            self.tunnel.close()

    def __enter__(self) -> RankComm:
        return self

    def __exit__(self, *exc) -> None:
        self.close(barrier=exc[0] is None)

