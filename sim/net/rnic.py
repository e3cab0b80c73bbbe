"""A software RNIC: the RC requester/responder of Linux soft-RoCE (rxe), on a simulated fabric.

One :class:`RNIC` per host (MAC, IPv4), holding memory regions and RC queue pairs. It is used
wherever no real RNIC exists (docs/design.md section 5) and follows ``drivers/infiniband/sw/rxe``
(docs/roce.md):

Requester (``rxe_req.c``/``rxe_comp.c``)
    * RDMA WRITE (optionally WITH_IMM) segmented at the path MTU into FIRST / MIDDLE / LAST(_IMM)
      or ONLY(_IMM); RETH (VA, R_Key, DMA length of the whole message) on FIRST and ONLY.
    * 24-bit PSNs that wrap; AckReq on each message's last packet and on every
      ``ack_every`` (64) packets; at most ``max_unacked`` (128) unacknowledged PSNs in flight.
    * cumulative ACKs complete work requests in order; NAK-PSN-sequence at p acknowledges
      everything before p and goes back to p (go-back-N), mid-message with MIDDLE/LAST opcodes as
      rxe does; a second NAK for the same PSN without progress in between is ignored (rxe's
      ``started_retry``).
    * retransmit timer 4.096 us * 2^timeout, armed while anything is unacknowledged and re-armed on
      progress; on expiry go back to the oldest unacknowledged PSN. Every retry (timeout or NAK)
      uses one of ``retry_cnt`` retries; an ACK that makes progress restores them. Exhausted: the QP
      goes to ERROR with :class:`RCError` naming QP and PSN.
    * NAK invalid request / remote access / remote operational error: QP to ERROR. Errors are
      reported through ``on_error`` and :attr:`RNIC.errors`; outstanding work requests are not
      flushed with error completions.
    * CNPs are counted per QP (``cnps``). No rate cut is modelled: rxe has no DCQCN either; the
      count lets callers check that the engine answered CE marks.

Responder (``rxe_resp.c``)
    * expected PSN (signed 24-bit compare). PSN ahead: one NAK-PSN-sequence carrying the expected
      PSN, then silent drops until the expected PSN arrives. PSN behind (a duplicate): re-ACK with
      expected-1, memory untouched.
    * sequencing and lengths are fatal (NAK invalid request, QP to ERROR, :class:`RCError` naming QP
      and PSN): after FIRST/MIDDLE only MIDDLE/LAST; FIRST and MIDDLE exactly PMTU; LAST 1..PMTU;
      ONLY <= PMTU; the packets of a WRITE add up to its RETH DMA length. An unknown R_Key or a
      range outside the region: NAK remote access error, QP to ERROR. SEND opcodes are not
      supported (no receive queue is modelled): NAK invalid request.
    * payload written into the registered region at the RETH VA; WITH_IMM completes a receive
      (``on_recv``) carrying the immediate and the message length.
    * ACKs are cumulative and coalesced: a packet with AckReq schedules an ACK ``ack_delay_ns``
      later; AckReq packets arriving before it is sent only move its PSN forward.

Receive filter (silent drops, counted in :attr:`RNIC.stats`): bad IPv4 checksum or ICRC (rxe checks
ICRC; a frame with a stale ICRC is dropped and later shows up as a gap or a timeout), anything
:func:`netreduce.wire.parse` rejects, wrong destination IP, unknown QPN, wrong source IP for the
QP, P_Key mismatch, non-RC opcodes, a QP in ERROR.

Frames optionally carry ECT(0) (``QPConfig.ecn``). The responder can answer CE marks with a CNP
(``QPConfig.cnp_on_ce``; off by default since rxe does not).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from netreduce.wire import (
    ACK_NO_CREDIT,
    ECN_CE,
    ECN_ECT0,
    NAK_INVALID_REQ,
    NAK_PSN_SEQ,
    NAK_REMOTE_ACCESS,
    NAK_REMOTE_OP,
    PSN_MOD,
    AckSyndrome,
    Opcode,
    RoceFrame,
    WireError,
    ip_str,
    parse,
    psn_add,
    psn_diff,
)
from netreduce.wire import (
    ip as to_ip,
)
from netreduce.wire.fields import BTH
from netreduce.wire.icrc import icrc_bytes
from netreduce.wire.view import BTH_OFF, EXT_OFF, IPV4_OFF, parse_fast

from .scheduler import Fabric, Timer, mac_str

__all__ = ["RNIC", "QueuePair", "QPConfig", "QPState", "MemoryRegion", "Completion", "RCError",
           "timeout_ns", "RXE_MAX_UNACKED", "RXE_MAX_PKT_PER_ACK"]

_PSN_OFF = BTH_OFF + BTH.psn.offset  # BTH.psn of an untagged frame
_AETH_OFF = EXT_OFF  # an ACK's AETH follows the BTH
RXE_MAX_UNACKED = 128  # rxe: RXE_MAX_UNACKED_PSNS
RXE_MAX_PKT_PER_ACK = 64  # rxe: RXE_MAX_PKT_PER_ACK
PMTUS = (256, 512, 1024, 2048, 4096)


def timeout_ns(timeout: int) -> int:
    """IBA local ACK timeout: 4.096 us * 2^timeout (timeout 0 means infinite in IBA; not here)."""
    return (4096 << timeout)


class RCError(RuntimeError):
    """A fatal RC error: the QP went to ERROR. ``qp`` names it, ``psn`` is the PSN at fault."""

    def __init__(self, qp: str, psn: int, what: str):
        self.qp = qp
        self.psn = psn
        self.what = what
        super().__init__(f"{qp}: {what} (PSN {psn} = 0x{psn:06x})")


class QPState(Enum):
    RESET = "RESET"
    RTS = "RTS"  # connected: requester and responder both live
    ERROR = "ERROR"


@dataclass(frozen=True)
class QPConfig:
    """QP attributes. ``timeout``/``retry_cnt`` as in ibv_modify_qp; the rest are rxe constants."""

    pmtu: int = 1024
    timeout: int = 14  # 4.096 us * 2^14 = 67 ms, the usual default
    retry_cnt: int = 7
    max_unacked: int = RXE_MAX_UNACKED
    ack_every: int = RXE_MAX_PKT_PER_ACK
    ack_delay_ns: int = 0  # responder ACK coalescing delay
    ecn: bool = False  # mark data packets ECT(0)
    cnp_on_ce: bool = False  # responder answers CE-marked packets with a CNP (not rxe)
    pkey: int = 0xFFFF

    def __post_init__(self):
        if self.pmtu not in PMTUS:
            raise ValueError(f"pmtu must be one of {PMTUS}, got {self.pmtu}")
        if not 0 <= self.timeout <= 31:
            raise ValueError(f"timeout must be 0..31 (4.096us*2^timeout), got {self.timeout}")
        if not 0 <= self.retry_cnt <= 7:
            raise ValueError(f"retry_cnt is 3 bits (0..7), got {self.retry_cnt}")
        if not 1 <= self.max_unacked < PSN_MOD // 2:
            raise ValueError(f"max_unacked must be 1..2^23-1, got {self.max_unacked}")
        if self.ack_every < 1:
            raise ValueError(f"ack_every must be >= 1, got {self.ack_every}")


@dataclass
class MemoryRegion:
    """Registered memory: ``buf`` (uint8 numpy array) at virtual address ``va``, key ``rkey``."""

    rkey: int
    va: int
    buf: np.ndarray
    remote_write: bool = True

    @property
    def length(self) -> int:
        return int(self.buf.nbytes)

    def contains(self, va: int, length: int) -> bool:
        return self.va <= va and va + length <= self.va + self.length

    def view(self, dtype) -> np.ndarray:
        return self.buf.view(dtype)


@dataclass
class Completion:
    """A work completion. ``kind`` is "WRITE" (send side) or "RECV_RDMA_WITH_IMM"."""

    kind: str
    wr_id: object = None
    imm: int | None = None
    byte_len: int = 0
    psn: int = 0
    status: str = "OK"


@dataclass
class _WR:
    wr_id: object
    data: memoryview
    remote_va: int
    rkey: int
    imm: int | None
    first_psn: int
    npkts: int

    @property
    def length(self) -> int:
        return len(self.data)


@dataclass
class QPStats:
    sent: int = 0  # data packets sent, including retransmissions
    retransmitted: int = 0
    acks_sent: int = 0
    naks_sent: int = 0
    acks_received: int = 0
    naks_received: int = 0
    naks_ignored: int = 0  # a second NAK for a PSN already being retried
    stale_acks: int = 0
    timeouts: int = 0
    retries: int = 0
    received: int = 0  # in-sequence data packets accepted
    duplicates: int = 0
    out_of_seq_dropped: int = 0
    cnps: int = 0
    cnps_sent: int = 0
    ce_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class QueuePair:
    """One RC QP: requester and responder halves (see the module docstring for the behaviour).

    Create with :meth:`RNIC.create_qp`, then :meth:`connect`, then :meth:`post_write`.
    """

    def __init__(self, rnic: RNIC, qpn: int, cfg: QPConfig, start_psn: int,
                 on_send: Callable[[QueuePair, Completion], None] | None,
                 on_recv: Callable[[QueuePair, Completion], None] | None,
                 on_error: Callable[[QueuePair, RCError], None] | None):
        self.rnic = rnic
        self.qpn = qpn
        self.cfg = cfg
        self.name = f"{rnic.name}/QP{qpn}"
        self.state = QPState.RESET
        self.error: RCError | None = None
        self.on_send = on_send
        self.on_recv = on_recv
        self.on_error = on_error
        self.stats = QPStats()
        self.remote_mac = b""
        self.remote_ip = 0
        self.remote_qpn = 0
        self.sport = 0xC000
        self._ident = 0
        self._tpl: dict[tuple, bytes] = {}
        self._tos = ECN_ECT0 if cfg.ecn else 0
        # requester
        self.start_psn = start_psn % PSN_MOD
        self.next_psn = self.start_psn  # next PSN to transmit
        self.comp_psn = self.start_psn  # oldest unacknowledged PSN
        self.tail_psn = self.start_psn  # PSN after the last posted packet
        self.sent_psn = self.start_psn  # PSN after the highest ever transmitted
        self._wrs: list[_WR] = []  # posted, not yet completed, in PSN order
        self._cur = 0  # index in _wrs of the WR holding next_psn
        self._noack = 0
        self._retries_left = cfg.retry_cnt
        self._nak_retry_psn: int | None = None
        self._timer: Timer | None = None
        self._timeout_ns = timeout_ns(cfg.timeout)
        # responder
        self.epsn = 0  # expected PSN
        self.msn = 0
        self._in_msg = False
        self._mr: MemoryRegion | None = None
        self._wva = 0  # where the next payload byte goes
        self._remaining = 0  # bytes of the current WRITE still to come
        self._dmalen = 0
        self._nak_sent = False
        self._ack_psn: int | None = None  # pending coalesced ACK
        self._last_cnp = -(1 << 62)

    # ------------------------------------------------------------------ setup
    def connect(self, remote_mac: bytes, remote_ip: int, remote_qpn: int, rq_psn: int) -> None:
        """RESET -> RTS: the remote QP, and the PSN its requester starts at (our expected PSN)."""
        if self.state is not QPState.RESET:
            raise RuntimeError(f"{self.name}: connect() in state {self.state.value}")
        if not 0 <= remote_qpn < 1 << 24:
            raise ValueError(f"{self.name}: remote QPN {remote_qpn} is not 24 bits")
        self.remote_mac = bytes(remote_mac)
        self.remote_ip = remote_ip
        self.remote_qpn = remote_qpn
        self.epsn = rq_psn % PSN_MOD
        # rxe: 0xC000 | hash of the two QPNs, constant per connection
        self.sport = 0xC000 | ((self.qpn * 0x9E3779B1 ^ remote_qpn * 0x85EBCA77) >> 7) & 0x3FFF
        self.state = QPState.RTS

    @property
    def pmtu(self) -> int:
        return self.cfg.pmtu

    @property
    def outstanding(self) -> int:
        """PSNs transmitted and not yet acknowledged."""
        return psn_diff(self.sent_psn, self.comp_psn)

    @property
    def idle(self) -> bool:
        """Nothing posted that is not acknowledged."""
        return not self._wrs

    # ------------------------------------------------------------------ requester
    def post_write(self, data, remote_va: int, rkey: int, imm: int | None = None,
                   wr_id=None) -> int:
        """Post an RDMA WRITE (WITH_IMM if ``imm`` is given) of ``data``; returns its first PSN.

        ``data`` must stay unchanged until the completion (it is read again on retransmission).
        """
        if self.state is not QPState.RTS:
            raise RCError(self.name, self.tail_psn, f"post_write in state {self.state.value}")
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n >= 1 << 31:
            raise ValueError(f"{self.name}: WRITE of {n} B exceeds 2^31")
        if imm is not None and not 0 <= imm < 1 << 32:
            raise ValueError(f"{self.name}: immediate {imm} is not 32 bits")
        npk = max(1, -(-n // self.pmtu))
        wr = _WR(wr_id, mv, remote_va, rkey, imm, self.tail_psn, npk)
        self._wrs.append(wr)
        self.tail_psn = psn_add(self.tail_psn, npk)
        self._pump()
        return wr.first_psn

    def _locate(self, psn: int) -> int:
        for i, w in enumerate(self._wrs):
            if 0 <= psn_diff(psn, w.first_psn) < w.npkts:
                return i
        raise AssertionError(f"{self.name}: PSN {psn} not in any posted WR")

    def _pump(self) -> None:
        if self.state is not QPState.RTS:
            return
        mx = self.cfg.max_unacked
        while (psn_diff(self.tail_psn, self.next_psn) > 0
               and psn_diff(self.next_psn, self.comp_psn) < mx):
            w = self._wrs[self._cur]
            i = psn_diff(self.next_psn, w.first_psn)
            if i >= w.npkts:
                self._cur += 1
                continue
            self._transmit(w, i, self.next_psn)
            self.next_psn = psn_add(self.next_psn, 1)
            if psn_diff(self.next_psn, self.sent_psn) > 0:
                self.sent_psn = self.next_psn
        if self._timer is None and self.outstanding > 0:
            self._arm()

    def _transmit(self, w: _WR, i: int, psn: int) -> None:
        pmtu = self.pmtu
        last = i == w.npkts - 1
        if w.npkts == 1:
            op = Opcode.WRITE_ONLY if w.imm is None else Opcode.WRITE_ONLY_IMM
        elif i == 0:
            op = Opcode.WRITE_FIRST
        elif last:
            op = Opcode.WRITE_LAST if w.imm is None else Opcode.WRITE_LAST_IMM
        else:
            op = Opcode.WRITE_MIDDLE
        self._noack += 1
        ackreq = last or self._noack >= self.cfg.ack_every
        if ackreq:
            self._noack = 0
        st = self.stats
        st.sent += 1
        if psn_diff(psn, self.sent_psn) < 0:
            st.retransmitted += 1
        elif last:
            st.messages_sent += 1
        kw = {"ackreq": int(ackreq), "tos": self._tos}
        if op in (Opcode.WRITE_FIRST, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM):
            kw.update(va=w.remote_va, rkey=w.rkey, dmalen=w.length)
        if op in (Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM):
            kw["imm"] = w.imm
        f = self._frame(op, psn, bytes(w.data[i * pmtu:(i + 1) * pmtu]), **kw)
        self.rnic.fabric.send(f)

    def _frame(self, opcode, psn, payload: bytes = b"", syndrome: int = 0, msn: int = 0,
               **kw) -> bytes:
        """Pack a frame from a cached header template (built by :meth:`RoceFrame.headers`) with
        PSN, AETH and ICRC filled in: byte-identical to ``RoceFrame(...).pack()`` (IPv4 id is
        per template rather than per packet)."""
        key = (opcode, len(payload), *kw.values())
        hdr = self._tpl.get(key)
        if hdr is None:
            if len(self._tpl) > 256:
                self._tpl.clear()
            r = self.rnic
            self._ident = (self._ident + 1) & 0xFFFF
            hdr = bytes(RoceFrame(opcode=opcode, dqpn=self.remote_qpn, psn=0, dmac=self.remote_mac,
                                  smac=r.mac, src_ip=r.ip, dst_ip=self.remote_ip,
                                  sport=self.sport, ident=self._ident, pkey=self.cfg.pkey,
                                  payload=bytes(len(payload)), **kw).headers())
            self._tpl[key] = hdr
        buf = bytearray(hdr)
        buf[_PSN_OFF:_PSN_OFF + 3] = psn.to_bytes(3, "big")
        if opcode == Opcode.ACK:
            buf[_AETH_OFF] = syndrome
            buf[_AETH_OFF + 1:_AETH_OFF + 4] = msn.to_bytes(3, "big")
        buf += payload
        pad = (-len(payload)) & 3
        if pad:
            buf += bytes(pad)
        buf += icrc_bytes(memoryview(buf)[IPV4_OFF:])
        return bytes(buf)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.rnic.fabric.call_at(self.rnic.fabric.now() + self._timeout_ns,
                                               self._on_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timeout(self) -> None:
        self._timer = None
        if self.state is not QPState.RTS or self.outstanding <= 0:
            return
        self.stats.timeouts += 1
        self._retry(self.comp_psn, "retransmit timeout")

    def _retry(self, psn: int, why: str) -> None:
        if self._retries_left <= 0:
            self._fail(psn, f"retry limit exceeded ({self.cfg.retry_cnt} retries) after {why}; "
                            f"oldest unacknowledged PSN {self.comp_psn}")
            return
        self._retries_left -= 1
        self.stats.retries += 1
        self.next_psn = psn
        self._cur = self._locate(psn) if self._wrs else 0
        self._noack = 0
        self._arm()
        self._pump()

    def _advance(self, psn: int) -> bool:
        """Everything before ``psn`` is acknowledged; complete WRs. True if that was progress."""
        if psn_diff(psn, self.comp_psn) <= 0:
            return False
        self.comp_psn = psn
        if psn_diff(self.next_psn, psn) < 0:
            self.next_psn = psn  # acked beyond what we were about to (re)send
        done = 0
        for w in self._wrs:
            if psn_diff(psn, w.first_psn) >= w.npkts:
                done += 1
            else:
                break
        completed, self._wrs = self._wrs[:done], self._wrs[done:]
        self._cur = self._locate(self.next_psn) if (
            self._wrs and psn_diff(self.tail_psn, self.next_psn) > 0) else len(self._wrs)
        self._retries_left = self.cfg.retry_cnt
        self._nak_retry_psn = None
        if self.outstanding > 0:
            self._arm()
        else:
            self._disarm()
        for w in completed:
            if self.on_send is not None:
                self.on_send(self, Completion("WRITE", w.wr_id, w.imm, w.length,
                                              psn_add(w.first_psn, w.npkts - 1)))
        self._pump()
        return True

    def _on_ack(self, f: RoceFrame) -> None:
        syn = f.syndrome
        p = f.psn
        st = self.stats
        kind = AckSyndrome.kind(syn)
        # Valid acknowledged PSNs lie in [comp_psn - 1, sent_psn - 1].
        if psn_diff(p, self.sent_psn) >= 0 or psn_diff(p, self.comp_psn) < -1:
            st.stale_acks += 1
            return
        if kind == AckSyndrome.ACK:
            st.acks_received += 1
            if not self._advance(psn_add(p, 1)):
                st.stale_acks += 1
        elif kind == AckSyndrome.NAK:
            st.naks_received += 1
            if syn == NAK_PSN_SEQ:
                if psn_diff(p, self.comp_psn) < 0:
                    st.stale_acks += 1
                    return
                progress = self._advance(p)
                if not progress and self._nak_retry_psn == p:
                    st.naks_ignored += 1
                    return
                self._nak_retry_psn = p
                self._retry(p, f"NAK sequence error at PSN {p}")
            else:
                what = {NAK_INVALID_REQ: "invalid request",
                        NAK_REMOTE_ACCESS: "remote access error",
                        NAK_REMOTE_OP: "remote operational error"}.get(syn, f"syndrome 0x{syn:02x}")
                self._advance(p)
                self._fail(p, f"remote NAK: {what}")
        else:  # RNR NAK: nothing here sends them; retry like a timeout
            st.naks_received += 1
            self._retry(self.comp_psn, "RNR NAK")

    # ------------------------------------------------------------------ responder
    def _on_data(self, f: RoceFrame) -> None:
        st = self.stats
        d = psn_diff(f.psn, self.epsn)
        if f.ecn == ECN_CE:
            st.ce_received += 1
            if self.cfg.cnp_on_ce:
                self._send_cnp()
        if d > 0:
            st.out_of_seq_dropped += 1
            if not self._nak_sent:
                self._nak_sent = True
                self._send_ack(self.epsn, NAK_PSN_SEQ)
            return
        if d < 0:
            # duplicate: re-ACK what we have, never touch memory (rxe duplicate_request, C9-105)
            st.duplicates += 1
            self._send_ack(psn_add(self.epsn, -1))
            return
        info = f.info
        pos = info.position
        psn = f.psn
        if info.kind != "WRITE":
            return self._fatal(psn, NAK_INVALID_REQ,
                               f"unsupported opcode {Opcode(f.opcode).name} (only RDMA WRITE)")
        if self._in_msg and pos not in ("MIDDLE", "LAST"):
            return self._fatal(psn, NAK_INVALID_REQ,
                               f"{Opcode(f.opcode).name} inside a WRITE (after FIRST/MIDDLE only "
                               f"MIDDLE/LAST)")
        if not self._in_msg and pos not in ("FIRST", "ONLY"):
            return self._fatal(psn, NAK_INVALID_REQ,
                               f"{Opcode(f.opcode).name} without a preceding FIRST")
        n = len(f.payload)
        pmtu = self.pmtu
        if pos in ("FIRST", "ONLY"):
            if pos == "FIRST" and n != pmtu:
                return self._fatal(psn, NAK_INVALID_REQ,
                                   f"WRITE_FIRST payload {n} B, must be exactly PMTU {pmtu}")
            if pos == "ONLY" and n > pmtu:
                return self._fatal(psn, NAK_INVALID_REQ,
                                   f"{Opcode(f.opcode).name} payload {n} B exceeds PMTU {pmtu}")
            if pos == "ONLY" and n != f.dmalen:
                return self._fatal(psn, NAK_INVALID_REQ,
                                   f"{Opcode(f.opcode).name} payload {n} B != DMA length "
                                   f"{f.dmalen}")
            if pos == "FIRST" and f.dmalen <= pmtu:
                return self._fatal(psn, NAK_INVALID_REQ,
                                   f"WRITE_FIRST with DMA length {f.dmalen} <= PMTU {pmtu}")
            mr = self.rnic.mrs.get(f.rkey)
            if mr is None or not mr.remote_write or not mr.contains(f.va, f.dmalen):
                why = (f"unknown R_Key 0x{f.rkey:08x}" if mr is None else
                       f"VA 0x{f.va:x}+{f.dmalen} outside region 0x{mr.va:x}+{mr.length}")
                return self._fatal(psn, NAK_REMOTE_ACCESS, f"remote access error: {why}")
            self._mr, self._wva, self._remaining, self._dmalen = mr, f.va, f.dmalen, f.dmalen
        else:
            if pos == "MIDDLE" and (n != pmtu or self._remaining <= pmtu):
                return self._fatal(psn, NAK_INVALID_REQ,
                                   f"WRITE_MIDDLE payload {n} B with {self._remaining} B left "
                                   f"(must be PMTU {pmtu} and leave a LAST)")
            if pos == "LAST" and not (1 <= n <= pmtu and n == self._remaining):
                return self._fatal(psn, NAK_INVALID_REQ,
                                   f"{Opcode(f.opcode).name} payload {n} B, expected "
                                   f"{self._remaining} B (1..PMTU {pmtu}) to complete the DMA "
                                   f"length {self._dmalen}")
        mr = self._mr
        off = self._wva - mr.va
        if n:
            mr.buf[off:off + n] = np.frombuffer(f.payload, np.uint8)
        self._wva += n
        self._remaining -= n
        self.epsn = psn_add(self.epsn, 1)
        self._nak_sent = False
        st.received += 1
        if pos in ("LAST", "ONLY"):
            self._in_msg = False
            self.msn = (self.msn + 1) % PSN_MOD
            st.messages_received += 1
            if info.immdt and self.on_recv is not None:
                self.on_recv(self, Completion("RECV_RDMA_WITH_IMM", None, f.imm, self._dmalen,
                                              psn))
        else:
            self._in_msg = True
        if f.ackreq:
            self._schedule_ack(psn)

    def _schedule_ack(self, psn: int) -> None:
        pending = self._ack_psn is not None
        self._ack_psn = psn
        if not pending:
            fab = self.rnic.fabric
            fab.call_at(fab.now() + self.cfg.ack_delay_ns, self._flush_ack)

    def _flush_ack(self) -> None:
        if self._ack_psn is None or self.state is not QPState.RTS:
            self._ack_psn = None
            return
        p, self._ack_psn = self._ack_psn, None
        self._send_ack(p)

    def _send_ack(self, psn: int, syndrome: int | None = None) -> None:
        syn = ACK_NO_CREDIT if syndrome is None else syndrome
        if AckSyndrome.is_nak(syn):
            self.stats.naks_sent += 1
        else:
            self.stats.acks_sent += 1
        self.rnic.fabric.send(self._frame(Opcode.ACK, psn, syndrome=syn, msn=self.msn))

    def _send_cnp(self) -> None:
        now = self.rnic.fabric.now()
        if now - self._last_cnp < 50_000:  # 50 us per-QP rate limit, as NICs do
            return
        self._last_cnp = now
        self.stats.cnps_sent += 1
        self.rnic.fabric.send(self._frame(Opcode.CNP, 0, becn=1))

    # ------------------------------------------------------------------ errors
    def _fatal(self, psn: int, syndrome: int, what: str) -> None:
        self._send_ack(psn, syndrome)
        self._fail(psn, what)

    def _fail(self, psn: int, what: str) -> None:
        if self.state is QPState.ERROR:
            return
        self.state = QPState.ERROR
        self.error = RCError(self.name, psn, what)
        self._disarm()
        self.rnic.errors.append(self.error)
        if self.on_error is not None:
            self.on_error(self, self.error)

    def __repr__(self) -> str:
        return (f"<{self.name} {self.state.value} -> {ip_str(self.remote_ip)}/QP{self.remote_qpn}"
                f" next={self.next_psn} comp={self.comp_psn} tail={self.tail_psn} "
                f"epsn={self.epsn}>")


class RNIC:
    """A host's software RNIC on ``fabric``: MAC, IPv4, memory regions and RC QPs.

    ``stats`` counts the frames it dropped, by reason (``drop_icrc``, ``drop_unknown_qp``...), and
    ``errors`` collects every :class:`RCError` of its QPs.
    """

    FIRST_QPN = 17  # rxe numbers QPs from 17 after boot

    def __init__(self, fabric: Fabric, mac: bytes, ip, name: str | None = None, seed: int = 0):
        self.fabric = fabric
        self.mac = bytes(mac)
        if len(self.mac) != 6:
            raise ValueError(f"MAC must be 6 bytes, got {self.mac!r}")
        self.ip = to_ip(ip)
        self.name = name or f"{ip_str(self.ip)}"
        self.qps: dict[int, QueuePair] = {}
        self.mrs: dict[int, MemoryRegion] = {}
        self.stats: Counter = Counter()
        self.errors: list[RCError] = []
        self._rng = random.Random(f"rnic/{seed}/{self.ip}")
        self._next_qpn = self.FIRST_QPN
        self._next_va = 0x7F00_0000_0000
        fabric.attach(self.mac, self._deliver)

    def reg_mr(self, buf, remote_write: bool = True) -> MemoryRegion:
        """Register ``buf`` (numpy array, viewed as bytes; or an int: a new zeroed buffer)."""
        if isinstance(buf, int):
            if buf < 0:
                raise ValueError(f"region size must be >= 0, got {buf}")
            buf = np.zeros(buf, np.uint8)
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise ValueError("memory regions must be C-contiguous")
        raw = arr.reshape(-1).view(np.uint8)
        while True:
            rkey = self._rng.getrandbits(32)
            if rkey and rkey not in self.mrs:
                break
        mr = MemoryRegion(rkey, self._next_va, raw, remote_write)
        self._next_va += (raw.nbytes + 0xFFFF) & ~0xFFF or 0x1000
        self.mrs[rkey] = mr
        return mr

    def dereg_mr(self, mr: MemoryRegion) -> None:
        self.mrs.pop(mr.rkey, None)

    def create_qp(self, cfg: QPConfig | None = None, start_psn: int | None = None, *,
                  on_send=None, on_recv=None, on_error=None) -> QueuePair:
        """A new RC QP (state RESET). ``start_psn`` defaults to a random 24-bit PSN, as RNICs do."""
        qpn = self._next_qpn
        self._next_qpn += 1
        if qpn >= 1 << 24:
            raise RuntimeError(f"{self.name}: out of QP numbers")
        if start_psn is None:
            start_psn = self._rng.getrandbits(24)
        if not 0 <= start_psn < PSN_MOD:
            raise ValueError(f"start PSN {start_psn} is not 24 bits")
        qp = QueuePair(self, qpn, cfg or QPConfig(), start_psn, on_send, on_recv, on_error)
        self.qps[qpn] = qp
        return qp

    def destroy_qp(self, qp: QueuePair) -> None:
        qp._disarm()
        qp.state = QPState.ERROR  # pending ACK/timer events of the QP become no-ops
        self.qps.pop(qp.qpn, None)

    def _drop(self, why: str) -> None:
        self.stats[f"drop_{why}"] += 1

    def _deliver(self, frame: bytes) -> None:
        self.stats["rx_frames"] += 1
        f = parse_fast(frame)
        if f is None:
            try:
                f = parse(frame)
            except WireError as e:
                return self._drop(e.reason)
        if f.dst_ip != self.ip:
            return self._drop("wrong_dst_ip")
        qp = self.qps.get(f.dqpn)
        if qp is None:
            return self._drop("unknown_qp")
        if f.opcode == Opcode.CNP:
            qp.stats.cnps += 1
            return
        if qp.state is not QPState.RTS:
            return self._drop("qp_not_rts")
        if f.src_ip != qp.remote_ip:
            return self._drop("wrong_src_ip")
        if f.pkey != qp.cfg.pkey:
            return self._drop("pkey")
        info = f.info
        if info.transport != "RC":
            return self._drop("opcode_class")
        if f.opcode == Opcode.ACK:
            qp._on_ack(f)
        else:
            qp._on_data(f)

    def __repr__(self) -> str:
        return f"<RNIC {self.name} {mac_str(self.mac)} {len(self.qps)} QPs>"
