"""One rank of an N-rank all-reduce per process, through the switch service's tunnel.

:class:`RankComm`
    One rank of an N-rank all-reduce in its own process (torchrun): one software RNIC, and one
    persistent RC ring and engine job per operation (op MAX for the exponents of the float path,
    SUM_SAT for the fixed-point values, SUM_WRAP for int32 when asked for). Rendezvous and the
    exchange of QP/buffer information go through an injected ``exchange`` callable (an
    all-gather of small dicts: gloo under torch, a barrier in tests); the gradient data only
    ever crosses the engine. Rank 0 registers the jobs once through the management bus; every
    all-reduce afterwards continues the same QPs, PSNs and engine indices, so an all-reduce costs
    no register traffic. See the class docstring for flow control and errors.

Transport: :class:`~.tunnel.Tunnel` (the worker half of the switch service's TCP protocol).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from netreduce.sw_driver import quant, ring_comm
from netreduce.sw_driver.control import EngineControl, Op
from netreduce.sw_driver.credits import Credits, RingKnobs, check_ring_knobs
from netreduce.sw_driver.mgmt import ReadAheadBus

from netreduce.regmap import BusError

from ..net.rnic import RNIC, QPConfig, QueuePair, RCError
from ..net.scheduler import SimulationHang, mac_str
from .tunnel import Tunnel, TunnelClosed, TunnelTimeout, log

__all__ = ["RankCommConfig", "RankComm", "CollectiveError", "thread_exchange"]


class CollectiveError(RuntimeError):
    """An all-reduce of this rank failed (RC error, timeout, switch gone); says which and why."""


@dataclass(frozen=True)
class RankCommConfig(RingKnobs):
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
        self.credits = Credits(window, margin, cfg.pmtu)
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
        self.credits.received()
        self.msgs_recvd += 1
        self._post()

    def _post(self) -> None:
        """Post pending messages while they stay within the window (message-level credits)."""
        credits = self.credits
        while self.pending:
            seq, off, ln = self.pending[0]
            if not credits.fits(ln):
                return
            self.pending.pop(0)
            credits.post(ln)
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
    count of packets whose results have arrived plus W - margin (docs/design.md section 5), across
    calls.

    Errors: an RC error on any QP (a peer died, so its results never come and the retries run
    out), no progress within ``op_timeout_s``, or the switch closing the tunnel raise
    :class:`CollectiveError` naming the rank, the call and the ring state; the communicator is
    then broken and every later call raises the same error. :meth:`close` removes the jobs
    (rank 0) and closes the tunnel.
    """

    def __init__(self, address, rank: int, world: int, exchange: Callable[[object], list],
                 cfg: RankCommConfig | None = None, seed: int | None = None,
                 tunnel: Tunnel | None = None, mgmt: dict | None = None):
        ring_comm.check_rank(rank, world)
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
        self.rings = ring_comm.make_rings(cfg, lambda *a: _Ring(self, *a), exp_bytes=cfg.exp_bytes)
        me = {"mac": self.rnic.mac, "ip": self.rnic.ip,
              "rings": {k: r.info() for k, r in self.rings.items()}}
        peers = self._exchange(me)
        succ, pred = peers[(rank + 1) % world], peers[(rank - 1) % world]
        for k, r in self.rings.items():
            s, p = succ["rings"][k], pred["rings"][k]
            r.sq.connect(succ["mac"], succ["ip"], s["rq"], s["rq_psn"])
            r.rq.connect(pred["mac"], pred["ip"], p["sq"], p["sq_psn"])
            r.remote_va, r.remote_rkey = s["va"], s["rkey"]
        jobs = ring_comm.share_jobs(rank, self._exchange, lambda: self._register(peers),
                                    CollectiveError)
        for k, j in jobs.items():
            self.rings[k].job = j
        self.jobs = list(jobs.values())
        log.info("rank %d/%d ready: %s, jobs %s", rank, world, mac_str(self.rnic.mac), jobs)

    def _register(self, peers: list[dict]) -> dict[str, int]:
        self.ctrl = EngineControl(ReadAheadBus(self.tunnel.mgmt_bus(**self.mgmt)))
        return ring_comm.register_jobs(self.ctrl, self.rings, peers, self.cfg.pmtu,
                                       " (jobs of a crashed run? restart the switch)")

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
        a, out, o = ring_comm.check_allreduce_args(x, out, self.rings, "RankCommConfig")
        self.calls += 1
        ring_comm.reduce_segments(self, a, o)
        return out

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

