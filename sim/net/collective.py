"""The collective all-reduce over a NetReduce engine, with software RC endpoints (docs/design.md
section 2, 5).

N ranks live in one process, each with its own :class:`~netreduce.sim.net.rnic.RNIC` on a
pluggable fabric (the reference model, the RTL, a tunnel: see :mod:`.fabric`). An all-reduce pass:

1. *Ring QPs.* Rank r's send QP is connected to a receive QP on rank (r+1) mod N (two QPs per rank:
   one RC QP cannot talk to two peers). Start PSNs are random per QP (seeded) unless given.
2. *Registration.* The job and its flows are written through
   :class:`~netreduce.sw_driver.control.EngineControl` over the fabric's register bus: forward key
   (IPv4 of r, QPN of the successor's receive QP), reverse key (IPv4 of the successor, QPN of r's
   send QP), start PSN of r's send QP; a free job id; ``alloc_slots(W)``.
3. *Messages.* The buffer is cut into messages of ``msg_packets`` packets (RDMA WRITE WITH_IMM,
   immediate = message index) into the successor's receive region at the same offset. The engine
   replaces every payload with the sum over the N flows, so every receive region ends up holding
   the all-reduced buffer.
4. *Credits* (message level): rank r posts message m only when its last packet index is below
   R_r + W - margin, where R_r is the number of packets of the messages whose results r has
   completely received. The engine frees an index once every receiver has ACKed it, and receivers
   ACK at least at every message end. A new packet can overtake the ACK of the message just
   received (that ACK may wait behind data on a link), but not the ACK of the one before, so
   free_j >= R_r - msg_packets when it arrives: with ``margin >= msg_packets`` (the defaults)
   nothing arrives ahead of the window in a loss-free run (``drop_ahead`` stays 0). Extra margin
   absorbs jitter and reordering.
5. *Teardown.* When every rank has both its send completions (all ACKed: the engine has seen every
   ACK, so every slot is free) and all results, the pass reads the job's counters and busy slots
   (reported as ``slots_left``; 0 on success), removes the job and destroys the QPs.

int32 buffers are reduced bit-exactly (op SUM_WRAP: two's complement, as ``np.int32`` addition).
float32 buffers go through :mod:`.quant`: first a MAX all-reduce of the per-chunk exponents (its
own small job and QP ring, op MAX, all exponents in one message per ``msg_packets``), then the SUM
all-reduce of the fixed-point values (op SUM_SAT: overflow is impossible by construction, so the
saturation counter doubles as a check), then dequantisation. One chunk = one message.

Errors: an RC error on any QP (retry limit, NAK, sequencing) is raised as
:class:`~netreduce.sim.net.rnic.RCError`; a hang as
:class:`~netreduce.sim.net.scheduler.SimulationHang` whose message lists every rank's progress.
The job is removed from the engine in every case.

The driver never imports netreduce.hw or netreduce.sim (docs/design.md section 9).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from netreduce.sw_driver import quant
from netreduce.sw_driver.control import EngineControl, FlowConfig, JobConfig, Op
from netreduce.sw_driver.credits import Credits, RingKnobs, check_ring_knobs

from netreduce.wire import PSN_MOD

from .dcqcn import DcqcnConfig
from .rnic import RNIC, QPConfig, QueuePair, RCError
from .scheduler import Fabric, SimulationHang

__all__ = ["CollectiveConfig", "Communicator", "AllReduce", "AllReduceResult", "run",
           "allreduce", "STAT_KEYS"]

# QP statistics summed into AllReduceResult.stats, in display order.
STAT_KEYS = ("sent", "retransmitted", "acks_sent", "naks_sent", "acks_received",
             "naks_received", "naks_ignored", "stale_acks", "timeouts", "retries", "received",
             "duplicates", "out_of_seq_dropped", "cnps", "ce_received", "rate_cuts")


@dataclass(frozen=True)
class CollectiveConfig(RingKnobs):
    """Knobs of the collective. Defaults: PMTU 1024, 64-packet messages, W = 256 (2 x rxe's 128)
    with a margin of 64, QP timeout 8 (4.096 us * 2^8 = 1.05 ms of simulated time), 7 retries.
    """

    pmtu: int = 1024
    msg_packets: int = 64
    window: int = 256
    margin: int = 64
    exp_window: int = 64  # the exponent (MAX) job
    timeout: int = 8
    retry_cnt: int = 7
    ecn: bool = False
    sim_timeout_ns: int = 60_000_000_000  # watchdog on simulated time per run
    start_psns: tuple[int, ...] | None = None  # send-QP start PSNs per rank (tests: PSN wrap)
    fast_retx: bool = False  # JOB.CTRL.fast_retx on the collective's jobs (engine D16)
    dcqcn: DcqcnConfig | None = None  # the RNICs' rate reaction to CNPs (.dcqcn); off: rxe

    def __post_init__(self):
        check_ring_knobs(self)


@dataclass
class AllReduceResult:
    """``results[r]`` is rank r's output. ``stats``: QP statistics summed over ranks and passes,
    plus ``frames_out``/``frames_in`` (endpoint frames), ``engine`` (the job counters of each pass,
    summed), ``slots_left`` (busy slots at teardown, summed; must be 0), ``passes``."""

    results: list[np.ndarray]
    stats: dict = field(default_factory=dict)
    exponents: np.ndarray | None = None  # float path: the shared e per chunk
    chunk: int = 0  # float path: elements per chunk

    def error_bound(self) -> np.ndarray:
        """Float path: per-element bound of |result - exact sum| (see :mod:`.quant`)."""
        if self.exponents is None:
            raise ValueError("error_bound() is only defined for the float32 path")
        return quant.error_bound(self.results[0], self.exponents, self.chunk, len(self.results))


class Communicator:
    """``world`` ranks on ``fabric``: one RNIC each (MAC 02:4e:52:hh:hh:hh, IPv4 10.x.y.z, picked
    among addresses not yet attached), and the engine's control over ``fabric.bus``."""

    def __init__(self, fabric: Fabric, world: int, cfg: CollectiveConfig | None = None,
                 seed: int = 0, name: str = "comm"):
        if not isinstance(world, int) or world < 2:
            raise ValueError(f"world size must be an int >= 2 (the engine aggregates at least 2 "
                             f"flows), got {world!r}")
        if fabric.bus is None:
            raise ValueError("this fabric has no engine (fabric.bus is None)")
        self.fabric = fabric
        self.world = world
        self.cfg = cfg or CollectiveConfig()
        self.name = name
        self.ctrl = EngineControl(fabric.bus)
        self.info = self.ctrl.identify()
        if self.cfg.pmtu > self.info.pmtu_max:
            raise ValueError(f"pmtu {self.cfg.pmtu} exceeds the engine's pmtu_max "
                             f"{self.info.pmtu_max}")
        if world > self.info.max_world:
            raise ValueError(f"world {world} exceeds the engine's max_world {self.info.max_world}")
        self._rng = random.Random(f"netreduce-comm/{seed}/{name}")
        self.rnics: list[RNIC] = []
        host = 1
        for r in range(world):
            while fabric.is_attached(_mac(host)):
                host += 1
            self.rnics.append(RNIC(fabric, _mac(host), _ip(host), name=f"{name}.r{r}",
                                   seed=self._rng.getrandbits(32)))
            host += 1

    def allreduce_async(self, arrays: Sequence[np.ndarray]) -> AllReduce:
        """Start an all-reduce (returns at once); drive it with :func:`run`."""
        op = AllReduce(self, arrays)
        op.start()
        return op

    def allreduce(self, arrays: Sequence[np.ndarray],
                  progress: Callable[[float], None] | None = None) -> AllReduceResult:
        """All-reduce ``arrays`` (one per rank, equal shape, all int32 or all float32)."""
        op = self.allreduce_async(arrays)
        run(self.fabric, [op], progress=progress, timeout_ns=self.cfg.sim_timeout_ns)
        return op.result()


def _mac(host: int) -> bytes:
    return bytes((0x02, 0x4E, 0x52)) + host.to_bytes(3, "big")


def _ip(host: int) -> int:
    return (10 << 24) | (host & 0xFFFFFF)


class _Pass:
    """One engine job: ring QPs, receive regions, messages and credits (module docstring 1-5)."""

    def __init__(self, comm: Communicator, op: Op, sendbufs: list[np.ndarray], window: int,
                 margin: int, msg_packets: int, on_done: Callable[[_Pass], None], tag: str,
                 port: int | None = None):
        cfg = comm.cfg
        self.port = port  # engine port of this job (striping), None: the fabric's choice
        self.comm = comm
        self.op = op
        self.window = window
        self.margin = margin
        self.tag = tag
        self.on_done = on_done
        n = comm.world
        self.send = [np.ascontiguousarray(b).reshape(-1).view(np.uint8) for b in sendbufs]
        nbytes = self.send[0].nbytes
        mb = msg_packets * cfg.pmtu
        self.msgs = [(o, min(mb, nbytes - o)) for o in range(0, nbytes, mb)] or [(0, 0)]
        npk = [max(1, -(-ln // cfg.pmtu)) for _, ln in self.msgs]
        self.pkt_end = np.cumsum(npk).tolist()
        self.total_pkts = self.pkt_end[-1]
        self.qcfg = QPConfig(pmtu=cfg.pmtu, timeout=cfg.timeout, retry_cnt=cfg.retry_cnt,
                             ecn=cfg.ecn, dcqcn=cfg.dcqcn)
        self.posted = [0] * n
        self.credits = [Credits(window, margin, cfg.pmtu) for _ in range(n)]
        self.sent = [0] * n
        self.recvd = [0] * n
        self.error: RCError | None = None
        self.done = False
        self.job: int | None = None
        self.engine_counters: dict[str, int] = {}
        self.slots_left = 0
        self.sq: list[QueuePair] = []
        self.rq: list[QueuePair] = []
        self.mrs = []

    # ------------------------------------------------------------------ setup / teardown
    def start(self) -> None:
        comm, n = self.comm, self.comm.world
        rn = comm.rnics
        psns = comm.cfg.start_psns
        if psns is not None and len(psns) != n:
            raise ValueError(f"start_psns has {len(psns)} entries for {n} ranks")
        for r in range(n):
            sp = None if psns is None else psns[r] % PSN_MOD
            self.sq.append(rn[r].create_qp(self.qcfg, sp, on_send=self._sent(r),
                                           on_error=self._failed))
            self.rq.append(rn[r].create_qp(self.qcfg, on_recv=self._received(r),
                                           on_error=self._failed))
            self.mrs.append(rn[r].reg_mr(np.zeros(max(1, self.send[r].nbytes), np.uint8)))
        for r in range(n):
            s = (r + 1) % n
            self.sq[r].connect(rn[s].mac, rn[s].ip, self.rq[s].qpn, self.rq[s].start_psn)
            self.rq[s].connect(rn[r].mac, rn[r].ip, self.sq[r].qpn, self.sq[r].start_psn)
        ctrl = comm.ctrl
        used = set(ctrl.enabled_jobs())
        free = [j for j in range(comm.info.jobs) if j not in used]
        if not free:
            raise RuntimeError(f"all {comm.info.jobs} engine jobs are in use")
        job = free[0]
        flows = [FlowConfig(rank=r, fwd_ip=rn[r].ip, fwd_qpn=self.rq[(r + 1) % n].qpn,
                            rev_ip=rn[(r + 1) % n].ip, rev_qpn=self.sq[r].qpn,
                            start_psn=self.sq[r].start_psn) for r in range(n)]
        ctrl.add_job(JobConfig(job=job, world=n, window=self.window,
                               slot_base=ctrl.alloc_slots(self.window), pmtu=comm.cfg.pmtu,
                               op=self.op, flows=flows, fast_retx=comm.cfg.fast_retx))
        self.job = job
        # the switch's per-flow steering (a ToR with the engine on some of its ports), installed
        # with the job: forward and reverse key of every flow, and the job's engine port
        steer = getattr(comm.fabric, "steer_flows", None)
        if steer is not None:
            steer([(r, f.fwd_ip, f.fwd_qpn, f.rev_ip, f.rev_qpn) for r, f in enumerate(flows)],
                  self.port)
        for r in range(n):
            self._post(r)

    def teardown(self) -> None:
        ctrl = self.comm.ctrl
        if self.job is not None:
            self.slots_left = ctrl.slots_in_use(self.job)
            self.engine_counters = ctrl.counters(self.job)
            ctrl.remove_job(self.job)
            self.job = None
        for r, rnic in enumerate(self.comm.rnics):
            for qps in (self.sq, self.rq):
                if r < len(qps):
                    rnic.destroy_qp(qps[r])
            if r < len(self.mrs):
                rnic.dereg_mr(self.mrs[r])

    # ------------------------------------------------------------------ data path
    def _post(self, r: int) -> None:
        credits = self.credits[r]
        m = self.posted[r]
        s = (r + 1) % self.comm.world
        mr = self.mrs[s]
        while m < len(self.msgs) and credits.fits(self.msgs[m][1]):
            off, ln = self.msgs[m]
            credits.post(ln)
            self.sq[r].post_write(self.send[r][off:off + ln], mr.va + off, mr.rkey, imm=m,
                                  wr_id=m)
            m += 1
        self.posted[r] = m

    def _sent(self, r: int):
        def cb(qp, c):
            self.sent[r] += 1
            self._check_done()
        return cb

    def _received(self, r: int):
        def cb(qp, c):
            if c.imm != self.recvd[r]:
                self._failed(qp, RCError(qp.name, c.psn, f"message {c.imm} completed, expected "
                                                         f"{self.recvd[r]} (out of order)"))
                return
            self.recvd[r] += 1
            self.credits[r].received()
            self._post(r)
            self._check_done()
        return cb

    def _failed(self, qp, err: RCError) -> None:
        if self.error is None:
            self.error = err

    def _check_done(self) -> None:
        m = len(self.msgs)
        if not self.done and all(x == m for x in self.sent) and all(x == m for x in self.recvd):
            self.done = True
            self.on_done(self)

    def result(self, r: int) -> np.ndarray:
        return self.mrs[r].buf[:self.send[r].nbytes]

    def qp_stats(self) -> Counter:
        c = Counter()
        for qp in self.sq + self.rq:
            c.update(qp.stats.as_dict())
        return c

    def describe(self) -> str:
        m = len(self.msgs)
        ranks = ", ".join(f"r{r}: posted {self.posted[r]}/{m} acked {self.sent[r]} "
                          f"results {self.recvd[r]} [{self.sq[r]!r}]"
                          for r in range(self.comm.world))
        return f"{self.comm.name}/{self.tag} job {self.job}: {ranks}"

    def progress(self) -> float:
        m = len(self.msgs) * self.comm.world
        return (sum(self.recvd) + sum(self.sent)) / (2 * m)


class AllReduce:
    """One all-reduce in progress (see :meth:`Communicator.allreduce_async` and :func:`run`)."""

    def __init__(self, comm: Communicator, arrays: Sequence[np.ndarray], port: int | None = None):
        n = comm.world
        if len(arrays) != n:
            raise ValueError(f"need one array per rank ({n}), got {len(arrays)}")
        arrs = [np.ascontiguousarray(a) for a in arrays]
        shape, dt = arrs[0].shape, arrs[0].dtype
        for r, a in enumerate(arrs):
            if a.dtype not in (np.int32, np.float32):
                raise TypeError(f"rank {r}: dtype {a.dtype} not supported (int32 or float32)")
            if a.dtype != dt or a.shape != shape:
                raise ValueError(f"rank {r}: {a.dtype}{list(a.shape)} differs from rank 0's "
                                 f"{dt}{list(shape)}")
        self.comm = comm
        self.port = port  # engine port of this all-reduce's jobs (a stripe), None: any
        self.arrays = arrs
        self.shape = shape
        self.dtype = dt
        self.passes: list[_Pass] = []
        self.cur: _Pass | None = None
        self.done = False
        self.error: BaseException | None = None
        self.e: np.ndarray | None = None
        self._result: AllReduceResult | None = None

    # the float path is a little state machine: exponents (MAX) -> values (SUM_SAT)
    def start(self) -> None:
        cfg = self.comm.cfg
        if self.dtype == np.int32:
            self._run_pass(Op.SUM_WRAP, self.arrays, cfg.window, cfg.margin, cfg.msg_packets,
                           self._finish_int, "sum")
        else:
            self.chunk = cfg.chunk_elems
            exps = [quant.chunk_exponents(a.reshape(-1), self.chunk) for a in self.arrays]
            ew = cfg.exp_window
            self._run_pass(Op.MAX, exps, ew, ew // 4, min(cfg.msg_packets, ew - ew // 4),
                           self._exps_done, "exp")

    def _run_pass(self, op, bufs, window, margin, msg_packets, then, tag) -> None:
        p = _Pass(self.comm, op, bufs, window, margin, msg_packets, self._pass_done, tag,
                  self.port)
        p.then = then
        self.passes.append(p)
        self.cur = p
        try:
            p.start()
        except BaseException as e:
            p.teardown()
            self.error = e
            raise

    def _pass_done(self, p: _Pass) -> None:
        # runs inside an event callback: tear down now (frees the engine job), continue later
        p.teardown()
        self.comm.fabric.call_at(self.comm.fabric.now(), p.then, p)

    def _exps_done(self, p: _Pass) -> None:
        gexp = p.result(0).view(np.int32).copy()
        for r in range(1, self.comm.world):
            if not np.array_equal(p.result(r).view(np.int32), gexp):
                self.error = RuntimeError(f"exponent pass: rank {r} disagrees with rank 0")
                return
        self.e = quant.scales(gexp, self.comm.world)
        qs = [quant.quantize(a.reshape(-1), self.e, self.chunk) for a in self.arrays]
        cfg = self.comm.cfg
        try:
            self._run_pass(Op.SUM_SAT, qs, cfg.window, cfg.margin, cfg.msg_packets,
                           self._finish_float, "sum")
        except BaseException as e:  # surfaced by run()
            self.error = e

    def _finish_int(self, p: _Pass) -> None:
        self._finish([p.result(r).view(np.int32).copy().reshape(self.shape)
                      for r in range(self.comm.world)])

    def _finish_float(self, p: _Pass) -> None:
        out = [quant.dequantize(p.result(r).view(np.int32), self.e, self.chunk).reshape(self.shape)
               for r in range(self.comm.world)]
        self._finish(out)

    def _finish(self, results: list[np.ndarray]) -> None:
        st = Counter()
        eng = Counter()
        slots = 0
        for p in self.passes:
            st.update(p.qp_stats())
            eng.update(p.engine_counters)
            slots += p.slots_left
        stats = {k: st.get(k, 0) for k in STAT_KEYS}
        stats["frames_out"] = st["sent"] + st["acks_sent"] + st["naks_sent"]
        stats["frames_in"] = (st["received"] + st["duplicates"] + st["out_of_seq_dropped"]
                              + st["acks_received"] + st["naks_received"] + st["stale_acks"]
                              + st["cnps"])
        stats["slots_left"] = slots
        stats["engine"] = dict(eng)
        stats["passes"] = len(self.passes)
        stats["bytes"] = int(self.arrays[0].nbytes)
        self._result = AllReduceResult(results, stats, self.e, getattr(self, "chunk", 0))
        self.done = True

    # ------------------------------------------------------------------ driving
    def poll_error(self) -> BaseException | None:
        if self.error is None and self.cur is not None and self.cur.error is not None:
            self.error = self.cur.error
        return self.error

    def abort(self) -> None:
        if self.cur is not None:
            self.cur.teardown()

    def progress(self) -> float:
        if self.done:
            return 1.0
        if self.cur is None:
            return 0.0
        # float path: the exponent pass counts as the first 5 %
        if self.dtype == np.float32:
            return 0.05 * self.cur.progress() if self.cur.tag == "exp" else (
                0.05 + 0.95 * self.cur.progress())
        return self.cur.progress()

    def describe(self) -> str:
        return self.cur.describe() if self.cur is not None else "not started"

    def result(self) -> AllReduceResult:
        if self._result is None:
            raise RuntimeError("all-reduce not finished; drive it with run()")
        return self._result


def run(fabric: Fabric, ops: Sequence[AllReduce], *, timeout_ns: int | None = None,
        progress: Callable[[float], None] | None = None) -> None:
    """Run the fabric's event loop until every op is done; raise the first op's error.

    On any error (RC error, hang) every op's current engine job is removed before raising.
    """
    def pred():
        return all(o.done for o in ops) or any(o.poll_error() is not None for o in ops)

    def describe():
        return "; ".join(o.describe() for o in ops if not o.done)

    cb = None
    if progress is not None:
        def cb():
            progress(sum(o.progress() for o in ops) / len(ops))
    try:
        fabric.run_until(pred, timeout_ns, describe=describe, progress=cb)
    except SimulationHang:
        for o in ops:
            o.abort()
        raise
    for o in ops:
        if o.error is not None:
            for x in ops:
                x.abort()
            raise o.error
    if progress is not None:
        progress(1.0)


def allreduce(fabric: Fabric, arrays: Sequence[np.ndarray], cfg: CollectiveConfig | None = None,
              seed: int = 0, progress: Callable[[float], None] | None = None) -> AllReduceResult:
    """One-shot: a :class:`Communicator` of ``len(arrays)`` ranks on ``fabric``, one all-reduce."""
    return Communicator(fabric, len(arrays), cfg, seed).allreduce(arrays, progress=progress)
