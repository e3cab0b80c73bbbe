"""Building blocks for driving the reference model by hand: a ring job's addresses and frames.

:class:`RingJob` describes job ``job`` of ``world`` ranks: rank r (IPv4 10.<job>.0.<r+1>) sends
its flow from its QP ``sq(r)`` to QP ``rq(r+1 mod N)`` of its successor. It builds the
:class:`~netreduce.sw_driver.control.JobConfig` and the frames each side of a flow sends (data
packets of an index, ACK/NAK from the successor, CNP from the successor's NIC). Used by the model
tests and the benchmark; the RC endpoint model (sw_driver) builds real traffic instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from netreduce.sw_driver.control import EngineControl, FlowConfig, JobConfig

from netreduce.regmap import DEFAULT_CNP_INTERVAL, Op
from netreduce.wire import ECN_NOT_ECT, NAK_PSN_SEQ, Opcode, RoceFrame

from .engine import Engine

__all__ = ["RingJob", "engine_with"]

PSN_MASK = (1 << 24) - 1


@dataclass
class RingJob:
    job: int = 0
    world: int = 4
    window: int = 16
    slot_base: int = 0
    pmtu: int = 1024
    op: Op = Op.SUM_WRAP
    start_psns: list[int] = field(default_factory=list)  # default: 1000 * (r + 1)
    cnp_interval: int = DEFAULT_CNP_INTERVAL
    vlan_tci: int | None = None

    def __post_init__(self):
        if not self.start_psns:
            self.start_psns = [(1000 * (r + 1)) & PSN_MASK for r in range(self.world)]

    # ------------------------------------------------------------------ addressing
    def ip(self, r: int) -> int:
        return (10 << 24) | (self.job << 16) | (r + 1)

    def mac(self, r: int) -> bytes:
        return bytes([0x02, 0, 0, self.job, 0, r + 1])

    def sq(self, r: int) -> int:
        """Rank r's sending QP (the requester of its flow)."""
        return 0x1000 * (self.job + 1) + 0x100 + r

    def rq(self, r: int) -> int:
        """Rank r's receiving QP (the responder of its predecessor's flow)."""
        return 0x1000 * (self.job + 1) + 0x200 + r

    def succ(self, r: int) -> int:
        return (r + 1) % self.world

    def psn(self, r: int, index: int) -> int:
        return (self.start_psns[r] + index) & PSN_MASK

    def config(self) -> JobConfig:
        return JobConfig(self.job, self.world, self.window, self.slot_base, self.pmtu, self.op,
                         [FlowConfig(r, self.ip(r), self.rq(self.succ(r)), self.ip(self.succ(r)),
                                     self.sq(r), self.start_psns[r])
                          for r in range(self.world)], self.cnp_interval)

    # ------------------------------------------------------------------ frames
    def data(self, r: int, index: int, payload, opcode: int = Opcode.WRITE_ONLY,
             ecn: int = ECN_NOT_ECT, **kw) -> RoceFrame:
        """Rank r's packet of ``index`` (payload: int32 array-like or bytes)."""
        index &= PSN_MASK
        if not isinstance(payload, bytes | bytearray):
            payload = np.asarray(payload, dtype="<i4").tobytes()
        s = self.succ(r)
        return RoceFrame(opcode=int(opcode), dqpn=self.rq(s), psn=self.psn(r, index),
                         payload=bytes(payload), smac=self.mac(r), dmac=self.mac(s),
                         src_ip=self.ip(r), dst_ip=self.ip(s), tos=ecn, sport=0xC000 + r,
                         vlan_tci=self.vlan_tci, va=0x10000 * (r + 1) + index * self.pmtu,
                         rkey=0x77 + r, dmalen=len(payload), **kw)

    def data_bytes(self, r: int, index: int, payload, **kw) -> bytes:
        return self.data(r, index, payload, **kw).pack()

    def ack(self, r: int, index: int, nak: bool = False, syndrome: int | None = None) -> bytes:
        """The successor's ACK (or NAK-sequence) for flow r at ``index``, sent to rank r's QP."""
        s = self.succ(r)
        kw = dict(dqpn=self.sq(r), psn=self.psn(r, index), smac=self.mac(s), dmac=self.mac(r),
                  src_ip=self.ip(s), dst_ip=self.ip(r), vlan_tci=self.vlan_tci)
        if syndrome is not None:
            return RoceFrame.ack(syndrome=syndrome, **kw).pack()
        if nak:
            return RoceFrame.nak_seq(**kw).pack()
        return RoceFrame.ack(**kw).pack()

    def receiver_cnp(self, r: int) -> bytes:
        """A CNP from flow r's receiver NIC to rank r's QP."""
        s = self.succ(r)
        return RoceFrame.cnp(dqpn=self.sq(r), smac=self.mac(s), dmac=self.mac(r),
                             src_ip=self.ip(s), dst_ip=self.ip(r)).pack()

    def ack_all(self, index: int) -> list[bytes]:
        """One cumulative ACK per flow up to ``index``."""
        return [self.ack(r, index) for r in range(self.world)]

    @staticmethod
    def nak_syndrome() -> int:
        return NAK_PSN_SEQ


def engine_with(*jobs: RingJob, **params) -> tuple[Engine, EngineControl]:
    """A fresh :class:`Engine` (``params`` = build parameters) with ``jobs`` registered."""
    eng = Engine(**params)
    ctl = EngineControl(eng.bus)
    for j in jobs:
        ctl.add_job(j.config())
    return eng, ctl
