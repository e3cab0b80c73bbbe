"""The engine-side in-band management agent (reference model; protocol: docs/management.md).

:class:`MgmtAgent` wraps any :class:`~netreduce.regmap.RegisterBus` (the engine's register bank)
and answers management request frames (:mod:`netreduce.wire.mgmt`). :func:`attach_mgmt` hooks it
into the reference :class:`~netreduce.sim.model.Engine`: frames addressed to the management IPv4 /
UDP port are consumed by the agent (``Engine.mgmt``) and its responses leave on the port the
request came in on.

Contract (what the gateware agent must do too)
----------------------------------------------
* *Match* (:meth:`MgmtAgent.matches`): ``MGMT.CTRL.enable`` and an IPv4 frame (optionally
  802.1Q-tagged) to ``MGMT.IP`` with protocol UDP that is either an unfragmented IHL-5 datagram to
  ``MGMT.PORT`` or something the agent cannot read the port of (IP options, a fragment, truncated
  before the UDP ports). Matched frames are consumed: counted ``mgmt_rx`` and never forwarded.
  Anything else (other ports, ICMP, ARP, the management path disabled) is ordinary traffic.
* *Checks*, in this order; the first failure decides and is counted under its reason:

  1. structure (:func:`~netreduce.wire.mgmt.parse_mgmt`, strict; type REQUEST) ->
     ``mgmt_reject_malformed``, silent drop;
  2. source: the first valid ``MGMT_SRC`` entry whose IPv4 (and MAC / UDP source port if the entry
     asks) matches -> else ``mgmt_reject_source``, silent drop;
  3. tag, when ``MGMT.CTRL.auth``: SipHash-2-4 under ``MGMT.KEY0..3`` -> ``mgmt_reject_auth``,
     silent drop;
  4. sequence: ``seq > LAST_SEQ`` of the entry (unsigned 32-bit, no wrap) -> else
     ``mgmt_reject_replay``, answered ``REPLAY`` with the entry's ``LAST_SEQ``;
  5. every op, in order: op code READ/WRITE (``mgmt_reject_opcode``, ``BAD_OPCODE``), address
     4-aligned and mapped (``mgmt_reject_addr``, ``BAD_ADDR``), not a key register
     (``mgmt_reject_denied``, ``DENIED``); answered with the failing op's index, the other ops
     ``SKIPPED``.

  A refused request executes no op and changes no register (``LAST_SEQ`` included): only the
  counters move. Silent drops send nothing, so forged sources get no reflection and no oracle.
* *Execution*: ``LAST_SEQ := seq``, then the ops in frame order (a READ after a WRITE sees it),
  then ``mgmt_accepted``; the response echoes the ops with status OK and, for READs, the value.
  Exactly one response per accepted or refused request, the same size as the request (no
  amplification), tagged when ``auth``.
* Never raises on frame content; only a non-bytes frame is a caller error (``TypeError``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from netreduce.regmap import BusError, RegisterBus, RegMap
from netreduce.wire import DOT1Q, WireError
from netreduce.wire.mgmt import (
    MGMT_TTL,
    NO_ERROR_INDEX,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtOpcode,
    MgmtStatus,
    MgmtType,
    mgmt_tag,
    pack_mgmt,
    parse_mgmt,
)
from netreduce.wire.view import IPV4_OFF, udp_dport_to, udp_payload

__all__ = ["MgmtAgent", "attach_mgmt", "REJECT_COUNTERS"]

REJECT_COUNTERS = ("mgmt_reject_malformed", "mgmt_reject_source", "mgmt_reject_auth",
                   "mgmt_reject_replay", "mgmt_reject_opcode", "mgmt_reject_addr",
                   "mgmt_reject_denied")
_REFUSAL = {MgmtStatus.BAD_OPCODE: "mgmt_reject_opcode", MgmtStatus.BAD_ADDR: "mgmt_reject_addr",
            MgmtStatus.DENIED: "mgmt_reject_denied"}
_U32 = 0xFFFFFFFF


class MgmtAgent:
    """Answers management requests against ``bus`` laid out as ``regmap``.

    ``count(name)`` (optional) is called for every counter event besides the agent's own
    :attr:`counts` (the reference Engine passes its global-counter increment, so the counts show in
    the ``CNT`` registers). If ``bus`` is a :class:`~netreduce.regmap.RegisterFile`, the
    ``MGMT_SRC.LAST_SEQ`` registers are bound to the agent's state and the match configuration is
    cached (refreshed by write hooks); otherwise it is read from the bus for every frame.
    """

    def __init__(self, bus: RegisterBus, regmap: RegMap,
                 count: Callable[[str], None] | None = None):
        self.bus, self.map = bus, regmap
        self.counts: Counter = Counter()
        self._count_cb = count
        src = regmap.table("MGMT_SRC")
        self.nsources = src.count
        self.last_seq = [0] * src.count
        self._src = [{r.name: src.addr(i, r.name) for r in src.registers} for i in range(src.count)]
        self._a = {r.name: regmap.addr(f"MGMT.{r.name}") for r in regmap.table("MGMT").registers}
        self._f = {n: regmap.field(n) for n in (
            "MGMT.CTRL.enable", "MGMT.CTRL.auth", "MGMT_SRC.CFG.valid", "MGMT_SRC.CFG.match_mac",
            "MGMT_SRC.CFG.match_port", "MGMT_SRC.CFG.port")}
        # Registers the network may not touch: the key (reading it would send it in clear).
        self.protected = frozenset(a for n, a in self._a.items() if n.startswith("KEY"))
        self._cached = False
        if hasattr(bus, "bind") and hasattr(bus, "on_write"):
            for i in range(src.count):
                bus.bind(self._src[i]["LAST_SEQ"], lambda i=i: self.last_seq[i])
            for n in ("CTRL", "IP", "PORT"):
                bus.on_write(self._a[n], lambda *_: self._refresh())
            self._cached = True
        self._refresh()

    # ------------------------------------------------------------------ configuration
    def _refresh(self) -> None:
        rd = self.bus.read
        self._enabled = bool(self._f["MGMT.CTRL.enable"].get(rd(self._a["CTRL"])))
        self._ip = rd(self._a["IP"]).to_bytes(4, "big")
        self._port = rd(self._a["PORT"]) & 0xFFFF

    def _count(self, name: str) -> None:
        self.counts[name] += 1
        if self._count_cb is not None:
            self._count_cb(name)

    # ------------------------------------------------------------------ data path
    def matches(self, frame) -> bool:
        """True if ``frame`` is addressed to the management path (see the module doc)."""
        if not self._cached:
            self._refresh()
        if not self._enabled:
            return False
        port = udp_dport_to(frame, self._ip)
        # a frame to the engine's IPv4 whose UDP port cannot be read is a malformed management frame
        return port is not None and (port < 0 or port == self._port)

    def handle(self, frame) -> bytes | None:
        """Process one matched frame; returns the response frame, or None (silent drop)."""
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise TypeError(f"frame must be bytes, not {type(frame).__name__}")
        self._count("mgmt_rx")
        try:
            fr = parse_mgmt(bytes(frame))
            if fr.msg.type != MgmtType.REQUEST:
                raise WireError("malformed", "MGMT_HDR.type", int(fr.msg.type),
                                int(MgmtType.REQUEST))
        except WireError:
            self._count("mgmt_reject_malformed")
            return None
        rd = self.bus.read
        ctrl = rd(self._a["CTRL"])
        ent = self._source(fr)
        if ent is None:
            self._count("mgmt_reject_source")
            return None
        key = None
        if self._f["MGMT.CTRL.auth"].get(ctrl):
            key = self.key()
            want = mgmt_tag(key, fr.src_ip, fr.dst_ip, fr.sport, fr.dport,
                            _payload_of(frame, fr))
            if want != fr.msg.tag:
                self._count("mgmt_reject_auth")
                return None
        msg = fr.msg
        if msg.seq <= self.last_seq[ent]:
            self._count("mgmt_reject_replay")
            return self._respond(fr, ent, key, MgmtStatus.REPLAY, NO_ERROR_INDEX,
                                 [_with(op, MgmtStatus.SKIPPED) for op in msg.ops])
        for i, op in enumerate(msg.ops):
            st = self._check_op(op)
            if st != MgmtStatus.OK:
                self._count(_REFUSAL[st])
                ops = [_with(o, st if j == i else MgmtStatus.SKIPPED)
                       for j, o in enumerate(msg.ops)]
                return self._respond(fr, ent, key, st, i, ops)
        self.last_seq[ent] = msg.seq
        out: list[MgmtOp] = []
        status, err = MgmtStatus.OK, NO_ERROR_INDEX
        for i, op in enumerate(msg.ops):
            if status != MgmtStatus.OK:
                out.append(_with(op, MgmtStatus.SKIPPED))
                continue
            try:
                if op.opcode == MgmtOpcode.READ:
                    out.append(MgmtOp(op.opcode, op.addr, rd(op.addr) & _U32, MgmtStatus.OK))
                else:
                    self.bus.write(op.addr, op.value)
                    out.append(_with(op, MgmtStatus.OK))
            except BusError:  # validated above, so only a bus that disagrees with its map
                status, err = MgmtStatus.BUS_ERROR, i
                out.append(_with(op, MgmtStatus.BUS_ERROR))
        self._count("mgmt_accepted")
        return self._respond(fr, ent, key, status, err, out)

    def _check_op(self, op: MgmtOp) -> MgmtStatus:
        if op.opcode not in (MgmtOpcode.READ, MgmtOpcode.WRITE):
            return MgmtStatus.BAD_OPCODE
        if op.addr & 3 or self.map.decode(op.addr) is None:
            return MgmtStatus.BAD_ADDR
        if op.addr in self.protected:
            return MgmtStatus.DENIED
        return MgmtStatus.OK

    def _source(self, fr: MgmtFrame) -> int | None:
        rd, f = self.bus.read, self._f
        for i, a in enumerate(self._src):
            cfg = rd(a["CFG"])
            if not f["MGMT_SRC.CFG.valid"].get(cfg) or rd(a["IP"]) != fr.src_ip:
                continue
            if f["MGMT_SRC.CFG.match_mac"].get(cfg):
                mac = ((rd(a["MAC_HI"]) & 0xFFFF) << 32 | rd(a["MAC_LO"])).to_bytes(6, "big")
                if mac != fr.src_mac:
                    continue
            if f["MGMT_SRC.CFG.match_port"].get(cfg) and \
                    f["MGMT_SRC.CFG.port"].get(cfg) != fr.sport:
                continue
            return i
        return None

    def key(self) -> bytes:
        """The 16-byte SipHash key from ``MGMT.KEY0..3`` (each word little-endian)."""
        return b"".join(self.bus.read(self._a[f"KEY{i}"]).to_bytes(4, "little")
                        for i in range(4))

    def mac(self) -> bytes:
        rd = self.bus.read
        return ((rd(self._a["MAC_HI"]) & 0xFFFF) << 32 | rd(self._a["MAC_LO"])).to_bytes(6, "big")

    def _respond(self, fr: MgmtFrame, ent: int, key: bytes | None, status: int, err: int,
                 ops: list[MgmtOp]) -> bytes:
        msg = MgmtMessage(MgmtType.RESPONSE, fr.msg.seq, ops, int(status), err,
                          self.last_seq[ent])
        resp = MgmtFrame(msg, self.mac(), fr.src_mac, fr.dst_ip, fr.src_ip, fr.dport, fr.sport,
                         fr.vlan_tci, MGMT_TTL, fr.dscp)
        return pack_mgmt(resp, key)


def _with(op: MgmtOp, status: int) -> MgmtOp:
    return MgmtOp(op.opcode, op.addr, op.value, int(status))


def _payload_of(frame, fr: MgmtFrame) -> bytes:
    """The UDP payload of an already parsed frame (its own bytes, tag included)."""
    return udp_payload(frame, IPV4_OFF + (0 if fr.vlan_tci is None else DOT1Q.size))


def attach_mgmt(engine, settings=None) -> MgmtAgent:
    """Give the reference ``engine`` a management agent (``engine.mgmt``), counting into its
    ``CNT`` registers. ``settings`` (a :class:`netreduce.sw_driver.mgmt.MgmtSettings`) is written
    through ``engine.bus`` first: the bootstrap a switch-attached board gets from its bitstream
    (register reset values) or a host provisions over its trusted bus."""
    if settings is not None:
        from netreduce.sw_driver.mgmt import provision

        provision(engine.bus, settings, engine.regmap)
    agent = MgmtAgent(engine.bus, engine.regmap, engine.count_global)
    engine.mgmt = agent
    return agent
