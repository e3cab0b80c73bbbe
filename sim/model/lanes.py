"""Per-port contribution lanes (model decision D20, docs/design.md section 10).

An engine built with ``lanes = ports`` (> 1) aggregates each port's contributions in that port's
own lane, in that port's arrival order, and combines the lane partials when the slot completes:
lanes in port order 0..P-1, the first lane that holds a partial copied, each further one added
(SUM_WRAP wraps, SUM_SAT saturates, MAX takes the maximum). For SUM_WRAP and MAX the result is the
same as with one lane (both are associative and commutative); for SUM_SAT it differs only when a
lane or the combination clips. ``saturations`` counts every contribution that clipped inside its
lane, plus every combining addition that clipped at least one element. With ``lanes = 1`` nothing
here runs and D6 holds unchanged.
"""

from __future__ import annotations

import numpy as np

from netreduce.regmap import Op

__all__ = ["add", "combine"]

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def add(op: int, acc: np.ndarray, x: np.ndarray) -> bool:
    """acc = acc (op) x in place (int32 lanes); True if SUM_SAT clipped an element."""
    if op == Op.SUM_WRAP:
        np.add(acc, x, out=acc)
    elif op == Op.MAX:
        np.maximum(acc, x, out=acc)
    else:
        t = acc.astype(np.int64)
        t += x
        if t.size and (t.max() > _I32_MAX or t.min() < _I32_MIN):
            np.clip(t, _I32_MIN, _I32_MAX, out=t)
            acc[:] = t
            return True
        acc[:] = t
    return False


def combine(op: int, parts: dict[int, np.ndarray]) -> tuple[np.ndarray, int]:
    """The slot's aggregate from its lane partials (port -> partial): lanes in port order, the
    first copied; returns (aggregate, number of combining additions that clipped)."""
    order = sorted(parts)
    acc = parts[order[0]].copy()
    clipped = 0
    for p in order[1:]:
        clipped += add(op, acc, parts[p])
    return acc, clipped
