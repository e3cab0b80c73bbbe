"""ECN marking on arrival while a port's input is congested (model decision D19).

:class:`CeMarker` is two pipeline stages on a port's receive stream, in the core clock domain
between the link gate and the core. While ``congested`` (the shell's RX FIFO at or above
``PORT.FC_ECN`` with ``PORT.FC_CTRL.ecn_enable``; sampled at each frame's first beat, so a
frame is marked whole or not at all), it applies :func:`netreduce.sim.model.congestion.mark_ce`'s
rule, which the tests scoreboard it against: an Ethernet frame, untagged or with one 802.1Q tag,
of EtherType IPv4 with first IPv4 byte 0x45 and ECN = ECT(0) or ECT(1) gets ECN = CE, and its
IPv4 header checksum, if the frame holds both its bytes, is updated incrementally (RFC 1624
eqn. 3: a bad checksum stays bad). Everything else passes unchanged. ``marked`` pulses once per
marked frame.

Timing: 2 cycles of latency (an input register, then the marking stage), one beat per cycle
(``i.ready`` = ``~a.valid | ~o.valid | o.ready``). The input register also holds the compares of
the EtherType and version bytes with their constants, so the mark decision after it is an AND
of flags (logic depth, core clock budget of 8: the frame checks, the mark and the byte mux
were 9 LUT levels in the whole port's netlist). The fields are read as the beats pass (the
compares, and the TOS bytes, are kept in registers when they fall in an earlier beat than the
one they are needed in), so any width from 64 bits works. Reset: synchronous.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from netreduce.wire import ECN_CE, ETHERTYPE_IPV4, ETHERTYPE_VLAN

from ..stream import beat_signature, bytes_of, check_data_width

__all__ = ["CeMarker"]

_ETH, _VLAN_ETH = 12, 16  # EtherType offsets: untagged, inner of a tagged frame
_TOS, _CSUM = 1, 10  # from the IPv4 header
_IP_V4_IHL5 = 0x45


def _ones_add(a, b):
    """16-bit one's complement sum (end-around carry; never carries twice)."""
    s = a + b
    return (s[:16] + s[16])[:16]


class CeMarker(wiring.Component):
    """See the module docstring. Ports: ``congested`` (In), ``i`` (In) / ``o`` (Out) beat
    streams of ``width`` bits, ``marked`` (Out, one-cycle pulse)."""

    def __init__(self, width: int = 512):
        self.width = check_data_width(width)
        super().__init__({"congested": In(1), "i": In(beat_signature(width)),
                          "o": Out(beat_signature(width)), "marked": Out(1)})

    def elaborate(self, platform):
        m = Module()
        nb = self.width // 8
        o = self.o

        # ---- input stage: the beat registered together with the byte compares of the rule
        # (so the mark decision after the register is an AND of flags: logic depth)
        cmp = sorted({(_ETH, ETHERTYPE_IPV4 >> 8), (_ETH + 1, ETHERTYPE_IPV4 & 0xFF),
                      (_ETH, ETHERTYPE_VLAN >> 8), (_ETH + 1, ETHERTYPE_VLAN & 0xFF),
                      (_VLAN_ETH, ETHERTYPE_IPV4 >> 8), (_VLAN_ETH + 1, ETHERTYPE_IPV4 & 0xFF),
                      (14, _IP_V4_IHL5), (18, _IP_V4_IHL5)})
        a_valid = Signal()
        a = Signal.like(self.i.payload, name="a")
        a_eq = {pc: Signal(name=f"eq{pc[0]}_{pc[1]:02x}") for pc in cmp}
        a_cong = Signal()       # congested, sampled as the beat is taken on ``i``
        ready = Signal()        # the second stage takes the registered beat
        m.d.comb += [ready.eq(~o.valid | o.ready), self.i.ready.eq(~a_valid | ready)]
        in_lanes = bytes_of(self.i.payload.data, nb)
        with m.If(self.i.ready):
            m.d.sync += [a_valid.eq(self.i.valid), a.eq(self.i.payload),
                         a_cong.eq(self.congested)]
            m.d.sync += [a_eq[(p, c)].eq(in_lanes[p % nb] == c) for p, c in cmp]

        take = Signal()
        m.d.comb += take.eq(a_valid & ready)
        last_b = (18 + _CSUM + 1) // nb  # the last beat holding a byte the rule reads or writes
        bi = Signal(range(last_b + 2))  # beat index in the frame (saturates past last_b)
        with m.If(take):
            with m.If(a.last):
                m.d.sync += bi.eq(0)
            with m.Elif(bi <= last_b):
                m.d.sync += bi.eq(bi + 1)

        lanes = bytes_of(a.data, nb)
        keep = a.keep
        lat = {p: Signal(8, name=f"byte{p}") for p in (14 + _TOS, 18 + _TOS)}
        for p, r in lat.items():
            with m.If(take & (bi == p // nb)):
                m.d.sync += r.eq(lanes[p % nb])
        lat_eq = {pc: Signal(name=f"eq{pc[0]}_{pc[1]:02x}_held") for pc in cmp}
        for (p, c), r in lat_eq.items():
            with m.If(take & (bi == p // nb)):
                m.d.sync += r.eq(a_eq[(p, c)])

        def val(p, beat):
            """Byte p of the frame, read while the beat ``beat`` is in the second stage."""
            return lanes[p % nb] if p // nb == beat else lat[p]

        def eq(p, c, beat):
            """Byte p of the frame == c, read while the beat ``beat`` is in the second stage."""
            return a_eq[(p, c)] if p // nb == beat else lat_eq[(p, c)]

        cong_l = Signal()
        with m.If(take & (bi == 0)):
            m.d.sync += cong_l.eq(a_cong)
        cong = Mux(bi == 0, a_cong, cong_l)

        out = list(lanes)
        marked = Signal()
        for tagged, l3 in ((False, 14), (True, 18)):
            t, c = l3 + _TOS, l3 + _CSUM
            bt, bc = t // nb, c // nb

            def fields_ok(beat, tagged=tagged, l3=l3):
                et = ETHERTYPE_VLAN if tagged else ETHERTYPE_IPV4
                ok = eq(_ETH, et >> 8, beat) & eq(_ETH + 1, et & 0xFF, beat)
                if tagged:
                    ok &= (eq(_VLAN_ETH, ETHERTYPE_IPV4 >> 8, beat)
                           & eq(_VLAN_ETH + 1, ETHERTYPE_IPV4 & 0xFF, beat))
                ecn = val(l3 + _TOS, beat)[:2]
                return ok & eq(l3, _IP_V4_IHL5, beat) & (ecn != 0) & (ecn != ECN_CE)

            now = Signal(name=f"mark_now_{int(tagged)}")   # the TOS byte is here: mark it
            m.d.comb += now.eq((bi == bt) & keep[t % nb] & cong & fields_ok(bt))
            held = Signal(name=f"mark_held_{int(tagged)}")  # marked in an earlier beat
            tos = Signal(8, name=f"tos_old_{int(tagged)}")
            with m.If(take & now):
                m.d.sync += [held.eq(1), tos.eq(lanes[t % nb])]
            with m.If(take & a.last):
                m.d.sync += held.eq(0)
            with m.If(now):
                m.d.comb += marked.eq(1)
            # checksum: both bytes present in this beat (c is even, so they share one)
            active = (bi == bc) & keep[(c + 1) % nb] & (now if bc == bt else held)
            old_tos = lanes[t % nb] if bc == bt else tos
            hc = Cat(lanes[(c + 1) % nb], lanes[c % nb])
            ver = Const(_IP_V4_IHL5, 8)
            m_old = Cat(old_tos, ver)
            m_new = Cat(old_tos | ECN_CE, ver)
            new = ~_ones_add(_ones_add(~hc, ~m_old), m_new)  # RFC 1624 eqn. 3
            out[c % nb] = Mux(active, new[8:16], out[c % nb])
            out[(c + 1) % nb] = Mux(active, new[0:8], out[(c + 1) % nb])
            out[t % nb] = Mux(now, lanes[t % nb] | ECN_CE, out[t % nb])

        m.d.sync += self.marked.eq(take & marked)
        with m.If(take):
            m.d.sync += [o.valid.eq(1), o.payload.eq(a), o.payload.data.eq(Cat(*out))]
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)
        return m
