"""Seeded randomised end-to-end runs of the reference model, plus malformed-input fuzzing.

N ranks' packets arrive in random interleavings (each sender limited to the window), with
duplicates, late retransmissions and cumulative ACK/NAKs; results must equal numpy's reduction
bit for bit, every flow must get every index, every frame must be accounted for, and all slots
must be free once every receiver has acknowledged everything.
"""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob, engine_with

from netreduce.regmap import DISPOSITIONS, Op
from netreduce.wire import ECN_CE, ECN_ECT0, Opcode, WireError, parse
from netreduce.wire.view import check as _parse
from netreduce.wire.view import l3_offset as _l3

MSG_OPS = {1: [Opcode.WRITE_ONLY_IMM],
           2: [Opcode.WRITE_FIRST, Opcode.WRITE_LAST_IMM]}


def _opcodes(n: int) -> list[int]:
    if n <= 2:
        return MSG_OPS[n]
    return [Opcode.WRITE_FIRST] + [Opcode.WRITE_MIDDLE] * (n - 2) + [Opcode.WRITE_LAST_IMM]


def _reference(op: Op, x: np.ndarray) -> np.ndarray:
    if op == Op.MAX:
        return x.max(axis=0)
    return x.sum(axis=0, dtype=np.int64).astype(np.int32)  # SUM_SAT runs never saturate


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_interleavings_bit_exact_and_all_freed(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    op = Op(int(rng.integers(0, 3)))
    window = 8
    pmtu = 256
    starts = [int(rng.integers(0, 1 << 24)) if rng.random() < 0.5
              else (1 << 24) - int(rng.integers(1, 20)) for _ in range(n)]  # wraps mid-run
    j = RingJob(world=n, window=window, pmtu=pmtu, op=op, start_psns=starts)
    eng, ctl = engine_with(j, ports=2)
    # messages of 1..4 packets; every rank posts the same message sizes
    opcodes: list[int] = []
    while len(opcodes) < 60:
        opcodes += _opcodes(int(rng.integers(1, 5)))
    kmax = len(opcodes)
    lanes = [pmtu // 4 if o in (Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE)
             else int(rng.integers(0, pmtu // 4 + 1)) for o in opcodes]
    lim = 1 << 27 if op == Op.SUM_SAT else 1 << 31
    data = [rng.integers(-lim, lim, size=(n, m), dtype=np.int64).astype(np.int32)
            for m in lanes]
    frames = {(r, k): j.data_bytes(r, k, data[k][r], opcode=opcodes[k],
                                   ecn=ECN_CE if rng.random() < 0.1 else ECN_ECT0)
              for r in range(n) for k in range(kmax)}
    want = [_reference(op, d) for d in data]

    nxt = [0] * n  # next index each rank sends
    got: dict[tuple[int, int], list[bytes]] = {}  # (flow, index) -> result payloads received
    delivered = [-1] * n  # highest index of flow r its receiver got in order
    emits = 0
    cnps = [0]

    def deliver(out, sent):
        nonlocal emits
        emits += len(out)
        for e in out:
            if e.frame in sent:
                continue  # forwarded unchanged (ACK)
            f = parse(e.frame)
            if f.opcode == Opcode.WRITE_MIDDLE and not f.payload:
                continue  # behind window: the duplicate probe (D15)
            if f.opcode == Opcode.CNP or f.opcode == Opcode.ACK:
                cnps[0] += f.opcode == Opcode.CNP
                continue
            assert f.ecn == ECN_ECT0
            r = next(r for r in range(n) if j.ip(r) == f.src_ip)
            assert e.port == r % 2
            k = (f.psn - starts[r]) % (1 << 24)
            got.setdefault((r, k), []).append(f.payload)
            if k == delivered[r] + 1:
                delivered[r] = k

    steps = 0
    while min(delivered) < kmax - 1:
        steps += 1
        assert steps < 50 * n * kmax, "no progress"
        r = int(rng.integers(0, n))
        free = eng.job_state(0)["free"]
        roll = rng.random()
        if roll < 0.12 and nxt[r] > 0:  # duplicate / retransmission of an older packet
            k = int(rng.integers(max(0, nxt[r] - 2 * window), nxt[r]))
        elif roll < 0.30:  # the receiver of flow r ACKs (sometimes NAKs) what it got
            if delivered[r] >= 0:
                a = j.ack(r, delivered[r]) if rng.random() < 0.8 else \
                    j.ack(r, delivered[r] + 1, nak=True)
                deliver(eng.receive(r % 2, a, steps), {a})
            continue
        elif nxt[r] < kmax and nxt[r] < free + window:
            k = nxt[r]
            nxt[r] += 1
        else:
            continue
        f = frames[(r, k)]
        deliver(eng.receive(r % 2, f, steps), {f})
    for r in range(n):
        a = j.ack(r, kmax - 1)
        deliver(eng.receive(r % 2, a, steps), {a})

    for r in range(n):
        for k in range(kmax):
            res = got.get(((r + 0) % n, k))
            assert res, f"flow {r} index {k} got no result"
            assert all(p == want[k].tobytes() for p in res), (r, k)
    assert ctl.slots_in_use() == 0 and eng.job_state(0)["free"] == kmax
    c = eng.counters()
    assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS)
    assert c["tx_frames"] == emits
    assert c["released"] == kmax and c["results_sent"] == n * kmax
    assert c["saturations"] == 0 and c["drop_ahead"] == 0
    assert c["duplicates"] and c["reemits"] and c["behind_window"] and c["fwd_nak"]
    assert c["cnp_sent"] == cnps[0] > 0
    assert sum(c[d] for d in DISPOSITIONS if d.startswith("drop_")) == 0


def _mutate(rng, frame: bytes) -> bytes:
    b = bytearray(frame)
    kind = rng.integers(0, 4)
    if kind == 0:
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1:
        b = b[:int(rng.integers(0, len(b)))]
    elif kind == 2:
        b += bytes(int(rng.integers(1, 9)))
    else:
        i = int(rng.integers(14, min(len(b), 70)))
        b[i] = int(rng.integers(0, 256))
    return bytes(b)


def test_fuzz_malformed_frames_counted_never_change_results():
    rng = np.random.default_rng(99)
    j = RingJob(world=3, window=8, pmtu=256)
    eng, _ = engine_with(j)
    x = rng.integers(-1000, 1000, size=(8, 3, 24), dtype=np.int64).astype(np.int32)
    good = {(r, k): j.data_bytes(r, k, x[k][r]) for r in range(3) for k in range(8)}
    acks = j.ack_all(3)
    results = []
    for k in range(8):
        for r in range(3):
            for _ in range(6):
                src = good[(int(rng.integers(0, 3)), int(rng.integers(0, 8)))] \
                    if rng.random() < 0.8 else acks[int(rng.integers(0, 3))]
                bad = _mutate(rng, src)
                if bad in good.values() or bad in acks:
                    continue
                # the model's parser agrees with netreduce.wire.parse on every RoCE frame
                try:
                    parse(bad)
                    wire_reason = None
                except WireError as e:
                    wire_reason = e.reason
                if len(bad) >= 58 and wire_reason not in ("ethertype", "ip_version", "ihl",
                                                          "fragment", "protocol", "udp_port",
                                                          "truncated"):
                    p = _parse(bad, _l3(bad))
                    assert (p if isinstance(p, str) else None) == wire_reason
                for e in eng.receive(0, bad, 0):
                    assert e.frame == bad or parse(e.frame).opcode in (
                        Opcode.CNP, Opcode.WRITE_MIDDLE)  # CNP, or a behind-window probe (D15)
            results += eng.receive(0, good[(r, k)], 0)
        if k == 3:
            for a in acks:
                eng.receive(0, a, 0)
    assert len(results) == 24
    for i, e in enumerate(results):
        k = i // 3
        assert np.array_equal(np.frombuffer(parse(e.frame).payload, "<i4"),
                              x[k].sum(axis=0, dtype=np.int32))
    c = eng.counters()
    assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS)
    assert c["contributions"] == 24
    assert c["drop_icrc"] and c["drop_length"] and c["fwd_ctrl_invalid"] and c["fwd_not_roce"]
