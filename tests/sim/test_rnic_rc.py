"""The software RC endpoint model against the receiver and requester rules of docs/roce.md (rxe)."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.net.rnic import RNIC, QPConfig, QPState, RCError, timeout_ns
from netreduce.sim.net.scheduler import LoopbackFabric, SimulationHang

from netreduce.wire import (
    NAK_INVALID_REQ,
    NAK_PSN_SEQ,
    NAK_REMOTE_ACCESS,
    PSN_MOD,
    AckSyndrome,
    Opcode,
    RoceFrame,
    parse,
    psn_add,
)

MAC_A, MAC_B = b"\x02\x00\x00\x00\x00\x0a", b"\x02\x00\x00\x00\x00\x0b"


class Pair:
    """Requester A -> responder B over a loopback fabric; ``tap`` sees every frame."""

    def __init__(self, cfg: QPConfig | None = None, a_psn=100, b_psn=5000, drop=None,
                 size=1 << 20):
        self.log: list[tuple[int, RoceFrame]] = []
        self.drop = drop  # drop(frame: RoceFrame, nth_copy_of_this_psn: int) -> bool
        self.seen: dict[tuple, int] = {}
        self.fab = LoopbackFabric(1000, tap=self._tap)
        self.a = RNIC(self.fab, MAC_A, "10.0.0.1", name="A")
        self.b = RNIC(self.fab, MAC_B, "10.0.0.2", name="B")
        self.mr = self.b.reg_mr(size)
        self.sent: list = []
        self.recv: list = []
        cfg = cfg or QPConfig(pmtu=256, timeout=4)
        self.qa = self.a.create_qp(cfg, a_psn, on_send=lambda q, c: self.sent.append(c))
        self.qb = self.b.create_qp(cfg, b_psn, on_recv=lambda q, c: self.recv.append(c))
        self.qa.connect(MAC_B, self.b.ip, self.qb.qpn, self.qb.start_psn)
        self.qb.connect(MAC_A, self.a.ip, self.qa.qpn, self.qa.start_psn)

    def _tap(self, frame):
        f = parse(frame)
        key = (bytes(frame[6:12]), f.opcode, f.psn)
        n = self.seen.get(key, 0)
        self.seen[key] = n + 1
        if self.drop is not None and self.drop(f, n):
            self.log.append((self.fab.now(), f.copy(payload=b"<dropped>")))
            return None
        self.log.append((self.fab.now(), f))
        return frame

    def frames(self, src=MAC_A, data=None):
        out = [f for _, f in self.log if f.smac == src and f.payload != b"<dropped>"]
        if data is True:
            out = [f for f in out if f.info.has_payload]
        if data is False:
            out = [f for f in out if f.opcode == Opcode.ACK]
        return out

    def write(self, nbytes, seed=0, off=0, imm=7):
        data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        self.qa.post_write(data, self.mr.va + off, self.mr.rkey, imm=imm, wr_id=seed)
        return data

    def run(self, n_sent=1, limit_ns=10**10):
        self.fab.run_until(lambda: len(self.sent) >= n_sent or self.qa.error or self.qb.error,
                           limit_ns)

    def inject(self, opcode, psn, payload=b"", **kw):
        """A hand-made frame from A's QP to B's QP, delivered now."""
        f = RoceFrame(opcode=opcode, psn=psn % PSN_MOD, payload=payload, dqpn=self.qb.qpn,
                      smac=MAC_A, dmac=MAC_B, src_ip=self.a.ip, dst_ip=self.b.ip, **kw)
        self.b._deliver(f.pack())

    def b_out(self):
        """Frames B has sent, after letting the loopback deliver them (ACK coalescing)."""
        self.fab.run_all(10**9)
        return self.frames(src=MAC_B)


def test_segmentation_opcodes_reth_ackreq_and_psn_wrap():
    start = PSN_MOD - 70  # wraps inside the message
    p = Pair(QPConfig(pmtu=256, timeout=10), a_psn=start)
    data = p.write(150 * 256 - 3)
    p.run()
    fs = p.frames(data=True)
    assert len(fs) == 150
    assert [f.psn for f in fs] == [psn_add(start, i) for i in range(150)]
    assert fs[0].opcode == Opcode.WRITE_FIRST and fs[-1].opcode == Opcode.WRITE_LAST_IMM
    assert all(f.opcode == Opcode.WRITE_MIDDLE for f in fs[1:-1])
    assert (fs[0].va, fs[0].rkey, fs[0].dmalen) == (p.mr.va, p.mr.rkey, len(data))
    assert fs[-1].imm == 7 and len(fs[-1].payload) == 256 - 3
    ackreq = [i for i, f in enumerate(fs) if f.ackreq]
    assert ackreq == [63, 127, 149]  # every 64 packets and the message's last
    assert np.array_equal(p.mr.buf[:len(data)], data)
    assert p.recv[0].imm == 7 and p.recv[0].byte_len == len(data)
    # coalesced cumulative ACKs: one per AckReq at most, the last one covers everything
    acks = p.frames(src=MAC_B, data=False)
    assert 1 <= len(acks) <= 3 and acks[-1].psn == fs[-1].psn


def test_only_opcodes_and_zero_length():
    p = Pair()
    p.write(256, seed=1, imm=None)
    p.write(0, seed=2)
    p.run(2)
    ops = [f.opcode for f in p.frames(data=True)]
    assert ops == [Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM]
    assert [c.byte_len for c in p.recv] == [0]


def test_at_most_128_unacked_in_flight():
    # B never ACKs: A stops at 128 unacknowledged PSNs, then times out.
    p = Pair(QPConfig(pmtu=256, timeout=12),
             drop=lambda f, n: f.opcode == Opcode.ACK)
    p.write(400 * 256)
    t_to = timeout_ns(12)
    p.fab.run_until(lambda: p.qa.stats.timeouts == 1, 10**10)
    before = [f for t, f in p.log if t < t_to and f.smac == MAC_A]
    assert len(before) == 128 and p.qa.outstanding == 128
    # the timeout resends the same 128 PSNs (go-back-N from the oldest unacknowledged)
    p.fab.run_until(lambda: p.fab.sched.pending() <= 1, 10**10)
    again = [f.psn for t, f in p.log if t >= t_to and f.smac == MAC_A]
    assert again == [f.psn for f in before]


def test_duplicates_are_reacked_without_rewriting_memory():
    p = Pair()
    e = p.qb.epsn
    p.inject(Opcode.WRITE_ONLY_IMM, e, b"\x11" * 16, va=p.mr.va, rkey=p.mr.rkey, dmalen=16,
             ackreq=1)
    assert bytes(p.mr.buf[:16]) == b"\x11" * 16
    p.inject(Opcode.WRITE_ONLY_IMM, e, b"\x22" * 16, va=p.mr.va, rkey=p.mr.rkey, dmalen=16)
    assert bytes(p.mr.buf[:16]) == b"\x11" * 16  # untouched
    acks = p.b_out()
    assert [(a.psn, AckSyndrome.is_ack(a.syndrome)) for a in acks] == [(e, True), (e, True)]
    assert p.qb.stats.duplicates == 1 and len(p.recv) == 1


def test_exactly_one_nak_per_gap_then_silent_drops():
    p = Pair()
    e = p.qb.epsn
    kw = dict(va=p.mr.va, rkey=p.mr.rkey, dmalen=16, ackreq=1)
    for k in (1, 2, 3):  # ahead of the expected PSN
        p.inject(Opcode.WRITE_ONLY, e + k, b"\x01" * 16, **kw)
    out = p.b_out()
    assert [(f.psn, f.syndrome) for f in out] == [(e, NAK_PSN_SEQ)]
    p.inject(Opcode.WRITE_ONLY, e, b"\x02" * 16, **kw)  # the gap is filled
    p.inject(Opcode.WRITE_ONLY, e + 2, b"\x03" * 16, **kw)  # a new gap: a new NAK
    p.inject(Opcode.WRITE_ONLY, e + 3, b"\x03" * 16, **kw)
    out = p.b_out()
    naks = [f.psn for f in out if f.syndrome == NAK_PSN_SEQ]
    assert naks == [e, psn_add(e, 1)]
    assert bytes(p.mr.buf[:16]) == b"\x02" * 16
    assert p.qb.stats.out_of_seq_dropped == 5


@pytest.mark.parametrize("case, opcode, payload_len, dmalen, prefix", [
    ("MIDDLE without FIRST", Opcode.WRITE_MIDDLE, 256, None, None),
    ("LAST without FIRST", Opcode.WRITE_LAST, 100, None, None),
    ("FIRST shorter than PMTU", Opcode.WRITE_FIRST, 200, 1000, None),
    ("ONLY above PMTU", Opcode.WRITE_ONLY, 260, 260, None),
    ("ONLY shorter than DMA length", Opcode.WRITE_ONLY, 100, 104, None),
    ("FIRST after FIRST", Opcode.WRITE_FIRST, 256, 1000, "first"),
    ("ONLY inside a WRITE", Opcode.WRITE_ONLY, 16, 16, "first"),
    ("MIDDLE shorter than PMTU", Opcode.WRITE_MIDDLE, 252, None, "first"),
    ("LAST not completing the DMA length", Opcode.WRITE_LAST, 100, None, "first"),
    ("MIDDLE where only LAST fits", Opcode.WRITE_MIDDLE, 256, None, "first300"),
    ("SEND is not supported", Opcode.SEND_ONLY, 16, None, None),
])
def test_sequencing_and_length_violations_are_fatal(case, opcode, payload_len, dmalen, prefix):
    p = Pair()
    e = p.qb.epsn
    reth = dict(va=p.mr.va, rkey=p.mr.rkey)
    if prefix:
        total = 1000 if prefix == "first" else 300
        p.inject(Opcode.WRITE_FIRST, e, bytes(256), dmalen=total, **reth)
        e += 1
    kw = dict(reth, dmalen=dmalen) if dmalen is not None else {}
    p.inject(opcode, e, bytes(payload_len), **kw)
    assert p.qb.state is QPState.ERROR, case
    err = p.qb.error
    assert isinstance(err, RCError) and err.psn == e % PSN_MOD
    assert p.qb.name in str(err) and f"PSN {e % PSN_MOD}" in str(err)
    out = p.b_out()
    assert [(f.psn, f.syndrome) for f in out] == [(e % PSN_MOD, NAK_INVALID_REQ)]
    # A never sent that PSN: its requester ignores the NAK as stale
    assert p.qa.state is QPState.RTS and p.qa.stats.stale_acks == 1
    # anything after the error is dropped
    p.inject(Opcode.WRITE_ONLY, e + 1, bytes(16), dmalen=16, **reth)
    assert p.b.stats["drop_qp_not_rts"] == 1


@pytest.mark.parametrize("bad", ["rkey", "range"])
def test_remote_access_violation(bad):
    p = Pair(size=4096)
    if bad == "rkey":
        p.qa.post_write(bytes(64), p.mr.va, p.mr.rkey ^ 1, imm=1)
    else:
        p.qa.post_write(bytes(512), p.mr.va + 4096 - 256, p.mr.rkey, imm=1)
    p.fab.run_until(lambda: p.qa.error is not None, 10**9)
    assert p.qb.state is QPState.ERROR and "remote access" in str(p.qb.error)
    naks = [f.syndrome for f in p.frames(src=MAC_B)]
    assert naks == [NAK_REMOTE_ACCESS]
    assert p.qa.state is QPState.ERROR and "remote access" in str(p.qa.error)
    assert not p.mr.buf.any()


def test_go_back_n_resumes_mid_message_with_middle_last():
    lost = 0x40  # drop the first transmission of the 10th packet of the message
    p = Pair(QPConfig(pmtu=256, timeout=10), a_psn=lost - 9,
             drop=lambda f, n: f.info.has_payload and f.psn == lost and n == 0)
    data = p.write(20 * 256 - 8)
    p.run()
    assert np.array_equal(p.mr.buf[:len(data)], data)
    fs = p.frames(data=True)
    first = [f.psn for f in fs]
    k = first.index(lost)  # the retransmission starts at the lost PSN
    assert first[k:] == list(range(lost, lost + 11))
    assert fs[k].opcode == Opcode.WRITE_MIDDLE and fs[-1].opcode == Opcode.WRITE_LAST_IMM
    naks = [f for f in p.frames(src=MAC_B) if f.syndrome == NAK_PSN_SEQ]
    assert [f.psn for f in naks] == [lost]
    assert p.qa.stats.naks_received == 1 and p.qa.stats.timeouts == 0
    assert p.qa.stats.retransmitted == 20 - 9
    assert len(p.recv) == 1


def test_lost_tail_recovers_by_timeout():
    p = Pair(QPConfig(pmtu=256, timeout=6), a_psn=0,
             drop=lambda f, n: f.info.has_payload and f.psn == 4 and n == 0)
    data = p.write(5 * 256)
    t0 = p.fab.now()
    p.run()
    assert np.array_equal(p.mr.buf[:len(data)], data)
    # nothing before the lost last packet asked for an ACK: go back to the oldest unacked PSN
    assert p.qa.stats.timeouts == 1 and p.qa.stats.retransmitted == 5
    assert p.qb.stats.duplicates == 4 and len(p.recv) == 1
    assert p.fab.now() - t0 >= timeout_ns(6)


def test_lost_ack_is_answered_by_duplicate_reack():
    p = Pair(QPConfig(pmtu=256, timeout=6),
             drop=lambda f, n: f.opcode == Opcode.ACK and n == 0)
    p.write(3 * 256)
    p.run()
    assert p.qa.stats.timeouts == 1 and p.qb.stats.duplicates == 3
    assert len(p.recv) == 1  # one completion: duplicates are not delivered again


def test_retry_limit_is_a_clear_error():
    p = Pair(QPConfig(pmtu=256, timeout=3, retry_cnt=2), a_psn=77,
             drop=lambda f, n: f.info.has_payload)
    p.write(300)
    p.run()
    err = p.qa.error
    assert isinstance(err, RCError) and p.qa.state is QPState.ERROR
    assert "retry limit" in str(err) and p.qa.name in str(err) and err.psn == 77
    assert p.qa.stats.timeouts == 3  # the first attempt plus 2 retries, then the error


def test_bad_icrc_dropped_silently_then_recovered():
    def corrupt(frame):
        f = parse(frame)
        if f.info.has_payload and f.psn == 2 and not corrupt.done:
            corrupt.done = True
            b = bytearray(frame)
            b[-10] ^= 0xFF  # payload byte, stale ICRC
            return bytes(b)
        return frame
    corrupt.done = False
    p = Pair(QPConfig(pmtu=256, timeout=8), a_psn=0)
    p.fab.tap = corrupt
    data = p.write(6 * 256)
    p.run()
    assert p.b.stats["drop_icrc"] == 1
    assert np.array_equal(p.mr.buf[:len(data)], data)
    assert p.qb.stats.naks_sent == 1


def test_filters_unknown_qp_wrong_source_and_cnp_count():
    p = Pair()
    f = RoceFrame(opcode=Opcode.WRITE_ONLY, psn=p.qb.epsn, payload=bytes(4), dqpn=p.qb.qpn + 50,
                  smac=MAC_A, dmac=MAC_B, src_ip=p.a.ip, dst_ip=p.b.ip, dmalen=4)
    p.b._deliver(f.pack())
    p.b._deliver(f.copy(dqpn=p.qb.qpn, src_ip=p.a.ip + 9).pack())
    p.a._deliver(RoceFrame.cnp(dqpn=p.qa.qpn, smac=MAC_B, dmac=MAC_A, src_ip=p.b.ip,
                               dst_ip=p.a.ip).pack())
    assert p.b.stats["drop_unknown_qp"] == 1 and p.b.stats["drop_wrong_src_ip"] == 1
    assert p.qa.stats.cnps == 1
    assert p.qb.epsn == p.qa.start_psn and not p.mr.buf.any()


def test_ect0_marking_option():
    p = Pair(QPConfig(pmtu=256, ecn=True))
    p.write(100)
    p.run()
    assert all(f.ecn == 0b10 for f in p.frames(data=True))


def test_watchdog_reports_a_deadlock():
    p = Pair(drop=lambda f, n: True, cfg=QPConfig(pmtu=256, timeout=2, retry_cnt=0))
    p.write(10)
    with pytest.raises(SimulationHang, match="no events left.*waiting"):
        p.fab.run_until(lambda: False, describe=lambda: "waiting for nothing")


_FIELDS = ("opcode", "dqpn", "psn", "payload", "dmac", "smac", "src_ip", "dst_ip", "tos", "pkey",
           "ackreq", "becn", "fecn", "va", "rkey", "dmalen", "imm", "syndrome", "msn")


@pytest.mark.parametrize("frame", [
    RoceFrame(opcode=Opcode.WRITE_FIRST, psn=5, payload=bytes(range(256)), va=1 << 40, rkey=9,
              dmalen=1000, ackreq=1, tos=2),
    RoceFrame(opcode=Opcode.WRITE_MIDDLE, psn=PSN_MOD - 1, payload=b"\x01" * 256, dqpn=0xABCDEF),
    RoceFrame(opcode=Opcode.WRITE_LAST_IMM, psn=7, payload=b"abc", imm=0xDEADBEEF),
    RoceFrame(opcode=Opcode.WRITE_ONLY_IMM, psn=7, payload=b"", imm=1, va=4, rkey=5, dmalen=0),
    RoceFrame.ack(77, msn=5, syndrome=NAK_PSN_SEQ),
    RoceFrame.cnp(dqpn=3),
])
def test_fast_parse_agrees_with_parse(frame):
    from netreduce.wire.view import parse_fast as _fast_parse

    raw = frame.pack()
    fast, ref = _fast_parse(raw), parse(raw)
    assert fast is not None
    assert {k: getattr(fast, k) for k in _FIELDS} == {k: getattr(ref, k) for k in _FIELDS}
    for i in (15, 30, 42, 60, len(raw) - 1):  # any corruption: fall back to parse()'s verdict
        bad = bytearray(raw)
        bad[i] ^= 0x40
        assert _fast_parse(bytes(bad)) is None  # (TOS: the IPv4 checksum catches it)
    tagged = RoceFrame(opcode=Opcode.WRITE_ONLY, payload=b"1234", dmalen=4, vlan_tci=5).pack()
    assert _fast_parse(tagged) is None and parse(tagged).payload == b"1234"
