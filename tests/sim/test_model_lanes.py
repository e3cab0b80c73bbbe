"""Model decision D20: per-port contribution lanes (``Engine(lanes=ports)``).

Each port's contributions are combined in that port's arrival order, the port partials in port
order 0..P-1 when the slot completes. Only SUM_SAT with clipping can tell it from D6.
"""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob, engine_with

from netreduce.regmap import Op
from netreduce.wire import parse

I32_MAX, I32_MIN = 2**31 - 1, -2**31


def vals(frame: bytes) -> np.ndarray:
    return np.frombuffer(parse(frame).payload, dtype="<i4")


def sat_add(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, bool]:
    t = a.astype(np.int64) + b
    return np.clip(t, I32_MIN, I32_MAX), bool(np.any((t > I32_MAX) | (t < I32_MIN)))


def lanes_ref(op: Op, arrivals: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, int]:
    """D20 written out independently: per port in arrival order, then ports in order."""
    part: dict[int, np.ndarray] = {}
    sat = 0
    for port, x in arrivals:
        if port not in part:
            part[port] = x.astype(np.int64)
        elif op == Op.SUM_SAT:
            part[port], s = sat_add(part[port], x)
            sat += s
        elif op == Op.MAX:
            part[port] = np.maximum(part[port], x)
        else:
            part[port] = part[port] + x
    acc = None
    for port in sorted(part):
        if acc is None:
            acc = part[port]
        elif op == Op.SUM_SAT:
            acc, s = sat_add(acc, part[port])
            sat += s
        elif op == Op.MAX:
            acc = np.maximum(acc, part[port])
        else:
            acc = acc + part[port]
    wrapped = (acc + (1 << 31)) % (1 << 32) - (1 << 31)
    return wrapped.astype(np.int32), sat


def run(op: Op, lanes: int, arrivals: list[tuple[int, int, np.ndarray]], ports: int = 2):
    j = RingJob(world=len(arrivals), window=4, op=op)
    eng, ctl = engine_with(j, ports=ports, lanes=lanes)
    out = []
    for port, r, x in arrivals:
        out += eng.receive(port, j.data_bytes(r, 0, x), 0)
    return out, eng, ctl


BIG = np.array([I32_MAX, I32_MIN, 2**30, -5], dtype=np.int32)
NEG = np.array([-I32_MAX, I32_MAX, 2**30, 5], dtype=np.int32)


@pytest.mark.parametrize("op", list(Op))
def test_lanes_match_reference_and_d6_where_order_free(op):
    # ranks 0, 2 on port 1; ranks 1, 3 on port 0: port 1 clips first for SUM_SAT
    rows = [BIG, NEG, BIG, np.array([1, -1, 2**30, 0], dtype=np.int32)]
    arr = [(1, 0, rows[0]), (0, 1, rows[1]), (1, 2, rows[2]), (0, 3, rows[3])]
    out, eng, ctl = run(op, 2, arr)
    want, sat = lanes_ref(op, [(p, x) for p, _, x in arr])
    assert len(out) == 4 and all(np.array_equal(vals(e.frame), want) for e in out)
    assert eng.counters(0)["saturations"] == sat
    assert ctl.job_status(0).saturated == (sat > 0)
    # result r leaves on the port its own frame came in on (D13)
    assert [e.port for e in out] == [1, 0, 1, 0]
    d6, eng1, _ = run(op, 1, arr)
    same = all(np.array_equal(vals(a.frame), vals(b.frame)) for a, b in zip(out, d6, strict=True))
    if op == Op.SUM_SAT:
        assert sat > 0 and not same  # clipping in another order: D20 differs from D6
    else:
        assert same and eng1.counters(0)["saturations"] == 0


def test_lanes_one_port_used_is_d6():
    """All frames on one port: one lane, the same arrival order as D6."""
    arr = [(1, r, x) for r, x in enumerate([BIG, NEG, BIG, BIG])]
    a, ea, _ = run(Op.SUM_SAT, 2, arr)
    b, eb, _ = run(Op.SUM_SAT, 1, arr)
    assert [e.frame for e in a] == [e.frame for e in b]
    assert ea.counters(0)["saturations"] == eb.counters(0)["saturations"] > 0


def test_lanes_combine_clip_counted_and_reemit_keeps_result():
    # each lane alone stays in range; only the combination clips (one saturation)
    x = np.array([2**30 + 2**29], dtype=np.int32)
    arr = [(0, 0, x), (1, 1, x), (2, 2, -x), (3, 3, -x)]
    out, eng, _ = run(Op.SUM_SAT, 4, arr, ports=4)
    want, sat = lanes_ref(Op.SUM_SAT, [(p, v) for p, _, v in arr])
    assert sat == 1 and eng.counters(0)["saturations"] == 1
    assert list(vals(out[0].frame)) == list(want) == [I32_MAX - (2**30 + 2**29) * 2]
    j = RingJob(world=4, window=4, op=Op.SUM_SAT)
    again = eng.receive(2, j.data_bytes(2, 0, -x), 0)  # retransmission after release: re-emit
    assert len(again) == 1 and again[0].port == 2 and np.array_equal(vals(again[0].frame), want)


def test_lanes_parameter_checked():
    with pytest.raises(ValueError, match="lanes = 3 must be 1 or ports = 2"):
        engine_with(ports=2, lanes=3)
