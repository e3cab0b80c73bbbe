"""The in-band management path around :class:`netreduce.hw.mgmt.MgmtAgent`, for the engine top.

Protocol and match rule: docs/management.md; behaviour: :class:`netreduce.sim.model.mgmt.MgmtAgent`
as hooked into :meth:`netreduce.sim.model.Engine.receive`. Data flow (``w`` = engine data width)::

    i_p<k> ─► MgmtSplitter ─ o ─────────────────────────────► (guard, parser: ordinary traffic)
                   └─ o_mgmt ─► MgmtPath.i_p<k> ─► FIFO ─┐
                                                          FrameArbiter ─► Downsizer w->64 ─► agent
    s_axil (host) ─► AxiLiteArbiter.s0 ─┐                                          │ bus   │ o
          agent.bus ─► slice ─► s1 ────┴─► m ─► slice ─► RegisterBank.s_axil ◄────┘       │
    o_p<k> ◄─ FrameArbiter(engine TX, MgmtPath.o_p<k>) ◄─ Upsizer 64->w ◄──────────────────┘

Blocks (each a ``wiring.Component``, contract in its docstring): :class:`MgmtSplitter`,
:class:`Downsizer`, :class:`Upsizer`, :class:`FrameArbiter`, :class:`AxiLiteArbiter`,
:class:`AxiLiteSlice`, :class:`MgmtPath`. :func:`attach_mgmt` builds them all inside the
engine's ``elaborate`` and returns the few hooks the engine uses instead of its own ports (see
there).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from netreduce.regmap import Access, RegMap
from netreduce.wire.fields import DOT1Q, ETH, ETHERTYPE_IPV4, ETHERTYPE_VLAN, IP_PROTO_UDP, IPV4
from netreduce.wire.view import DPORT_AT, DST_IP_AT, IPV4_OFF, PROTO_AT

from .csr.axil import AXI4LiteSignature
from .mgmt import MGMT_COUNTERS, MgmtAgent
from .skid import SkidBuffer
from .stream import LookAhead, beat_layout, beat_signature, check_data_width

_IPV4_IHL5 = 0x45  # IPv4 version 4, IHL 5 (no options)

__all__ = ["MATCH_BYTES", "MgmtSplitter", "Downsizer", "Upsizer", "FrameArbiter",
           "AxiLiteArbiter", "AxiLiteSlice", "MgmtPath", "PATH_COUNTERS", "mgmt_cfg_layouts",
           "attach_mgmt", "MgmtHooks"]

# Bytes of a frame the match rule reads: up to the UDP destination port behind an 802.1Q tag
# (18 + 20 + 4); frames shorter than that are decided from their length (see MgmtSplitter).
MATCH_BYTES = 42
# Counter strobes of MgmtPath.inc: the agent's, plus the engine-wide rx/tx frame counts the
# management frames contribute (the model counts rx_frames for every frame and tx_frames for
# every response it emits).
PATH_COUNTERS = ("rx_frames", "tx_frames") + MGMT_COUNTERS


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


# ============================================================================ splitter
class MgmtSplitter(wiring.Component):
    """Per port, in front of the parser: steers management frames to ``o_mgmt``.

    Match rule (exactly :meth:`netreduce.sim.model.mgmt.MgmtAgent.matches`, ``n`` = frame length):
    ``enable`` and ``n >= 34``; Ethernet type 0x0800 at bytes 12-13, or 0x8100 there with
    ``n >= 38`` and 0x0800 at bytes 16-17 (then everything below is 4 bytes later); IPv4
    protocol 17 and destination address ``ip``; then either the UDP port cannot be read (the
    IPv4 version/IHL byte is not 0x45, the fragment offset is not 0, or ``n < l3 + 24``), or the
    UDP destination port equals ``port``. Every other frame (shorter ones included) goes to
    ``o``. The MAC ``error`` flag plays no part (the agent drops a flagged frame as malformed).

    Ports: ``i`` (In), ``o`` and ``o_mgmt`` (Out), all :func:`~netreduce.hw.stream.beat_signature`
    (``width``); ``enable``, ``ip``, ``port`` (In): ``MGMT.CTRL.enable``, ``MGMT.IP``,
    ``MGMT.PORT``, sampled when a frame is decided (``enable`` through a register of its own:
    the value of the cycle before).

    * Frames leave unchanged on one output (``first`` is regenerated from the previous
      ``last``, as every consumer does), in order, one beat per cycle back to back.
    * Decision: a shift-register FIFO holds ``depth = ceil(42 / (width / 8))`` beats (6 at 64
      bits, 3 at 128, 1 at 512); a frame's first beat leaves once the FIFO holds ``depth`` beats
      of it or its last beat; later beats follow the decision, latched with the first.
    * Latency: ``depth`` + 1 cycles from a beat in to the same beat out when the frame is longer
      than ``depth`` beats (a frame end makes it earlier; the match is registered, see
      :meth:`~netreduce.hw.stream.LookAhead.registered`); throughput one beat per cycle.
    * Backpressure: ``i.ready`` is high while the FIFO (``depth`` + 2 beats) has room, a
      register output (:class:`~netreduce.hw.stream.LookAhead`); the head waits for the ready of
      the output it is routed to (the other output stalls nothing). No input reaches an output
      combinationally (``o.valid`` / ``o_mgmt.valid`` come from registers only).
    * Reset: synchronous, empty, next beat starts a frame.
    """

    def __init__(self, width: int):
        self.width = check_data_width(width)
        self.depth = -(-MATCH_BYTES // (width // 8))
        super().__init__({
            "i": In(beat_signature(width)),
            "o": Out(beat_signature(width)),
            "o_mgmt": Out(beat_signature(width)),
            "enable": In(1), "ip": In(32), "port": In(16),
        })

    def elaborate(self, platform):
        m = Module()
        w, D = self.width, self.depth
        # ---- the match, from the head beat (a frame's first) and the beats behind it
        win = LookAhead(m, self.i, w, D)
        pop = win.pop

        def match(off: int):   # the rule on the window at buf[off] (see LookAhead.registered)
            def byte(k):
                return win.byte(k, off)

            def be16(k):
                return win.be16(k, off)

            def shorter(x: int):
                return win.shorter(x, off)

            def rule(l2: int, et_at: int):   # the rule's terms behind a tag of l2 bytes
                l3 = IPV4_OFF + l2
                unreadable = ((byte(l3) != _IPV4_IHL5)
                              | (be16(l3 + IPV4.flags_frag.offset)[:13] != 0)
                              | shorter(l3 + DPORT_AT + 2))
                return Cat(~shorter(l3 + IPV4.size), be16(et_at) == ETHERTYPE_IPV4,
                           byte(l3 + PROTO_AT) == IP_PROTO_UDP,
                           Cat(*[byte(l3 + DST_IP_AT + 3 - i) for i in range(4)]) == self.ip,
                           unreadable, be16(l3 + DPORT_AT) == self.port)

            et = ETH.ethertype.offset
            return Cat(be16(et) == ETHERTYPE_VLAN, rule(DOT1Q.size, et + DOT1Q.size),
                       rule(0, et))

        # the rule's terms from registers (computed the cycle before): they end in flip-flops;
        # enable, the terms' AND and the tag choice come after
        fresh, parts = win.registered(match)

        def holds(t):
            return t[0] & t[1] & t[2] & t[3] & (t[4] | t[5])

        # enable (a register of the bank) is registered here once more, so that no input of
        # the splitter reaches an output combinationally (a write of MGMT.CTRL.enable takes
        # effect one cycle later)
        enable = Signal()
        m.d.sync += enable.eq(self.enable)
        live = enable & Mux(parts[0], holds(parts[1:7]), holds(parts[7:13]))

        # ---- routing: the decision is taken once per frame and held (stable while stalled)
        head, head_ok = win.head, win.head_ok
        held, route = Signal(), Signal()
        to_mgmt = Mux(held, route, live)
        ok = head_ok & (held | fresh)
        with m.If(head_ok & ~held & fresh):
            m.d.sync += [held.eq(1), route.eq(live)]
        with m.If(pop & head.last):
            m.d.sync += held.eq(0)
        m.d.comb += [
            self.o.payload.eq(head), self.o_mgmt.payload.eq(head),
            self.o.valid.eq(ok & ~to_mgmt), self.o_mgmt.valid.eq(ok & to_mgmt),
            pop.eq((self.o.valid & self.o.ready) | (self.o_mgmt.valid & self.o_mgmt.ready)),
        ]
        return m


# ============================================================================ width converters
class Downsizer(wiring.Component):
    """Beat width converter ``in_width`` -> ``out_width`` (e.g. the engine's 512 bits to the
    agent's 64), :func:`~netreduce.hw.stream.beat_layout` on both sides.

    * Each input beat leaves as its non-empty ``out_width`` pieces, lowest bytes first; the
      piece with the beat's last valid byte ends it (``keep`` is a thermometer code, so the
      pieces after it are empty and skipped). ``last`` and ``error`` go on the final piece of a
      beat with ``last`` (``error`` only there); ``first`` on the first piece of a frame. An
      empty last beat (``keep == 0``) leaves as one empty piece with ``last``.
    * One piece per cycle; ``i.ready`` is high when no beat is held or the held beat's final
      piece leaves this cycle (a new beat is then taken without a bubble). Latency one cycle.
    * ``in_width == out_width``: a wire (no register, no latency).
    * Reset: synchronous, empty.
    """

    def __init__(self, in_width: int, out_width: int = 64):
        check_data_width(in_width)
        check_data_width(out_width)
        if in_width % out_width:
            raise ValueError(f"in_width {in_width} is not a multiple of out_width {out_width}")
        self.in_width, self.out_width = in_width, out_width
        super().__init__({"i": In(beat_signature(in_width)),
                          "o": Out(beat_signature(out_width))})

    def elaborate(self, platform):
        m = Module()
        if self.in_width == self.out_width:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
            return m
        k = self.in_width // self.out_width
        ob = self.out_width // 8
        buf = Signal(beat_layout(self.in_width))
        full = Signal()
        idx = Signal(range(k))
        out_first = Signal(init=1)
        more = Array([buf.keep[ob * (i + 1)] for i in range(k - 1)] + [Const(0, 1)])[idx]
        end = Signal()
        m.d.comb += end.eq(~more)
        o = self.o.payload
        m.d.comb += [
            self.o.valid.eq(full),
            o.data.eq(buf.data.word_select(idx, self.out_width)),
            o.keep.eq(buf.keep.word_select(idx, ob)),
            o.first.eq(out_first), o.last.eq(buf.last & end), o.error.eq(buf.error & end),
        ]
        take = self.o.valid & self.o.ready
        done = take & end
        m.d.comb += self.i.ready.eq(~full | done)
        with m.If(take):
            m.d.sync += [idx.eq(idx + 1), out_first.eq(o.last)]
        with m.If(done):
            m.d.sync += full.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [buf.eq(self.i.payload), full.eq(1), idx.eq(0)]
        return m


class Upsizer(wiring.Component):
    """Beat width converter ``in_width`` -> ``out_width`` (the agent's 64-bit responses to the
    engine's width), :func:`~netreduce.hw.stream.beat_layout` on both sides.

    * Input beats are packed lowest bytes first; an output beat leaves when it is full or holds
      a beat with ``last`` (then ``last``, and ``error`` of that beat). Every input beat but a
      frame's last must be full (the beat layout's rule), so output ``keep`` stays a
      thermometer code. ``first`` marks an output beat that starts a frame.
    * ``i.ready`` is high when no complete beat is held or it leaves this cycle (the next input
      beat then starts a fresh one): one input beat per cycle. Latency one cycle after the
      completing input beat.
    * ``in_width == out_width``: a wire.
    * Reset: synchronous, empty.
    """

    def __init__(self, in_width: int = 64, out_width: int = 64):
        check_data_width(in_width)
        check_data_width(out_width)
        if out_width % in_width:
            raise ValueError(f"out_width {out_width} is not a multiple of in_width {in_width}")
        self.in_width, self.out_width = in_width, out_width
        super().__init__({"i": In(beat_signature(in_width)),
                          "o": Out(beat_signature(out_width))})

    def elaborate(self, platform):
        m = Module()
        if self.in_width == self.out_width:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
            return m
        k = self.out_width // self.in_width
        iw, ib = self.in_width, self.in_width // 8
        buf = Signal(beat_layout(self.out_width))
        full = Signal()
        idx = Signal(range(k))
        start = Signal(init=1)  # the next input beat starts a frame
        m.d.comb += [self.o.valid.eq(full), self.o.payload.eq(buf)]
        take = full & self.o.ready
        m.d.comb += self.i.ready.eq(~full | self.o.ready)
        with m.If(take):
            m.d.sync += full.eq(0)
        pos = Mux(full, 0, idx)  # a held beat leaves this cycle: start a fresh one
        b = self.i.payload
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [start.eq(b.last)]
            with m.If(pos == 0):
                m.d.sync += [buf.data.eq(b.data), buf.keep.eq(b.keep), buf.first.eq(start)]
            with m.Else():
                m.d.sync += [buf.data.word_select(pos, iw).eq(b.data),
                             buf.keep.word_select(pos, ib).eq(b.keep)]
            complete = b.last | (pos == k - 1)
            m.d.sync += [full.eq(complete), idx.eq(Mux(complete, 0, pos + 1)),
                         buf.last.eq(b.last), buf.error.eq(b.error & b.last)]
        return m


# ============================================================================ frame arbiter
class FrameArbiter(wiring.Component):
    """``n``:1 merge of beat streams, frame by frame, round robin.

    * Ports ``i0`` .. ``i<n-1>`` (In), ``o`` (Out), :func:`~netreduce.hw.stream.beat_signature`
      (``width``); ``sel`` (Out): the input being forwarded (valid with ``o.valid``).
    * Between frames the arbiter picks the first input with ``valid`` at or after the one after
      the last served input, and forwards it combinationally (no latency) until its ``last``
      beat; other inputs see ``ready`` low. The choice is held from the first cycle it is
      offered, so ``o.payload`` is stable while ``o.valid`` waits for ``o.ready``. A waiting
      input is served after at most ``n - 1`` other frames. ``first`` is regenerated on the output.
    * One beat per cycle, back to back across frames. Reset: synchronous, input 0 first.
    """

    def __init__(self, width: int, n: int):
        if n < 1:
            raise ValueError(f"n = {n}: need at least one input")
        self.width, self.n = check_data_width(width), n
        members = {f"i{k}": In(beat_signature(width)) for k in range(n)}
        members["o"] = Out(beat_signature(width))
        members["sel"] = Out(range(max(2, n)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.n
        ins = [getattr(self, f"i{k}") for k in range(n)]
        if n == 1:
            wiring.connect(m, wiring.flipped(ins[0]), wiring.flipped(self.o))
            return m
        rr = Signal(range(n))  # preferred input when free
        locked = Signal()
        cur = Signal(range(n))
        pick = Signal(range(n))
        chain = Const(0, len(pick))
        for k in reversed(range(n)):
            chain = Mux(ins[k].valid, k, chain)
        for k in reversed(range(n)):
            chain = Mux(ins[k].valid & (k >= rr), k, chain)
        m.d.comb += pick.eq(chain)
        sel = Signal(range(n))
        m.d.comb += [sel.eq(Mux(locked, cur, pick)), self.sel.eq(sel)]
        if n == 2:  # one 2:1 multiplexer per bit
            m.d.comb += [self.o.valid.eq(Mux(sel, ins[1].valid, ins[0].valid)),
                         self.o.payload.eq(Mux(sel, ins[1].payload.as_value(),
                                               ins[0].payload.as_value()))]
        else:
            m.d.comb += [self.o.valid.eq(Array(i.valid for i in ins)[sel]),
                         self.o.payload.eq(Array(i.payload for i in ins)[sel])]
        in_frame = Signal()
        m.d.comb += self.o.payload.first.eq(~in_frame)
        for k, i in enumerate(ins):
            m.d.comb += i.ready.eq(self.o.ready & (sel == k))
        # the choice holds from the cycle a beat is offered (AXI-Stream: tdata stays stable
        # while tvalid waits for tready) to the frame's last beat
        with m.If(self.o.valid):
            m.d.sync += [cur.eq(sel), locked.eq(1)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += in_frame.eq(~self.o.payload.last)
            with m.If(self.o.payload.last):
                m.d.sync += [locked.eq(0), rr.eq(Mux(sel == n - 1, 0, sel + 1))]
        return m


# ============================================================================ AXI4-Lite arbiter
class AxiLiteArbiter(wiring.Component):
    """AXI4-Lite 2:1 arbiter: masters on ``s0`` and ``s1`` (In), the slave on ``m`` (Out), all
    :class:`~netreduce.hw.csr.AXI4LiteSignature` (``addr_width``, ``data_width``).

    * One transaction at a time, end to end: a master is granted when it raises ``arvalid``,
      ``awvalid`` or ``wvalid`` while the arbiter is free; the grant holds until that
      transaction's response handshake (R or B). A master raising AR and AW together gets its
      read first; the write waits for a new grant. Only the granted master's request channel
      reaches ``m`` and only until its handshake, so the slave never sees a second request
      inside a transaction; the other master sees every ``ready``/``valid`` low.
    * Round robin: when both wait, the master not served last goes first, so neither starves
      (each waits for at most one transaction of the other).
    * Latency: one cycle to grant. The grant, its owner and the read/write choice are
      registers, set in the cycle a request appears while the arbiter is free; the owner's
      request is forwarded from the next cycle (``m.*valid`` then follow the owner's ``*valid``
      through one gate; ``s*.*ready`` follow ``m.*ready``), so no select depends
      combinationally on a master's valid. ``*prot`` pass through. Reset: synchronous, free,
      ``s0`` first.
    """

    def __init__(self, addr_width: int, data_width: int = 32):
        sig = AXI4LiteSignature(addr_width, data_width)
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({"s0": In(sig), "s1": In(sig), "m": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        s, bus = (self.s0, self.s1), self.m
        busy, owner, is_read = Signal(), Signal(), Signal()
        prio = Signal()  # the master that goes first when both request
        ar_done, aw_done, w_done = Signal(), Signal(), Signal()
        req = [x.arvalid | x.awvalid | x.wvalid for x in s]
        grant = Mux(req[0] & req[1], prio, req[1])
        # the grant is a register: the selects below depend on no master's valid
        with m.If(~busy & (req[0] | req[1])):
            m.d.sync += [busy.eq(1), owner.eq(grant),
                         is_read.eq(Mux(grant, s[1].arvalid, s[0].arvalid))]
        ssel = {n: Mux(owner, getattr(s[1], n), getattr(s[0], n))
                for n in ("awaddr", "awprot", "awvalid", "wdata", "wstrb", "wvalid", "bready",
                          "araddr", "arprot", "arvalid", "rready")}
        ar_ok = busy & is_read & ~ar_done
        aw_ok = busy & ~is_read & ~aw_done
        w_ok = busy & ~is_read & ~w_done
        m.d.comb += [
            bus.araddr.eq(ssel["araddr"]), bus.arprot.eq(ssel["arprot"]),
            bus.awaddr.eq(ssel["awaddr"]), bus.awprot.eq(ssel["awprot"]),
            bus.wdata.eq(ssel["wdata"]), bus.wstrb.eq(ssel["wstrb"]),
            bus.arvalid.eq(ar_ok & ssel["arvalid"]),
            bus.awvalid.eq(aw_ok & ssel["awvalid"]),
            bus.wvalid.eq(w_ok & ssel["wvalid"]),
            bus.rready.eq(busy & is_read & ssel["rready"]),
            bus.bready.eq(busy & ~is_read & ssel["bready"]),
        ]
        for k, x in enumerate(s):
            mine = busy & (owner == k)
            m.d.comb += [
                x.arready.eq(mine & ar_ok & bus.arready),
                x.awready.eq(mine & aw_ok & bus.awready),
                x.wready.eq(mine & w_ok & bus.wready),
                x.rvalid.eq(mine & is_read & bus.rvalid), x.rdata.eq(bus.rdata),
                x.rresp.eq(bus.rresp),
                x.bvalid.eq(mine & ~is_read & bus.bvalid), x.bresp.eq(bus.bresp),
            ]
        done = (bus.rvalid & bus.rready) | (bus.bvalid & bus.bready)
        with m.If(busy):
            m.d.sync += [ar_done.eq(ar_done | (bus.arvalid & bus.arready)),
                         aw_done.eq(aw_done | (bus.awvalid & bus.awready)),
                         w_done.eq(w_done | (bus.wvalid & bus.wready))]
        with m.If(busy & done):
            m.d.sync += [busy.eq(0), prio.eq(~owner), ar_done.eq(0), aw_done.eq(0),
                         w_done.eq(0)]
        return m


class AxiLiteSlice(wiring.Component):
    """AXI4-Lite register slice: the master on ``s`` (In), the slave on ``m`` (Out), both
    :class:`~netreduce.hw.csr.AXI4LiteSignature` (``addr_width``, ``data_width``).

    Every channel goes through a :class:`~netreduce.hw.skid.SkidBuffer` (AR, AW, W towards the
    slave; R, B back), so every output is a flip-flop and no path runs combinationally from one
    side to the other (the valid/ready chains of the master, the arbiter and the register bank
    stay within one block each). Latency: 1 cycle per channel and direction (a read or a write
    takes 2 cycles more end to end); throughput: one transfer per cycle per channel; order kept,
    nothing dropped; backpressure: each side's ``*ready`` from the skid registers. No errors of
    its own (responses pass through). Reset: synchronous, empty.
    """

    def __init__(self, addr_width: int, data_width: int = 32):
        sig = AXI4LiteSignature(addr_width, data_width)
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({"s": In(sig), "m": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        aw, dw = self.addr_width, self.data_width
        s, o = self.s, self.m
        # channel -> (payload layout, its two fields' names on the bus)
        fwd = {"ar": (data.StructLayout({"x": aw, "y": 3}), "araddr", "arprot"),
               "aw": (data.StructLayout({"x": aw, "y": 3}), "awaddr", "awprot"),
               "w": (data.StructLayout({"x": dw, "y": dw // 8}), "wdata", "wstrb")}
        for ch, (lay, f0, f1) in fwd.items():
            m.submodules[ch] = sk = SkidBuffer(lay)
            m.d.comb += [sk.i.valid.eq(getattr(s, f"{ch}valid")),
                         sk.i.payload.x.eq(getattr(s, f0)),
                         sk.i.payload.y.eq(getattr(s, f1)),
                         getattr(s, f"{ch}ready").eq(sk.i.ready),
                         getattr(o, f"{ch}valid").eq(sk.o.valid),
                         getattr(o, f0).eq(sk.o.payload.x),
                         getattr(o, f1).eq(sk.o.payload.y),
                         sk.o.ready.eq(getattr(o, f"{ch}ready"))]
        m.submodules.r = r = SkidBuffer(data.StructLayout({"data": dw, "resp": 2}))
        m.submodules.b = b = SkidBuffer(2)
        m.d.comb += [r.i.valid.eq(o.rvalid), r.i.payload.data.eq(o.rdata),
                     r.i.payload.resp.eq(o.rresp), o.rready.eq(r.i.ready),
                     s.rvalid.eq(r.o.valid), s.rdata.eq(r.o.payload.data),
                     s.rresp.eq(r.o.payload.resp), r.o.ready.eq(s.rready),
                     b.i.valid.eq(o.bvalid), b.i.payload.eq(o.bresp), o.bready.eq(b.i.ready),
                     s.bvalid.eq(b.o.valid), s.bresp.eq(b.o.payload), b.o.ready.eq(s.bready)]
        return m


# ============================================================================ the path
def mgmt_cfg_layouts(rm: RegMap) -> tuple[data.StructLayout, data.ArrayLayout,
                                          data.ArrayLayout]:
    """The layouts of the register bank's ``mgmt_cfg``, ``mgmt_src_cfg`` and
    ``mgmt_src_status`` members for ``rm`` (RW fields, resp. RO fields, keys in lower case, as
    :class:`~netreduce.hw.csr.RegisterBank` generates them), so they connect with ``.eq``."""
    def lay(t, access):
        return data.StructLayout({
            r.name.lower(): data.StructLayout({f.name.lower(): unsigned(f.width)
                                               for f in r.fields if f.access == access})
            for r in t.registers if any(f.access == access for f in r.fields)})

    t, s = rm.table("MGMT"), rm.table("MGMT_SRC")
    return (lay(t, Access.RW), data.ArrayLayout(lay(s, Access.RW), s.count),
            data.ArrayLayout(lay(s, Access.RO), s.count))


class MgmtPath(wiring.Component):
    """The management agent with its stream plumbing: ``ports`` request inputs and response
    outputs of ``width`` bits, the agent's AXI4-Lite master, configuration and counters.

    Ports
    -----
    * ``i_p<k>`` (In, beat stream): the frames :class:`MgmtSplitter` of port ``k`` steered to
      management. Each port has a FIFO of ``buffer_bytes`` (rounded up to beats; default one
      largest management frame, 838 bytes with a VLAN tag), so a request is taken at line rate
      and the port's ordinary traffic is not held up while the agent works (about 3.5 cycles
      per request byte, plus one bus access per op). When a FIFO is full, ``i_p<k>.ready`` drops
      (the splitter then holds the port): frames are never dropped here.
    * Requests are merged frame by frame, round robin (:class:`FrameArbiter`), cut into 64-bit
      beats (:class:`Downsizer`) and read by :class:`~netreduce.hw.mgmt.MgmtAgent`, one frame at
      a time. The port of each frame goes with it (a small FIFO from the merge to the agent).
    * ``o_p<k>`` (Out, beat stream): the response to a request that came in on port ``k``
      (:class:`Upsizer` back to ``width``), held until ``ready``. Silent drops (malformed,
      source, tag) send nothing.
    * ``bus`` (Out, AXI4-Lite, ``addr_width``): the agent's master (one access per op).
    * ``mgmt_cfg``, ``mgmt_src_cfg`` (In), ``mgmt_src_status`` (Out): the register bank's
      members of the same names (:func:`mgmt_cfg_layouts`); ``MGMT.CTRL.enable`` is used by the
      splitters, not here.
    * ``inc`` (Out): one-cycle strobes (:data:`PATH_COUNTERS`): the agent's ``mgmt_*``,
      ``rx_frames`` with every ``mgmt_rx`` (a management frame is a received frame) and
      ``tx_frames`` in the cycle after a response's last beat left on an ``o_p<k>`` (a
      register: no input of the path reaches an output combinationally).

    Latency: request FIFO and merge 1-2 cycles, downsizer 1, the agent (see its docstring),
    upsizer 1. Reset: synchronous, empty.
    """

    def __init__(self, regmap: RegMap, width: int, ports: int, *, addr_width: int | None = None,
                 buffer_bytes: int = 838):
        self.map = regmap
        self.width, self.ports = check_data_width(width), ports
        if ports < 1:
            raise ValueError(f"ports = {ports}: need at least one")
        if buffer_bytes < 0:
            raise ValueError(f"buffer_bytes = {buffer_bytes} must be >= 0")
        self.buffer_beats = -(-buffer_bytes // (width // 8))
        self.agent = MgmtAgent(regmap, addr_width=addr_width)
        self.addr_width = self.agent.addr_width
        cfg_l, src_l, st_l = mgmt_cfg_layouts(regmap)
        members = {}
        for k in range(ports):
            members[f"i_p{k}"] = In(beat_signature(width))
        for k in range(ports):
            members[f"o_p{k}"] = Out(beat_signature(width))
        members.update({
            "bus": Out(AXI4LiteSignature(self.addr_width)),
            "mgmt_cfg": In(cfg_l), "mgmt_src_cfg": In(src_l), "mgmt_src_status": Out(st_l),
            "inc": Out(data.StructLayout({n: 1 for n in PATH_COUNTERS})),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        P, w = self.ports, self.width
        ag = self.agent
        m.submodules.agent = ag
        cfg, src = self.mgmt_cfg, self.mgmt_src_cfg

        # ---- configuration and status
        # MGMT.CTRL.auth selects the agent's 64-bit tag: a copy of its own here, so that the
        # bank's flip-flop drives one load (a write takes effect one cycle later)
        auth = Signal()
        m.d.sync += auth.eq(cfg.ctrl.auth)
        m.d.comb += [
            ag.auth.eq(auth), ag.ip.eq(cfg.ip.ip), ag.port.eq(cfg.port.port),
            ag.mac.eq(Cat(cfg.mac_lo.mac, cfg.mac_hi.mac)),
            ag.key.eq(Cat(cfg.key0.key, cfg.key1.key, cfg.key2.key, cfg.key3.key)),
        ]
        for e in range(ag.nsrc):
            a, c = ag.src[e], src[e]
            m.d.comb += [a.valid.eq(c.cfg.valid), a.match_mac.eq(c.cfg.match_mac),
                         a.match_port.eq(c.cfg.match_port), a.port.eq(c.cfg.port),
                         a.ip.eq(c.ip.ip), a.mac.eq(Cat(c.mac_lo.mac, c.mac_hi.mac)),
                         self.mgmt_src_status[e].last_seq.seq.eq(ag.last_seq[e])]
        wiring.connect(m, ag.bus, wiring.flipped(self.bus))

        # ---- requests: per-port FIFO, merge, downsizer, agent
        merge = FrameArbiter(w, P)
        m.submodules.merge = merge
        for k in range(P):
            src_k = getattr(self, f"i_p{k}")
            dst = getattr(merge, f"i{k}")
            if self.buffer_beats:
                q = fifo.SyncFIFOBuffered(width=len(src_k.payload.as_value()),
                                          depth=self.buffer_beats)
                m.submodules[f"reqq{k}"] = q
                m.d.comb += [q.w_data.eq(src_k.payload), q.w_en.eq(src_k.valid),
                             src_k.ready.eq(q.w_rdy), dst.payload.eq(q.r_data),
                             dst.valid.eq(q.r_rdy), q.r_en.eq(dst.ready)]
            else:
                wiring.connect(m, wiring.flipped(src_k), dst)
        down = Downsizer(w, 64)
        m.submodules.down = down
        wiring.connect(m, merge.o, down.i)
        wiring.connect(m, down.o, ag.i)

        # the port travels with the frame: pushed when the merge starts a frame, popped when the
        # agent takes a frame's first beat (at most two frames lie between these points). Both
        # can happen in the same cycle with the FIFO empty (64-bit path, no downsizer
        # register): the merge's choice then goes straight to the agent's side.
        pb = _bits(P)
        cur_port = Signal(pb)
        if P > 1:
            pq = fifo.SyncFIFOBuffered(width=pb, depth=4)
            m.submodules.portq = pq
            ag_first = Signal(init=1)
            took = ag.i.valid & ag.i.ready
            with m.If(took):
                m.d.sync += ag_first.eq(ag.i.payload.last)
            push = merge.o.valid & merge.o.ready & merge.o.payload.first
            pop = took & ag_first
            through = pop & ~pq.r_rdy
            m.d.comb += [pq.w_data.eq(merge.sel), pq.w_en.eq(push & ~through),
                         pq.r_en.eq(pop)]
            with m.If(pop):
                m.d.sync += cur_port.eq(Mux(through, merge.sel, pq.r_data))

        # ---- responses: upsizer, then the output of the request's port
        up = Upsizer(64, w)
        m.submodules.up = up
        wiring.connect(m, ag.o, up.i)
        # the agent takes no request before its response is out of it; the upsizer may still
        # hold the response's last beat then, so it keeps the port latched with the first beat
        # (at 64 bits the upsizer is a wire and the agent's port is the response's)
        if w == 64:
            out_port = cur_port
        else:
            out_port = Signal(pb)
            with m.If(ag.o.valid & ag.o.ready & ag.o.payload.first):
                m.d.sync += out_port.eq(cur_port)
        sent = []
        for k in range(P):
            o = getattr(self, f"o_p{k}")
            mine = out_port == k
            m.d.comb += [o.payload.eq(up.o.payload), o.valid.eq(up.o.valid & mine)]
            sent.append(o.valid & o.ready & o.payload.last)
        m.d.comb += up.o.ready.eq(Array(getattr(self, f"o_p{k}").ready for k in range(P))[
            out_port])

        # ---- counters
        for name in MGMT_COUNTERS:
            m.d.comb += self.inc[name].eq(ag.inc[name])
        # tx_frames one cycle after the response's last beat left: registered, so that an
        # output's ready (from the port's frame merge) reaches no output of the path
        m.d.comb += self.inc.rx_frames.eq(ag.inc.mgmt_rx)
        m.d.sync += self.inc.tx_frames.eq(Cat(*sent).any())
        return m


# ============================================================================ engine hook
@dataclass
class MgmtHooks:
    """What :func:`attach_mgmt` gives the engine's ``elaborate``.

    * ``rx[k]``: the stream that replaces ``i_p<k>`` in front of the frame guard and parser
      (ordinary traffic only); read ``valid``/``payload``, drive ``ready``.
    * ``tx[k]``: the stream the engine's TX arbiter drives instead of ``o_p<k>``; it is merged
      frame by frame with the port's management responses into ``o_p<k>``.
    * ``inc``: counter strobes (:data:`PATH_COUNTERS`) to add into ``bank.cnt_inc``: every
      ``mgmt_*`` and ``rx_frames`` (one per management frame), and ``tx_frames`` (one per
      response sent); the engine's own ``tx_frames`` keeps counting its ``tx[k]`` frames.
    * ``path``, ``splitters``, ``axil_arbiter``, ``tx_merge``: the submodules, for tests.
    """

    rx: list
    tx: list
    inc: object
    path: MgmtPath
    splitters: list
    axil_arbiter: AxiLiteArbiter
    tx_merge: list


def attach_mgmt(m: Module, engine, bank, *, buffer_bytes: int = 838) -> MgmtHooks:
    """Build the management path inside ``engine``'s ``elaborate`` (module ``m``; ``bank`` the
    engine's :class:`~netreduce.hw.csr.RegisterBank`, not yet connected to ``engine.s_axil``).

    Connections made here: ``engine.i_p<k>`` -> :class:`MgmtSplitter` (``o_mgmt`` ->
    :class:`MgmtPath`); ``engine.s_axil`` -> :class:`AxiLiteArbiter` ``s0``, the agent's bus ->
    ``s1``, ``m`` -> ``bank.s_axil``; ``bank.mgmt_cfg`` / ``mgmt_src_cfg`` -> the path and the
    splitters (``enable``, ``ip``, ``port``), the path's ``mgmt_src_status`` -> the bank; per
    port a :class:`FrameArbiter` (engine TX = input 0, responses = input 1) -> ``o_p<k>``.

    Left to the engine (see :class:`MgmtHooks`): use ``rx[k]`` instead of ``i_p<k>`` and
    ``tx[k]`` instead of ``o_p<k>``, add ``inc`` into ``bank.cnt_inc``.
    """
    P, w = engine.ports, engine.width
    path = MgmtPath(engine.map, w, P, addr_width=bank.addr_width, buffer_bytes=buffer_bytes)
    m.submodules.mgmt_path = path
    arb = AxiLiteArbiter(bank.addr_width)
    m.submodules.mgmt_axil_arb = arb
    # register slices on both sides of the arbiter: the agent's bus FSM, the arbiter and the
    # bank's handshake logic each end at flip-flops (no valid/ready chain through all three)
    m.submodules.mgmt_axil_s1 = s1 = AxiLiteSlice(bank.addr_width)
    m.submodules.mgmt_axil_m = sm = AxiLiteSlice(bank.addr_width)
    wiring.connect(m, wiring.flipped(engine.s_axil), arb.s0)
    wiring.connect(m, path.bus, s1.s)
    wiring.connect(m, s1.m, arb.s1)
    wiring.connect(m, arb.m, sm.s)
    wiring.connect(m, sm.m, bank.s_axil)
    m.d.comb += [path.mgmt_cfg.eq(bank.mgmt_cfg), path.mgmt_src_cfg.eq(bank.mgmt_src_cfg),
                 bank.mgmt_src_status.eq(path.mgmt_src_status)]
    rx, tx, spl, txm = [], [], [], []
    for k in range(P):
        s = MgmtSplitter(w)
        m.submodules[f"mgmt_split{k}"] = s
        wiring.connect(m, wiring.flipped(getattr(engine, f"i_p{k}")), s.i)
        wiring.connect(m, s.o_mgmt, getattr(path, f"i_p{k}"))
        m.d.comb += [s.enable.eq(bank.mgmt_cfg.ctrl.enable), s.ip.eq(bank.mgmt_cfg.ip.ip),
                     s.port.eq(bank.mgmt_cfg.port.port)]
        a = FrameArbiter(w, 2)
        m.submodules[f"mgmt_txm{k}"] = a
        wiring.connect(m, getattr(path, f"o_p{k}"), a.i1)
        wiring.connect(m, a.o, wiring.flipped(getattr(engine, f"o_p{k}")))
        rx.append(s.o)
        tx.append(a.i0)
        spl.append(s)
        txm.append(a)
    return MgmtHooks(rx, tx, path.inc, path, spl, arb, txm)
