"""Link-local frame filter: consumes MAC control (PAUSE, PFC) and IEEE link-local group frames.

The rule is :func:`netreduce.wire.linklocal.classify` (reference model decision D18): such frames
are never forwarded. :class:`LinkLocalFilter` sits per port in front of the frame guard and the
parser (behind the management splitter, as the model matches management first);
:func:`attach_linklocal` builds one per port inside the engine's ``elaborate``.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.wire.fields import ETHERTYPE_VLAN
from netreduce.wire.linklocal import (
    COUNTERS,
    ETHERTYPE_MAC_CONTROL,
    LINK_LOCAL_PREFIX,
    MAC_CONTROL_PAUSE,
    MAC_CONTROL_PFC,
    MATCH_BYTES,
    PFC_PRIORITIES,
    LinkLocal,
)

from ..stream import LookAhead, beat_signature, check_data_width

__all__ = ["LL_COUNTERS", "LinkLocalFilter", "LinkLocalHooks", "attach_linklocal",
           "pause_layout"]

LL_COUNTERS = tuple(COUNTERS.values())  # ll_pause, ll_pfc, ll_mac_control, ll_group


def pause_layout() -> data.StructLayout:
    """A received PAUSE/PFC request: ``enable`` bit p = priority p, ``quanta[p]`` its time."""
    return data.StructLayout({"enable": PFC_PRIORITIES,
                              "quanta": data.ArrayLayout(16, PFC_PRIORITIES)})


class LinkLocalFilter(wiring.Component):
    """Per port: drops link-local frames, passes every other frame unchanged.

    * ``i`` (In), ``o`` (Out): :func:`~netreduce.hw.stream.beat_signature` (``width``). Frames
      that :func:`netreduce.wire.linklocal.classify` finds link-local are consumed (one beat per
      cycle, never offered on ``o``); others leave unchanged, in order (``first`` regenerated).
      The MAC ``error`` flag plays no part in the match.
    * ``inc`` (Out): one-cycle strobes, one per consumed frame, named after its counter
      (``ll_pause``, ``ll_pfc``, ``ll_mac_control``, ``ll_group``), one cycle after the frame's
      decision.
    * ``pause`` (Out, :func:`pause_layout`) with ``pause_valid`` (Out): a one-cycle strobe when
      the last beat of a consumed PAUSE (``enable`` = 0xFF, every quanta equal) or PFC frame
      is taken, unless that beat has ``error`` (a frame with a bad FCS is not acted on).
    * Decision: a shift register holds ``depth = ceil(34 / (width / 8))`` beats (5 at 64 bits,
      1 at 512); a frame is decided once it holds ``depth`` beats of it or its last beat.
      Latency ``depth`` + 1 cycles (the classification is registered, see
      :meth:`~netreduce.hw.stream.LookAhead.registered`); throughput one beat per cycle;
      ``i.ready`` is high while the register (``depth`` + 2 beats) has room, a register output.
    * Reset: synchronous, empty.
    """

    def __init__(self, width: int):
        self.width = check_data_width(width)
        self.depth = -(-MATCH_BYTES // (width // 8))
        super().__init__({
            "i": In(beat_signature(width)),
            "o": Out(beat_signature(width)),
            "inc": Out(data.StructLayout({n: 1 for n in LL_COUNTERS})),
            "pause": Out(pause_layout()),
            "pause_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, D = self.width, self.depth
        win = LookAhead(m, self.i, w, D)
        pop = win.pop

        def classify(off: int):   # kind and request on the window at buf[off]
            def byte(k):
                return win.byte(k, off)

            def be16(k):
                return win.be16(k, off)

            def atleast(x: int):
                return ~win.shorter(x, off)

            mc = atleast(14) & (be16(12) == ETHERTYPE_MAC_CONTROL)
            op = be16(14)
            is_pause = mc & atleast(18) & (op == MAC_CONTROL_PAUSE)
            is_pfc = mc & atleast(MATCH_BYTES) & (op == MAC_CONTROL_PFC)
            tagged_mc = (atleast(18) & (be16(12) == ETHERTYPE_VLAN)
                         & (be16(16) == ETHERTYPE_MAC_CONTROL))
            prefix = Cat(*[byte(4 - i) for i in range(5)])
            group = atleast(6) & (prefix == int.from_bytes(LINK_LOCAL_PREFIX, "big")) \
                & (byte(5) < 0x10)
            kind = Signal(LinkLocal, name=f"kind{off}")
            with m.If(is_pause):
                m.d.comb += kind.eq(LinkLocal.PAUSE)
            with m.Elif(is_pfc):
                m.d.comb += kind.eq(LinkLocal.PFC)
            with m.Elif(mc | tagged_mc):
                m.d.comb += kind.eq(LinkLocal.MAC_CONTROL)
            with m.Elif(group):
                m.d.comb += kind.eq(LinkLocal.GROUP)
            req = Signal(pause_layout(), name=f"req{off}")
            m.d.comb += req.enable.eq(Mux(is_pause, 0xFF, byte(17)))
            for p in range(PFC_PRIORITIES):
                m.d.comb += req.quanta[p].eq(Mux(is_pause, be16(16), be16(18 + 2 * p)))
            return Cat(kind, req)

        # the classification from registers (computed the cycle before): it ends in flip-flops
        fresh, dec = win.registered(classify)
        kind = Signal(LinkLocal)
        req = Signal(pause_layout())
        m.d.comb += Cat(kind, req).eq(dec)

        # ---- one decision per frame, held until its last beat leaves
        head, head_ok = win.head, win.head_ok
        held = Signal()
        hkind = Signal(LinkLocal)
        hreq = Signal(pause_layout())
        decide = head_ok & ~held & fresh
        cur = Mux(held, hkind, kind)
        drop = cur != LinkLocal.NONE
        with m.If(decide):
            m.d.sync += [held.eq(1), hkind.eq(kind), hreq.eq(req)]
        with m.If(pop & head.last):
            m.d.sync += held.eq(0)
        m.d.comb += [
            self.o.payload.eq(head),
            self.o.valid.eq(head_ok & (held | fresh) & ~drop),
            pop.eq((self.o.valid & self.o.ready) | (head_ok & (held | fresh) & drop)),
        ]
        for k, name in COUNTERS.items():
            m.d.sync += self.inc[name].eq(decide & (kind == k))
        acts = (cur == LinkLocal.PAUSE) | (cur == LinkLocal.PFC)
        m.d.sync += [self.pause_valid.eq(pop & head.last & acts & ~head.error),
                     self.pause.eq(Mux(held, hreq, req))]
        return m


@dataclass
class LinkLocalHooks:
    """What :func:`attach_linklocal` gives the engine: ``rx[k]`` (the filtered stream of port k,
    to use instead of its input), ``inc`` (name -> strobe sum over the ports for each of
    :data:`LL_COUNTERS` and ``rx_frames``: a consumed frame is a received frame), ``pause[k]``
    / ``pause_valid[k]`` (port k's received requests) and ``filters``."""

    rx: list
    inc: dict
    pause: list
    pause_valid: list
    filters: list


def attach_linklocal(m: Module, srcs: list, width: int) -> LinkLocalHooks:
    """One :class:`LinkLocalFilter` per stream of ``srcs`` (each connected to its input)."""
    fl = []
    for k, s in enumerate(srcs):
        f = LinkLocalFilter(width)
        m.submodules[f"linklocal{k}"] = f
        _connect(m, s, f.i)
        fl.append(f)
    inc = {}
    for name in LL_COUNTERS:
        inc[name] = sum(getattr(f.inc, name) for f in fl)
    inc["rx_frames"] = sum(getattr(f.inc, name) for f in fl for name in LL_COUNTERS)
    return LinkLocalHooks([f.o for f in fl], inc, [f.pause for f in fl],
                          [f.pause_valid for f in fl], fl)


def _connect(m: Module, src, dst) -> None:
    """``src`` (a stream whose ``valid``/``payload`` we read) -> ``dst`` (the filter's ``i``)."""
    m.d.comb += [dst.valid.eq(src.valid), dst.payload.eq(src.payload),
                 src.ready.eq(dst.ready)]
