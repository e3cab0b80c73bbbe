"""Ring all-reduce (reduce-scatter + all-gather) over software RC endpoints: the baseline.

The classic bandwidth-optimal host algorithm NetReduce is compared with: N ranks on a ring, the
buffer cut into N chunks (``np.array_split`` boundaries, whole elements). Rank r's send QP is
connected to a receive QP on rank (r+1) mod N, exactly as in :mod:`.collective`, but the fabric in
the middle only forwards (no engine).

* Reduce-scatter, steps s = 0..N-2: rank r sends chunk (r - s) mod N and, on receiving chunk
  (r - s - 1) mod N from its predecessor, adds it into its own copy. After N-1 steps rank r holds
  the fully reduced chunk (r + 1) mod N.
* All-gather, steps t = 0..N-2: rank r sends chunk (r + 1 - t) mod N and overwrites chunk
  (r - t) mod N with what it receives.

Each step is one RDMA WRITE WITH_IMM (immediate = step) into the successor's staging region; a
rank posts step s as soon as it has consumed step s-1 (the data of step s depends on it). One
staging region per rank suffices: RC delivers in PSN order and a step is consumed synchronously
in its completion, before any packet of the next step can be written. Every rank sends
2(N-1)/N x S bytes, the bound the benchmark compares with.

int32 adds wrap (two's complement, as np.int32); float32 adds in ring order (the result is
order-dependent, as in any ring implementation). Errors: an RC error on any QP raises
:class:`~.rnic.RCError`, a hang :class:`~.fabric.SimulationHang` naming every rank's step.
The driver never imports netreduce.sim (docs/design.md section 9).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .rnic import RNIC, QPConfig, RCError
from .scheduler import Fabric

__all__ = ["RingAllReduce", "RingResult", "ring_allreduce"]


@dataclass
class RingResult:
    """``results[r]``: rank r's output; ``sim_ns``: simulated time from start to the last
    completion; ``stats``: QP statistics summed over ranks."""

    results: list[np.ndarray]
    sim_ns: int
    stats: dict = field(default_factory=dict)


def _mac(host: int) -> bytes:
    return bytes((0x02, 0x52, 0x49)) + host.to_bytes(3, "big")  # 02:'R':'I'


def _ip(host: int) -> int:
    return (10 << 24) | (200 << 16) | (host & 0xFFFF)


class RingAllReduce:
    """One ring all-reduce of ``arrays`` (one per rank, equal shape, int32 or float32) over
    ``fabric``. :meth:`start` posts the first step; drive with ``fabric.run_until(self.finished)``
    or use :meth:`run`."""

    def __init__(self, fabric: Fabric, arrays: Sequence[np.ndarray], pmtu: int = 1024,
                 timeout: int = 8, retry_cnt: int = 7, seed: int = 0):
        n = len(arrays)
        if n < 2:
            raise ValueError(f"a ring needs at least 2 ranks, got {n}")
        arrs = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        dt, size = arrs[0].dtype, arrs[0].size
        for r, a in enumerate(arrs):
            if a.dtype not in (np.int32, np.float32):
                raise TypeError(f"rank {r}: dtype {a.dtype} not supported (int32 or float32)")
            if a.dtype != dt or a.size != size:
                raise ValueError(f"rank {r}: {a.dtype}[{a.size}] differs from rank 0's "
                                 f"{dt}[{size}]")
        self.fabric = fabric
        self.n = n
        self.shape = np.shape(arrays[0])
        self.acc = [a.copy() for a in arrs]
        cuts = np.linspace(0, size, n + 1).astype(np.int64) if size else np.zeros(n + 1, int)
        self.bounds = [(int(cuts[c]), int(cuts[c + 1])) for c in range(n)]
        self.steps = 2 * (n - 1)
        self.qcfg = QPConfig(pmtu=pmtu, timeout=timeout, retry_cnt=retry_cnt)
        rng = random.Random(f"netreduce-ring/{seed}")
        self.rnics = []
        host = 1
        for r in range(n):
            while fabric.is_attached(_mac(host)):
                host += 1
            self.rnics.append(RNIC(fabric, _mac(host), _ip(host), name=f"ring.r{r}",
                                   seed=rng.getrandbits(32)))
            host += 1
        maxc = max(max(e - b for b, e in self.bounds), 1) * arrs[0].itemsize
        self.stage = [rn.reg_mr(np.zeros(maxc, np.uint8)) for rn in self.rnics]
        self.sq = [rn.create_qp(self.qcfg, on_send=self._sent(r), on_error=self._failed)
                   for r, rn in enumerate(self.rnics)]
        self.rq = [rn.create_qp(self.qcfg, on_recv=self._received(r), on_error=self._failed)
                   for r, rn in enumerate(self.rnics)]
        for r in range(n):
            s = (r + 1) % n
            self.sq[r].connect(self.rnics[s].mac, self.rnics[s].ip, self.rq[s].qpn,
                               self.rq[s].start_psn)
            self.rq[s].connect(self.rnics[r].mac, self.rnics[r].ip, self.sq[r].qpn,
                               self.sq[r].start_psn)
        self.posted = [0] * n
        self.sent = [0] * n
        self.recvd = [0] * n
        self._bufs: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
        self.error: RCError | None = None
        self.t0 = 0
        self.t_end: int | None = None

    # ------------------------------------------------------------------ schedule
    def _send_chunk(self, r: int, s: int) -> int:
        n = self.n
        return (r - s) % n if s < n - 1 else (r + 1 - (s - (n - 1))) % n

    def _post(self, r: int) -> None:
        s = self.posted[r]
        if s >= self.steps or s > self.recvd[r]:
            return
        b, e = self.bounds[self._send_chunk(r, s)]
        buf = self.acc[r][b:e].copy()  # frozen until the WRITE completes (retransmissions)
        self._bufs[r][s] = buf
        mr = self.stage[(r + 1) % self.n]
        self.sq[r].post_write(buf.view(np.uint8), mr.va, mr.rkey, imm=s, wr_id=s)
        self.posted[r] = s + 1

    def _sent(self, r: int):
        def cb(qp, c):
            self._bufs[r].pop(c.wr_id, None)
            self.sent[r] += 1
            self._check_done()
        return cb

    def _received(self, r: int):
        def cb(qp, c):
            s = self.recvd[r]
            if c.imm != s:
                self._failed(qp, RCError(qp.name, c.psn, f"step {c.imm} completed, expected {s}"))
                return
            n = self.n
            chunk = (r - s - 1) % n if s < n - 1 else (r - (s - (n - 1))) % n
            b, e = self.bounds[chunk]
            acc = self.acc[r]
            got = self.stage[r].buf[:(e - b) * acc.itemsize].view(acc.dtype)
            if s < n - 1:
                acc[b:e] += got
            else:
                acc[b:e] = got
            self.recvd[r] = s + 1
            self._post(r)
            self._check_done()
        return cb

    def _failed(self, qp, err: RCError) -> None:
        if self.error is None:
            self.error = err

    def _check_done(self) -> None:
        if self.t_end is None and all(x == self.steps for x in self.sent) and all(
                x == self.steps for x in self.recvd):
            self.t_end = self.fabric.now()

    # ------------------------------------------------------------------ driving
    def start(self) -> None:
        self.t0 = self.fabric.now()
        for r in range(self.n):
            self._post(r)

    def finished(self) -> bool:
        return self.t_end is not None or self.error is not None

    def progress(self) -> float:
        return (sum(self.sent) + sum(self.recvd)) / (2 * self.n * self.steps)

    def describe(self) -> str:
        return "ring: " + ", ".join(f"r{r}: posted {self.posted[r]}/{self.steps} acked "
                                    f"{self.sent[r]} received {self.recvd[r]}"
                                    for r in range(self.n))

    def run(self, timeout_ns: int = 60_000_000_000,
            progress: Callable[[float], None] | None = None) -> RingResult:
        """Start, run to completion and tear down; raises RCError / SimulationHang."""
        self.start()
        cb = None if progress is None else (lambda: progress(self.progress()))
        try:
            self.fabric.run_until(self.finished, timeout_ns, describe=self.describe, progress=cb)
            if self.error is not None:
                raise self.error
        finally:
            self.teardown()
        st = Counter()
        for qp in self.sq + self.rq:
            st.update(qp.stats.as_dict())
        return RingResult([a.reshape(self.shape) for a in self.acc], self.t_end - self.t0,
                          dict(st))

    def teardown(self) -> None:
        for r, rn in enumerate(self.rnics):
            rn.destroy_qp(self.sq[r])
            rn.destroy_qp(self.rq[r])


def ring_allreduce(fabric: Fabric, arrays: Sequence[np.ndarray], pmtu: int = 1024,
                   seed: int = 0, timeout_ns: int = 60_000_000_000,
                   progress: Callable[[float], None] | None = None) -> RingResult:
    """One-shot ring all-reduce of ``arrays`` on ``fabric`` (see the module docstring)."""
    return RingAllReduce(fabric, arrays, pmtu=pmtu, seed=seed).run(timeout_ns, progress)
