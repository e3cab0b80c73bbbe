"""In-band management frames: register reads/writes over UDP to the engine (stdlib only).

A switch-attached engine has no host bus, so its register bank is reached by UDP frames addressed
to the engine's own management IPv4 address and UDP port (registers ``MGMT.IP`` / ``MGMT.PORT``).
The protocol is documented in ``docs/management.md``; this module is its single definition: the
byte-offset field tables (like :mod:`netreduce.wire.fields`), the op/status codes, SipHash-2-4 for
the optional authentication tag, and :func:`pack_mgmt` / :func:`parse_mgmt` for whole Ethernet
frames. The driver's client, the reference model's agent and the gateware all derive from it.

UDP payload::

    MGMT_HDR (24 bytes)  magic "NM", version 1, type, seq, count, status, err_index, last_seq, tag
    count x MGMT_OP (12 bytes)  opcode, status, reserved, addr, value

All multi-byte fields are big-endian (network order) except the tag, which is the SipHash-2-4
output serialised little-endian, as the SipHash reference does. Authentication input
(:func:`auth_input`): a 12-byte pseudo-header (source IPv4, destination IPv4, source UDP port,
destination UDP port) followed by the UDP payload with the tag field zeroed. Binding the addresses
stops a frame captured from one allowed source from being replayed as another source, whose
sequence number may be lower.

Errors: :func:`parse_mgmt` raises :class:`~netreduce.wire.errors.WireError` with ``reason``
``"malformed"`` (and ``field`` naming the culprit) for every structural defect, or ``"not_mgmt"``
when the frame is simply not IPv4/UDP (the caller decides which frames are addressed to it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from .errors import WireError
from .fields import DOT1Q, ETH, ETHERTYPE_IPV4, ETHERTYPE_VLAN, IP_PROTO_UDP, IPV4, UDP, Header
from .fields import Field as HField
from .icrc import ipv4_checksum

__all__ = [
    "MGMT_HDR", "MGMT_OP", "MGMT_MAGIC", "MGMT_VERSION", "MGMT_DEFAULT_PORT", "MGMT_MAX_OPS",
    "MGMT_HDR_BYTES", "MGMT_OP_BYTES", "MgmtType", "MgmtOpcode", "MgmtStatus", "MgmtOp",
    "MgmtMessage", "MgmtFrame", "pack_mgmt", "parse_mgmt", "parse_mgmt_payload",
    "pack_mgmt_payload", "auth_input", "siphash24", "mgmt_tag", "udp_checksum", "NO_ERROR_INDEX",
]

MGMT_MAGIC = 0x4E4D  # "NM"
MGMT_VERSION = 1
MGMT_DEFAULT_PORT = 0x4E52  # 20050 ("NR"); the reset value of MGMT.PORT
MGMT_MAX_OPS = 64  # 24 + 64 * 12 = 792 bytes of UDP payload: fits any 1500-byte MTU
NO_ERROR_INDEX = 0xFF
MGMT_TTL = 64  # the IPv4 TTL of the agent's responses


class MgmtType(IntEnum):
    REQUEST = 1
    RESPONSE = 2


class MgmtOpcode(IntEnum):
    READ = 1  # value ignored in the request (must be 0); the response carries the register value
    WRITE = 2  # 32-bit write of value (AXI4-Lite, all byte strobes set)


class MgmtStatus(IntEnum):
    """Header ``status`` (the whole request) and per-op ``status`` codes of a response."""

    OK = 0
    BAD_OPCODE = 1  # op code not READ/WRITE
    BAD_ADDR = 2  # address unaligned or decoding to no register
    DENIED = 3  # register not reachable over the management path (the key registers)
    REPLAY = 4  # sequence number not above the source's LAST_SEQ; nothing executed
    SKIPPED = 5  # per op: not executed because another op of the request was refused
    BUS_ERROR = 6  # the register bus answered an error while executing (should not happen)


MGMT_HDR = Header("MGMT_HDR", "NetReduce in-band management header (docs/management.md)", 24, (
    HField("magic", 0, 2), HField("version", 2, 1), HField("type", 3, 1),
    HField("seq", 4, 4), HField("count", 8, 1), HField("status", 9, 1),
    HField("err_index", 10, 1), HField("reserved", 11, 1), HField("last_seq", 12, 4),
    HField("tag", 16, 8),
))

MGMT_OP = Header("MGMT_OP", "NetReduce in-band management register op", 12, (
    HField("opcode", 0, 1), HField("status", 1, 1), HField("reserved", 2, 2),
    HField("addr", 4, 4), HField("value", 8, 4),
))

MGMT_HDR_BYTES = MGMT_HDR.size
MGMT_OP_BYTES = MGMT_OP.size
_TAG = MGMT_HDR["tag"]


@dataclass(frozen=True)
class MgmtOp:
    """One register access. In a response, ``status`` is a :class:`MgmtStatus` and ``value`` the
    value read (READ) or written (WRITE)."""

    opcode: int
    addr: int
    value: int = 0
    status: int = 0

    @classmethod
    def read(cls, addr: int) -> MgmtOp:
        return cls(MgmtOpcode.READ, addr)

    @classmethod
    def write(cls, addr: int, value: int) -> MgmtOp:
        return cls(MgmtOpcode.WRITE, addr, value)


@dataclass
class MgmtMessage:
    """The UDP payload of a management frame."""

    type: int
    seq: int
    ops: list[MgmtOp] = field(default_factory=list)
    status: int = 0
    err_index: int = 0
    last_seq: int = 0
    tag: bytes = bytes(8)


@dataclass
class MgmtFrame:
    """A whole management frame: Ethernet (optional 802.1Q), IPv4, UDP and the message."""

    msg: MgmtMessage
    src_mac: bytes
    dst_mac: bytes
    src_ip: int
    dst_ip: int
    sport: int
    dport: int
    vlan_tci: int | None = None
    ttl: int = MGMT_TTL
    dscp: int = 0


# ---------------------------------------------------------------------------- SipHash-2-4
_M64 = 0xFFFFFFFFFFFFFFFF


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash24(key: bytes, msg: bytes) -> int:
    """SipHash-2-4 (Aumasson & Bernstein) of ``msg`` under the 16-byte ``key``: a 64-bit int.

    k0/k1 are the key's two little-endian 64-bit halves; the message is absorbed as little-endian
    64-bit words, the last one holding the remaining bytes and ``len(msg) % 256`` in its top byte.
    """
    if len(key) != 16:
        raise ValueError(f"SipHash key must be 16 bytes, got {len(key)}")
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573

    def rounds(n):
        nonlocal v0, v1, v2, v3
        for _ in range(n):
            v0 = (v0 + v1) & _M64
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _M64
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _M64
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _M64
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)

    n = len(msg)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(msg[i:i + 8], "little")
        v3 ^= m
        rounds(2)
        v0 ^= m
    m = int.from_bytes(msg[end:], "little") | ((n & 0xFF) << 56)
    v3 ^= m
    rounds(2)
    v0 ^= m
    v2 ^= 0xFF
    rounds(4)
    return v0 ^ v1 ^ v2 ^ v3


def auth_input(src_ip: int, dst_ip: int, sport: int, dport: int, payload: bytes) -> bytes:
    """What the tag authenticates: pseudo-header (addresses, ports) + payload with tag zeroed."""
    p = bytearray(payload)
    if len(p) >= MGMT_HDR_BYTES:
        _TAG.put(p, 0)
    return (src_ip.to_bytes(4, "big") + dst_ip.to_bytes(4, "big") + sport.to_bytes(2, "big")
            + dport.to_bytes(2, "big") + bytes(p))


def mgmt_tag(key: bytes, src_ip: int, dst_ip: int, sport: int, dport: int,
             payload: bytes) -> bytes:
    """The 8-byte tag (SipHash-2-4 output, little-endian) of a management payload."""
    return siphash24(key, auth_input(src_ip, dst_ip, sport, dport, payload)).to_bytes(8, "little")


# ---------------------------------------------------------------------------- payload
def _check_u(name: str, v: int, bits: int) -> None:
    if not isinstance(v, int) or not 0 <= v < 1 << bits:
        raise ValueError(f"{name} = {v!r} does not fit {bits} bits")


def pack_mgmt_payload(msg: MgmtMessage) -> bytes:
    """The UDP payload of ``msg`` (tag as given; see :func:`pack_mgmt` for tagging).

    Raises ``ValueError`` (naming the value) for out-of-range fields or a bad op count."""
    if not 1 <= len(msg.ops) <= MGMT_MAX_OPS:
        raise ValueError(f"a management message holds 1..{MGMT_MAX_OPS} ops, got {len(msg.ops)}")
    if len(msg.tag) != 8:
        raise ValueError(f"tag must be 8 bytes, got {len(msg.tag)}")
    buf = bytearray(MGMT_HDR_BYTES + MGMT_OP_BYTES * len(msg.ops))
    MGMT_HDR.pack_into(buf, 0, magic=MGMT_MAGIC, version=MGMT_VERSION, type=int(msg.type),
                       seq=msg.seq, count=len(msg.ops), status=int(msg.status),
                       err_index=msg.err_index, last_seq=msg.last_seq)
    buf[16:24] = msg.tag
    for i, op in enumerate(msg.ops):
        _check_u(f"op {i} addr", op.addr, 32)
        _check_u(f"op {i} value", op.value, 32)
        MGMT_OP.pack_into(buf, MGMT_HDR_BYTES + i * MGMT_OP_BYTES, opcode=int(op.opcode),
                          status=int(op.status), addr=op.addr, value=op.value)
    return bytes(buf)


def _bad(fld: str, value, expected=None, detail: str = "") -> WireError:
    return WireError("malformed", fld, value, expected, detail)


def parse_mgmt_payload(payload: bytes, *, strict: bool = True) -> MgmtMessage:
    """Parse a management UDP payload. Checks: length >= header, magic, version, type, count in
    1..MGMT_MAX_OPS, length exactly header + count ops, and (``strict``) that every reserved
    field is zero. Op codes are *not* checked here (an unknown op is a protocol-level refusal,
    ``BAD_OPCODE``, not a malformed frame). Raises WireError(reason="malformed")."""
    n = len(payload)
    if n < MGMT_HDR_BYTES:
        raise _bad("MGMT_HDR", n, MGMT_HDR_BYTES, "payload shorter than the header")
    h = MGMT_HDR.unpack(payload)
    if h["magic"] != MGMT_MAGIC:
        raise _bad("MGMT_HDR.magic", h["magic"], MGMT_MAGIC)
    if h["version"] != MGMT_VERSION:
        raise _bad("MGMT_HDR.version", h["version"], MGMT_VERSION)
    try:
        typ = MgmtType(h["type"])
    except ValueError:
        raise _bad("MGMT_HDR.type", h["type"], None, "1 request, 2 response") from None
    cnt = h["count"]
    if not 1 <= cnt <= MGMT_MAX_OPS:
        raise _bad("MGMT_HDR.count", cnt, None, f"1..{MGMT_MAX_OPS}")
    want = MGMT_HDR_BYTES + cnt * MGMT_OP_BYTES
    if n != want:
        raise _bad("MGMT_HDR.count", cnt, None,
                   f"payload of {n} bytes, {cnt} ops need exactly {want}")
    if strict and h["reserved"]:
        raise _bad("MGMT_HDR.reserved", h["reserved"], 0)
    if strict and typ == MgmtType.REQUEST:
        for name in ("status", "err_index", "last_seq"):
            if h[name]:
                raise _bad(f"MGMT_HDR.{name}", h[name], 0, "must be 0 in a request")
    ops = []
    for i in range(cnt):
        o = MGMT_OP.unpack(payload, MGMT_HDR_BYTES + i * MGMT_OP_BYTES)
        if strict and o["reserved"]:
            raise _bad("MGMT_OP.reserved", o["reserved"], 0, f"op {i}")
        if strict and typ == MgmtType.REQUEST:
            if o["status"]:
                raise _bad("MGMT_OP.status", o["status"], 0, f"op {i}: must be 0 in a request")
            if o["opcode"] == MgmtOpcode.READ and o["value"]:
                raise _bad("MGMT_OP.value", o["value"], 0, f"op {i}: a READ carries value 0")
        ops.append(MgmtOp(o["opcode"], o["addr"], o["value"], o["status"]))
    return MgmtMessage(typ, h["seq"], ops, h["status"], h["err_index"], h["last_seq"],
                       bytes(payload[16:24]))


# ---------------------------------------------------------------------------- frame
def udp_checksum(src_ip: int, dst_ip: int, udp: bytes) -> int:
    """RFC 768 checksum of a UDP datagram (header with checksum 0 + payload) over IPv4; a
    computed 0 is sent as 0xFFFF."""
    data = (src_ip.to_bytes(4, "big") + dst_ip.to_bytes(4, "big") + bytes([0, IP_PROTO_UDP])
            + len(udp).to_bytes(2, "big") + bytes(udp))
    if len(data) & 1:
        data += b"\x00"
    s = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ((~s) & 0xFFFF) or 0xFFFF


def pack_mgmt(fr: MgmtFrame, key: bytes | None = None) -> bytes:
    """The Ethernet frame (no FCS, padded to 60 bytes) of ``fr``; with ``key`` the tag is
    computed and set (``fr.msg.tag`` is updated), else the tag goes out as given."""
    payload = bytearray(pack_mgmt_payload(fr.msg))
    if key is not None:
        tag = mgmt_tag(key, fr.src_ip, fr.dst_ip, fr.sport, fr.dport, bytes(payload))
        payload[16:24] = tag
        fr.msg.tag = tag
    for name, v, bits in (("sport", fr.sport, 16), ("dport", fr.dport, 16),
                          ("src_ip", fr.src_ip, 32), ("dst_ip", fr.dst_ip, 32),
                          ("ttl", fr.ttl, 8), ("dscp", fr.dscp, 6)):
        _check_u(name, v, bits)
    udp = bytearray(UDP.pack(sport=fr.sport, dport=fr.dport, length=8 + len(payload)))
    udp += payload
    UDP.checksum.put(udp, udp_checksum(fr.src_ip, fr.dst_ip, bytes(udp)))
    ip = bytearray(IPV4.pack(version=4, ihl=5, dscp=fr.dscp, total_length=20 + len(udp),
                             flags=0b010, ttl=fr.ttl, protocol=IP_PROTO_UDP, src=fr.src_ip,
                             dst=fr.dst_ip))
    IPV4.checksum.put(ip, ipv4_checksum(ip))
    if len(fr.src_mac) != 6 or len(fr.dst_mac) != 6:
        raise ValueError(f"MACs must be 6 bytes: src {fr.src_mac!r}, dst {fr.dst_mac!r}")
    eth = bytes(fr.dst_mac) + bytes(fr.src_mac)
    if fr.vlan_tci is not None:
        _check_u("vlan_tci", fr.vlan_tci, 16)
        eth += DOT1Q.pack(tpid=ETHERTYPE_VLAN, tci=fr.vlan_tci)[:4]
    eth += ETHERTYPE_IPV4.to_bytes(2, "big")
    out = eth + bytes(ip) + bytes(udp)
    return out + bytes(max(0, 60 - len(out)))


def parse_mgmt(frame: bytes, *, strict: bool = True) -> MgmtFrame:
    """Parse a management frame. Raises WireError: ``reason="not_mgmt"`` if it is not IPv4
    (IHL 5) / UDP at all, ``reason="malformed"`` for a fragment, inconsistent IPv4/UDP lengths, a
    bad IPv4 header checksum, a bad UDP checksum (when non-zero) or a bad payload
    (:func:`parse_mgmt_payload`). The tag is not verified here (the caller holds the key)."""
    n = len(frame)
    if n < 14:
        raise WireError("not_mgmt", "ETH", n, 14, "shorter than an Ethernet header")
    et = ETH.ethertype.get(frame)
    l3, vlan = 14, None
    if et == ETHERTYPE_VLAN:
        if n < 18:
            raise WireError("not_mgmt", "DOT1Q", n, 18, "truncated VLAN tag")
        vlan = DOT1Q.tci.get(frame, 12)
        et = int.from_bytes(frame[16:18], "big")
        l3 = 18
    if et != ETHERTYPE_IPV4:
        raise WireError("not_mgmt", "ETH.ethertype", et, ETHERTYPE_IPV4)
    if n < l3 + 20:
        raise WireError("not_mgmt", "IPV4", n - l3, 20, "truncated IPv4 header")
    if IPV4.version.get(frame, l3) != 4 or IPV4.ihl.get(frame, l3) != 5:
        raise WireError("not_mgmt", "IPV4.ihl", frame[l3], 0x45)
    if IPV4.protocol.get(frame, l3) != IP_PROTO_UDP:
        raise WireError("not_mgmt", "IPV4.protocol", IPV4.protocol.get(frame, l3), IP_PROTO_UDP)
    ff = IPV4.flags_frag.get(frame, l3)
    if ff & 0x3FFF:
        raise _bad("IPV4.flags_frag", ff, None, "fragmented management frame")
    total = IPV4.total_length.get(frame, l3)
    end = l3 + total
    if total < 28 or end > n or (end < n and n > 60):
        raise _bad("IPV4.total_length", total, None, f"frame of {n} bytes, IPv4 at {l3}")
    if ipv4_checksum(frame[l3:l3 + 20]) != IPV4.checksum.get(frame, l3):
        raise _bad("IPV4.checksum", IPV4.checksum.get(frame, l3),
                   ipv4_checksum(frame[l3:l3 + 20]))
    u = l3 + 20
    ulen = UDP.length.get(frame, u)
    if ulen != total - 20:
        raise _bad("UDP.length", ulen, total - 20)
    src_ip, dst_ip = IPV4.src.get(frame, l3), IPV4.dst.get(frame, l3)
    csum = UDP.checksum.get(frame, u)
    if csum:
        udp = bytearray(frame[u:end])
        UDP.checksum.put(udp, 0)
        want = udp_checksum(src_ip, dst_ip, bytes(udp))
        if want != csum:
            raise _bad("UDP.checksum", csum, want)
    msg = parse_mgmt_payload(bytes(frame[u + 8:end]), strict=strict)
    return MgmtFrame(msg, bytes(frame[6:12]), bytes(frame[0:6]), src_ip, dst_ip,
                     UDP.sport.get(frame, u), UDP.dport.get(frame, u), vlan,
                     IPV4.ttl.get(frame, l3), IPV4.dscp.get(frame, l3))
