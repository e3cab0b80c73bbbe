"""Bit-exact, event-level reference model of the NetReduce engine: the specification in code.

:class:`Engine` implements docs/design.md section 4 frame by frame. The gateware is scoreboarded
against it (same frames in, same frames out, same counters) and the switch service runs it.

Contract
--------
* ``Engine.receive(port, frame, time)`` consumes one Ethernet frame (no FCS) that entered on
  ``port`` at ``time`` (cycles of the 250 MHz core clock, CLOCK_HZ) and returns the frames the
  engine sends because of it, as :class:`Emit` records, in a deterministic order: (1) the frame
  itself when forwarded (a behind-window data frame as its duplicate probe, D15; an ACK
  possibly as a NAK-sequence, D16), or the re-emitted result, or D16's ACK request; (2) result
  frames released by it, index by index, ranks 0..N-1 within an index; (3) a CNP answering it.
  Every ``Emit.time`` equals the input time: the model is untimed; the gateware adds pipeline
  latency, so scoreboards compare order per port, not time.
* Configuration only through the register map (``Engine.bus``, the AXI4-Lite view; see
  :mod:`netreduce.regmap`). Bad frames never raise: they are forwarded or dropped and counted.
  Only caller errors (port out of range, non-bytes frame) raise ``ValueError``/``TypeError``.
* Every received frame increments ``rx_frames`` and exactly one disposition counter
  (:data:`netreduce.regmap.DISPOSITIONS`); every emitted frame increments ``tx_frames``.

Processing of one frame
-----------------------
0. *Congestion* (D19). While ``congested[port]``, an IPv4 ECT frame is CE-marked on arrival
   (checksum updated), then processed as below.
1. *Classify*. Not IPv4/IHL 5/unfragmented/UDP to 4791, or too short to tell -> forward unchanged,
   ``fwd_not_roce``. RoCE but shorter than the end of the BTH -> forward, ``fwd_unregistered``.
   Opcode ACK (0x11) or CNP (0x81): look up the reverse key (source IPv4, DestQP); no match ->
   forward, ``fwd_unregistered``. Any other opcode: look up the forward key; no match -> forward,
   ``fwd_unregistered``. Only flows of enabled jobs are registered.
2. *Control frames on a reverse key* are always forwarded, unchanged except for an ACK rewritten
   as a NAK-sequence by the fast retransmit (D16, off by default). If the frame passes the
   checks of :func:`netreduce.wire.parse` (lengths, IPv4 checksum, TVer, opcode, ICRC; the model
   reads frames through the faster view :mod:`netreduce.wire.view`, cross-checked against it in
   the tests, and builds its frames with :mod:`netreduce.wire.rewrite`) and the AETH syndrome is an
   ACK, NAK or RNR NAK, it is snooped (step 6); else ``fwd_ctrl_invalid``. CNPs only count.
3. *Data frames on a forward key* (flow f = rank r of job j, PSN p), checks in this priority:
   lengths/truncation/PadCnt (``drop_length``), IPv4 checksum (``drop_ip_checksum``), TVer or
   unknown opcode (``drop_opcode``), ICRC (``drop_icrc``), RC WRITE/SEND opcode (``drop_opcode``),
   payload <= the job's PMTU (``drop_pmtu``), payload a multiple of 4 (``drop_align``). Failure:
   drop, count, no state change.
4. *Window*. k = (p - S_r) mod 2^24, d = k - free_j as a signed 24-bit number. d < 0 -> forward
   its duplicate probe (D15), ``behind_window``. d >= W -> drop, ``drop_ahead``. Else slot
   s = base_j + (k mod W).
5. *Slot*. EMPTY -> first contribution: the slot takes index k, opcode and payload length, the
   payload overwrites the accumulator. Otherwise opcode or length different from the first
   contribution -> drop, ``drop_mismatch``, ``JOB.STATUS.mismatch``. Bit r clear -> accumulate,
   set bit r, store f's header (Ethernet .. last extension header) and arrival port. Bit r set:
   slot FILLING/COMPLETE -> drop, ``duplicates``; RELEASED -> ``reemits``: send the result to f.
   When the slot at index rel_j is COMPLETE it is released, then rel_j+1, ... (in order).
6. *Snooping*. ACK at PSN p acknowledges indices up to k = p - S_r, NAK (any) at p those below k.
   The candidate acked_f is accepted if it lies in (acked_f, rel_j] modulo 2^24, else
   ``ack_stale``. free_j = the smallest acked_f over the job's flows; indices below it are freed.

Decisions
---------
Where the design leaves room, the model decides; the decisions D1-D21 (window arithmetic, check
priority, release, result and CNP format, configuration latching, the duplicate probe D15, the
fast retransmit D16, the spine-leaf flow roles D17, the link-local frames D18, congestion
signalling D19, the per-port lanes D20, held ports D21, ...) are written out in docs/design.md
section 10.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netreduce.regmap import (
    ALL_GLOBAL_COUNTERS,
    CLOCK_HZ,
    DISPOSITIONS,
    JOB_COUNTERS,
    PMTU_VALUES,
    JobError,
    Op,
    RegisterFile,
    Role,
    build_regmap,
)
from netreduce.regmap.clock import ns_to_cycles
from netreduce.wire import ECN_CE, AckSyndrome
from netreduce.wire.rewrite import cnp_for as _cnp_frame
from netreduce.wire.rewrite import duplicate_probe as _probe
from netreduce.wire.rewrite import nak_seq as _nak_seq
from netreduce.wire.rewrite import result_frame as _result
from netreduce.wire.view import BTH_AT as _BTH_AT
from netreduce.wire.view import DQPN_AT as _DQPN_AT
from netreduce.wire.view import NOT_ROCE as _NOT_ROCE
from netreduce.wire.view import OP_ACK, OP_CNP
from netreduce.wire.view import SRC_IP_AT as _SRC_IP_AT
from netreduce.wire.view import TOS_AT as _TOS_AT
from netreduce.wire.view import Checked as _Parsed
from netreduce.wire.view import check as _parse
from netreduce.wire.view import roce_l3 as _roce_l3

from . import lanes as _lanes
from .congestion import Congestion
from .linklocal import COUNTERS as _LL_COUNTERS
from .linklocal import PauseTimers
from .linklocal import classify as _ll_classify
from .ports import PortCounters

__all__ = ["CLOCK_HZ", "Emit", "Engine", "DISPOSITIONS", "ns_to_cycles"]

PSN_MASK = (1 << 24) - 1
_HALF = 1 << 23
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_OP_ACK, _OP_CNP = OP_ACK, OP_CNP
_syndrome_kind = AckSyndrome.kind
_SYNDROME_RESERVED = 0b10  # neither ACK, RNR NAK nor NAK


@dataclass(frozen=True)
class Emit:
    """A frame the engine sends out of ``port`` at ``time`` (cycles)."""

    port: int
    frame: bytes
    time: int


# Counter indices (per-job list JOB_COUNTERS; global list = GLOBAL_COUNTERS + JOB_COUNTERS).
_J = {c.name: i for i, c in enumerate(JOB_COUNTERS)}
_G = {c.name: i for i, c in enumerate(ALL_GLOBAL_COUNTERS)}
_GJ = len(ALL_GLOBAL_COUNTERS) - len(JOB_COUNTERS)  # offset of job counters in the global list
_G_NOT_ROCE, _G_UNREG = _G["fwd_not_roce"], _G["fwd_unregistered"]
_G_RX, _G_TX = _G["rx_frames"], _G["tx_frames"]
_G_LL = {k: _G[name] for k, name in _LL_COUNTERS.items()}
_REASON = {  # WireError.reason of a data frame -> drop counter
    "icrc": "drop_icrc", "ip_checksum": "drop_ip_checksum", "tver": "drop_opcode",
    "opcode": "drop_opcode", "truncated": "drop_length", "ip_length": "drop_length",
    "udp_length": "drop_length", "padcnt": "drop_length",
}


class _Flow:
    __slots__ = ("entry", "job", "rank", "fwd", "rev", "rev_qpn", "start", "acked", "last_cnp",
                 "nxt", "top", "mark", "naked", "role")

    def __init__(self, entry, job, rank, fwd, rev, start, role=Role.MEMBER):
        self.entry, self.job, self.rank, self.role = entry, job, rank, role
        self.fwd, self.rev, self.start = _key(*fwd), _key(*rev), start
        self.rev_qpn = rev[1]
        self.acked = 0  # every index below this one is acknowledged by f's receiver
        self.last_cnp: int | None = None
        # fast retransmit (D16): f's contributions 0..nxt-1 are all present (in order), top is
        # one past the highest index present, mark the hole last probed for (None: none) and
        # naked whether that hole was NAKed too
        self.nxt = 0
        self.top = 0
        self.mark: int | None = None
        self.naked = False


def _key(ip: int, qpn: int) -> bytes:
    return ip.to_bytes(4, "big") + qpn.to_bytes(3, "big")


class _Slot:
    __slots__ = ("index", "bitmap", "count", "released", "opcode", "length", "acc", "hdrs",
                 "l2", "ports", "sent_up", "total", "parts")

    def __init__(self, index, n, opcode, length, acc):
        self.index = index
        self.bitmap = 0
        self.count = 0
        self.released = False
        self.opcode = opcode
        self.length = length
        self.acc = acc
        self.hdrs: list[bytes | None] = [None] * n
        self.l2: list[int] = [0] * n
        self.ports: list[int] = [0] * n
        self.sent_up = False  # leaf (D17): the partial went up
        self.total = None  # leaf (D17): the total from the DOWN flow
        self.parts: dict[int, np.ndarray] = {}  # D20: port -> that port's partial (lanes > 1)


class _Job:
    __slots__ = ("id", "n", "w", "wmask", "base", "pmtu", "op", "cnp_interval", "flows", "free",
                 "rel", "slots", "cnt", "fast_retx", "leaf", "roles")

    def __init__(self, jid, n, w, base, pmtu, op, cnp_interval, flows, cnt):
        self.id, self.n, self.w, self.wmask, self.base = jid, n, w, w - 1, base
        self.pmtu, self.op, self.cnp_interval = pmtu, op, cnp_interval
        self.flows: list[_Flow] = flows
        self.free = 0  # oldest index not yet freed
        self.rel = 0  # next index to release
        self.slots: dict[int, _Slot] = {}  # slot number -> non-EMPTY slot
        self.cnt = cnt  # this job's counter list (outlives the _Job across disable)
        self.fast_retx = False  # JOB.CTRL.fast_retx, live (D16)
        self.roles = any(f.role for f in flows)  # a leaf or spine job (D17)
        self.leaf = _roles.leaf_state(flows)  # leaf jobs' partial pointer etc. (D17), or None


class Engine:
    """The engine: ``ports`` Ethernet ports, a job table, a flow table, a shared slot pool.

    Build parameters as the gateware's; they appear in the identity registers.
    """

    def __init__(self, ports: int = 1, jobs: int = 8, flows: int = 256, slots: int = 1024,
                 pmtu_max: int = 4096, *, data_width: int = 512, max_world: int = 64,
                 lanes: int = 1):
        self.regmap = build_regmap(ports=ports, jobs=jobs, flows=flows, slots=slots,
                                   pmtu_max=pmtu_max, data_width=data_width, max_world=max_world,
                                   lanes=lanes)
        self.lanes = lanes  # contribution lanes (D20; 1: one shared accumulator, D6)
        self.ports, self.njobs, self.nflows, self.nslots = ports, jobs, flows, slots
        self.pmtu_max, self.max_world = pmtu_max, max_world
        self.regs = RegisterFile(self.regmap)
        self.bus = self.regs  # the AXI4-Lite view
        self._g = [0] * len(ALL_GLOBAL_COUNTERS)
        self._jc = [[0] * len(JOB_COUNTERS) for _ in range(jobs)]
        self._jobs: list[_Job | None] = [None] * jobs
        # key: source IPv4 (4 bytes) + DestQP (3 bytes), as found in the frame
        self._fwd: dict[bytes, _Flow] = {}
        self._rev: dict[bytes, _Flow] = {}
        self._bound: dict[int, _Flow] = {}  # flow-table entry -> latched flow
        self._status_addr = [self.regmap.addr("JOB.STATUS", j) for j in range(jobs)]
        self._mismatch_mask = self.regmap.field("JOB.STATUS.mismatch").mask
        self._saturated_mask = self.regmap.field("JOB.STATUS.saturated").mask
        self._fast_retx_mask = self.regmap.field("JOB.CTRL.fast_retx").mask
        self._wire_regs()
        # In-band management agent (netreduce.sim.model.mgmt.attach_mgmt): frames it matches are
        # its.
        self.mgmt = None
        # received PAUSE/PFC per port and priority (D18; netreduce.sim.model.linklocal)
        self.link = PauseTimers(ports)
        # per-port counters (PORT table; netreduce.sim.model.ports)
        self.port_stats = PortCounters(ports, self.regs, self.regmap, self.link)
        # per-port "input buffer congested" flags, set by whoever keeps time (D19;
        # netreduce.sim.model.congestion)
        self.congested = Congestion(ports)
        # per-port "TX held" flags, set by whoever keeps time (D21): while set, the frames
        # emitted on the port are dropped and counted (PORT.TX_DROP_HELD), the others' not
        self.tx_held = [False] * ports

    # ================================================================== register side
    def _wire_regs(self) -> None:
        rm, rf = self.regmap, self.regs
        for i, _c in enumerate(ALL_GLOBAL_COUNTERS):
            rf.bind(rm.table("CNT").base + 4 * i, lambda i=i: self._g[i])
        cnt, job = rm.table("JOB_CNT"), rm.table("JOB")
        for j in range(self.njobs):
            for i in range(len(JOB_COUNTERS)):
                rf.bind(cnt.base + j * cnt.stride + 4 * i, lambda j=j, i=i: self._jc[j][i])
            rf.bind(job.addr(j, "FREE_PTR"), lambda j=j: self._job_attr(j, "free"))
            rf.bind(job.addr(j, "RELEASE_PTR"), lambda j=j: self._job_attr(j, "rel"))
            rf.bind(job.addr(j, "SLOTS_BUSY"), lambda j=j: self.slots_in_use(j))
            rf.bind(job.addr(j, "PARTIAL_PTR"), lambda j=j: _roles.partial_ptr(self._jobs[j]))
            rf.on_write(job.addr(j, "CTRL"), self._on_job_ctrl)
        for e in range(self.nflows):
            rf.bind(rm.addr("FLOW.ACKED", e), lambda e=e: self._flow_acked(e))
        rf.on_write(rm.addr("GLOBAL.CONTROL"), self._on_control)

    def _job_attr(self, j: int, attr: str) -> int:
        job = self._jobs[j]
        return getattr(job, attr) if job is not None else 0

    def _flow_acked(self, e: int) -> int:
        f = self._bound.get(e)
        return f.acked if f is not None else 0

    def _on_control(self, inst, value, old) -> None:
        if value & self.regmap.field("GLOBAL.CONTROL.clear_counters").mask:
            self._g[:] = [0] * len(self._g)
            for c in self._jc:
                c[:] = [0] * len(c)
            self.port_stats.clear()

    def _on_job_ctrl(self, inst, value, old) -> None:
        j = inst.index
        want = bool(value & 1)
        if want and self._jobs[j] is None:
            self._enable(j)
        elif not want and self._jobs[j] is not None:
            self._disable(j)
        job = self._jobs[j]
        if job is not None:
            job.fast_retx = bool(value & self._fast_retx_mask) and not job.roles

    def _set_status(self, j: int, enabled: int, error: int) -> None:
        rm = self.regmap
        a = rm.addr("JOB.STATUS", j)
        v = self.regs.peek(a)
        v = rm.field("JOB.STATUS.enabled").put(v, enabled)
        v = rm.field("JOB.STATUS.error").put(v, int(error))
        self.regs.poke(a, v)

    def _enable(self, j: int) -> None:
        rm, rf = self.regmap, self.regs

        def get(path, idx=j):
            return rf.peek(rm.addr(path, idx))

        n, w, base = get("JOB.WORLD"), get("JOB.WINDOW"), get("JOB.SLOT_BASE")
        pmtu, op, cnp = get("JOB.PMTU"), get("JOB.OP"), get("JOB.CNP_INTERVAL")
        entries = []
        cfg_f = rm.reg("FLOW.CFG")
        for e in range(self.nflows):
            cfg = get("FLOW.CFG", e)
            if cfg_f.field("valid").get(cfg) and cfg_f.field("job").get(cfg) == j:
                entries.append((e, cfg_f.field("rank").get(cfg), cfg_f.field("role").get(cfg)))
        err = JobError.NONE
        if not 1 <= n <= self.max_world:
            err = JobError.WORLD
        elif w < 1 or w & (w - 1):
            err = JobError.WINDOW
        elif base + w > self.nslots:
            err = JobError.SLOT_RANGE
        elif any(o is not None and base < o.base + o.w and o.base < base + w
                 for o in self._jobs):
            err = JobError.SLOT_OVERLAP
        elif pmtu not in PMTU_VALUES or pmtu > self.pmtu_max:
            err = JobError.PMTU
        elif op not in set(Op):
            err = JobError.OP
        elif sorted(e[1] for e in entries) != list(range(n)):
            err = JobError.FLOWS
        elif not _roles.roles_ok([e[2] for e in entries]):
            err = JobError.ROLES
        flows: list[_Flow] = []
        if err == JobError.NONE:
            for e, r, role in sorted(entries, key=lambda x: x[1]):
                flows.append(_Flow(e, j, r, (get("FLOW.FWD_IP", e), get("FLOW.FWD_QPN", e)),
                                   (get("FLOW.REV_IP", e), get("FLOW.REV_QPN", e)),
                                   get("FLOW.START_PSN", e), Role(role)))
            fk = [f.fwd for f in flows]
            rk = [f.rev for f in flows]
            if (len(set(fk)) != n or len(set(rk)) != n or any(k in self._fwd for k in fk)
                    or any(k in self._rev for k in rk)):
                err = JobError.KEY_CONFLICT
        if err != JobError.NONE:
            self._set_status(j, 0, err)
            rf.poke(rm.addr("JOB.CTRL", j), 0)
            return
        self._jobs[j] = _Job(j, n, w, base, pmtu, Op(op), cnp, flows, self._jc[j])
        for f in flows:
            self._fwd[f.fwd] = f
            self._rev[f.rev] = f
            self._bound[f.entry] = f
            rf.poke(rm.addr("FLOW.STATUS", f.entry), 1)
        self._set_status(j, 1, JobError.NONE)

    def _disable(self, j: int) -> None:
        job = self._jobs[j]
        for f in job.flows:
            del self._fwd[f.fwd]
            del self._rev[f.rev]
            del self._bound[f.entry]
            self.regs.poke(self.regmap.addr("FLOW.STATUS", f.entry), 0)
        job.slots.clear()
        self._jobs[j] = None
        self._set_status(j, 0, JobError.NONE)

    def count_global(self, name: str, n: int = 1) -> None:
        """Increment the engine-wide counter ``name`` (for attached agents, e.g. management)."""
        self._g[_G[name]] += n

    # ================================================================== queries
    def counters(self, job: int | None = None) -> dict[str, int]:
        """Every counter by name: engine-wide (``job=None``; job counters summed) or one job's."""
        if job is None:
            return {c.name: self._g[i] for i, c in enumerate(ALL_GLOBAL_COUNTERS)}
        if not 0 <= job < self.njobs:
            raise ValueError(f"job {job} outside 0..{self.njobs - 1}")
        return {c.name: self._jc[job][i] for i, c in enumerate(JOB_COUNTERS)}

    def slots_in_use(self, job: int | None = None) -> int:
        """Slots not EMPTY, of one job or of all."""
        if job is None:
            return sum(len(jb.slots) for jb in self._jobs if jb is not None)
        jb = self._jobs[job]
        return len(jb.slots) if jb is not None else 0

    def job_state(self, job: int) -> dict | None:
        """Debug view of a running job: free/rel pointers, acked_f per rank, and every non-EMPTY
        slot as ``slot number -> (index, state, contribution bitmap)``; None if disabled."""
        jb = self._jobs[job]
        if jb is None:
            return None
        return {"free": jb.free, "rel": jb.rel, "acked": [f.acked for f in jb.flows],
                "slots": {n: (s.index, "RELEASED" if s.released else
                              "COMPLETE" if s.count == jb.n else "FILLING", s.bitmap)
                          for n, s in sorted(jb.slots.items())}}

    # ================================================================== data path
    def _count(self, job: _Job, name: str, n: int = 1) -> None:
        i = _J[name]
        job.cnt[i] += n
        self._g[_GJ + i] += n

    def receive(self, port: int, frame: bytes, time: int) -> list[Emit]:
        """Process one frame entering on ``port`` at ``time`` (cycles); see the module doc."""
        if not 0 <= port < self.ports:
            raise ValueError(f"port {port} outside 0..{self.ports - 1}")
        if not isinstance(frame, bytes):
            if not isinstance(frame, bytearray | memoryview):
                raise TypeError(f"frame must be bytes, not {type(frame).__name__}")
            frame = bytes(frame)
        if self.congested.flags[port]:  # D19: ECN-marked on arrival while the port is congested
            frame = self.congested.mark(port, frame)
        g = self._g
        g[_G_RX] += 1
        mg = self.mgmt
        if mg is not None and mg.matches(frame):
            resp = mg.handle(frame)  # counts mgmt_rx (the disposition) and its verdict
            out = [] if resp is None else [Emit(port, resp, time)]
        else:
            ll, pause = _ll_classify(frame)  # D18: link-local frames are consumed
            if ll:
                g[_G_LL[ll]] += 1
                if pause is not None:
                    self.link.update(port, pause, time)
                out = []
            else:
                out = self._classify(port, frame, time)
        held = ()
        if True in self.tx_held:   # D21
            held = [e for e in out if self.tx_held[e.port]]
            out = [e for e in out if not self.tx_held[e.port]]
        g[_G_TX] += len(out)
        self.port_stats.count(port, frame, out, held)
        return out

    def _bypass(self, which: int, port: int, buf: bytes, time: int) -> list[Emit]:
        self._g[which] += 1
        return [Emit(port, buf, time)]

    def _classify(self, port: int, buf: bytes, time: int) -> list[Emit]:
        l3 = _roce_l3(buf)
        if l3 <= 0:
            return self._bypass(_G_NOT_ROCE if l3 == _NOT_ROCE else _G_UNREG, port, buf, time)
        opcode = buf[l3 + _BTH_AT]
        key = buf[l3 + _SRC_IP_AT:l3 + _SRC_IP_AT + 4] + buf[l3 + _DQPN_AT:l3 + _DQPN_AT + 3]
        if opcode == _OP_ACK or opcode == _OP_CNP:
            fl = self._rev.get(key)
            if fl is None:
                return self._bypass(_G_UNREG, port, buf, time)
            return self._control(fl, port, buf, l3, opcode, time)
        fl = self._fwd.get(key)
        if fl is None:
            return self._bypass(_G_UNREG, port, buf, time)
        return self._data(fl, port, buf, l3, time)

    # ------------------------------------------------------------------ ACK / NAK / CNP
    def _control(self, fl: _Flow, port: int, buf: bytes, l3: int, opcode: int,
                 time: int) -> list[Emit]:
        job = self._jobs[fl.job]
        out = [Emit(port, buf, time)]
        p = _parse(buf, l3)
        if isinstance(p, str):
            self._count(job, "fwd_ctrl_invalid")
            return out
        if opcode == _OP_CNP:
            self._count(job, "fwd_cnp")
            return out
        kind = _syndrome_kind(buf[p.x])
        if kind == _SYNDROME_RESERVED:
            self._count(job, "fwd_ctrl_invalid")
            return out
        k = (p.psn - fl.start) & PSN_MASK
        if kind == AckSyndrome.ACK:
            self._count(job, "fwd_ack")
            cand = (k + 1) & PSN_MASK
        else:
            self._count(job, "fwd_nak")
            cand = k
        adv = (cand - fl.acked) & PSN_MASK
        # D17: a leaf's UP flow is acknowledged for what went up (the partial pointer)
        lim = ((job.leaf.upptr if fl.role == Role.UP else job.rel) - fl.acked) & PSN_MASK
        if kind == AckSyndrome.ACK and adv <= lim:  # an ACK not behind acked_f (D16)
            fl.nxt = nxt = _nxt(fl, job)
            if (job.fast_retx and 0 < (fl.top - nxt) & PSN_MASK < _HALF
                    and not (fl.mark == nxt and fl.naked)):
                fl.mark, fl.naked = nxt, True
                self._count(job, "fast_retx")
                out[0] = Emit(port, _nak_seq(buf, l3, (p.psn + 1) & PSN_MASK), time)
        if 0 < adv <= lim:
            fl.acked = cand
            self._advance_free(job)
        else:
            self._count(job, "ack_stale")
        return out

    def _advance_free(self, job: _Job) -> None:
        free = job.free
        step = min((f.acked - free) & PSN_MASK for f in job.flows)
        if not step:
            return
        slots, base, wmask = job.slots, job.base, job.wmask
        for i in range(step):
            slots.pop(base + ((free + i) & wmask), None)
        job.free = (free + step) & PSN_MASK
        self._count(job, "freed", step)

    # ------------------------------------------------------------------ data frames
    def _data(self, fl: _Flow, port: int, buf: bytes, l2: int, time: int) -> list[Emit]:
        job = self._jobs[fl.job]
        self._count(job, "rx_data")
        p = _parse(buf, l2)
        if isinstance(p, str):
            self._count(job, _REASON[p])
            return []
        if not p.info.rc_data:
            self._count(job, "drop_opcode")
            return []
        plen = p.end - p.x
        if plen > job.pmtu:
            self._count(job, "drop_pmtu")
            return []
        if plen & 3:
            self._count(job, "drop_align")
            return []
        if job.roles:  # D17: stage marks, totals, other engines' probes
            r = _roles.data(self, job, fl, port, buf, l2, p, plen, time)
            if isinstance(r, list):
                return r
            buf = r
        k = (p.psn - fl.start) & PSN_MASK
        d = (k - job.free) & PSN_MASK
        if d >= _HALF:
            self._count(job, "behind_window")
            return [Emit(port, _probe(buf, l2), time)]
        out: list[Emit] = []
        if d >= job.w:
            self._count(job, "drop_ahead")
        else:
            s = job.base + (k & job.wmask)
            slot = job.slots.get(s)
            r = fl.rank
            if slot is None:
                acc = np.frombuffer(buf, dtype="<i4", count=plen >> 2, offset=p.x).copy()
                slot = _Slot(k, job.n, p.opcode, plen, acc)
                if self.lanes > 1:
                    slot.parts = {port: acc}  # D20: per-port partials
                job.slots[s] = slot
                self._accept(job, slot, r, port, buf, l2, p, time, out, first=True)
            elif p.opcode != slot.opcode or plen != slot.length:
                self._count(job, "drop_mismatch")
                self.regs.set_bits(self._status_addr[job.id], self._mismatch_mask)
            elif slot.bitmap >> r & 1:
                if job.leaf is not None:  # D17
                    _roles.again(self, job, fl, slot, port, buf, l2, p, time, out)
                elif slot.released:
                    self._count(job, "reemits")
                    out.append(Emit(port, _result(buf[:p.x], l2, slot.acc.tobytes()), time))
                else:
                    self._count(job, "duplicates")
                _present(fl, k, _nxt(fl, job))
            else:
                self._accept(job, slot, r, port, buf, l2, p, time, out, first=False)
        if buf[l2 + _TOS_AT] & 3 == ECN_CE:
            self._cnp(job, fl, buf, l2, port, time, out)
        return out

    def _accept(self, job: _Job, slot: _Slot, r: int, port: int, buf: bytes, l2: int,
                p: _Parsed, time: int, out: list[Emit], first: bool) -> None:
        self._count(job, "contributions")
        fl = job.flows[r]
        k = slot.index
        nxt = _nxt(fl, job)
        if job.fast_retx and 0 < (k - nxt) & PSN_MASK < _HALF and fl.mark != nxt:
            # D16: f's first contribution past a missing one: ask f's receiver for an ACK
            fl.mark, fl.naked = nxt, False
            self._count(job, "fast_retx_probes")
            out.append(Emit(port, _probe(buf, l2, (fl.start + fl.acked - 1) & PSN_MASK), time))
        _present(fl, k, nxt)
        if not first:
            x = np.frombuffer(buf, dtype="<i4", count=slot.length >> 2, offset=p.x)
            if self.lanes > 1 and port not in slot.parts:  # D20: the port's first: copied
                slot.parts[port] = x.copy()
            elif _lanes.add(job.op, slot.parts[port] if self.lanes > 1 else slot.acc, x):
                self._count(job, "saturations")
                self.regs.set_bits(self._status_addr[job.id], self._saturated_mask)
        slot.bitmap |= 1 << r
        slot.count += 1
        if self.lanes > 1 and slot.count == (job.n if job.leaf is None else job.leaf.nloc):
            slot.acc, clipped = _lanes.combine(job.op, slot.parts)  # D20: lanes in port order
            if clipped:
                self._count(job, "saturations", clipped)
                self.regs.set_bits(self._status_addr[job.id], self._saturated_mask)
        slot.hdrs[r] = buf[:p.x]
        slot.l2[r] = l2
        slot.ports[r] = port
        if job.leaf is not None:  # D17: a complete slot goes up, in index order
            _roles.send_up(self, job, time, out)
        elif slot.count == job.n and slot.index == job.rel:
            self._release(job, time, out)

    def _release(self, job: _Job, time: int, out: list[Emit]) -> None:
        slots, base, wmask, n = job.slots, job.base, job.wmask, job.n
        while True:
            slot = slots.get(base + (job.rel & wmask))
            if slot is None or slot.index != job.rel or slot.count != n or slot.released:
                return
            payload = slot.acc.tobytes()
            for r in range(n):
                out.append(Emit(slot.ports[r], _result(slot.hdrs[r], slot.l2[r], payload), time))
            slot.released = True
            job.rel = (job.rel + 1) & PSN_MASK
            self._count(job, "released")
            self._count(job, "results_sent", n)

    def _cnp(self, job: _Job, fl: _Flow, buf: bytes, l2: int, port: int, time: int,
             out: list[Emit]) -> None:
        last = fl.last_cnp
        if last is not None and time - last < job.cnp_interval:
            self._count(job, "cnp_suppressed")
            return
        fl.last_cnp = time
        out.append(Emit(port, _cnp_frame(buf, l2, fl.rev_qpn), time))
        self._count(job, "cnp_sent")


def _nxt(fl: _Flow, job: _Job) -> int:
    """D16's in-order prefix of f: nxt_f, or rel_j if that is ahead (every index below rel_j was
    released, so f contributed it; this also catches nxt_f up after a go-back-N)."""
    n = fl.nxt
    return n if (n - job.rel) & PSN_MASK < _HALF else job.rel


def _present(fl: _Flow, k: int, nxt: int) -> None:
    """Flow f's contribution of index k is in its slot (accepted, duplicate or re-emit): D16's
    per-flow tracking of the highest index present (top) and of the in-order prefix (nxt, from
    :func:`_nxt`). The contribution at nxt moves nxt to top: it fills f's first hole, and the
    go-back-N that filled it resends everything after it, so later holes of f need no NAK of
    their own (and the frames of that go-back, duplicates, must not look like new holes)."""
    if 0 < (k + 1 - fl.top) & PSN_MASK < _HALF:
        fl.top = (k + 1) & PSN_MASK
    fl.nxt = fl.top if k == nxt else nxt


# D17 (flow roles, spine-leaf) lives in .roles; it builds its frames with the helpers above
from . import roles as _roles  # noqa: E402

_roles.bind(Emit, _probe, _result)
