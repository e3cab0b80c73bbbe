"""Gateware for the in-band management path (protocol: docs/management.md).

* :class:`SipHash24`: the tag engine (``MGMT.CTRL.auth``), computing SipHash-2-4 exactly as
  :func:`netreduce.wire.mgmt.siphash24` (tests: reference vectors, random keys and messages).
* :class:`MgmtAgent`: the agent, the behaviour of :class:`netreduce.sim.model.mgmt.MgmtAgent` in
  gateware (tests: byte-identical responses, counter events and registers on the same frames),
  built from :class:`ByteReader` (request bytes), :class:`SourceMatch` (allow-list and replay
  state), :class:`OpCheck` (op checks), :class:`OpBusMaster` (one register access per op) and
  :class:`BeatPacker` (response beats) around its FSM; each states its contract.

:class:`SipHash24` contract
---------------------------
* ``key`` (In, 128): the key as the integer ``int.from_bytes(key_bytes, "little")``, i.e.
  ``MGMT.KEY3 << 96 | MGMT.KEY2 << 64 | MGMT.KEY1 << 32 | MGMT.KEY0``. Sampled with the first
  word of each message; it must stay stable until the tag has been taken.
* ``i`` (In, ``lib.stream``): message words, ``data`` 64 bits little-endian (message byte ``8w+b``
  is ``data[8b:8b+8]`` of word ``w``). Every word is 8 full bytes except the one with ``last``
  set, which holds ``nbytes`` (0..7) valid bytes in its low bytes (bits above are ignored). So a
  message of ``n`` bytes is ``n // 8`` full words and a last word of ``n % 8`` bytes.
* ``o`` (Out, ``lib.stream``): the 64-bit tag (the integer SipHash value; on the wire it goes
  little-endian), one per message, held until ``o.ready``.
* Timing: half a SipRound per cycle (one 64-bit adder deep: the clock plan's 8 CARRY8). A word
  is taken every 6 cycles (accept into a register, mix in, 4 half-rounds); after the last word,
  8 finalisation half-rounds, then ``o.valid``: ``6 * words + 8`` cycles from the first word
  offered to the tag. ``i.ready`` is low while a word is in flight or a tag waits. A 792-byte
  management payload (+12-byte pseudo-header, 101 words) takes about 614 cycles, 2.5 us at
  250 MHz. No backpressure path besides ``o.ready``.
* Cost: four 64-bit carry-select adders (three pieces each: the longest carry chain is 25 bits),
  XOR/rotate wiring and 256 + 64 + 64 + small flip-flops (state, word, input word, length,
  counters); ``bench/mgmt_siphash.py`` gives the Yosys ``synth_xilinx -family xcup`` figures.
  Reset: synchronous, idle, no tag pending.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from netreduce.regmap import RegMap, build_regmap
from netreduce.wire import ETHERTYPE_IPV4, ETHERTYPE_VLAN, IP_PROTO_UDP
from netreduce.wire import fields as wf
from netreduce.wire.mgmt import (
    MGMT_HDR,
    MGMT_MAGIC,
    MGMT_MAX_OPS,
    MGMT_OP,
    MGMT_TTL,
    MGMT_VERSION,
    NO_ERROR_INDEX,
    MgmtOpcode,
    MgmtStatus,
    MgmtType,
)

from .csr.axil import AXI4LiteSignature
from .stream import beat_layout

__all__ = ["SipHash24", "sip_word_layout", "SIP_C", "MgmtAgent", "MGMT_COUNTERS",
           "src_entry_layout", "addr_valid", "ByteReader", "SourceMatch", "OpCheck",
           "OpBusMaster", "BeatPacker"]

# v0..v3 initialisation constants ("somepseudorandomlygeneratedbytes")
SIP_C = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
_M64 = (1 << 64) - 1


def sip_word_layout() -> data.StructLayout:
    """Payload of :class:`SipHash24`'s input stream."""
    return data.StructLayout({"data": 64, "nbytes": 3, "last": 1})


def _rotl(v, n: int):
    return v.rotate_left(n)


def _add64(a, b, cut=(24, 44)):
    """``(a + b) mod 2**64`` as a carry-select adder in three pieces: each upper piece is added
    for both carries into it in parallel and chosen by the carry out of the piece below, so the
    longest carry chain is 25 bits (7 CARRY4 cells), not 64."""
    lo = a[:cut[0]] + b[:cut[0]]
    out, carry = [lo[:cut[0]]], lo[cut[0]]
    for x, y in ((cut[0], cut[1]), (cut[1], 64)):
        s0, s1 = a[x:y] + b[x:y], a[x:y] + b[x:y] + 1
        out.append(Mux(carry, s1[:y - x], s0[:y - x]))
        carry = Mux(carry, s1[y - x], s0[y - x])
    return Cat(*out)


def _half_a(v0, v1, v2, v3):
    """The first half of a SipRound (one adder deep, combinational)."""
    v0 = _add64(v0, v1)
    v2 = _add64(v2, v3)
    return _rotl(v0, 32), _rotl(v1, 13) ^ v0, v2, _rotl(v3, 16) ^ v2


def _half_b(v0, v1, v2, v3):
    """The second half of a SipRound (one adder deep, combinational)."""
    v0 = _add64(v0, v3)
    v2 = _add64(v2, v1)
    return v0, _rotl(v1, 17) ^ v2, _rotl(v2, 32), _rotl(v3, 21) ^ v0


class SipHash24(wiring.Component):
    """SipHash-2-4 over a stream of 64-bit message words (see the module docstring)."""

    def __init__(self):
        super().__init__({
            "key": In(128),
            "i": In(stream.Signature(sip_word_layout())),
            "o": Out(stream.Signature(64)),
        })

    def elaborate(self, platform):
        m = Module()
        v = [Signal(64, name=f"v{k}") for k in range(4)]
        word = Signal(64)  # the word being absorbed
        last = Signal()  # it is the message's last word
        length = Signal(8)  # message length mod 256 (bytes absorbed so far)
        fresh = Signal(init=1)  # next word starts a new message: load the key first
        halves = Signal(range(9))  # half-rounds left
        odd = Signal()  # the next half-round is a second half
        k0, k1 = self.key[:64], self.key[64:]
        # the word as taken (registered: the masking and length below start from flip-flops)
        i_data, nb, i_last = Signal(64), Signal(3), Signal()

        # The word as absorbed: the last one gets its valid bytes and the length in byte 7.
        mask = Signal(64)  # the valid bytes of a last word (a compare per byte, no subtraction)
        m.d.comb += mask.eq(Cat(*[Mux(nb > j, 0xFF, 0) for j in range(8)]))
        total = Signal(8)
        m.d.comb += total.eq(Mux(fresh, 0, length) + Mux(i_last, nb, 8))
        eff = Signal(64)
        m.d.comb += eff.eq(Mux(i_last, (i_data & mask) | (total << 56), i_data))

        ha, hb = _half_a(*v), _half_b(*v)
        r = [Mux(odd, hb[k], ha[k]) for k in range(4)]
        with m.FSM(name="state"):
            with m.State("ABSORB"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [i_data.eq(self.i.payload.data), nb.eq(self.i.payload.nbytes),
                                 i_last.eq(self.i.payload.last)]
                    m.next = "MIX"
            with m.State("MIX"):
                init = [k0 ^ SIP_C[0], k1 ^ SIP_C[1], k0 ^ SIP_C[2], k1 ^ SIP_C[3]]
                for k in range(3):
                    m.d.sync += v[k].eq(Mux(fresh, init[k], v[k]))
                m.d.sync += [
                    v[3].eq(Mux(fresh, init[3], v[3]) ^ eff),
                    word.eq(eff), last.eq(i_last), length.eq(total),
                    fresh.eq(0), halves.eq(4), odd.eq(0),
                ]
                m.next = "COMPRESS"
            with m.State("COMPRESS"):
                m.d.sync += [halves.eq(halves - 1), odd.eq(~odd)]
                m.d.sync += [v[k].eq(r[k]) for k in range(4)]
                with m.If(halves == 1):
                    m.d.sync += v[0].eq(hb[0] ^ word)
                    with m.If(last):
                        m.d.sync += [v[2].eq(hb[2] ^ 0xFF), halves.eq(8)]
                        m.next = "FINAL"
                    with m.Else():
                        m.next = "ABSORB"
            with m.State("FINAL"):
                m.d.sync += [halves.eq(halves - 1), odd.eq(~odd)]
                m.d.sync += [v[k].eq(r[k]) for k in range(4)]
                with m.If(halves == 1):
                    m.next = "OUT"
            m.d.comb += self.o.payload.eq(v[0] ^ v[1] ^ v[2] ^ v[3])  # valid in OUT
            with m.State("OUT"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.d.sync += fresh.eq(1)
                    m.next = "ABSORB"
        return m


# ============================================================================ the agent
MGMT_COUNTERS = ("mgmt_rx", "mgmt_accepted", "mgmt_reject_malformed", "mgmt_reject_source",
                 "mgmt_reject_auth", "mgmt_reject_replay", "mgmt_reject_opcode",
                 "mgmt_reject_addr", "mgmt_reject_denied")


def src_entry_layout() -> data.StructLayout:
    """One allow-list entry as the agent sees it (the MGMT_SRC registers' RW fields)."""
    return data.StructLayout({"valid": 1, "match_mac": 1, "match_port": 1, "port": 16, "ip": 32,
                              "mac": 48})


def _addr_hits(rm: RegMap, addr) -> list:
    """Per register table (single-entry tables: per register), whether ``addr`` (32 bits) falls
    on one of its registers (alignment not checked): :func:`addr_valid` is their OR."""
    hits = []
    for t in rm.tables:
        if not t.count:
            continue
        offs = sorted(r.offset for r in t.registers)
        if t.count == 1:
            hits += [addr == t.base + o for o in offs]
            continue
        shift = t.stride.bit_length() - 1
        if t.stride != 1 << shift or t.base % t.stride:
            raise ValueError(f"table {t.name}: stride 0x{t.stride:x} / base 0x{t.base:x} not "
                             "power-of-two aligned")
        idx = addr[shift:] - (t.base >> shift)
        inr = (addr >= t.base) & (idx < t.count)
        hits.append(inr & Cat(*[addr[:shift] == o for o in offs]).any())
    return hits


def addr_valid(rm: RegMap, addr):
    """Combinational: ``addr`` (32 bits) is 4-aligned and maps to a register of ``rm``."""
    return (addr[:2] == 0) & Cat(*_addr_hits(rm, addr)).any()


# Byte offsets of what the agent reads and writes, from netreduce.wire's tables. Frame offsets
# (``pos``, ``r``) count from the Ethernet header, L3 offsets (``q``, ``rq``) from the IPv4 header.
_E_SRC = wf.ETH.src.offset
_E_TYPE = wf.ETH.ethertype.offset  # the TPID of an 802.1Q frame sits here
_E_TCI = _E_TYPE + wf.DOT1Q.tci.offset
_E_TYPE_TAGGED = _E_TYPE + wf.DOT1Q.size
_L3, _L3_TAGGED = wf.ETH.size, wf.ETH.size + wf.DOT1Q.size
_IP = {f.name: f.offset for f in wf.IPV4.fields}
_UDP_AT = wf.IPV4.size
_UDP = {f.name: _UDP_AT + f.offset for f in wf.UDP.fields}
_MG_AT = _UDP_AT + wf.UDP.size  # the management header, then the ops
_MG = {f.name: f.offset for f in MGMT_HDR.fields}
_OPS_AT = _MG_AT + MGMT_HDR.size
_OP = {f.name: f.offset for f in MGMT_OP.fields}
# The authenticated pseudo-header: IPv4 source and destination, UDP source and destination ports.
_AUTH_FROM, _AUTH_TO = _IP["src"], _UDP["length"]
_OP_LAST = MGMT_OP.size - 1
_MIN_FRAME = 60  # a frame padded to the Ethernet minimum (without FCS) may carry bytes past L3
# An op is shifted in as one 96-bit word, byte 0 most significant: this layout is assumed below.
assert (_OP["opcode"], _OP["status"], _OP["addr"], _OP["value"]) == (0, 1, 4, 8)
# The response's IPv4 header with its constant fields (version/IHL, DF, TTL, protocol).
_IP_CONST = wf.IPV4.pack(version=4, ihl=wf.IPV4.size // 4, flags=0b010, ttl=MGMT_TTL,
                         protocol=IP_PROTO_UDP)
_IP_CONST_SUM = sum(int.from_bytes(_IP_CONST[i:i + 2], "big") for i in range(0, wf.IPV4.size, 2))
_E_IPV4 = ETHERTYPE_IPV4.to_bytes(2, "big")
_E_VLAN = ETHERTYPE_VLAN.to_bytes(2, "big")


def _span(at: int, n: int) -> range:
    return range(at, at + n)


def _be(v, i: int, n: int):
    """Byte ``i`` (0 = most significant) of the ``n``-byte big-endian value ``v``."""
    return v.word_select(n - 1 - i, 8)


# ---------------------------------------------------------------------------- agent blocks
class ByteReader(wiring.Component):
    """The agent's input: 64-bit beats read one byte per cycle through a one-beat register.

    * ``i`` (In, :func:`~netreduce.hw.stream.beat_layout` (64)): request frames.
    * ``en`` (In): read (the agent's RX state). While low nothing moves and ``i.ready`` is low.
    * ``valid`` / ``byte`` (Out): a byte of the frame this cycle (the held beat's low byte; bytes
      come in order, at most one per cycle, none for an empty beat).
    * ``end`` (Out): the frame's last beat is used up this cycle (with its last byte, if any);
      ``error``: that beat's ``error`` flag.

    Latency: a beat taken in cycle *t* gives its first byte in *t + 1*. Throughput: one byte per
    cycle with ``en`` high; ``i.ready`` (from registers only, and ``en``) is high while the
    register is empty, or its last valid byte is read and it is not the frame's last beat (the
    next beat follows without a gap); after the frame's last beat it stays low until ``en``
    rises again with the register empty. No errors of its own. Reset: synchronous, empty.
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(beat_layout(64))), "en": In(1),
                          "valid": Out(1), "byte": Out(8), "end": Out(1), "error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        beat = self.i.payload
        rxd, rxk, rxl, rxe, rxf = Signal(64), Signal(8), Signal(), Signal(), Signal()
        done = Signal()  # the held byte is the beat's last valid one, or the beat is empty
        m.d.comb += [done.eq(~rxk[1] | ~rxk[0]), self.byte.eq(rxd[:8]), self.error.eq(rxe),
                     self.valid.eq(self.en & rxf & rxk[0]),
                     self.end.eq(self.en & rxf & done & rxl)]
        with m.If(self.en):
            with m.If(rxf):
                with m.If(done):
                    m.d.sync += rxf.eq(0)
                    with m.If(~rxl):
                        m.d.comb += self.i.ready.eq(1)  # the next beat, without a gap
                with m.Else():
                    m.d.sync += [rxd.eq(rxd >> 8), rxk.eq(rxk >> 1)]
            with m.Else():
                m.d.comb += self.i.ready.eq(1)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [rxd.eq(beat.data), rxk.eq(beat.keep), rxl.eq(beat.last),
                         rxe.eq(beat.error), rxf.eq(1)]
        return m


class SourceMatch(wiring.Component):
    """The agent's allow-list and replay state (docs/management.md: source and replay checks).

    * ``src`` (In): the ``MGMT_SRC`` entries (:func:`src_entry_layout`); ``ip``, ``mac``,
      ``port``, ``seq`` (In): the request's IPv4 source, source MAC, UDP source port and
      sequence number, stable from the end of the frame until the decision.
    * A registered pipeline recomputed every cycle, one stage per cycle: the entries' field
      compares (and ``seq <= last_seq[e]`` per entry); each entry's rule; the first entry that
      matches and whether any does (``any``, Out); the replay check of that entry. Everything
      has settled 4 cycles after the inputs.
    * ``take`` (In, a strobe at least 4 cycles after the inputs settled): ``ent`` (Out) <= the
      first matching entry and ``replay`` (Out) <= ``seq <= last_seq[ent]``, from the next cycle.
    * ``commit`` (In, strobe): ``last_seq[ent] <= seq``. ``last_seq`` (Out): per entry, the last
      accepted sequence number (reset 0); ``ent_seq`` (Out): ``last_seq[ent]``, one cycle later.

    Throughput: new inputs every cycle; no backpressure; no errors. Depth: each stage is a
    compare, a 3-term rule, an 8-way priority pick or an 8-way bit select from flip-flops.
    Reset: synchronous, all zero.
    """

    def __init__(self, nsrc: int):
        self.nsrc = nsrc
        super().__init__({
            "src": In(data.ArrayLayout(src_entry_layout(), nsrc)),
            "ip": In(32), "mac": In(48), "port": In(16), "seq": In(32),
            "take": In(1), "commit": In(1),
            "any": Out(1), "ent": Out(range(max(2, nsrc))), "replay": Out(1),
            "ent_seq": Out(32), "last_seq": Out(data.ArrayLayout(32, nsrc)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.nsrc
        hit = Signal(n)
        seq_le = Signal(max(2, n))
        for e in range(n):
            s = self.src[e]
            eq_ip, eq_mac, eq_port = Signal(), Signal(), Signal()
            m.d.sync += [eq_ip.eq(s.ip == self.ip), eq_mac.eq(s.mac == self.mac),
                         eq_port.eq(s.port == self.port),
                         hit[e].eq(s.valid & eq_ip & (~s.match_mac | eq_mac)
                                   & (~s.match_port | eq_port)),
                         seq_le[e].eq(self.seq <= self.last_seq[e])]
        first_c, first = Signal.like(self.ent), Signal.like(self.ent)
        for e in reversed(range(n)):
            with m.If(hit[e]):
                m.d.comb += first_c.eq(e)
        replay = Signal()
        m.d.sync += [first.eq(first_c), self.any.eq(hit.any()),
                     replay.eq(seq_le.bit_select(first, 1)),
                     self.ent_seq.eq(self.last_seq[self.ent])]
        with m.If(self.take):
            m.d.sync += [self.ent.eq(first), self.replay.eq(replay)]
        with m.If(self.commit):
            m.d.sync += self.last_seq[self.ent].eq(self.seq)
        return m


class OpCheck(wiring.Component):
    """The agent's checks of one op (docs/management.md): ``opcode`` and ``addr`` (In) give
    ``bad_opc`` (neither READ nor WRITE), ``bad_addr`` (not 4-aligned or no register of the map:
    :func:`addr_valid`) and ``prot`` (one of ``protected``, the key registers) (Out), 2 cycles
    later. Stage 1 registers the opcode check, the protected-address compare and, per register
    table, whether the address falls in it; stage 2 joins the tables. Pipelined (new inputs every
    cycle); no backpressure; no errors."""

    def __init__(self, regmap: RegMap, protected):
        self.map, self.protected = regmap, tuple(protected)
        super().__init__({"opcode": In(8), "addr": In(32),
                          "bad_opc": Out(1), "bad_addr": Out(1), "prot": Out(1)})

    def elaborate(self, platform):
        m = Module()
        op, addr = self.opcode, self.addr
        hits = _addr_hits(self.map, addr)
        hit_q, aligned, opc, prot = Signal(len(hits)), Signal(), Signal(), Signal()
        m.d.sync += [hit_q.eq(Cat(*hits)), aligned.eq(addr[:2] == 0),
                     opc.eq((op != MgmtOpcode.READ) & (op != MgmtOpcode.WRITE)),
                     prot.eq(Cat(*[addr == a for a in self.protected]).any()),
                     self.bad_opc.eq(opc), self.prot.eq(prot),
                     self.bad_addr.eq(~(aligned & hit_q.any()))]
        return m


class OpBusMaster(wiring.Component):
    """One register access per ``start`` on an AXI4-Lite master (the agent's op execution).

    * ``start`` (In, strobe, while idle): ``write`` (In) selects a write of ``wdata`` or a read,
      at ``addr`` (In); ``addr`` and ``wdata`` must hold until ``done`` (they go to the bus
      combinationally). All byte strobes; ``awprot`` / ``arprot`` 0.
    * ``bus`` (Out, :class:`~netreduce.hw.csr.axil.AXI4LiteSignature`): a read is AR then R; a
      write offers AW and W together and takes each handshake when it comes, then B.
    * ``done`` (Out, strobe): the access completes this cycle (R or B handshake), with ``error``
      (a response other than OKAY) and, for a read, ``rdata``.

    Latency: ``start`` in cycle *t* offers AR or AW/W from *t + 1*; ``done`` comes with the R or
    B handshake (one cycle after the address handshake at the earliest). One access at a time;
    the bus's ready/valid signals are the only backpressure. Reset: synchronous, idle.
    """

    def __init__(self, addr_width: int):
        super().__init__({"start": In(1), "write": In(1), "addr": In(32), "wdata": In(32),
                          "bus": Out(AXI4LiteSignature(addr_width)),
                          "done": Out(1), "error": Out(1), "rdata": Out(32)})

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        aw_done, w_done = Signal(), Signal()
        m.d.comb += [bus.araddr.eq(self.addr), bus.awaddr.eq(self.addr),
                     bus.wdata.eq(self.wdata), bus.wstrb.eq(0xF), self.rdata.eq(bus.rdata)]
        with m.FSM(name="bus"):
            with m.State("IDLE"):
                m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                with m.If(self.start):
                    with m.If(self.write):
                        m.next = "AW"
                    with m.Else():
                        m.next = "AR"
            with m.State("AR"):
                m.d.comb += bus.arvalid.eq(1)
                with m.If(bus.arready):
                    m.next = "R"
            with m.State("R"):
                m.d.comb += [bus.rready.eq(1), self.done.eq(bus.rvalid),
                             self.error.eq(bus.rresp != 0)]
                with m.If(bus.rvalid):
                    m.next = "IDLE"
            with m.State("AW"):
                m.d.comb += [bus.awvalid.eq(~aw_done), bus.wvalid.eq(~w_done)]
                aw_now = aw_done | bus.awready
                w_now = w_done | bus.wready
                m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]
                with m.If(aw_now & w_now):
                    m.next = "B"
            with m.State("B"):
                m.d.comb += [bus.bready.eq(1), self.done.eq(bus.bvalid),
                             self.error.eq(bus.bresp != 0)]
                with m.If(bus.bvalid):
                    m.next = "IDLE"
        return m


class BeatPacker(wiring.Component):
    """The agent's output: response bytes packed into 64-bit beats.

    * ``start`` (In, strobe, while idle): a response frame begins; bytes are taken from the next
      cycle on.
    * ``take`` (Out): ``byte`` (In) is taken this cycle; ``byte_last`` (In): it is the frame's
      last. Bytes are taken one per cycle until a beat is full (8) or the frame's last byte.
    * ``o`` (Out, :func:`~netreduce.hw.stream.beat_layout` (64)): the beat (``keep`` per byte,
      ``first`` on the frame's first beat, ``last`` on its last), held until ``o.ready``;
      ``done`` (Out, strobe): the frame's last beat is taken this cycle.

    Throughput: 8 bytes in 9 cycles (a beat is sent in the cycle after its last byte, at the
    earliest); backpressure: ``o.ready`` (no byte is taken while a beat waits). No errors.
    Reset: synchronous, idle.
    """

    def __init__(self):
        super().__init__({"start": In(1), "byte": In(8), "byte_last": In(1), "take": Out(1),
                          "o": Out(stream.Signature(beat_layout(64))), "done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        obeat, okeep, ofirst, olast, onext = (Signal(64), Signal(8), Signal(), Signal(),
                                              Signal(3))
        with m.FSM(name="pack"):
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [onext.eq(0), okeep.eq(0), ofirst.eq(1), obeat.eq(0)]
                    m.next = "EMIT"
            with m.State("EMIT"):
                m.d.comb += self.take.eq(1)
                m.d.sync += [obeat.word_select(onext, 8).eq(self.byte),
                             okeep.bit_select(onext, 1).eq(1), onext.eq(onext + 1),
                             olast.eq(self.byte_last)]
                with m.If((onext == 7) | self.byte_last):
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.o.valid.eq(1), self.o.payload.data.eq(obeat),
                             self.o.payload.keep.eq(okeep), self.o.payload.first.eq(ofirst),
                             self.o.payload.last.eq(olast)]
                with m.If(self.o.ready):
                    m.d.sync += [okeep.eq(0), ofirst.eq(0), onext.eq(0), obeat.eq(0)]
                    with m.If(olast):
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "EMIT"
        return m


class MgmtAgent(wiring.Component):
    """The engine-side management agent in gateware: the behaviour of
    :class:`netreduce.sim.model.mgmt.MgmtAgent` (checks and their order, counters, response bytes),
    tested frame by frame against it.

    Ports
    -----
    * ``i``: frames the packet path steers to management (the match rule of docs/management.md:
      IPv4 to ``MGMT.IP``, UDP, port ``MGMT.PORT`` or unreadable) as 64-bit beats
      (:func:`netreduce.hw.stream.beat_layout`). Every frame counts ``mgmt_rx``. Read at one byte
      per cycle through a one-beat register: ``i.ready`` (from registers only) is high while
      the register is empty or its last valid byte is read and it is not the frame's last
      beat; low while the rest of a frame is processed (one frame at a time). A beat with
      ``error`` set on the last beat makes the frame malformed. Frames above 2047 bytes are
      malformed and drained.
    * ``o``: response frames as 64-bit beats (``first``/``last``/``keep`` per the beat layout),
      held until ``o.ready``.
    * ``bus``: AXI4-Lite master into the register bank; one access at a time, all byte strobes.
    * ``auth``, ``ip``, ``mac`` (48 bits, first byte most significant), ``port``, ``key`` (see
      :class:`SipHash24`), ``src`` (:func:`src_entry_layout` per entry): the bank's ``MGMT`` /
      ``MGMT_SRC`` configuration outputs. (``MGMT.CTRL.enable`` gates the packet path's match.)
    * ``last_seq`` (Out): per entry, to the bank's ``MGMT_SRC.LAST_SEQ`` status inputs.
    * ``inc`` (Out): a one-cycle strobe per counter event (:data:`MGMT_COUNTERS`), for the bank's
      ``cnt_inc``, registered (the cycle after the event).
    * ``busy`` (Out): a frame is being processed or answered.

    Latency (cycles, ``n`` frame bytes, ``c`` ops): reading ~``n``; end checks 3; tag ~14 after
    the last byte (the core keeps up with the bytes); decision ``3c + 2``; one AXI4-Lite access
    per op (bank: 3 cycles each); response hash ~``n`` (+ 14 for the tag); checksum 11;
    emission ~``9n/8``. Refused and dropped frames stop after the decision. Reset: synchronous,
    idle.

    Depth (clock plan, docs/engine.md): every register-to-register path within 8 LUT levels.
    The input beat sits in a shift register (the byte read is its low byte); field positions
    are one-hot shift registers, not compares on a byte counter; the response comes from
    shift registers loaded in whole (header bytes of a pass, then one op at a time from the op
    memory), so no cycle muxes a byte by its offset; multi-operand sums (checksums, the IPv4
    header sum) are added one term per cycle or over register stages; compares that feed the
    FSM (tag, source rules, op checks, end-of-frame checks) are registered first.
    """

    def __init__(self, regmap: RegMap | None = None, *, addr_width: int | None = None):
        rm = regmap if regmap is not None else build_regmap()
        self.map = rm
        need = max(1, (rm.size - 1).bit_length())
        self.addr_width = addr_width or need
        self.nsrc = rm.table("MGMT_SRC").count
        self.protected = tuple(rm.addr(f"MGMT.KEY{i}") for i in range(4))
        super().__init__({
            "i": In(stream.Signature(beat_layout(64))),
            "o": Out(stream.Signature(beat_layout(64))),
            "bus": Out(AXI4LiteSignature(self.addr_width)),
            "auth": In(1), "ip": In(32), "mac": In(48), "port": In(16), "key": In(128),
            "src": In(data.ArrayLayout(src_entry_layout(), self.nsrc)),
            "last_seq": Out(data.ArrayLayout(32, self.nsrc)),
            "inc": Out(data.StructLayout({n: 1 for n in MGMT_COUNTERS})),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        s = SimpleNamespace()  # the agent's state, shared by the FSM's parts below
        m.submodules.sip = s.sip = SipHash24()
        m.d.comb += s.sip.key.eq(self.key)
        m.submodules.ops = ops = Memory(shape=72, depth=MGMT_MAX_OPS, init=[])
        s.op_rd = ops.read_port(domain="comb")
        s.op_wr = ops.write_port()
        s.op_opcode, s.op_addr = s.op_rd.data[64:72], s.op_rd.data[32:64]
        s.op_value = s.op_rd.data[:32]
        m.submodules.reader = s.rd = ByteReader()
        m.submodules.src = s.sm = SourceMatch(self.nsrc)
        m.submodules.opcheck = s.chk = OpCheck(self.map, self.protected)
        m.submodules.master = s.bm = OpBusMaster(self.addr_width)
        m.submodules.packer = s.pk = BeatPacker()
        wiring.connect(m, wiring.flipped(self.i), s.rd.i)
        wiring.connect(m, s.pk.o, wiring.flipped(self.o))
        wiring.connect(m, s.bm.bus, wiring.flipped(self.bus))
        m.d.comb += [s.chk.opcode.eq(s.op_opcode), s.chk.addr.eq(s.op_addr),
                     s.bm.addr.eq(s.op_addr), s.bm.wdata.eq(s.op_value),
                     s.bm.write.eq(s.op_opcode != MgmtOpcode.READ),
                     s.sm.src.eq(self.src), self.last_seq.eq(s.sm.last_seq)]
        # counter strobes registered (one cycle later): the decision logic ends here, not in
        # the register bank's counter adders
        s.inc = Signal.like(self.inc, name="inc_c")
        m.d.sync += self.inc.eq(s.inc)
        self._request_state(m, s)
        self._response_bytes(m, s)
        with m.FSM(name="state") as fsm:
            # (and while a registered counter strobe is out, the cycle after the frame's end)
            m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | self.inc.as_value().any())
            self._rx_states(m, s)
            self._decide_states(m, s)
            self._exec_states(m, s)
            self._resp_states(m, s)
        return m

    # ---------------------------------------------------------------- request state
    def _request_state(self, m, s):
        """The request's fields and running sums, filled byte by byte in RX."""
        s.pos = Signal(11)  # bytes of the frame seen (saturating)
        s.q = Signal(11)  # bytes seen from the IPv4 header on
        # one-hot positions (pos < 18, q < the first op) and q past the header, shifted with
        # every byte: the field decodes are flip-flops, not compares on pos / q
        s.ph = Signal(_E_TYPE_TAGGED + 2)
        s.qh = Signal(_OPS_AT)
        s.q_ops = Signal()
        s.q_lt = Signal()  # q < total, registered with q's step (total is complete by q = 4)
        s.in_l3, s.vlan = Signal(), Signal()
        s.tci, s.et_hi, s.src_mac, s.dscp = Signal(16), Signal(8), Signal(48), Signal(6)
        s.total = Signal(16)
        s.src_ip, s.dst_ip = Signal(32), Signal(32)
        s.sport, s.dport, s.ulen, s.ucsum = Signal(16), Signal(16), Signal(16), Signal(16)
        s.ipsum = Signal(24)
        s.usum = Signal(27)  # < 1024 words of 16 bits (+ 17): no carry past bit 26
        s.bad = Signal()
        s.magic, s.version, s.typ = Signal(16), Signal(8), Signal(8)
        s.seq, s.count = Signal(32), Signal(8)
        s.hdr_rsv = Signal(56)  # status, err_index, reserved, last_seq: 0 in a request
        s.tag_rx = Signal(64)
        s.opbuf = Signal(88)  # the first 11 bytes of the op being received
        s.ob = Signal(4)  # byte within the op
        s.ri = Signal(7)  # op index while receiving
        s.oi = Signal(7)  # op index in the response passes
        s.hw_data = Signal(64)  # hash word being assembled (newest byte on top)
        s.hw_n = Signal(4)
        # decision state
        s.status, s.err = Signal(8), Signal(8)
        s.tag_bad = Signal()  # the computed tag differs from the frame's (registered compare)
        s.k = Signal(7)
        s.cnt_m1 = Signal(8)
        m.d.sync += s.cnt_m1.eq(s.count - 1)
        # "op k is the last" as a register: k and count settle at least a cycle before the
        # states that read it (VALIDATE two after VAL_RD, BUS one after EXEC), so the FSM's
        # next state reads one flip-flop instead of the compare
        s.k_last = Signal()
        m.d.sync += s.k_last.eq(s.k == s.cnt_m1)
        # the source checks (registered stages: the fields are complete at RX_END, the result
        # is taken in HASH_WAIT, several cycles of hashing later)
        m.d.comb += [s.sm.ip.eq(s.src_ip), s.sm.mac.eq(s.src_mac), s.sm.port.eq(s.sport),
                     s.sm.seq.eq(s.seq)]
        s.bad_end = Signal()  # the end-of-frame checks failed (set in RX_CSUM)
        # a defect seen this cycle, one bit per check (several may fire at once; no OR of them
        # before the register)
        s.bad_set = Signal(6)
        s.bad_q = Signal(6)  # bad_set, registered (``bad`` is read at the decision, cycles later)
        m.d.sync += [s.bad_q.eq(s.bad_set),
                     s.bad.eq(s.bad | s.bad_q.any())]  # before the FSM: IDLE's clear wins

    def _hash_byte(self, m, s, b):
        """Append a message byte; a full word goes to the core, which is always ready for it
        (bytes come at most one per cycle, it takes a word every 6 cycles)."""
        word = Cat(s.hw_data[8:], b)
        m.d.sync += [s.hw_data.eq(word), s.hw_n.eq(Mux(s.hw_n == 7, 0, s.hw_n + 1))]
        with m.If(s.hw_n == 7):
            m.d.comb += [s.sip.i.valid.eq(1), s.sip.i.payload.data.eq(word)]

    @staticmethod
    def _add16(m, acc, b, even):
        """One's-complement accumulation of byte ``b`` at an even (high) or odd position."""
        m.d.sync += acc.eq(acc + Mux(even, b << 8, b))

    def _last_word(self, m, s, nxt):
        sip = s.sip
        m.d.comb += [sip.i.valid.eq(1), sip.i.payload.last.eq(1),
                     sip.i.payload.nbytes.eq(s.hw_n),
                     sip.i.payload.data.eq(s.hw_data >> ((8 - s.hw_n) * 8).as_unsigned())]
        with m.If(sip.i.ready):
            m.next = nxt

    # ---------------------------------------------------------------- response bytes
    def _response_bytes(self, m, s):
        """The response leaves byte-serially from shift registers loaded in whole, so every
        cycle takes the byte at a fixed position (no byte mux on an offset): ``hsr`` holds the
        header bytes of a pass (``hv``: which are left), ``osr`` the op being sent, loaded from
        the op memory when the header or the previous op ends. Pass 1 (hash and UDP checksum)
        sends the pseudo-header and the management header with a zero tag, pass 2 (emission)
        the whole frame; both then send the ``count`` ops."""
        s.tag_tx, s.rck, s.ipck = Signal(64), Signal(16), Signal(16)
        s0 = Signal(20)  # response IPv4 header words (checksum field 0)
        m.d.sync += s0.eq(_IP_CONST_SUM + (s.dscp << 2) + s.total + s.dst_ip[16:]
                          + s.dst_ip[:16] + s.src_ip[16:] + s.src_ip[:16])
        s1 = Signal(17)
        m.d.sync += s1.eq(s0[:16] + s0[16:])
        m.d.sync += s.ipck.eq(~(s1[:16] + s1[16:])[:16])
        s.rsum = Signal(26)  # a response is under 1024 bytes
        s.par = Signal()  # the next pass-1 byte is the high byte of a 16-bit word
        s.resp_phase = Signal()
        m.d.comb += s.op_rd.addr.eq(Mux(s.resp_phase, s.oi, s.k))

        opstat = Signal(8)  # the status of op ``oi`` in the response
        with m.Switch(s.status):
            with m.Case(MgmtStatus.OK):
                m.d.comb += opstat.eq(MgmtStatus.OK)
            with m.Case(MgmtStatus.BUS_ERROR):
                m.d.comb += opstat.eq(Mux(s.oi < s.err, MgmtStatus.OK, Mux(
                    s.oi == s.err, MgmtStatus.BUS_ERROR, MgmtStatus.SKIPPED)))
            with m.Case(MgmtStatus.REPLAY):
                m.d.comb += opstat.eq(MgmtStatus.SKIPPED)
            with m.Default():
                m.d.comb += opstat.eq(Mux(s.oi == s.err, s.status, MgmtStatus.SKIPPED))

        s.hdr_bytes = self._header_bytes(s)
        s.hsr = Signal(8 * s.hdr_bytes.nbytes)
        s.hv = Signal(s.hdr_bytes.nbytes)
        s.osr = Signal(8 * MGMT_OP.size)
        ob2 = Signal(4)  # byte of the op being sent
        lastop = Signal()  # it is the last op
        in_hdr = s.hv[0]
        s.rbyte = Signal(8)
        m.d.comb += s.rbyte.eq(Mux(in_hdr, s.hsr[:8], s.osr[:8]))
        op_end = ~in_hdr & (ob2 == _OP_LAST)
        s.rlast = Signal()  # ``rbyte`` is the pass's last byte
        m.d.comb += s.rlast.eq(op_end & lastop)
        s.adv = Signal()  # ``rbyte`` is taken this cycle
        with m.If(s.adv):
            m.d.sync += [s.hsr.eq(s.hsr >> 8), s.hv.eq(s.hv >> 1)]
            with m.If((in_hdr & ~s.hv[1]) | op_end):
                op_bytes = [s.op_opcode, opstat, Const(0, 16)]
                op_bytes += [_be(s.op_addr, j, 4) for j in range(4)]
                op_bytes += [_be(s.op_value, j, 4) for j in range(4)]
                m.d.sync += [s.osr.eq(Cat(*op_bytes)), ob2.eq(0), s.oi.eq(s.oi + 1),
                             lastop.eq(s.oi == s.cnt_m1)]
            with m.Elif(~in_hdr):
                m.d.sync += [s.osr.eq(s.osr >> 8), ob2.eq(ob2 + 1)]

    def _header_bytes(self, s):
        """The header bytes of the two response passes (see :meth:`_response_bytes`)."""
        hdr = {i: Const(b, 8) for i, b in enumerate(_IP_CONST) if b}
        hdr[_IP["tos"]] = Cat(Const(0, 2), s.dscp)

        def put(at, v, n):
            for j in range(n):
                hdr[at + j] = _be(v, j, n)

        mg = {f: _MG_AT + o for f, o in _MG.items()}
        put(_IP["total_length"], s.total, 2)
        put(_IP["checksum"], s.ipck, 2)
        put(_IP["src"], s.dst_ip, 4)
        put(_IP["dst"], s.src_ip, 4)
        put(_UDP["sport"], s.dport, 2)
        put(_UDP["dport"], s.sport, 2)
        put(_UDP["length"], s.ulen, 2)
        put(_UDP["checksum"], s.rck, 2)
        put(mg["magic"], Const(MGMT_MAGIC, 16), 2)
        hdr[mg["version"]] = Const(MGMT_VERSION, 8)
        hdr[mg["type"]] = Const(int(MgmtType.RESPONSE), 8)
        put(mg["seq"], s.seq, 4)
        hdr[mg["count"]] = s.count
        hdr[mg["status"]] = s.status
        hdr[mg["err_index"]] = s.err
        put(mg["last_seq"], s.sm.ent_seq, 4)  # the source's last sequence number
        tag_at = range(mg["tag"], mg["tag"] + 8)

        def l3_bytes(lo, hi, tag):
            out = []
            for i in range(lo, hi):
                if i in tag_at:  # the tag goes out little-endian (SipHash byte order)
                    out.append(tag.word_select(i - mg["tag"], 8))
                else:
                    out.append(hdr.get(i, Const(0, 8)))
            return out

        eth = ([_be(s.src_mac, j, 6) for j in range(6)]
               + [_be(self.mac, j, 6) for j in range(6)])
        l3_all = l3_bytes(0, _OPS_AT, s.tag_tx)
        e_ipv4, e_vlan = [Const(b, 8) for b in _E_IPV4], [Const(b, 8) for b in _E_VLAN]
        pass1 = Cat(*l3_bytes(_AUTH_FROM, _AUTH_TO, None),
                    *l3_bytes(_MG_AT, _OPS_AT, Const(0, 64)))
        pass2_t = Cat(*eth, *e_vlan, s.tci[8:], s.tci[:8], *e_ipv4, *l3_all)
        return SimpleNamespace(pass1=pass1, pass2_u=Cat(*eth, *e_ipv4, *l3_all),
                               pass2_t=pass2_t, nbytes=len(pass2_t) // 8)

    def _load_header(self, m, s, pass2):
        h = s.hdr_bytes
        if pass2:
            m.d.sync += [s.hsr.eq(Mux(s.vlan, h.pass2_t, h.pass2_u)),
                         s.hv.eq(Mux(s.vlan, (1 << h.nbytes) - 1, (1 << (h.nbytes - 4)) - 1))]
        else:
            m.d.sync += [s.hsr.eq(h.pass1), s.hv.eq((1 << (len(h.pass1) // 8)) - 1)]
        m.d.sync += s.oi.eq(0)

    # ---------------------------------------------------------------- FSM: request
    def _rx_states(self, m, s):
        """IDLE, RX (a byte per cycle into the fields, sums and hash), the end-of-frame checks
        (RX_END, RX_FOLD, RX_CSUM)."""
        with m.State("IDLE"):
            m.d.sync += [s.pos.eq(0), s.q.eq(0), s.ph.eq(1), s.qh.eq(1), s.q_ops.eq(0),
                         s.in_l3.eq(0), s.vlan.eq(0), s.bad.eq(0), s.bad_end.eq(0),
                         s.ipsum.eq(0), s.usum.eq(IP_PROTO_UDP), s.ob.eq(0), s.ri.eq(0),
                         s.hw_n.eq(0), s.total.eq(0), s.hdr_rsv.eq(0), s.count.eq(0)]
            with m.If(self.i.valid):
                m.d.comb += s.inc.mgmt_rx.eq(1)
                m.next = "RX"
        with m.State("RX"):
            m.d.comb += s.rd.en.eq(1)
            with m.If(s.rd.valid):
                m.d.sync += [s.pos.eq(Mux(s.pos == 2047, s.pos, s.pos + 1)), s.ph.eq(s.ph << 1)]
                with m.If(s.pos == 2047):
                    m.d.comb += s.bad_set[0].eq(1)
                with m.If(~s.in_l3):
                    self._rx_l2(m, s)
                with m.Else():
                    self._rx_l3(m, s)
            with m.If(s.rd.end):
                with m.If(s.rd.error):
                    m.d.comb += s.bad_set[5].eq(1)
                m.next = "RX_END"
        self._end_states(m, s)

    def _rx_l2(self, m, s):
        """An Ethernet header byte: the source MAC, the ethertype, an 802.1Q tag."""
        ph, byte = s.ph, s.rd.byte
        with m.If(ph[_E_SRC:_E_SRC + 6].any()):
            m.d.sync += s.src_mac.eq(Cat(byte, s.src_mac[:40]))
        with m.If(ph[_E_TYPE] | ph[_E_TYPE_TAGGED]):
            m.d.sync += s.et_hi.eq(byte)
        with m.If(ph[_E_TCI] | ph[_E_TCI + 1]):
            m.d.sync += s.tci.eq(Cat(byte, s.tci[:8]))
        not_ipv4 = (s.et_hi != _E_IPV4[0]) | (byte != _E_IPV4[1])
        with m.If(ph[_E_TYPE + 1]):
            with m.If((s.et_hi == _E_VLAN[0]) & (byte == _E_VLAN[1])):
                m.d.sync += s.vlan.eq(1)
            with m.Else():
                m.d.sync += s.in_l3.eq(1)
                with m.If(not_ipv4):
                    m.d.comb += s.bad_set[1].eq(1)
        with m.If(s.vlan & ph[_E_TYPE_TAGGED + 1]):
            m.d.sync += s.in_l3.eq(1)
            with m.If(not_ipv4):
                m.d.comb += s.bad_set[2].eq(1)

    def _rx_l3(self, m, s):
        """A byte from the IPv4 header on: IPv4 and UDP fields and checks, the checksums, the
        management header, the tag, the hashed bytes, the ops (into the op memory)."""
        q, qh, byte = s.q, s.qh, s.rd.byte
        q_next = Mux(q == 2047, q, q + 1)
        m.d.sync += [q.eq(q_next), qh.eq(qh << 1), s.q_ops.eq(s.q_ops | qh[-1]),
                     s.q_lt.eq(q_next < s.total)]
        with m.If(qh[:wf.IPV4.size].any()):
            self._add16(m, s.ipsum, byte, ~q[0])
        with m.If((qh[_AUTH_FROM:].any() | s.q_ops) & s.q_lt):
            self._add16(m, s.usum, byte, ~q[0])
        ff = _IP["flags_frag"]

        def at(lo, n=1):   # q in [lo, lo + n)
            return qh[lo:lo + n].any()

        checks = [(at(0), byte != _IP_CONST[0]),  # version 4, IHL 5
                  (at(ff), byte[:6] != 0),  # MF, fragment offset (DF may be set)
                  (at(ff + 1), byte != 0),
                  (at(_IP["protocol"]), byte != IP_PROTO_UDP)]
        with m.If(Cat(*[w & c for w, c in checks]).any()):
            m.d.comb += s.bad_set[3].eq(1)
        for lo, n, reg in ((_IP["tos"], 1, s.dscp), (_IP["total_length"], 2, s.total),
                           (_IP["src"], 4, s.src_ip), (_IP["dst"], 4, s.dst_ip),
                           (_UDP["sport"], 2, s.sport), (_UDP["dport"], 2, s.dport),
                           (_UDP["length"], 2, s.ulen), (_UDP["checksum"], 2, s.ucsum)):
            with m.If(at(lo, n)):
                if reg is s.dscp:
                    m.d.sync += s.dscp.eq(byte[2:])
                else:
                    m.d.sync += reg.eq(Cat(byte, reg[:len(reg) - 8]))
        in_pay = Signal()
        m.d.comb += in_pay.eq((qh[_MG_AT:].any() | s.q_ops) & s.q_lt)
        in_tag = at(_MG_AT + _MG["tag"], 8)
        with m.If(at(_AUTH_FROM, _AUTH_TO - _AUTH_FROM) | in_pay):
            self._hash_byte(m, s, Mux(in_pay & in_tag, 0, byte))
        with m.If(in_pay):
            for lo, n, reg in ((_MG["magic"], 2, s.magic), (_MG["version"], 1, s.version),
                               (_MG["type"], 1, s.typ), (_MG["seq"], 4, s.seq),
                               (_MG["count"], 1, s.count),
                               (_MG["status"], _MG["tag"] - _MG["status"], s.hdr_rsv)):
                with m.If(at(_MG_AT + lo, n)):
                    m.d.sync += reg.eq(Cat(byte, reg[:len(reg) - 8]))
            with m.If(in_tag):
                m.d.sync += s.tag_rx.eq(Cat(s.tag_rx[8:], byte))
        with m.If(s.q_ops & s.q_lt):  # an op byte (in the payload)
            full = Cat(byte, s.opbuf)  # op byte 0 most significant
            m.d.sync += [s.opbuf.eq(full[:88]), s.ob.eq(Mux(s.ob == _OP_LAST, 0, s.ob + 1))]
            with m.If(s.ob == _OP_LAST):
                m.d.sync += s.ri.eq(s.ri + 1)
                m.d.comb += [s.op_wr.addr.eq(s.ri),
                             s.op_wr.data.eq(Cat(full[:64], full[88:96])),
                             s.op_wr.en.eq(s.ri < MGMT_MAX_OPS)]
                rsv = full[64:88] != 0  # op status and reserved
                rd_val = (full[88:96] == MgmtOpcode.READ) & (full[:32] != 0)
                with m.If(rsv | rd_val):
                    m.d.comb += s.bad_set[4].eq(1)

    def _end_states(self, m, s):
        """The end-of-frame checks over three cycles, each into a register of its own (the
        checksum folds one adder deep); ``bad_end`` joins ``bad`` at the decision."""
        s2, s3 = Signal(17), Signal(16)
        u0, u1 = Signal(28), Signal(17)
        end_r, exp_r, ulen_r = Signal(16), Signal(16), Signal(16)
        chk_a, chk_b = Signal(), Signal()
        rl3 = Signal(5)
        m.d.comb += rl3.eq(Mux(s.vlan, _L3_TAGGED, _L3))
        with m.State("RX_END"):
            m.d.sync += [s2.eq(s.ipsum[:16] + s.ipsum[16:]), u0.eq(s.usum + s.ulen),
                         end_r.eq(rl3 + s.total), ulen_r.eq(s.total - _UDP_AT),
                         exp_r.eq(_MG_AT + MGMT_HDR.size + (s.count << 3) + (s.count << 2)),
                         chk_a.eq(~s.in_l3 | (s.q < _MG_AT) | (s.total < _MG_AT)
                                  | (s.count == 0) | (s.count > MGMT_MAX_OPS)
                                  | (s.magic != MGMT_MAGIC) | (s.version != MGMT_VERSION)
                                  | (s.typ != MgmtType.REQUEST) | (s.hdr_rsv != 0))]
            m.next = "RX_FOLD"
        with m.State("RX_FOLD"):
            m.d.sync += [s3.eq(s2[:16] + s2[16:]), u1.eq(u0[:16] + u0[16:]),
                         chk_b.eq((end_r > s.pos) | ((end_r < s.pos) & (s.pos > _MIN_FRAME))
                                  | (s.ulen != ulen_r) | (s.total != exp_r))]
            m.next = "RX_CSUM"
        with m.State("RX_CSUM"):
            m.d.sync += s.bad_end.eq(chk_a | chk_b | (s3 != 0xFFFF)
                                     | ((s.ucsum != 0) & ((u1[:16] + u1[16:])[:16] != 0xFFFF)))
            m.next = "HASH_LAST"

    # ---------------------------------------------------------------- FSM: decision
    def _decide_states(self, m, s):
        """The tag, the source and replay checks, then each op's checks (3 cycles per op)."""
        inc, sm, chk = s.inc, s.sm, s.chk
        with m.State("HASH_LAST"):
            self._last_word(m, s, "HASH_WAIT")
        with m.State("HASH_WAIT"):
            m.d.comb += s.sip.o.ready.eq(1)
            with m.If(s.sip.o.valid):
                m.d.comb += sm.take.eq(1)
                m.d.sync += s.tag_bad.eq(s.sip.o.payload != s.tag_rx)
                m.next = "DECIDE"
        with m.State("DECIDE"):
            m.d.sync += [s.k.eq(0), s.err.eq(NO_ERROR_INDEX), s.status.eq(MgmtStatus.OK)]
            with m.If(s.bad | s.bad_end):
                m.d.comb += inc.mgmt_reject_malformed.eq(1)
                m.next = "IDLE"
            with m.Elif(~sm.any):
                m.d.comb += inc.mgmt_reject_source.eq(1)
                m.next = "IDLE"
            with m.Elif(self.auth & s.tag_bad):
                m.d.comb += inc.mgmt_reject_auth.eq(1)
                m.next = "IDLE"
            with m.Elif(sm.replay):
                m.d.comb += inc.mgmt_reject_replay.eq(1)
                m.d.sync += s.status.eq(MgmtStatus.REPLAY)
                m.next = "RESP"
            with m.Else():
                m.next = "VAL_RD"
        # op k's checks: the op memory read and the checks' two register stages, then decided
        with m.State("VAL_RD"):
            m.next = "VAL_CHK"
        with m.State("VAL_CHK"):
            m.next = "VALIDATE"
        with m.State("VALIDATE"):
            with m.If(chk.bad_opc):
                m.d.comb += inc.mgmt_reject_opcode.eq(1)
                m.d.sync += [s.status.eq(MgmtStatus.BAD_OPCODE), s.err.eq(s.k)]
                m.next = "RESP"
            with m.Elif(chk.bad_addr):
                m.d.comb += inc.mgmt_reject_addr.eq(1)
                m.d.sync += [s.status.eq(MgmtStatus.BAD_ADDR), s.err.eq(s.k)]
                m.next = "RESP"
            with m.Elif(chk.prot):
                m.d.comb += inc.mgmt_reject_denied.eq(1)
                m.d.sync += [s.status.eq(MgmtStatus.DENIED), s.err.eq(s.k)]
                m.next = "RESP"
            with m.Elif(s.k_last):
                m.d.comb += sm.commit.eq(1)
                m.d.sync += s.k.eq(0)
                m.next = "EXEC"
            with m.Else():
                m.d.sync += s.k.eq(s.k + 1)
                m.next = "VAL_RD"

    # ---------------------------------------------------------------- FSM: execution
    def _exec_states(self, m, s):
        """One AXI4-Lite access per op (:class:`OpBusMaster`); a read's value goes back into
        the op memory."""
        bm = s.bm
        with m.State("EXEC"):
            m.d.comb += bm.start.eq(1)
            m.next = "BUS"
        with m.State("BUS"):
            with m.If(bm.done):
                with m.If(bm.error):
                    m.d.comb += s.inc.mgmt_accepted.eq(1)
                    m.d.sync += [s.status.eq(MgmtStatus.BUS_ERROR), s.err.eq(s.k)]
                    m.next = "RESP"
                with m.Else():
                    with m.If(s.op_opcode == MgmtOpcode.READ):
                        m.d.comb += [s.op_wr.addr.eq(s.k), s.op_wr.en.eq(1),
                                     s.op_wr.data.eq(Cat(bm.rdata, s.op_addr, s.op_opcode))]
                    with m.If(s.k_last):
                        m.d.comb += s.inc.mgmt_accepted.eq(1)
                        m.next = "RESP"
                    with m.Else():
                        m.d.sync += s.k.eq(s.k + 1)
                        m.next = "EXEC"

    # ---------------------------------------------------------------- FSM: response
    def _resp_states(self, m, s):
        """Pass 1 (hash and UDP checksum of the response, tag field zero), the checksum, pass 2
        (emission through :class:`BeatPacker`)."""
        with m.State("RESP"):
            m.d.sync += [s.rsum.eq(0), s.par.eq(1), s.hw_n.eq(0), s.tag_tx.eq(0)]
            self._load_header(m, s, False)
            m.next = "HASH2"
        with m.State("HASH2"):
            m.d.comb += [s.resp_phase.eq(1), s.adv.eq(1)]
            self._hash_byte(m, s, s.rbyte)
            self._add16(m, s.rsum, s.rbyte, s.par)
            m.d.sync += s.par.eq(~s.par)
            with m.If(s.rlast):
                m.next = "HASH2_LAST"
        with m.State("HASH2_LAST"):
            self._last_word(m, s, "HASH2_WAIT")
        ci = Signal(3)  # checksum term
        with m.State("HASH2_WAIT"):
            m.d.comb += s.sip.o.ready.eq(1)
            with m.If(s.sip.o.valid):
                m.d.sync += [s.tag_tx.eq(Mux(self.auth, s.sip.o.payload, 0)), ci.eq(0)]
                m.next = "CSUM"
        # the UDP checksum: the rest of the pseudo-header (protocol, length), the UDP
        # length field and the tag, one term per cycle; two folds; the complement
        with m.State("CSUM"):
            t = s.tag_tx
            terms = Array([Const(IP_PROTO_UDP, 16), s.ulen, s.ulen]
                          + [Cat(t[16 * j + 8:16 * j + 16], t[16 * j:16 * j + 8])
                             for j in range(4)])
            m.d.sync += [s.rsum.eq(s.rsum + terms[ci]), ci.eq(ci + 1)]
            with m.If(ci == len(terms) - 1):
                m.d.sync += ci.eq(0)
                m.next = "FOLD"
        with m.State("FOLD"):
            m.d.sync += [s.rsum.eq(s.rsum[:16] + s.rsum[16:]), ci.eq(ci + 1)]
            with m.If(ci == 1):
                m.next = "CK"
        with m.State("CK"):
            c2 = ~s.rsum[:16]
            m.d.sync += s.rck.eq(Mux(c2 == 0, 0xFFFF, c2))
            m.next = "LOAD"
        with m.State("LOAD"):
            self._load_header(m, s, True)
            m.d.comb += s.pk.start.eq(1)
            m.next = "EMIT"
        with m.State("EMIT"):
            m.d.comb += [s.resp_phase.eq(1), s.adv.eq(s.pk.take), s.pk.byte.eq(s.rbyte),
                         s.pk.byte_last.eq(s.rlast)]
            with m.If(s.pk.done):
                m.next = "IDLE"
