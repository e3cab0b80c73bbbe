"""Gateware for the in-band management path (protocol: docs/management.md).

* :class:`SipHash24`: the tag engine (``MGMT.CTRL.auth``), computing SipHash-2-4 exactly as
  :func:`netreduce.wire.mgmt.siphash24` (tests: reference vectors, random keys and messages).
* :class:`MgmtAgent`: the agent, the behaviour of :class:`netreduce.sim.model.mgmt.MgmtAgent` in
  gateware (tests: byte-identical responses, counter events and registers on the same frames).

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
           "src_entry_layout", "addr_valid"]

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


def addr_valid(rm: RegMap, addr):
    """Combinational: ``addr`` (32 bits) is 4-aligned and maps to a register of ``rm``."""
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
    return (addr[:2] == 0) & Cat(*hits).any()


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
    the last byte (the core keeps up with the bytes); decision ``2c + 2``; one AXI4-Lite access
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
        m.submodules.sip = sip = SipHash24()
        m.d.comb += sip.key.eq(self.key)
        m.submodules.ops = ops = Memory(shape=72, depth=MGMT_MAX_OPS, init=[])
        op_rd = ops.read_port(domain="comb")
        op_wr = ops.write_port()
        op_opcode, op_addr, op_value = op_rd.data[64:72], op_rd.data[32:64], op_rd.data[:32]
        bus = self.bus
        # counter strobes registered (one cycle later): the decision logic ends here, not in
        # the register bank's counter adders
        inc = Signal.like(self.inc, name="inc_c")
        m.d.sync += self.inc.eq(inc)

        # ------------------------------------------------------------ request state
        pos = Signal(11)  # bytes of the frame seen (saturating)
        q = Signal(11)  # bytes seen from the IPv4 header on
        # one-hot positions (pos < 18, q < the first op) and q past the header, shifted with
        # every byte: the field decodes are flip-flops, not compares on pos / q
        ph = Signal(_E_TYPE_TAGGED + 2)
        qh = Signal(_OPS_AT)
        q_ops = Signal()
        q_lt = Signal()  # q < total, registered with q's step (total is complete by q = 4)
        in_l3 = Signal()
        vlan = Signal()
        tci = Signal(16)
        et_hi = Signal(8)
        src_mac = Signal(48)
        dscp = Signal(6)
        total = Signal(16)
        src_ip, dst_ip = Signal(32), Signal(32)
        sport, dport, ulen, ucsum = Signal(16), Signal(16), Signal(16), Signal(16)
        ipsum = Signal(24)
        usum = Signal(27)  # < 1024 words of 16 bits (+ 17): no carry past bit 26
        bad = Signal()
        magic, version, typ = Signal(16), Signal(8), Signal(8)
        seq, count = Signal(32), Signal(8)
        hdr_rsv = Signal(56)  # status, err_index, reserved, last_seq: 0 in a request
        tag_rx = Signal(64)
        opbuf = Signal(88)  # the first 11 bytes of the op being received
        ob = Signal(4)  # byte within the op
        ri = Signal(7)  # op index while receiving
        oi = Signal(7)  # op index in the response passes
        hw_data = Signal(64)  # hash word being assembled (newest byte on top)
        hw_n = Signal(4)

        # the input beat, held in a register that shifts by a byte per byte read: the byte read
        # is always its low byte (no byte mux on a position)
        beat = self.i.payload
        rxd, rxk, rxl, rxe, rxf = Signal(64), Signal(8), Signal(), Signal(), Signal()
        byte = Signal(8)
        m.d.comb += byte.eq(rxd[:8])
        beat_done = Signal()  # the held byte is the beat's last valid one, or the beat is empty
        m.d.comb += beat_done.eq(~rxk[1] | ~rxk[0])

        # ------------------------------------------------------------ decision state
        status = Signal(8)
        err = Signal(8)
        nsel = max(2, self.nsrc)
        ent = Signal(range(nsel))
        tag_bad = Signal()  # the computed tag differs from the frame's (registered compare)
        k = Signal(7)
        last_seq = Signal(data.ArrayLayout(32, self.nsrc))
        m.d.comb += self.last_seq.eq(last_seq)
        # registered: the source fields are complete at RX_END, the hit is read from HASH_WAIT
        # on (several cycles of hashing later)
        # (two register stages: the field compares, then the entry's rule)
        hit = Signal(self.nsrc)
        for e in range(self.nsrc):
            s = self.src[e]
            eq_ip, eq_mac, eq_port = Signal(), Signal(), Signal()
            m.d.sync += [eq_ip.eq(s.ip == src_ip), eq_mac.eq(s.mac == src_mac),
                         eq_port.eq(s.port == sport),
                         hit[e].eq(s.valid & eq_ip & (~s.match_mac | eq_mac)
                                   & (~s.match_port | eq_port))]
        first_hit = Signal(range(nsel))
        for e in reversed(range(self.nsrc)):
            with m.If(hit[e]):
                m.d.comb += first_hit.eq(e)
        ent_seq = Signal(32)
        m.d.comb += ent_seq.eq(last_seq[ent])
        # the replay check (seq <= the entry's last sequence number) per entry, registered every
        # cycle (seq is stable from RX_END, last_seq changes only in VALIDATE), selected by the
        # first hit into ``replay`` with the tag: the decision reads one flip-flop
        seq_le = Signal(nsel)
        for e in range(self.nsrc):
            m.d.sync += seq_le[e].eq(seq <= last_seq[e])
        replay = Signal()

        def hash_byte(b):
            """Append a message byte; a full word goes to the core, which is always ready for
            it (bytes come at most one per cycle, it takes a word every 6 cycles)."""
            word = Cat(hw_data[8:], b)
            m.d.sync += [hw_data.eq(word), hw_n.eq(Mux(hw_n == 7, 0, hw_n + 1))]
            with m.If(hw_n == 7):
                m.d.comb += [sip.i.valid.eq(1), sip.i.payload.data.eq(word)]

        def add16(acc, b, even):
            """One's-complement accumulation of byte ``b`` at an even (high) or odd position."""
            m.d.sync += acc.eq(acc + Mux(even, b << 8, b))

        # ------------------------------------------------------------ response bytes
        # The response leaves byte-serially from shift registers loaded in whole, so every
        # cycle takes the byte at a fixed position (no byte mux on an offset): ``hsr`` holds the
        # header bytes of a pass (``hv``: which are left), ``osr`` the op being sent, loaded from
        # the op memory when the header or the previous op ends. Pass 1 (hash and UDP checksum)
        # sends the pseudo-header and the management header with a zero tag, pass 2 (emission)
        # the whole frame; both then send the ``count`` ops.
        rl3 = Signal(5)
        m.d.comb += rl3.eq(Mux(vlan, _L3_TAGGED, _L3))
        tag_tx = Signal(64)
        rck = Signal(16)
        ipck = Signal(16)
        s0 = Signal(20)  # response IPv4 header words (checksum field 0)
        m.d.sync += s0.eq(_IP_CONST_SUM + (dscp << 2) + total + dst_ip[16:]
                          + dst_ip[:16] + src_ip[16:] + src_ip[:16])
        s1 = Signal(17)
        m.d.sync += s1.eq(s0[:16] + s0[16:])
        m.d.sync += ipck.eq(~(s1[:16] + s1[16:])[:16])
        rsum = Signal(26)  # a response is under 1024 bytes
        par = Signal()  # the next pass-1 byte is the high byte of a 16-bit word
        resp_phase = Signal()
        m.d.comb += op_rd.addr.eq(Mux(resp_phase, oi, k))

        opstat = Signal(8)  # the status of op ``oi`` in the response
        with m.Switch(status):
            with m.Case(MgmtStatus.OK):
                m.d.comb += opstat.eq(MgmtStatus.OK)
            with m.Case(MgmtStatus.BUS_ERROR):
                m.d.comb += opstat.eq(Mux(oi < err, MgmtStatus.OK, Mux(
                    oi == err, MgmtStatus.BUS_ERROR, MgmtStatus.SKIPPED)))
            with m.Case(MgmtStatus.REPLAY):
                m.d.comb += opstat.eq(MgmtStatus.SKIPPED)
            with m.Default():
                m.d.comb += opstat.eq(Mux(oi == err, status, MgmtStatus.SKIPPED))

        # IPv4, UDP and management header bytes by L3 offset
        hdr = {i: Const(b, 8) for i, b in enumerate(_IP_CONST) if b}
        hdr[_IP["tos"]] = Cat(Const(0, 2), dscp)

        def put(at, v, n):
            for j in range(n):
                hdr[at + j] = _be(v, j, n)

        mg = {f: _MG_AT + o for f, o in _MG.items()}
        put(_IP["total_length"], total, 2)
        put(_IP["checksum"], ipck, 2)
        put(_IP["src"], dst_ip, 4)
        put(_IP["dst"], src_ip, 4)
        put(_UDP["sport"], dport, 2)
        put(_UDP["dport"], sport, 2)
        put(_UDP["length"], ulen, 2)
        put(_UDP["checksum"], rck, 2)
        put(mg["magic"], Const(MGMT_MAGIC, 16), 2)
        hdr[mg["version"]] = Const(MGMT_VERSION, 8)
        hdr[mg["type"]] = Const(int(MgmtType.RESPONSE), 8)
        put(mg["seq"], seq, 4)
        hdr[mg["count"]] = count
        hdr[mg["status"]] = status
        hdr[mg["err_index"]] = err
        ent_seq_r = Signal(32)  # the source's last sequence number (stable from RESP on)
        m.d.sync += ent_seq_r.eq(ent_seq)
        put(mg["last_seq"], ent_seq_r, 4)
        tag_at = range(mg["tag"], mg["tag"] + 8)

        def l3_bytes(lo, hi, tag):
            out = []
            for i in range(lo, hi):
                if i in tag_at:  # the tag goes out little-endian (SipHash byte order)
                    out.append(tag.word_select(i - mg["tag"], 8))
                else:
                    out.append(hdr.get(i, Const(0, 8)))
            return out

        eth = [_be(src_mac, j, 6) for j in range(6)] + [_be(self.mac, j, 6) for j in range(6)]
        l3_all = l3_bytes(0, _OPS_AT, tag_tx)
        e_ipv4, e_vlan = [Const(b, 8) for b in _E_IPV4], [Const(b, 8) for b in _E_VLAN]
        pass2_u = Cat(*eth, *e_ipv4, *l3_all)
        pass2_t = Cat(*eth, *e_vlan, tci[8:], tci[:8], *e_ipv4, *l3_all)
        pass1 = Cat(*l3_bytes(_AUTH_FROM, _AUTH_TO, None),
                    *l3_bytes(_MG_AT, _OPS_AT, Const(0, 64)))
        hbytes = len(pass2_t) // 8
        hsr = Signal(8 * hbytes)
        hv = Signal(hbytes)
        osr = Signal(8 * MGMT_OP.size)
        ob2 = Signal(4)  # byte of the op being sent
        lastop = Signal()  # it is the last op
        cnt_m1 = Signal(8)
        m.d.sync += cnt_m1.eq(count - 1)
        in_hdr = hv[0]
        rbyte = Signal(8)
        m.d.comb += rbyte.eq(Mux(in_hdr, hsr[:8], osr[:8]))
        op_end = ~in_hdr & (ob2 == _OP_LAST)
        rlast = Signal()  # ``rbyte`` is the pass's last byte
        m.d.comb += rlast.eq(op_end & lastop)
        adv = Signal()  # ``rbyte`` is taken this cycle
        with m.If(adv):
            m.d.sync += [hsr.eq(hsr >> 8), hv.eq(hv >> 1)]
            with m.If((in_hdr & ~hv[1]) | op_end):
                op_bytes = [op_opcode, opstat, Const(0, 16)]
                op_bytes += [_be(op_addr, j, 4) for j in range(4)]
                op_bytes += [_be(op_value, j, 4) for j in range(4)]
                m.d.sync += [osr.eq(Cat(*op_bytes)), ob2.eq(0), oi.eq(oi + 1),
                             lastop.eq(oi == cnt_m1)]
            with m.Elif(~in_hdr):
                m.d.sync += [osr.eq(osr >> 8), ob2.eq(ob2 + 1)]

        def load_header(pass2):
            if pass2:
                m.d.sync += [hsr.eq(Mux(vlan, pass2_t, pass2_u)),
                             hv.eq(Mux(vlan, (1 << hbytes) - 1, (1 << (hbytes - 4)) - 1))]
            else:
                m.d.sync += [hsr.eq(pass1), hv.eq((1 << (len(pass1) // 8)) - 1)]
            m.d.sync += oi.eq(0)

        obeat = Signal(64)
        okeep = Signal(8)
        ofirst = Signal()
        olast = Signal()
        onext = Signal(3)
        ci = Signal(3)  # checksum term

        # ------------------------------------------------------------ the FSM
        bad_end = Signal()  # the end-of-frame checks failed (set in RX_CSUM)
        # a defect seen this cycle, one bit per check (several may fire at once; no OR of them
        # before the register)
        bad_set = Signal(6)
        bad_q = Signal(6)  # bad_set, registered (``bad`` is read at the decision, cycles later)
        m.d.sync += [bad_q.eq(bad_set),
                     bad.eq(bad | bad_q.any())]  # before the FSM: IDLE's clear comes later and wins
        with m.FSM(name="state") as fsm:
            # (and while a registered counter strobe is out, the cycle after the frame's end)
            m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | self.inc.as_value().any())
            with m.State("IDLE"):
                m.d.sync += [pos.eq(0), q.eq(0), ph.eq(1), qh.eq(1), q_ops.eq(0),
                             in_l3.eq(0), vlan.eq(0), bad.eq(0), bad_end.eq(0),
                             ipsum.eq(0), usum.eq(IP_PROTO_UDP), ob.eq(0), ri.eq(0), hw_n.eq(0),
                             total.eq(0), hdr_rsv.eq(0), count.eq(0)]
                with m.If(self.i.valid):
                    m.d.comb += inc.mgmt_rx.eq(1)
                    m.next = "RX"

            with m.State("RX"):
                with m.If(rxf & rxk[0]):
                    m.d.sync += [pos.eq(Mux(pos == 2047, pos, pos + 1)), ph.eq(ph << 1)]
                    with m.If(pos == 2047):
                        m.d.comb += bad_set[0].eq(1)
                    with m.If(~in_l3):
                        with m.If(ph[_E_SRC:_E_SRC + 6].any()):
                            m.d.sync += src_mac.eq(Cat(byte, src_mac[:40]))
                        with m.If(ph[_E_TYPE] | ph[_E_TYPE_TAGGED]):
                            m.d.sync += et_hi.eq(byte)
                        with m.If(ph[_E_TCI] | ph[_E_TCI + 1]):
                            m.d.sync += tci.eq(Cat(byte, tci[:8]))
                        not_ipv4 = (et_hi != _E_IPV4[0]) | (byte != _E_IPV4[1])
                        with m.If(ph[_E_TYPE + 1]):
                            with m.If((et_hi == _E_VLAN[0]) & (byte == _E_VLAN[1])):
                                m.d.sync += vlan.eq(1)
                            with m.Else():
                                m.d.sync += in_l3.eq(1)
                                with m.If(not_ipv4):
                                    m.d.comb += bad_set[1].eq(1)
                        with m.If(vlan & ph[_E_TYPE_TAGGED + 1]):
                            m.d.sync += in_l3.eq(1)
                            with m.If(not_ipv4):
                                m.d.comb += bad_set[2].eq(1)
                    with m.Else():
                        q_next = Mux(q == 2047, q, q + 1)
                        m.d.sync += [q.eq(q_next), qh.eq(qh << 1), q_ops.eq(q_ops | qh[-1]),
                                     q_lt.eq(q_next < total)]
                        with m.If(qh[:wf.IPV4.size].any()):
                            add16(ipsum, byte, ~q[0])
                        with m.If((qh[_AUTH_FROM:].any() | q_ops) & q_lt):
                            add16(usum, byte, ~q[0])
                        ff = _IP["flags_frag"]

                        def at(lo, n=1):   # q in [lo, lo + n)
                            return qh[lo:lo + n].any()

                        checks = [(at(0), byte != _IP_CONST[0]),  # version 4, IHL 5
                                  (at(ff), byte[:6] != 0),  # MF, fragment offset (DF may be set)
                                  (at(ff + 1), byte != 0),
                                  (at(_IP["protocol"]), byte != IP_PROTO_UDP)]
                        with m.If(Cat(*[w & c for w, c in checks]).any()):
                            m.d.comb += bad_set[3].eq(1)
                        for lo, n, reg in ((_IP["tos"], 1, dscp),
                                           (_IP["total_length"], 2, total),
                                           (_IP["src"], 4, src_ip), (_IP["dst"], 4, dst_ip),
                                           (_UDP["sport"], 2, sport), (_UDP["dport"], 2, dport),
                                           (_UDP["length"], 2, ulen),
                                           (_UDP["checksum"], 2, ucsum)):
                            with m.If(at(lo, n)):
                                if reg is dscp:
                                    m.d.sync += dscp.eq(byte[2:])
                                else:
                                    m.d.sync += reg.eq(Cat(byte, reg[:len(reg) - 8]))
                        in_pay = Signal()
                        m.d.comb += in_pay.eq((qh[_MG_AT:].any() | q_ops) & q_lt)
                        in_tag = at(_MG_AT + _MG["tag"], 8)
                        with m.If(at(_AUTH_FROM, _AUTH_TO - _AUTH_FROM) | in_pay):
                            hash_byte(Mux(in_pay & in_tag, 0, byte))
                        with m.If(in_pay):
                            for lo, n, reg in ((_MG["magic"], 2, magic),
                                               (_MG["version"], 1, version),
                                               (_MG["type"], 1, typ), (_MG["seq"], 4, seq),
                                               (_MG["count"], 1, count),
                                               (_MG["status"], _MG["tag"] - _MG["status"],
                                                hdr_rsv)):
                                with m.If(at(_MG_AT + lo, n)):
                                    m.d.sync += reg.eq(Cat(byte, reg[:len(reg) - 8]))
                            with m.If(in_tag):
                                m.d.sync += tag_rx.eq(Cat(tag_rx[8:], byte))
                        with m.If(q_ops & q_lt):  # an op byte (in the payload)
                            full = Cat(byte, opbuf)  # op byte 0 most significant
                            m.d.sync += [opbuf.eq(full[:88]),
                                         ob.eq(Mux(ob == _OP_LAST, 0, ob + 1))]
                            with m.If(ob == _OP_LAST):
                                m.d.sync += ri.eq(ri + 1)
                                m.d.comb += [op_wr.addr.eq(ri),
                                             op_wr.data.eq(Cat(full[:64], full[88:96])),
                                             op_wr.en.eq(ri < MGMT_MAX_OPS)]
                                rsv = full[64:88] != 0  # op status and reserved
                                rd_val = (full[88:96] == MgmtOpcode.READ) & \
                                    (full[:32] != 0)
                                with m.If(rsv | rd_val):
                                    m.d.comb += bad_set[4].eq(1)
                with m.If(rxf):
                    with m.If(beat_done):
                        m.d.sync += rxf.eq(0)
                        with m.If(rxl):
                            with m.If(rxe):
                                m.d.comb += bad_set[5].eq(1)
                            m.next = "RX_END"
                        with m.Else():
                            m.d.comb += self.i.ready.eq(1)  # the next beat, without a gap
                    with m.Else():
                        m.d.sync += [rxd.eq(rxd >> 8), rxk.eq(rxk >> 1)]
                with m.Else():
                    m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid & self.i.ready):
                    m.d.sync += [rxd.eq(beat.data), rxk.eq(beat.keep), rxl.eq(beat.last),
                                 rxe.eq(beat.error), rxf.eq(1)]

            # the end-of-frame checks over three cycles, each into a register of its own (the
            # checksum folds one adder deep); ``bad_end`` joins ``bad`` at the decision
            s2, s3 = Signal(17), Signal(16)
            u0, u1 = Signal(28), Signal(17)
            end_r, exp_r, ulen_r = Signal(16), Signal(16), Signal(16)
            chk_a, chk_b = Signal(), Signal()
            with m.State("RX_END"):
                m.d.sync += [s2.eq(ipsum[:16] + ipsum[16:]), u0.eq(usum + ulen),
                             end_r.eq(rl3 + total), ulen_r.eq(total - _UDP_AT),
                             exp_r.eq(_MG_AT + MGMT_HDR.size + (count << 3) + (count << 2)),
                             chk_a.eq(~in_l3 | (q < _MG_AT) | (total < _MG_AT) | (count == 0)
                                      | (count > MGMT_MAX_OPS) | (magic != MGMT_MAGIC)
                                      | (version != MGMT_VERSION) | (typ != MgmtType.REQUEST)
                                      | (hdr_rsv != 0))]
                m.next = "RX_FOLD"
            with m.State("RX_FOLD"):
                m.d.sync += [s3.eq(s2[:16] + s2[16:]), u1.eq(u0[:16] + u0[16:]),
                             chk_b.eq((end_r > pos) | ((end_r < pos) & (pos > _MIN_FRAME))
                                      | (ulen != ulen_r) | (total != exp_r))]
                m.next = "RX_CSUM"
            with m.State("RX_CSUM"):
                m.d.sync += bad_end.eq(chk_a | chk_b | (s3 != 0xFFFF)
                                       | ((ucsum != 0) & ((u1[:16] + u1[16:])[:16] != 0xFFFF)))
                m.next = "HASH_LAST"

            def last_word(nxt):
                m.d.comb += [sip.i.valid.eq(1), sip.i.payload.last.eq(1),
                             sip.i.payload.nbytes.eq(hw_n),
                             sip.i.payload.data.eq(hw_data >> ((8 - hw_n) * 8).as_unsigned())]
                with m.If(sip.i.ready):
                    m.next = nxt

            with m.State("HASH_LAST"):
                last_word("HASH_WAIT")
            with m.State("HASH_WAIT"):
                m.d.comb += sip.o.ready.eq(1)
                with m.If(sip.o.valid):
                    m.d.sync += [tag_bad.eq(sip.o.payload != tag_rx), ent.eq(first_hit),
                                 replay.eq(seq_le.bit_select(first_hit, 1))]
                    m.next = "DECIDE"

            with m.State("DECIDE"):
                m.d.sync += [k.eq(0), err.eq(NO_ERROR_INDEX), status.eq(MgmtStatus.OK)]
                with m.If(bad | bad_end):
                    m.d.comb += inc.mgmt_reject_malformed.eq(1)
                    m.next = "IDLE"
                with m.Elif(~hit.any()):
                    m.d.comb += inc.mgmt_reject_source.eq(1)
                    m.next = "IDLE"
                with m.Elif(self.auth & tag_bad):
                    m.d.comb += inc.mgmt_reject_auth.eq(1)
                    m.next = "IDLE"
                with m.Elif(replay):
                    m.d.comb += inc.mgmt_reject_replay.eq(1)
                    m.d.sync += status.eq(MgmtStatus.REPLAY)
                    m.next = "RESP"
                with m.Else():
                    m.next = "VAL_RD"

            # op k's checks registered (op memory read, address decode), then decided
            bad_opc, bad_addr, prot = Signal(), Signal(), Signal()
            with m.State("VAL_RD"):
                m.d.sync += [
                    bad_opc.eq((op_opcode != MgmtOpcode.READ) & (op_opcode != MgmtOpcode.WRITE)),
                    bad_addr.eq(~addr_valid(self.map, op_addr)),
                    prot.eq(Cat(*[op_addr == a for a in self.protected]).any())]
                m.next = "VALIDATE"
            with m.State("VALIDATE"):
                with m.If(bad_opc):
                    m.d.comb += inc.mgmt_reject_opcode.eq(1)
                    m.d.sync += [status.eq(MgmtStatus.BAD_OPCODE), err.eq(k)]
                    m.next = "RESP"
                with m.Elif(bad_addr):
                    m.d.comb += inc.mgmt_reject_addr.eq(1)
                    m.d.sync += [status.eq(MgmtStatus.BAD_ADDR), err.eq(k)]
                    m.next = "RESP"
                with m.Elif(prot):
                    m.d.comb += inc.mgmt_reject_denied.eq(1)
                    m.d.sync += [status.eq(MgmtStatus.DENIED), err.eq(k)]
                    m.next = "RESP"
                with m.Elif(k == count - 1):
                    m.d.sync += [k.eq(0), last_seq[ent].eq(seq)]
                    m.next = "EXEC"
                with m.Else():
                    m.d.sync += k.eq(k + 1)
                    m.next = "VAL_RD"

            # ---- execution: one AXI4-Lite access per op
            aw_done, w_done = Signal(), Signal()
            m.d.comb += [bus.araddr.eq(op_addr), bus.awaddr.eq(op_addr), bus.wdata.eq(op_value),
                         bus.wstrb.eq(0xF)]

            def next_op():
                with m.If(k == count - 1):
                    m.d.comb += inc.mgmt_accepted.eq(1)
                    m.next = "RESP"
                with m.Else():
                    m.d.sync += k.eq(k + 1)
                    m.next = "EXEC"

            def bus_error():
                m.d.comb += inc.mgmt_accepted.eq(1)
                m.d.sync += [status.eq(MgmtStatus.BUS_ERROR), err.eq(k)]
                m.next = "RESP"

            with m.State("EXEC"):
                m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                with m.If(op_opcode == MgmtOpcode.READ):
                    m.next = "AR"
                with m.Else():
                    m.next = "AW"
            with m.State("AR"):
                m.d.comb += bus.arvalid.eq(1)
                with m.If(bus.arready):
                    m.next = "R"
            with m.State("R"):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    with m.If(bus.rresp != 0):
                        bus_error()
                    with m.Else():
                        m.d.comb += [op_wr.addr.eq(k), op_wr.en.eq(1),
                                     op_wr.data.eq(Cat(bus.rdata, op_addr, op_opcode))]
                        next_op()
            with m.State("AW"):
                m.d.comb += [bus.awvalid.eq(~aw_done), bus.wvalid.eq(~w_done)]
                aw_now = aw_done | bus.awready
                w_now = w_done | bus.wready
                m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]
                with m.If(aw_now & w_now):
                    m.next = "B"
            with m.State("B"):
                m.d.comb += bus.bready.eq(1)
                with m.If(bus.bvalid):
                    with m.If(bus.bresp != 0):
                        bus_error()
                    with m.Else():
                        next_op()

            # ---- response pass 1: hash and checksum of the response (tag field zero)
            with m.State("RESP"):
                m.d.sync += [rsum.eq(0), par.eq(1), hw_n.eq(0), tag_tx.eq(0)]
                load_header(False)
                m.next = "HASH2"
            with m.State("HASH2"):
                m.d.comb += [resp_phase.eq(1), adv.eq(1)]
                hash_byte(rbyte)
                add16(rsum, rbyte, par)
                m.d.sync += par.eq(~par)
                with m.If(rlast):
                    m.next = "HASH2_LAST"
            with m.State("HASH2_LAST"):
                last_word("HASH2_WAIT")
            with m.State("HASH2_WAIT"):
                m.d.comb += sip.o.ready.eq(1)
                with m.If(sip.o.valid):
                    m.d.sync += [tag_tx.eq(Mux(self.auth, sip.o.payload, 0)), ci.eq(0)]
                    m.next = "CSUM"
            # the UDP checksum: the rest of the pseudo-header (protocol, length), the UDP
            # length field and the tag, one term per cycle; two folds; the complement
            with m.State("CSUM"):
                t = tag_tx
                terms = Array([Const(IP_PROTO_UDP, 16), ulen, ulen]
                              + [Cat(t[16 * j + 8:16 * j + 16], t[16 * j:16 * j + 8])
                                 for j in range(4)])
                m.d.sync += [rsum.eq(rsum + terms[ci]), ci.eq(ci + 1)]
                with m.If(ci == len(terms) - 1):
                    m.d.sync += ci.eq(0)
                    m.next = "FOLD"
            with m.State("FOLD"):
                m.d.sync += [rsum.eq(rsum[:16] + rsum[16:]), ci.eq(ci + 1)]
                with m.If(ci == 1):
                    m.next = "CK"
            with m.State("CK"):
                c2 = ~rsum[:16]
                m.d.sync += rck.eq(Mux(c2 == 0, 0xFFFF, c2))
                m.next = "LOAD"
            with m.State("LOAD"):
                load_header(True)
                m.d.sync += [onext.eq(0), okeep.eq(0), ofirst.eq(1), obeat.eq(0)]
                m.next = "EMIT"

            # ---- response pass 2: emission
            with m.State("EMIT"):
                m.d.comb += [resp_phase.eq(1), adv.eq(1)]
                m.d.sync += [obeat.word_select(onext, 8).eq(rbyte),
                             okeep.bit_select(onext, 1).eq(1), onext.eq(onext + 1),
                             olast.eq(rlast)]
                with m.If((onext == 7) | rlast):
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.o.valid.eq(1), self.o.payload.data.eq(obeat),
                             self.o.payload.keep.eq(okeep), self.o.payload.first.eq(ofirst),
                             self.o.payload.last.eq(olast)]
                with m.If(self.o.ready):
                    m.d.sync += [okeep.eq(0), ofirst.eq(0), onext.eq(0), obeat.eq(0)]
                    with m.If(olast):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "EMIT"
        return m
