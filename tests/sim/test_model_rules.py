"""One test per rule of docs/design.md section 4, against the reference model (netreduce.sim.model).

Frames are hand-built with netreduce.wire.RoceFrame through netreduce.sim.model.kit.RingJob.
"""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.kit import RingJob, engine_with

from netreduce.regmap import DISPOSITIONS, Op
from netreduce.wire import (
    ECN_CE,
    ECN_ECT0,
    ECN_ECT1,
    ECN_NOT_ECT,
    Opcode,
    ipv4_checksum,
    parse,
)

PSN_MOD = 1 << 24


def vals(frame: bytes) -> np.ndarray:
    return np.frombuffer(parse(frame).payload, dtype="<i4")


def rnd(seed: int, ranks: int, lanes: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-(1 << 31), 1 << 31, size=(ranks, lanes), dtype=np.int64).astype(np.int32)


def feed(eng: Engine, frames, port: int = 0, time: int = 0):
    out = []
    for f in frames:
        out += eng.receive(port, f, time)
    return out


def wsum(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=0, dtype=np.int64).astype(np.int32)  # two's complement wrap


def full_index(eng, j: RingJob, k: int, x: np.ndarray, **kw):
    return feed(eng, [j.data_bytes(r, k, x[r], **kw) for r in range(j.world)])


def check_accounting(eng: Engine) -> None:
    c = eng.counters()
    assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS), c


# ---------------------------------------------------------------------------------------- index
def test_rule_index_and_slot():
    """k = (p - S_r) mod 2^24 and slot s = base_j + (k mod W)."""
    j = RingJob(world=3, window=8, slot_base=5, start_psns=[PSN_MOD - 2, 7, 123456])
    eng, _ = engine_with(j)
    x = rnd(1, 3)
    assert j.data(0, 3, x[0]).psn == 1  # rank 0's index 3 sits across the PSN wrap
    feed(eng, [j.data_bytes(0, 3, x[0]), j.data_bytes(1, 3, x[1])])
    assert eng.job_state(0)["slots"] == {5 + 3: (3, "FILLING", 0b011)}
    # Rank 2 sending rank 0's PSN of index 3 is rank 2's index (1 - 123456) mod 2^24: far
    # behind/ahead, never slot 8.
    f = j.data(2, 3, x[2]).copy(psn=1).pack()
    eng.receive(0, f, 0)
    assert eng.counters(0)["contributions"] == 2
    assert eng.job_state(0)["slots"] == {8: (3, "FILLING", 0b011)}
    out = feed(eng, [j.data_bytes(2, 3, x[2])])
    assert out == []  # index 3 complete but 0..2 not yet released
    assert eng.job_state(0)["slots"] == {8: (3, "COMPLETE", 0b111)}
    # Index 11 maps to the same slot (11 mod 8 = 3) but lies beyond the window.
    eng.receive(0, j.data_bytes(0, 11, x[0]), 0)
    assert eng.counters(0)["drop_ahead"] == 1


# --------------------------------------------------------------------------------------- window
def test_rule_window_ahead_dropped_and_counted():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    x = rnd(2, 2)
    assert eng.receive(0, j.data_bytes(0, 4, x[0]), 0) == []  # k = free + W
    assert eng.receive(0, j.data_bytes(0, (1 << 23) - 1, x[0]), 0) == []  # far ahead
    assert eng.counters(0)["drop_ahead"] == 2 and eng.slots_in_use(0) == 0
    eng.receive(0, j.data_bytes(0, 3, x[0]), 0)  # free + W - 1 is inside
    assert eng.slots_in_use(0) == 1
    # Slot of index 0 still RELEASED (not acked): index 4 (same slot, next generation) is ahead.
    assert len(full_index(eng, j, 0, x)) == 2
    assert feed(eng, [j.data_bytes(0, 4, x[0])]) == []
    assert eng.counters(0)["drop_ahead"] == 3
    feed(eng, j.ack_all(0))  # index 0 freed: the window moves to 1..4
    feed(eng, [j.data_bytes(0, 4, x[0])])
    assert eng.job_state(0)["slots"][4 % 4] == (4, "FILLING", 0b01)
    check_accounting(eng)


def test_rule_window_behind_forwarded_unchanged():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    x = rnd(3, 2)
    for k in range(2):
        full_index(eng, j, k, x)
    feed(eng, j.ack_all(1))
    before = eng.job_state(0)
    assert before["free"] == 2
    late = j.data_bytes(1, 0, x[1] + 5)
    out = eng.receive(0, late, 9)
    # D15 (issue 9): forwarded as a duplicate probe, never with its raw payload
    assert [(e.port, e.time) for e in out] == [(0, 9)]
    pr, lt = parse(out[0].frame), parse(late)
    assert (pr.opcode, pr.payload, pr.psn, pr.dqpn, pr.src_ip) == \
        (Opcode.WRITE_MIDDLE, b"", lt.psn, lt.dqpn, lt.src_ip)
    far = j.data_bytes(0, 2 - (1 << 23), x[0])  # the most negative distance is still behind
    assert parse(eng.receive(0, far, 9)[0].frame).psn == parse(far).psn
    assert eng.counters(0)["behind_window"] == 2
    assert eng.job_state(0) == before


# --------------------------------------------------------------------------------------- checks
def _bad_frames(j: RingJob, x):
    good = j.data(1, 0, x[1])
    raw = bytearray(good.pack())
    l3 = 14
    icrc = bytearray(raw)
    icrc[-1] ^= 0x01
    payload_flip = bytearray(raw)
    payload_flip[80] ^= 0x40  # a payload byte: only the ICRC catches it
    csum = bytearray(raw)
    csum[l3 + 10] ^= 0xFF  # the checksum is masked in the ICRC: only the IPv4 check fails
    trunc = bytes(raw[:-4])
    read_req = bytearray(raw)
    read_req[l3 + 28] = 0x0C  # RDMA READ request: not an opcode the engine aggregates
    read_req = bytes(read_req)
    udp = bytearray(raw)
    udp[l3 + 20 + 5] ^= 0x04  # UDP length no longer matches the IPv4 total length
    return {
        "drop_icrc": [bytes(icrc), bytes(payload_flip)],
        "drop_ip_checksum": [bytes(csum)],
        "drop_length": [trunc, bytes(udp)],
        "drop_opcode": [good.copy(opcode=Opcode.UC_WRITE_ONLY).pack(),
                        good.copy(tver=1).pack(), read_req],
        "drop_pmtu": [good.copy(payload=bytes(j.pmtu + 4)).pack()],
        "drop_align": [good.copy(payload=bytes(len(good.payload) - 2)).pack()],
        "drop_mismatch": [good.copy(payload=bytes(len(good.payload) - 4)).pack(),
                          good.copy(opcode=Opcode.WRITE_ONLY_IMM).pack()],
    }


@pytest.mark.parametrize("reason", ["drop_icrc", "drop_ip_checksum", "drop_length", "drop_opcode",
                                    "drop_pmtu", "drop_align", "drop_mismatch"])
def test_rule_checks_drop_count_no_state_change(reason):
    j = RingJob(world=2, window=4, pmtu=256)
    eng, ctl = engine_with(j)
    x = rnd(4, 2)
    eng.receive(0, j.data_bytes(0, 0, x[0]), 0)
    before = eng.job_state(0)
    bad = _bad_frames(j, x)[reason]
    for f in bad:
        assert eng.receive(0, f, 0) == []
    c = eng.counters(0)
    assert c[reason] == len(bad)
    assert sum(c[d] for d in DISPOSITIONS if d.startswith("drop_")) == len(bad)
    assert eng.job_state(0) == before
    assert ctl.job_status(0).mismatch == (reason == "drop_mismatch")
    out = eng.receive(0, j.data_bytes(1, 0, x[1]), 0)
    assert len(out) == 2 and all(np.array_equal(vals(e.frame), wsum(x)) for e in out)
    check_accounting(eng)


# ------------------------------------------------------------------------------------ slot life
def test_rule_slot_life_and_generation_overwrite():
    j = RingJob(world=2, window=2)
    eng, ctl = engine_with(j)
    x, y = rnd(5, 2), rnd(6, 2)
    assert eng.job_state(0)["slots"] == {}  # EMPTY
    feed(eng, [j.data_bytes(0, 1, x[0])])
    assert eng.job_state(0)["slots"] == {1: (1, "FILLING", 1)}
    feed(eng, [j.data_bytes(1, 1, x[1])])
    assert eng.job_state(0)["slots"] == {1: (1, "COMPLETE", 3)}
    out = full_index(eng, j, 0, x)
    assert len(out) == 4
    assert eng.job_state(0)["slots"] == {0: (0, "RELEASED", 3), 1: (1, "RELEASED", 3)}
    assert ctl.slots_in_use(0) == 2
    feed(eng, j.ack_all(1))
    assert eng.job_state(0)["slots"] == {} and ctl.slots_in_use() == 0  # freed
    out = full_index(eng, j, 2, y)  # same slot as index 0: the new generation starts fresh
    assert [vals(e.frame).tolist() for e in out] == [wsum(y).tolist()] * 2


# --------------------------------------------------------------------------------- contribution
def test_rule_contribution_duplicate_while_filling():
    j = RingJob(world=3, window=4)
    eng, _ = engine_with(j)
    x = rnd(7, 3)
    feed(eng, [j.data_bytes(0, 0, x[0], ident=1), j.data_bytes(1, 0, x[1])])
    dup = j.data_bytes(0, 0, x[0] ^ 0x5A5A, ident=2)  # same PSN, other bytes and header
    assert feed(eng, [dup]) == []
    assert eng.counters(0)["duplicates"] == 1
    assert eng.job_state(0)["slots"][0] == (0, "FILLING", 0b011)
    out = feed(eng, [j.data_bytes(2, 0, x[2])])
    assert len(out) == 3 and all(np.array_equal(vals(e.frame), wsum(x)) for e in out)
    assert parse(out[0].frame).ident == 1  # flow 0's result: header of its first frame


def test_rule_contribution_duplicate_while_complete():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    x0, x1 = rnd(8, 2), rnd(9, 2)
    full_index(eng, j, 1, x1)
    assert feed(eng, [j.data_bytes(1, 1, x0[1])]) == []
    assert eng.counters(0)["duplicates"] == 1 and eng.counters(0)["reemits"] == 0
    out = full_index(eng, j, 0, x0)  # the result of index 1 follows in order, unaffected
    assert [vals(e.frame).tolist() for e in out] == [wsum(x0).tolist()] * 2 + \
        [wsum(x1).tolist()] * 2


def test_rule_reemit_after_release_to_that_flow_only():
    j = RingJob(world=3, window=4)
    eng, _ = engine_with(j, ports=2)
    x = rnd(10, 3)
    for r in range(3):
        eng.receive(r % 2, j.data_bytes(r, 0, x[r]), 0)
    retx = j.data_bytes(2, 0, x[2])
    out = eng.receive(1, retx, 77)
    assert len(out) == 1 and out[0].port == 1 and out[0].time == 77
    f = parse(out[0].frame)
    assert (f.src_ip, f.dst_ip, f.dqpn) == (j.ip(2), j.ip(0), j.rq(0))
    assert np.array_equal(vals(out[0].frame), wsum(x))
    assert eng.counters(0)["reemits"] == 1 and eng.counters(0)["results_sent"] == 3
    assert eng.job_state(0)["slots"][0] == (0, "RELEASED", 0b111)


# -------------------------------------------------------------------------------------- release
def test_rule_release_in_index_order():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    xs = [rnd(20 + k, 2) for k in range(3)]
    assert full_index(eng, j, 2, xs[2]) == []
    assert full_index(eng, j, 1, xs[1]) == []
    out = full_index(eng, j, 0, xs[0])
    got = [(parse(e.frame).psn, parse(e.frame).src_ip, vals(e.frame).tolist()) for e in out]
    want = [(j.psn(r, k), j.ip(r), wsum(xs[k]).tolist()) for k in range(3) for r in range(2)]
    assert got == want
    assert eng.counters(0)["released"] == 3


# -------------------------------------------------------------------------------- result packet
@pytest.mark.parametrize("vlan", [None, 0x2064])
def test_rule_result_packet_is_own_packet_with_aggregate(vlan):
    j = RingJob(world=4, window=8, vlan_tci=vlan)
    eng, _ = engine_with(j, ports=2)
    x = rnd(11, 4, lanes=5)
    ins = {}
    opcodes = [Opcode.WRITE_ONLY_IMM, Opcode.SEND_ONLY, Opcode.WRITE_FIRST, Opcode.SEND_LAST_IMM]
    for k, opc in enumerate(opcodes):
        for r in range(4):
            f = j.data_bytes(r, k, x[r], opcode=opc, imm=0xABC0 + r, ident=r + 7 * k,
                             ttl=60 + r, se=1, ackreq=r & 1)
            ins[(k, r)] = f
    # zero-length packets (padded to 60 bytes on the wire) aggregate too
    for r in range(4):
        ins[(4, r)] = j.data_bytes(r, 4, b"", opcode=Opcode.SEND_ONLY)
    out = []
    for k in range(5):
        for r in range(4):
            out += eng.receive(r % 2, ins[(k, r)], k)
    assert len(out) == 20
    for e, (k, r) in zip(out, [(k, r) for k in range(5) for r in range(4)], strict=True):
        orig, res = parse(ins[(k, r)]), parse(e.frame)  # parse() verifies ICRC and checksum
        assert e.port == r % 2 and len(e.frame) == len(ins[(k, r)])
        want = wsum(x).tobytes() if k < 4 else b""
        assert res.payload == want
        assert res.copy(payload=b"") == orig.copy(payload=b"")  # every header field kept
        if k < 4:  # header bytes identical (the zero-length frames end in Ethernet padding)
            off = len(ins[(k, r)]) - 4 - len(want)
            assert e.frame[:off] == ins[(k, r)][:off]


def test_rule_result_ecn():
    """CE becomes ECT(0) (IPv4 checksum recomputed); every other codepoint is kept."""
    j = RingJob(world=4, window=4)
    eng, _ = engine_with(j)
    x = rnd(12, 4)
    ecns = [ECN_CE, ECN_ECT1, ECN_ECT0, ECN_NOT_ECT]
    out = feed(eng, [j.data(r, 0, x[r]).copy(tos=(26 << 2) | ecns[r]).pack() for r in range(4)])
    res = [e for e in out if parse(e.frame).opcode != Opcode.CNP]
    assert [parse(e.frame).tos for e in res] == [(26 << 2) | e for e in
                                                 (ECN_ECT0, ECN_ECT1, ECN_ECT0, ECN_NOT_ECT)]
    hdr = res[0].frame[14:34]
    assert int.from_bytes(hdr[10:12], "big") == ipv4_checksum(hdr)


# -------------------------------------------------------------------------------------- freeing
def test_rule_freeing_by_ack_nak_snooping():
    j = RingJob(world=3, window=4, start_psns=[PSN_MOD - 2, 5, 0])
    eng, ctl = engine_with(j)
    x = rnd(13, 3)
    for k in range(4):
        full_index(eng, j, k, x)
    assert ctl.slots_in_use(0) == 4
    feed(eng, [j.ack(0, 3), j.ack(1, 1)])  # cumulative: flow 0 acks 0..3 (across PSN wrap)
    assert eng.job_state(0)["free"] == 0  # flow 2 acked nothing
    feed(eng, [j.ack(2, 2, nak=True)])  # NAK-sequence at 2 acknowledges 0..1
    st = eng.job_state(0)
    assert (st["free"], st["acked"]) == (2, [4, 2, 2])
    assert ctl.slots_in_use(0) == 2 and ctl.job_status(0).free_ptr == 2
    feed(eng, [j.ack(1, 9), j.ack(1, 0)])  # beyond release / not ahead: ignored
    assert eng.counters(0)["ack_stale"] == 2 and eng.job_state(0)["acked"][1] == 2
    feed(eng, [j.ack(1, 3), j.ack(2, 3)])
    assert eng.job_state(0)["free"] == 4 and ctl.slots_in_use(0) == 0
    assert eng.counters(0)["freed"] == 4


def test_rule_ack_nak_cnp_forwarded_unchanged():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j, ports=2)
    full_index(eng, j, 0, rnd(14, 2))
    other = RingJob(job=5, world=2)  # never registered
    frames = [j.ack(0, 0), j.ack(1, 0, nak=True), j.receiver_cnp(0), other.ack(0, 0),
              other.receiver_cnp(1), j.ack(0, 0, syndrome=0x20)]  # RNR NAK
    for i, f in enumerate(frames):
        out = eng.receive(1, f, i)
        assert [(e.port, e.frame, e.time) for e in out] == [(1, f, i)]
    c = eng.counters(0)
    assert (c["fwd_ack"], c["fwd_nak"], c["fwd_cnp"]) == (1, 2, 1)
    assert eng.counters()["fwd_unregistered"] == 2


# ----------------------------------------------------------------------------------- congestion
def test_rule_cnp_for_ce_contribution_rate_limited_per_flow():
    j = RingJob(world=2, window=8, cnp_interval=100, vlan_tci=0x0005)
    eng, _ = engine_with(j, ports=2)
    x = rnd(15, 2)

    def ce(r, k, t, port=0):
        f = j.data(r, k, x[r]).copy(tos=(10 << 2) | ECN_CE).pack()
        return [parse(e.frame) for e in eng.receive(port, f, t)
                if parse(e.frame).opcode == Opcode.CNP], f

    cnps, f = ce(0, 0, 1000, port=1)
    assert len(cnps) == 1
    c = cnps[0]
    d = parse(f)
    assert (c.dmac, c.smac, c.vlan_tci) == (d.smac, d.dmac, d.vlan_tci)
    assert (c.src_ip, c.dst_ip, c.dqpn, c.psn, c.becn, c.fecn) == \
        (j.ip(1), j.ip(0), j.sq(0), 0, 1, 0)
    assert (c.tos, c.ttl, c.pkey, c.sport) == (10 << 2, 64, d.pkey, d.sport)
    assert ce(0, 1, 1099)[0] == []  # same flow inside the interval
    assert len(ce(1, 0, 1050)[0]) == 1  # another flow has its own limiter
    assert len(ce(0, 2, 1100)[0]) == 1  # interval elapsed
    c = eng.counters(0)
    assert (c["cnp_sent"], c["cnp_suppressed"]) == (3, 1)
    # CNP emitted on the port the CE-marked contribution came in on
    out = eng.receive(1, j.data(1, 3, x[1]).copy(tos=ECN_CE).pack(), 5000)
    assert [e.port for e in out if parse(e.frame).opcode == Opcode.CNP] == [1]


# ----------------------------------------------------------------------------------- arithmetic
def _seq_ref(op: Op, rows: np.ndarray) -> tuple[np.ndarray, int]:
    acc = rows[0].astype(np.int64)
    sat = 0
    for row in rows[1:]:
        if op == Op.SUM_WRAP:
            acc = (acc + row + (1 << 31)) % (1 << 32) - (1 << 31)
        elif op == Op.MAX:
            acc = np.maximum(acc, row)
        else:
            t = acc + row
            sat += bool(np.any((t > 2**31 - 1) | (t < -2**31)))
            acc = np.clip(t, -2**31, 2**31 - 1)
    return acc.astype(np.int32), sat


@pytest.mark.parametrize("op", list(Op))
def test_rule_arithmetic(op):
    j = RingJob(world=4, window=4, op=op)
    eng, ctl = engine_with(j)
    big = np.array([2**31 - 1, -2**31, 2**30, -5, 7, 0, 2**31 - 2, -1], dtype=np.int32)
    rows = np.stack([big, big, -big.astype(np.int64).clip(-2**31, 2**31 - 1).astype(np.int32),
                     np.arange(8, dtype=np.int32) - 4])
    order = [2, 0, 3, 1]  # arrival order matters for SUM_SAT only
    out = feed(eng, [j.data_bytes(r, 0, rows[r]) for r in order])
    want, sat = _seq_ref(op, rows[order])
    assert all(np.array_equal(vals(e.frame), want) for e in out) and len(out) == 4
    if op == Op.SUM_WRAP:
        assert np.array_equal(want, wsum(rows))
    if op == Op.MAX:
        assert np.array_equal(want, rows.max(axis=0))
    assert eng.counters(0)["saturations"] == sat
    assert ctl.job_status(0).saturated == (sat > 0)
    if op == Op.SUM_SAT:
        assert sat > 0


# ------------------------------------------------------------------------------------- counters
def test_rule_bad_input_and_bypass_never_touch_state():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    x = rnd(16, 2)
    feed(eng, [j.data_bytes(0, 0, x[0])])
    before = eng.job_state(0)
    good = j.data(1, 0, x[1]).pack()
    junk = [b"", b"\x01" * 13, bytes(60), good[:12] + b"\x86\xdd" + good[14:],  # IPv6
            good[:14 + 9] + b"\x06" + good[14 + 10:],  # TCP
            good[:14 + 22] + b"\x12\xb8" + good[14 + 24:],  # UDP port 4792
            good[:50],  # RoCE but cut inside the BTH
            RingJob(job=3).data_bytes(1, 0, x[1])]  # unregistered key
    for f in junk:
        out = eng.receive(0, f, 0)
        assert [e.frame for e in out] == [f]
    c = eng.counters()
    assert (c["fwd_not_roce"], c["fwd_unregistered"]) == (6, 2)
    assert eng.job_state(0) == before
    out = eng.receive(0, good, 0)
    assert all(np.array_equal(vals(e.frame), wsum(x)) for e in out) and len(out) == 2
    check_accounting(eng)


def test_job_isolation():
    """Two jobs with interleaved traffic at the same PSNs: neither touches the other's slots."""
    a = RingJob(job=0, world=2, window=4, slot_base=0, start_psns=[100, 100])
    b = RingJob(job=1, world=3, window=4, slot_base=4, start_psns=[100, 100, 100], op=Op.MAX)
    eng, _ = engine_with(a, b)
    xa, xb = rnd(30, 2), rnd(31, 3)
    feed(eng, [a.data_bytes(0, 0, xa[0]), b.data_bytes(0, 0, xb[0]), b.data_bytes(1, 0, xb[1])])
    assert eng.job_state(0)["slots"] == {0: (0, "FILLING", 0b01)}
    assert eng.job_state(1)["slots"] == {4: (0, "FILLING", 0b011)}
    out_a = feed(eng, [a.data_bytes(1, 0, xa[1])])
    out_b = feed(eng, [b.data_bytes(2, 0, xb[2])])
    assert [vals(e.frame).tolist() for e in out_a] == [wsum(xa).tolist()] * 2
    assert [vals(e.frame).tolist() for e in out_b] == [xb.max(axis=0).tolist()] * 3
    feed(eng, b.ack_all(0))  # job 1's ACKs free job 1 only
    assert eng.slots_in_use(0) == 1 and eng.slots_in_use(1) == 0
    # a bad frame of job 1 never flags or counts in job 0
    feed(eng, [b.data_bytes(0, 1, b"\0" * 8), b.data_bytes(1, 1, b"\0" * 4)])
    assert eng.counters(1)["drop_mismatch"] == 1 and eng.counters(0)["drop_mismatch"] == 0
    assert eng.counters(0)["contributions"] == 2 and eng.counters(1)["contributions"] == 4


def test_psn_wrap_mid_message():
    """A 5-packet WRITE whose PSNs wrap from 2^24 - 2 to 2 aggregates and frees normally."""
    j = RingJob(world=2, window=8, pmtu=256, start_psns=[PSN_MOD - 2, PSN_MOD - 3])
    eng, ctl = engine_with(j)
    ops = [Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_MIDDLE, Opcode.WRITE_MIDDLE,
           Opcode.WRITE_LAST_IMM]
    rng = np.random.default_rng(32)
    xs = [rng.integers(-9, 9, size=(2, 64 if k < 4 else 12), dtype=np.int32) for k in range(5)]
    out = []
    for k in (2, 0, 4, 1, 3):  # out of order across the wrap
        out += feed(eng, [j.data_bytes(r, k, xs[k][r], opcode=ops[k]) for r in range(2)])
    got = [(parse(e.frame).psn, vals(e.frame).tolist()) for e in out]
    assert got == [(j.psn(r, k), wsum(xs[k]).tolist()) for k in range(5) for r in range(2)]
    assert j.psn(0, 2) == 0 and j.psn(1, 4) == 1
    feed(eng, j.ack_all(4))
    assert ctl.slots_in_use() == 0 and eng.job_state(0)["free"] == 5
    check_accounting(eng)
