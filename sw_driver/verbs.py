"""Verbs backend: the driver's all-reduce over a real RNIC through pyverbs (docs/design.md section
2, 5).

Same collective as :class:`netreduce.sim.emu.rank.RankComm` (one rank per process, an
injected ``exchange`` all-gather for rendezvous), but the RC connections are the kernel's: Linux
soft-RoCE (rdma_rxe) in the VM lab, or any RoCEv2 RNIC.

* **Device and GID.** :class:`VerbsDevice` opens ``device`` (default: the first one) and uses
  GID ``gid_index`` (default 1: in rxe the IPv4 RoCEv2 GID ``::ffff:a.b.c.d``; index 0 is the
  IPv6 link-local one). It checks that the GID is IPv4-mapped and of type RoCE v2 and that the
  port is ACTIVE, and finds the netdev and MAC behind it; anything else is a :class:`VerbsError`
  naming the device, port and index.
* **Rings.** Per operation (MAX for the float path's exponents, SUM_SAT for its fixed-point values,
  SUM_WRAP for int32) one ring: rank r's RC send QP connected to a receive QP of rank (r+1) mod N,
  path MTU ``pmtu`` (1024 or 4096), local ACK timeout ``timeout`` (4.096 us * 2^timeout), retry
  count ``retry_cnt``. MRs: a send buffer and a receive buffer of ``max_bytes`` (REMOTE_WRITE),
  and a 4-byte MR for the receive WRs' single SGE (rxe wants one even for WRITE_WITH_IMM).
* **Messages.** A buffer is cut into messages of ``msg_packets`` packets, each one RDMA WRITE
  WITH_IMM (immediate = message number) into the successor's receive buffer at the same offset;
  the engine replaces every payload with the sum, so every receive buffer ends up holding the
  result. Message-level credits: message m is posted only while its last packet index is below
  R + W - margin (R: packets of the messages whose results arrived), across calls (the QPs, PSNs
  and engine indices continue from one all-reduce to the next).
* **Registration.** Rank 0 registers every ring as an engine job through the management protocol
  (docs/management.md) with :class:`~netreduce.sw_driver.control.EngineControl` over a
  :class:`~netreduce.sw_driver.mgmt.MgmtClient` whose frames go out of the RNIC's netdev on an
  AF_PACKET socket (:class:`RawLink`; source: the netdev's IPv4 and MAC, which the engine's
  allow-list must hold). :meth:`VerbsComm.close` removes the jobs.
* **Completions** are polled (short sleeps when idle). A completion with an error status raises
  :class:`VerbsError` naming the ring, the QP (number, peer), the work request (message, offset,
  length) and the status in words ("transport retry counter exceeded", "remote access error",
  ...); the communicator is then broken and every later call raises the same error. No progress
  within ``op_timeout_s`` raises too (with every ring's counters).

pyverbs is imported lazily: this module imports on any host; using it without pyverbs raises
:class:`VerbsUnavailable` saying which package provides it. The driver never imports hw or sim.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from netreduce.wire.fields import ETHERTYPE_IPV4
from netreduce.wire.view import dst_mac

from . import ring_comm
from .control import EngineControl, Op
from .credits import Credits, RingKnobs, check_ring_knobs

__all__ = ["VerbsError", "VerbsUnavailable", "VerbsConfig", "VerbsDevice", "VerbsComm",
           "RawLink", "FileExchange", "rxe_counters", "WC_STATUS"]

PMTUS = (1024, 4096)
RTR_ATTEMPTS = 6  # INIT -> RTR tries when resolving the peer's address times out
PSN_MOD = 1 << 24
_PYVERBS_HINT = ("pyverbs is not installed (Debian/Ubuntu: apt-get install python3-pyverbs; it "
                 "comes with rdma-core): the verbs backend needs it")

# ibv_wc_status values -> words (libibverbs ibv_wc_status_str)
WC_STATUS = {
    0: "success", 1: "local length error", 2: "local QP operation error",
    3: "local EE context operation error", 4: "local protection error",
    5: "work request flushed with error", 6: "memory window bind error",
    7: "bad response error", 8: "local access error", 9: "remote invalid request error",
    10: "remote access error", 11: "remote operation error",
    12: "transport retry counter exceeded", 13: "RNR retry counter exceeded",
    14: "local RDD violation error", 15: "remote invalid RD request", 16: "remote aborted error",
    17: "invalid EE context number", 18: "invalid EE context state", 19: "fatal error",
    20: "response timeout error", 21: "general error",
}


class VerbsUnavailable(ImportError):
    """pyverbs (python3-pyverbs) is missing."""


class VerbsError(RuntimeError):
    """A verbs call or a work request failed; the message names the QP and the work request."""


def _pyverbs():
    try:
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.cq import CQ
        from pyverbs.device import Context, get_device_list
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        from pyverbs.wr import SGE, RecvWR, SendWR
    except ImportError as ex:
        raise VerbsUnavailable(f"{_PYVERBS_HINT} ({ex})") from ex
    return dict(e=e, GID=GID, AHAttr=AHAttr, GlobalRoute=GlobalRoute, CQ=CQ, Context=Context,
                get_device_list=get_device_list, MR=MR, PD=PD, PyverbsError=PyverbsError, QP=QP,
                QPAttr=QPAttr, QPCap=QPCap, QPInitAttr=QPInitAttr, SGE=SGE, RecvWR=RecvWR,
                SendWR=SendWR)


@dataclass(frozen=True)
class VerbsConfig(RingKnobs):
    """Knobs: ``pmtu`` (1024/4096; the netdev MTU must carry it: 1500 -> 1024, 4200 -> 4096),
    ``msg_packets`` per message, engine window ``window`` (>= 2 x rxe's 128 unacked packets) and
    credit ``margin``, the exponent job's ``exp_window``, QP ``timeout`` (2^t x 4.096 us) and
    ``retry_cnt``, ``max_bytes`` per all-reduce segment, ``op_timeout_s`` without progress,
    ``int32`` (make the SUM_WRAP ring), ``float32`` (make the MAX and SUM_SAT rings of the float
    path), ``device``/``port``/``gid_index``. Each ring is one engine job."""

    pmtu: int = 1024
    msg_packets: int = 16
    window: int = 256
    margin: int = 64
    exp_window: int = 64
    timeout: int = 14
    retry_cnt: int = 7
    max_bytes: int = 1 << 20
    op_timeout_s: float = 600.0
    int32: bool = True
    float32: bool = True
    device: str | None = None
    port: int = 1
    gid_index: int = 1

    def __post_init__(self):
        check_ring_knobs(self, pmtus=PMTUS)
        if not (self.int32 or self.float32):
            raise ValueError("at least one of int32 and float32 must be enabled")
        if self.max_bytes <= 0 or self.max_bytes % 4:
            raise ValueError(f"max_bytes must be a positive multiple of 4, got {self.max_bytes!r}")


# ============================================================================ device
def _sysfs(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class VerbsDevice:
    """An opened RNIC port and its RoCEv2 IPv4 GID (see the module doc). ``ip`` (int), ``mac``
    (bytes), ``netdev`` (name), ``gid`` (16 bytes); ``ctx``/``pd`` are pyverbs objects."""

    def __init__(self, device: str | None = None, port: int = 1, gid_index: int = 1,
                 wait_s: float = 60.0):
        pv = self.pv = _pyverbs()
        names = [d.name.decode() if isinstance(d.name, bytes) else d.name
                 for d in pv["get_device_list"]()]
        if not names:
            raise VerbsError("no RDMA device found (soft-RoCE: modprobe rdma_rxe; rdma link add "
                             "rxe0 type rxe netdev eth0)")
        if device is None:
            device = names[0]
        elif device not in names:
            raise VerbsError(f"RDMA device {device!r} not found (have {names})")
        self.name, self.port, self.gid_index = device, port, gid_index
        self.ctx = pv["Context"](name=device)
        where = f"{device} port {port} GID index {gid_index}"
        deadline = time.monotonic() + wait_s
        while True:  # the IPv4 GID appears a little after the address is set
            state = self.ctx.query_port(port).state
            gid = self._gid()
            if state == pv["e"].IBV_PORT_ACTIVE and gid[:12] == bytes(10) + b"\xff\xff":
                break
            if time.monotonic() > deadline:
                raise VerbsError(f"{where}: not usable after {wait_s:.0f} s: port state {state} "
                                 f"(4 = ACTIVE), GID {gid.hex()} (need an IPv4-mapped RoCEv2 "
                                 f"GID ::ffff:a.b.c.d)")
            time.sleep(0.2)
        self.gid = gid
        self.ip = int.from_bytes(gid[12:], "big")
        base = Path(f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs")
        gtype = _sysfs(base / "types" / str(gid_index))
        if gtype is not None and gtype.lower() != "roce v2":
            raise VerbsError(f"{where}: GID type is {gtype!r}, need 'RoCE v2'")
        self.netdev = _sysfs(base / "ndevs" / str(gid_index))
        mac = _sysfs(Path(f"/sys/class/net/{self.netdev}/address")) if self.netdev else None
        self.mac = bytes.fromhex(mac.replace(":", "")) if mac else None
        self.pd = pv["PD"](self.ctx)

    def _gid(self) -> bytes:
        try:
            g = self.ctx.query_gid(self.port, self.gid_index).gid  # 'xxxx:xxxx:...'
        except self.pv["PyverbsError"]:  # an index not populated yet
            return bytes(16)
        return bytes.fromhex(g.replace(":", ""))

    def counters(self) -> dict[str, int]:
        return rxe_counters(self.name, self.port)

    def close(self) -> None:
        for o in (self.pd, self.ctx):
            try:
                o.close()
            except Exception:  # best effort at teardown
                pass


def rxe_counters(device: str = "rxe0", port: int = 1) -> dict[str, int]:
    """The device's hw_counters from sysfs (rxe: sent_pkts, rcvd_pkts, rcvd_seq_err,
    out_of_seq_request, duplicate_request, completer_retry_err, retry_exceeded_err, ...)."""
    out = {}
    for base in (Path(f"/sys/class/infiniband/{device}/ports/{port}/hw_counters"),
                 Path(f"/sys/class/infiniband/{device}/hw_counters")):
        if base.is_dir():
            for f in sorted(base.iterdir()):
                v = _sysfs(f)
                if v is not None and v.lstrip("-").isdigit():
                    out[f.name] = int(v)
    return out


# ============================================================================ management link
class RawLink:
    """A :class:`~netreduce.sw_driver.mgmt.FrameLink` on a netdev (AF_PACKET, root needed):
    sends whole Ethernet frames, receives IPv4 frames to ``mac``. A UDP socket bound to
    ``udp_port`` swallows the kernel's copy of the responses (no ICMP port-unreachable)."""

    def __init__(self, ifname: str, mac: bytes, udp_port: int):
        self.mac = bytes(mac)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETHERTYPE_IPV4))
        self.sock.bind((ifname, 0))
        self._sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sink.bind(("0.0.0.0", udp_port))

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def recv(self, timeout_s: float) -> bytes | None:
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                f = self.sock.recv(65535)
            except TimeoutError:
                return None
            if dst_mac(f) == self.mac:
                return f

    def close(self) -> None:
        self.sock.close()
        self._sink.close()


# ============================================================================ rendezvous
class FileExchange:
    """An all-gather of small JSON-able objects through a shared folder (the VM lab's 9p share):
    round k writes ``dir/k/<rank>.json`` atomically and waits for all ``world`` files.
    Bytes are carried as hex. Raises TimeoutError naming the missing ranks."""

    def __init__(self, folder, rank: int, world: int, timeout_s: float = 600.0):
        self.dir, self.rank, self.world, self.timeout_s = Path(folder), rank, world, timeout_s
        self.round = 0

    def __call__(self, obj) -> list:
        d = self.dir / str(self.round)
        self.round += 1
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{self.rank}.tmp"
        tmp.write_text(json.dumps(_enc(obj)))
        os.replace(tmp, d / f"{self.rank}.json")
        end = time.monotonic() + self.timeout_s
        while True:
            missing = [r for r in range(self.world) if not (d / f"{r}.json").exists()]
            if not missing:
                break
            if time.monotonic() > end:
                raise TimeoutError(f"rank {self.rank}: exchange round {self.round - 1}: ranks "
                                   f"{missing} never answered within {self.timeout_s:.0f} s")
            time.sleep(0.05)
        return [_dec(json.loads((d / f"{r}.json").read_text())) for r in range(self.world)]


def _enc(o):
    if isinstance(o, bytes):
        return {"__bytes__": o.hex()}
    if isinstance(o, dict):
        return {k: _enc(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_enc(v) for v in o]
    return o


def _dec(o):
    if isinstance(o, dict):
        if set(o) == {"__bytes__"}:
            return bytes.fromhex(o["__bytes__"])
        return {k: _dec(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_dec(v) for v in o]
    return o


# ============================================================================ rings
class _Ring:
    """One op's RC ring on this rank: send QP -> successor, receive QP <- predecessor."""

    def __init__(self, comm: VerbsComm, name: str, op: Op, window: int, margin: int,
                 msg_packets: int, max_bytes: int):
        pv, dev, cfg = comm.pv, comm.dev, comm.cfg
        e = pv["e"]
        self.comm, self.name, self.op = comm, name, op
        self.window, self.margin, self.msg_packets = window, margin, msg_packets
        self.max_bytes = max_bytes
        self.job: int | None = None
        depth = max(16, -(-max_bytes // (msg_packets * cfg.pmtu)) + 4)
        self.cq = pv["CQ"](dev.ctx, 4 * depth)
        cap = pv["QPCap"](max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        init = pv["QPInitAttr"](qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                                sq_sig_all=1)
        self.sq = pv["QP"](dev.pd, init)
        self.rq = pv["QP"](dev.pd, init)
        acc = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.smr = pv["MR"](dev.pd, max_bytes, e.IBV_ACCESS_LOCAL_WRITE)
        self.rmr = pv["MR"](dev.pd, max_bytes, acc)
        self.dmr = pv["MR"](dev.pd, 4, e.IBV_ACCESS_LOCAL_WRITE)
        self.sbuf = np.ctypeslib.as_array((ctypes.c_uint8 * max_bytes).from_address(self.smr.buf))
        self.rbuf = np.ctypeslib.as_array((ctypes.c_uint8 * max_bytes).from_address(self.rmr.buf))
        rng = np.random.default_rng()
        self.sq_psn, self.rq_psn = (int(x) for x in rng.integers(0, PSN_MOD, 2))
        # progress in engine indices (packets) and messages, cumulative over calls
        self.credits = Credits(window, margin, comm.cfg.pmtu)
        self.msg_recvd = 0
        self.msg_acked = 0
        self.peer = "?"
        self.pred = "?"

    def info(self) -> dict:
        return {"sq": self.sq.qp_num, "rq": self.rq.qp_num, "sq_psn": self.sq_psn,
                "rq_psn": self.rq_psn, "va": self.rmr.buf, "rkey": self.rmr.rkey}

    def connect(self, succ: dict, succ_ring: dict, pred: dict, pred_ring: dict) -> None:
        self.peer = f"{_ipstr(succ['ip'])} QP {succ_ring['rq']}"
        self.pred = f"{_ipstr(pred['ip'])} QP {pred_ring['sq']}"
        self._up(self.sq, succ["gid"], succ_ring["rq"], succ_ring["rq_psn"], self.sq_psn, "send")
        self._up(self.rq, pred["gid"], pred_ring["sq"], pred_ring["sq_psn"], self.rq_psn, "recv")
        self.remote_va, self.remote_rkey = succ_ring["va"], succ_ring["rkey"]

    def _up(self, qp, dgid: bytes, dqpn: int, rq_psn: int, sq_psn: int, role: str) -> None:
        pv, dev, cfg = self.comm.pv, self.comm.dev, self.comm.cfg
        e = pv["e"]
        what = f"{self.name} ring {role} QP {qp.qp_num}"
        try:
            a = pv["QPAttr"]()
            a.qp_state = e.IBV_QPS_INIT
            a.pkey_index = 0
            a.port_num = dev.port
            a.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                      | e.IBV_QP_ACCESS_FLAGS)
            a = pv["QPAttr"]()
            a.qp_state = e.IBV_QPS_RTR
            a.path_mtu = e.IBV_MTU_1024 if cfg.pmtu == 1024 else e.IBV_MTU_4096
            a.dest_qp_num = dqpn
            a.rq_psn = rq_psn
            a.max_dest_rd_atomic = 1
            a.min_rnr_timer = 12
            gr = pv["GlobalRoute"](dgid=pv["GID"](_gidstr(dgid)), sgid_index=dev.gid_index,
                                   hop_limit=64)
            a.ah_attr = pv["AHAttr"](gr=gr, is_global=1, port_num=dev.port)
            mask = (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                    | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
            for attempt in range(RTR_ATTEMPTS):
                try:
                    qp.modify(a, mask)
                    break
                except pv["PyverbsError"] as ex:
                    # ETIMEDOUT: resolving the peer's MAC (ARP) timed out, e.g. a lost ARP
                    # frame; the QP stays in INIT, so the kernel's next ARP attempt can win
                    if getattr(ex, "error_code", None) != errno.ETIMEDOUT or \
                            attempt == RTR_ATTEMPTS - 1:
                        raise
                    time.sleep(0.5)
            a = pv["QPAttr"]()
            a.qp_state = e.IBV_QPS_RTS
            a.timeout = cfg.timeout
            a.retry_cnt = cfg.retry_cnt
            a.rnr_retry = 7
            a.sq_psn = sq_psn
            a.max_rd_atomic = 1
            qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                      | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
        except pv["PyverbsError"] as ex:
            raise VerbsError(f"rank {self.comm.rank}: {what}: cannot bring the QP up to RTS "
                             f"(peer GID {_gidstr(dgid)}, QPN {dqpn}): {ex}") from ex

    # ------------------------------------------------------------------ one all-reduce
    def reduce(self, data: np.ndarray) -> np.ndarray:
        """All-reduce ``data`` (uint8 view, <= max_bytes) through this ring; returns a copy."""
        comm, cfg, pv = self.comm, self.comm.cfg, self.comm.pv
        e = pv["e"]
        n = data.nbytes
        if n > self.max_bytes:
            raise ValueError(f"{n} bytes exceed the ring's {self.max_bytes}")
        mb = self.msg_packets * cfg.pmtu
        msgs = [(o, min(mb, n - o)) for o in range(0, n, mb)] or [(0, 0)]
        self.sbuf[:n] = data
        base_msg = self.msg_recvd
        credits = self.credits
        # every message needs a receive WR (WRITE WITH_IMM consumes one); post them all first
        for m in range(len(msgs)):
            sge = pv["SGE"](self.dmr.buf, 4, self.dmr.lkey)
            try:
                self.rq.post_recv(pv["RecvWR"](wr_id=m, num_sge=1, sg=[sge]))
            except pv["PyverbsError"] as ex:
                raise VerbsError(self._where(self.rq, f"post_recv of message {m}") + f": {ex}") \
                    from ex
        posted = recvd = acked = 0
        last = time.monotonic()
        while recvd < len(msgs) or acked < len(msgs):
            while posted < len(msgs) and credits.fits(msgs[posted][1]):
                off, ln = msgs[posted]
                sge = pv["SGE"](self.smr.buf + off, ln, self.smr.lkey)
                wr = pv["SendWR"](wr_id=posted, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
                                  num_sge=1 if ln else 0, sg=[sge] if ln else None,
                                  send_flags=e.IBV_SEND_SIGNALED)
                wr.imm_data = socket.htonl((base_msg + posted) & 0xFFFFFFFF)
                wr.set_wr_rdma(self.remote_rkey, self.remote_va + off)
                try:
                    self.sq.post_send(wr)
                except pv["PyverbsError"] as ex:
                    raise VerbsError(self._where(self.sq, f"post_send of message {posted} "
                                                 f"(offset {off}, {ln} bytes)") + f": {ex}") \
                        from ex
                credits.post(ln)
                posted += 1
            k, wcs = self.cq.poll(64)
            if not k:
                if time.monotonic() - last > cfg.op_timeout_s:
                    raise VerbsError(f"rank {comm.rank}: {self.name} ring: no completion for "
                                     f"{cfg.op_timeout_s:.0f} s: posted {posted}/{len(msgs)}, "
                                     f"acked {acked}, results {recvd}; rxe counters "
                                     f"{comm.dev.counters()}")
                time.sleep(0.0005)
                continue
            last = time.monotonic()
            for wc in wcs:
                qp = self.sq if wc.qp_num == self.sq.qp_num else self.rq
                if wc.status != e.IBV_WC_SUCCESS:
                    m = wc.wr_id
                    off, ln = msgs[m] if 0 <= m < len(msgs) else (-1, -1)
                    kind = "RDMA WRITE WITH_IMM" if qp is self.sq else "receive"
                    raise VerbsError(self._where(qp, f"{kind} WR of message {m} (offset {off}, "
                                                 f"{ln} bytes)") + f": "
                                     f"{WC_STATUS.get(wc.status, wc.status)} (status "
                                     f"{wc.status}, vendor error {wc.vendor_err})")
                if qp is self.sq:
                    acked += 1
                    self.msg_acked += 1
                else:
                    imm = socket.ntohl(wc.imm_data)
                    want = (base_msg + recvd) & 0xFFFFFFFF
                    if imm != want:
                        raise VerbsError(self._where(qp, f"result of message {recvd}") +
                                         f": immediate {imm}, expected {want} (out of order)")
                    recvd += 1
                    self.msg_recvd += 1
                    credits.received()
        return self.rbuf[:n].copy()

    def _where(self, qp, wr: str) -> str:
        role = f"send QP {qp.qp_num} -> {self.peer}" if qp is self.sq else \
            f"receive QP {qp.qp_num} <- {self.pred}"
        return f"rank {self.comm.rank}: {self.name} ring ({self.op.name}, job {self.job}), " \
               f"{role}: {wr}"

    def close(self) -> None:
        for o in (self.sq, self.rq, self.smr, self.rmr, self.dmr, self.cq):
            try:
                o.close()
            except Exception:  # best effort at teardown
                pass


def _ipstr(v: int) -> str:
    return ".".join(str(b) for b in v.to_bytes(4, "big"))


def _gidstr(g: bytes) -> str:
    h = g.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


# ============================================================================ communicator
class VerbsComm:
    """One rank of an N-rank all-reduce over verbs (see the module doc).

    ``exchange``: an all-gather of small dicts (bytes allowed), e.g. :class:`FileExchange`.
    ``mgmt``: rank 0's management settings: ``engine_ip`` (int), ``engine_mac`` (bytes),
    optional ``key`` (16 bytes), ``port`` (UDP source port), ``timeout_s``, ``retries``.
    """

    def __init__(self, rank: int, world: int, exchange: Callable[[object], list],
                 cfg: VerbsConfig | None = None, mgmt: dict | None = None,
                 device: VerbsDevice | None = None):
        ring_comm.check_rank(rank, world)
        self.rank, self.world = rank, world
        self.cfg = cfg = cfg or VerbsConfig()
        self.pv = _pyverbs()
        self._exchange = exchange
        self.mgmt = dict(mgmt or {})
        self.error: BaseException | None = None
        self.calls = 0
        self.jobs: dict[str, int] = {}
        self.ctrl: EngineControl | None = None
        self._link: RawLink | None = None
        self.dev = device or VerbsDevice(cfg.device, cfg.port, cfg.gid_index)
        self.rings: dict[str, _Ring] = ring_comm.make_rings(
            cfg, lambda *a: _Ring(self, *a), float32=cfg.float32)
        me = {"ip": self.dev.ip, "gid": self.dev.gid,
              "rings": {k: r.info() for k, r in self.rings.items()}}
        peers = exchange(me)
        succ, pred = peers[(rank + 1) % world], peers[(rank - 1) % world]
        for k, r in self.rings.items():
            r.connect(succ, succ["rings"][k], pred, pred["rings"][k])
        jobs = ring_comm.share_jobs(rank, exchange, lambda: self._register(peers), VerbsError)
        for k, j in jobs.items():
            self.rings[k].job = j
        self.jobs = dict(jobs)

    def _register(self, peers: list[dict]) -> dict[str, int]:
        from .mgmt import MgmtClient, ReadAheadBus

        m = self.mgmt
        if "engine_ip" not in m or "engine_mac" not in m:
            raise ValueError("rank 0 needs mgmt={'engine_ip': ..., 'engine_mac': ...} to "
                             "register the jobs")
        if self.dev.netdev is None or self.dev.mac is None:
            raise VerbsError(f"{self.dev.name}: no netdev behind GID {self.dev.gid_index}: "
                             f"cannot send management frames")
        port = m.get("port", 0xC000 + 0x4E)
        self._link = RawLink(self.dev.netdev, self.dev.mac, port)
        bus = MgmtClient(self._link, engine_ip=m["engine_ip"], engine_mac=m["engine_mac"],
                         ip=self.dev.ip, mac=self.dev.mac, port=port, key=m.get("key"),
                         timeout_s=m.get("timeout_s", 1.0), retries=m.get("retries", 8),
                         clock=time.monotonic)
        self.ctrl = EngineControl(ReadAheadBus(bus))
        return ring_comm.register_jobs(self.ctrl, self.rings, peers, self.cfg.pmtu)

    # ------------------------------------------------------------------ all-reduce
    def allreduce(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Element-wise sum of ``x`` over all ranks: int32 bit-exact (wrapping), float32 within
        :func:`netreduce.sw_driver.quant.error_bound`. Same API as RankComm.allreduce."""
        if self.error is not None:
            raise self.error
        a, out, o = ring_comm.check_allreduce_args(x, out, self.rings, "VerbsConfig")
        self.calls += 1
        try:
            ring_comm.reduce_segments(self, a, o)
        except BaseException as ex:
            self.error = ex
            raise
        return out

    def engine_counters(self) -> dict[str, dict[str, int]]:
        """Rank 0 only: each ring's job counters, read over the management protocol."""
        if self.ctrl is None:
            raise RuntimeError("engine_counters() is for rank 0 (it registered the jobs)")
        return {k: self.ctrl.counters(r.job) for k, r in self.rings.items()}

    def close(self, barrier: bool = True) -> None:
        """Collective when ``barrier``: wait for every rank, then rank 0 removes the jobs."""
        try:
            if barrier and self.error is None:
                self._exchange(None)
            if self.ctrl is not None:
                for j in self.jobs.values():
                    self.ctrl.remove_job(j)
                self.jobs = {}
        finally:
            for r in self.rings.values():
                r.close()
            if self._link is not None:
                self._link.close()
            self.dev.close()
