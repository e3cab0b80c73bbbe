"""The header arbiter: the ports' control headers into the control path's one ``hdr`` stream.

:class:`HeaderArbiter` keeps each port's frame header in a register of its own (a two-entry skid
buffer: the adapter's compares end there, not in the arbitration and the control path) and
hands the control path one header per cycle, round robin over the ports with one waiting. With
pairs (the control's ``hdr_layout`` has a ``side`` field: :class:`~netreduce.hw.agg.control.
AggControl` built with ``pairs``), the same cycle may also carry a second header, the *side*
record, decided right after the first: two ACK/NAK heads of different ports and different flow
keys (docs/engine.md, "Every port at line rate").
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .agg.decide import OP_ACK
from .agg.types import FrameError, HdrClass

__all__ = ["HeaderArbiter", "record_layout", "pairable"]

KEY_FIELDS = ("src_ip", "dqpn")  # the flow key of an ACK/NAK (its reverse key)


def record_layout(hdr_layout: data.StructLayout) -> data.StructLayout:
    """A port's header record: the control's ``hdr_layout`` without the ``side`` record."""
    return data.StructLayout({n: f.shape for n, f in hdr_layout if n != "side"})


def pairable(h):
    """The header may be one of a pair: a RoCE ACK/NAK without frame error whose AETH syndrome
    is not the reserved 0b10 (CNPs excluded; the control's contract for ``side``)."""
    return ((h.cls == HdrClass.ROCE) & (h.err == FrameError.NONE) & (h.opcode == OP_ACK)
            & (h.syndrome[5:7] != 0b10))


class HeaderArbiter(wiring.Component):
    """P ports' header records -> the control path's ``hdr`` stream.

    Parameters: ``hdr_layout`` (the control's; a ``side`` field turns pairs on), ``ports``.

    Members: ``i<k>`` (In, stream of :func:`record_layout`: port k's headers, in arrival order),
    ``o`` (Out, stream of ``hdr_layout``: to ``AggControl.hdr``).

    Contract:

    * Per port a two-entry skid buffer (:class:`~netreduce.hw.skid.SkidBuffer` behaviour):
      ``i<k>.ready`` is a flip-flop output; latency 1 cycle from ``i<k>`` to the head register;
      one header per cycle per port. ``o.valid`` and the selects are from the head registers
      (and the round-robin pointer, the pair flags) only; ``o.payload`` is an AND-OR of the
      head registers. With pairs = False the arbiter is the plain round robin.
    * Main record: round robin over the ports with a head waiting (the first at or after the
      pointer, which moves past the port served): a port with a head waiting is served within
      P transfers. Throughput: one header per cycle while ``o.ready``.
    * Side record (pairs only): taken with the main one when both heads are pairable
      (:func:`pairable`) and their keys (``src_ip``, ``dqpn``) differ: the first such port
      after the main one in round-robin order. ``o.payload.side`` holds its fields and
      ``side.port``; the side's head leaves its port with the main's handshake. Each port gives
      at most its head, so per-port order is kept. The pair flags are registers computed a cycle
      ahead (the pairable bit is registered beside each record as it enters its port's
      register; the keys are compared on carry chains): a head pairs from its second cycle as
      its port's head, and not in the cycle after a transfer whose main head it could pair with
      but which took another side (the flags' update does not wait for the side's priority).
      So a backlog of ACKs on every port gives 1.5 headers per cycle, one of a data header and
      an ACK per port 1.33 (tests/hw/test_hdrarb.py).
    * ``pair_en`` (pairs only, 1 if undriven): pairs are formed only while it is high (the
      engine holds it low while any job has ``JOB.CTRL.fast_retx`` set: the control's side
      lane has no fast retransmit); it acts on the pair flags, a cycle later.
    * Fairness: the main pick alone serves every port within P transfers; the side only adds.
    * Backpressure: ``o.ready`` low holds every head; a port's register fills in two cycles,
      then its ``i<k>.ready`` drops. No errors of its own.
    """

    def __init__(self, hdr_layout: data.StructLayout, *, ports: int):
        if not isinstance(ports, int) or ports < 1:
            self._MustUse__silence = True  # rejected: no "created but never used" warning
            raise ValueError(f"ports must be a positive int, not {ports!r}")
        self.ports = ports
        self.hdr_layout = hdr_layout
        self.pairs = "side" in {n for n, _ in hdr_layout}
        self.rec_layout = record_layout(hdr_layout)
        members = {f"i{k}": In(stream.Signature(self.rec_layout)) for k in range(ports)}
        members["o"] = Out(stream.Signature(hdr_layout))
        if self.pairs:
            members["pair_en"] = In(1, init=1)
        super().__init__(members)

    def elaborate(self, platform):  # noqa: C901 (the registers, the picks, the key flags)
        m = Module()
        P = self.ports
        rl = self.rec_layout
        ins = [getattr(self, f"i{k}") for k in range(P)]
        o = self.o
        # ---- per port: head register (o_*) and skid register (s_*), with the pairable bit
        ov = [Signal(name=f"head_valid{k}") for k in range(P)]
        hd = [Signal(rl, name=f"head{k}") for k in range(P)]
        hp = [Signal(name=f"head_pair{k}") for k in range(P)]
        sv = [Signal(name=f"skid_valid{k}") for k in range(P)]
        sd = [Signal(rl, name=f"skid{k}") for k in range(P)]
        sp = [Signal(name=f"skid_pair{k}") for k in range(P)]
        ready = [Signal(name=f"served{k}") for k in range(P)]   # port k's head leaves now
        adv = [Signal(name=f"advance{k}") for k in range(P)]    # port k's head register loads
        for k in range(P):
            i = ins[k]
            ip = Signal(name=f"in_pair{k}")
            m.d.comb += ip.eq(pairable(i.payload) if self.pairs else 0)
            take = i.valid & ~sv[k]
            m.d.comb += [i.ready.eq(~sv[k]), adv[k].eq(~ov[k] | ready[k])]
            with m.If(adv[k]):
                with m.If(sv[k]):
                    m.d.sync += [ov[k].eq(1), hd[k].eq(sd[k]), hp[k].eq(sp[k]), sv[k].eq(0)]
                with m.Else():
                    # (hp: valid and pairable, so the pair logic needs no valid bits)
                    m.d.sync += [ov[k].eq(take), hd[k].eq(i.payload), hp[k].eq(take & ip)]
            with m.Elif(take):
                m.d.sync += [sv[k].eq(1), sd[k].eq(i.payload), sp[k].eq(ip)]

        # ---- main pick: the first port with a head at or after rr, else the first one (one-hot)
        pb = max(1, ceil_log2(P))
        rr = Signal(pb, name="rr")
        main = Signal(P, name="main_pick")
        for k in range(P):
            # port k wins if it has a head and no port before it in the order rr, rr+1, ... has
            at_rr = Const(k, pb) >= rr
            before = [j for j in range(P) if j != k]
            blocked = Cat(*[ov[j] & Mux(at_rr, (Const(j, pb) >= rr) & (j < k),
                                        (Const(j, pb) >= rr) | (j < k))
                            for j in before]).any() if before else Const(0, 1)
            m.d.comb += main[k].eq(ov[k] & ~blocked)
        any_head = Cat(*ov).any()
        go = o.valid & o.ready
        m.d.comb += o.valid.eq(any_head)

        def and_or(sel, vals):
            if len(vals) == 1:   # one port: its head as it is (no gate on every payload bit)
                return vals[0]
            out = 0
            for s, v in zip(sel, vals, strict=True):
                out = out | Mux(s, Value.cast(v), 0)
            return out

        for n, _ in rl:
            m.d.comb += o.payload[n].eq(and_or(main, [h[n] for h in hd]))

        side = Signal(P, name="side_pick")
        side_terms = {}
        if self.pairs:
            # Pair flags, from registers only: c[i, j] (the heads of ports i and j are both
            # pairable and their keys differ) and sg[i, j] (j is the side if i is the main one:
            # the first port after i, cyclic, whose head pairs with i's). Both are computed a
            # cycle ahead from the head registers and registered, so neither a key compare nor
            # the side's priority lies on the arbitration's path. A head loaded in the cycle
            # before pairs with none yet (its flags were computed beside the head it replaced,
            # and cleared as that one moved); so is one that may have moved: the main one and
            # those that pair with it (no priority on this path).
            def key(h):
                return Cat(*[h[f] for f in KEY_FIELDS])

            def differ(x, y):
                """x != y on a carry chain: the XORs ORed three pairs to a LUT, then the carry
                out of their sum with all ones (one LUT level and a CARRY8 per 8 groups)."""
                g = Cat(*[(x[i:i + 3] ^ y[i:i + 3]).any() for i in range(0, len(x), 3)])
                return (g + Const((1 << len(g)) - 1, len(g)))[len(g)]

            moved = [Signal(name=f"moved{k}") for k in range(P)]
            c, c_nxt = {}, {}
            for a in range(P):
                for b in range(a + 1, P):
                    r, n = Signal(name=f"pair_ok{a}_{b}"), Signal(name=f"pair_ok_next{a}_{b}")
                    m.d.comb += n.eq(self.pair_en & ~moved[a] & ~moved[b] & hp[a] & hp[b]
                                     & differ(key(hd[a]), key(hd[b])))
                    m.d.sync += r.eq(n)
                    c[a, b] = c[b, a] = r
                    c_nxt[a, b] = c_nxt[b, a] = n
            for i in range(P):
                order = [(i + d) % P for d in range(1, P)]
                for n, j in enumerate(order):
                    sg = Signal(name=f"side_if{i}_{j}")
                    m.d.sync += sg.eq(c_nxt[i, j]
                                      & ~Cat(*[c_nxt[i, x] for x in order[:n]]).any())
                    side_terms.setdefault(j, []).append(main[i] & sg)
            for j in range(P):
                m.d.comb += side[j].eq(Cat(*side_terms.get(j, [])).any())
            for k in range(P):
                could = Cat(*[main[i] & c[i, k] for i in range(P) if i != k]).any()
                m.d.comb += moved[k].eq(o.ready & (main[k] | could))
            sl = o.payload.side
            m.d.comb += sl.v.eq(side.any())
            for n, _ in self.hdr_layout["side"].shape:
                if n != "v":
                    m.d.comb += sl[n].eq(and_or(side, [h[n] for h in hd]))
        else:
            m.d.comb += side.eq(0)
        for k in range(P):
            m.d.comb += ready[k].eq(o.ready & (main[k] | side[k]))
        # rr: past the main port served
        with m.If(go):
            nxt_rr = 0
            for k in range(P):
                nxt_rr = nxt_rr | Mux(main[k], (k + 1) % P, 0)
            m.d.sync += rr.eq(nxt_rr)
        return m
