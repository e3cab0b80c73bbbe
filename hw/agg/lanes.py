"""Lane ALU: element-wise combination of one data beat with the slot's stored beat.

A beat of ``width`` bits is ``width // 32`` int32 lanes in host memory order: lane ``i`` is bytes
``4i .. 4i+3`` of the beat with byte ``4i`` the least significant (little-endian), and beat byte
``k`` is ``data[8k : 8k+8]`` (AXI-Stream byte order), so lane ``i`` is ``data[32i : 32i+32]``.

Operations (docs/design.md section 4, "Arithmetic"), per lane, ``acc`` = stored value, ``contrib`` =
incoming value, both signed int32:

* ``SUM_WRAP``: ``(acc + contrib) mod 2**32`` (two's complement wrap-around).
* ``SUM_SAT``: ``acc + contrib`` clamped to ``[-2**31, 2**31 - 1]``; the lane's ``sat`` flag is
  set when clamping happened, so the aggregator can bump the job's saturation counter.
* ``MAX``: signed maximum.
* ``first`` (with any operation): the slot's first contribution of a generation overwrites:
  ``result = contrib``, no saturation.

An operation code outside :class:`Op` leaves ``acc`` unchanged (``result = acc``) and raises
``op_error``: the caller must not write such a beat (the slot memory drops it and reports it).

The reference semantics are :func:`reference`, a numpy model used by the tests and usable by the
software reference model.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import Op as RegmapOp

__all__ = ["LANE_BITS", "Op", "LaneALU", "lane_layout", "reference", "INT32_MIN", "INT32_MAX"]

LANE_BITS = 32
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


class Op(enum.Enum, shape=2):
    """Aggregation operation of a job: the codes of :class:`netreduce.regmap.Op` (the register
    map is the single source), as a 2-bit Amaranth enum."""

    SUM_WRAP = RegmapOp.SUM_WRAP.value
    SUM_SAT = RegmapOp.SUM_SAT.value
    MAX = RegmapOp.MAX.value


if {o.name: o.value for o in Op} != {o.name: o.value for o in RegmapOp}:  # pragma: no cover
    raise ImportError(f"lane ALU operations {list(Op)} do not match the register map's "
                      f"{list(RegmapOp)}: extend LaneALU")


def lane_layout(width: int) -> data.ArrayLayout:
    """The lane view of a ``width``-bit beat: ``width // 32`` signed 32-bit lanes, lane 0 lowest."""
    return data.ArrayLayout(signed(LANE_BITS), _lanes(width))


def _lanes(width: int) -> int:
    if not isinstance(width, int) or width <= 0 or width % LANE_BITS:
        raise ValueError(f"beat width must be a positive multiple of {LANE_BITS}, not {width!r}")
    return width // LANE_BITS


class LaneALU(wiring.Component):
    """Combine a stored beat with an incoming beat, lane by lane.

    Parameters
    ----------
    width : int
        Beat width in bits, a multiple of 32 (512 = 16 lanes).
    registered : bool
        ``False`` (default): purely combinational, latency 0. ``True``: ``result``, ``sat`` and
        ``op_error`` are registered in the ``sync`` domain, latency 1 cycle, one beat per cycle.

    Attributes
    ----------
    op : In(Op)
        Operation of the beat's job.
    first : In(1)
        The beat is the slot's first contribution of a generation: ``result = contrib``.
    acc : In(width)
        Stored (old) beat.
    contrib : In(width)
        Incoming beat.
    result : Out(width)
        Combined beat.
    sat : Out(width // 32)
        Per-lane flag: ``SUM_SAT`` clamped this lane (never set with ``first``).
    op_error : Out(1)
        ``op`` is not a defined operation; ``result = acc``, ``sat = 0``.

    No handshake: the ALU accepts one beat per cycle and never stalls.
    """

    def __init__(self, width: int = 512, *, registered: bool = False):
        self.width = width
        try:
            self.lanes = _lanes(width)
        except ValueError:
            self._MustUse__silence = True  # rejected, so no "created but never used" warning
            raise
        self.registered = bool(registered)
        super().__init__({
            "op": In(Op),
            "first": In(1),
            "acc": In(unsigned(width)),
            "contrib": In(unsigned(width)),
            "result": Out(unsigned(width)),
            "sat": Out(unsigned(self.lanes)),
            "op_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        layout = lane_layout(self.width)
        acc = layout(self.acc)
        contrib = layout(self.contrib)
        result = Signal(layout)
        sat = Signal(self.lanes)
        op_error = Signal()

        valid_op = Signal()
        m.d.comb += valid_op.eq(
            (self.op == Op.SUM_WRAP) | (self.op == Op.SUM_SAT) | (self.op == Op.MAX))
        m.d.comb += op_error.eq(~valid_op)

        for i in range(self.lanes):
            a, b = acc[i], contrib[i]
            # 32-bit sum; signed overflow iff both operands have the same sign and the sum's
            # sign differs (cheaper than a 33-bit compare: one CARRY chain plus a LUT).
            total = Signal(signed(LANE_BITS), name=f"sum{i}")
            m.d.comb += total.eq(a + b)
            overflow = Signal(name=f"ovf{i}")
            m.d.comb += overflow.eq((a[-1] == b[-1]) & (total[-1] != a[-1]))
            # On overflow the clamp bound has the operands' sign: negative -> INT32_MIN.
            clamp = Mux(a[-1], INT32_MIN, INT32_MAX)
            lane = Signal(signed(LANE_BITS), name=f"lane{i}")
            with m.If(self.first & valid_op):
                m.d.comb += lane.eq(b)
            with m.Else():
                with m.Switch(self.op):
                    with m.Case(Op.SUM_WRAP):
                        m.d.comb += lane.eq(total)
                    with m.Case(Op.SUM_SAT):
                        m.d.comb += lane.eq(Mux(overflow, clamp, total))
                        m.d.comb += sat[i].eq(overflow)
                    with m.Case(Op.MAX):
                        m.d.comb += lane.eq(Mux(a > b, a, b))
                    with m.Default():
                        m.d.comb += lane.eq(a)
            m.d.comb += result[i].eq(lane)

        domain = m.d.sync if self.registered else m.d.comb
        domain += [
            self.result.eq(result.as_value()),
            self.sat.eq(sat),
            self.op_error.eq(op_error),
        ]
        return m


def reference(op, acc, contrib, first=False):
    """Numpy model of :class:`LaneALU`.

    ``acc`` and ``contrib`` are int32 arrays (any matching shape, e.g. ``(beats, lanes)``); ``op``
    an :class:`Op` or its integer code; ``first`` a bool. Returns ``(result, sat)``: an int32 array
    and a bool array of the same shape. Raises ``ValueError`` for an undefined ``op``.
    """
    acc = np.asarray(acc, dtype=np.int32)
    contrib = np.asarray(contrib, dtype=np.int32)
    if acc.shape != contrib.shape:
        raise ValueError(f"shape mismatch: acc {acc.shape} vs contrib {contrib.shape}")
    code = op.value if isinstance(op, Op) else int(op)
    if code not in {o.value for o in Op}:
        raise ValueError(f"undefined operation code {code!r}")
    no_sat = np.zeros(acc.shape, dtype=bool)
    if first:
        return contrib.copy(), no_sat
    wide = acc.astype(np.int64) + contrib.astype(np.int64)
    if code == Op.SUM_WRAP.value:
        return ((wide - INT32_MIN) % 2**32 + INT32_MIN).astype(np.int32), no_sat
    if code == Op.SUM_SAT.value:
        sat = (wide > INT32_MAX) | (wide < INT32_MIN)
        return np.clip(wide, INT32_MIN, INT32_MAX).astype(np.int32), sat
    return np.maximum(acc, contrib), no_sat
