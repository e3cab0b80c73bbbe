"""Frame material for the packet-path testbenches: RoCEv2 frames, malformed ones, scapy cross-check.

Everything is built with :mod:`netreduce.wire` (the one wire-format definition) and classified by
:func:`netreduce.wire.parse`, so a testbench's expectation never restates the format by hand; scapy
is the independent second opinion on header fields.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from netreduce.wire import (
    BTH,
    ECN_CE,
    ECN_ECT0,
    ECN_ECT1,
    ECN_NOT_ECT,
    ETH,
    IPV4,
    OPCODES,
    ROCEV2_UDP_PORT,
    UDP,
    Opcode,
    RoceFrame,
    WireError,
    icrc_bytes,
    ipv4_checksum,
    parse,
)
from netreduce.wire.view import BTH_OFF, IPV4_OFF, UDP_OFF

__all__ = ["random_frame", "frame_of_size", "raw_frame", "check_icrc", "malformed_frames",
           "classify", "scapy_fields", "wire_fields", "replace_payload", "Malformed",
           "DATA_OPCODES", "OVERHEAD"]

_ETHERTYPE_IPV6, _ETHERTYPE_ARP = 0x86DD, 0x0806  # not RoCEv2: forwarded untouched
_IP_PROTO_TCP = 6
_RESERVED_OPCODE = 0x1F  # an RC opcode IBA reserves

DATA_OPCODES = [o for o, i in OPCODES.items() if i.has_payload and i.transport == "RC"]
_OTHER = [Opcode.ACK, Opcode.CNP]

# bytes besides the payload, per opcode, untagged: Eth 14 + IPv4 20 + UDP 8 + BTH 12 + ext + ICRC 4
OVERHEAD = {o: 14 + 20 + 8 + 12 + i.ext_len + 4 for o, i in OPCODES.items()}


def random_frame(rng: random.Random, *, max_payload: int = 1024, opcode: int | None = None,
                 vlan: bool | None = None) -> RoceFrame:
    """A valid RoCEv2 frame with random headers (RC data mostly, some ACK/CNP)."""
    if opcode is None:
        opcode = rng.choice(DATA_OPCODES) if rng.random() < 0.85 else rng.choice(_OTHER)
    info = OPCODES[opcode]
    n = rng.randint(0, max_payload) if info.has_payload else 0
    if rng.random() < 0.3 and info.has_payload:
        n &= ~3  # the aggregator's case: whole int32 lanes
    if vlan is None:
        vlan = rng.random() < 0.25
    kw = dict(
        opcode=opcode, dqpn=rng.getrandbits(24), psn=rng.getrandbits(24),
        payload=rng.randbytes(n),
        dmac=rng.randbytes(6), smac=rng.randbytes(6),
        vlan_tci=rng.getrandbits(16) if vlan else None,
        src_ip=rng.getrandbits(32), dst_ip=rng.getrandbits(32),
        tos=(rng.getrandbits(6) << 2) | rng.choice([ECN_NOT_ECT, ECN_ECT0, ECN_ECT1, ECN_CE]),
        ident=rng.getrandbits(16), ttl=rng.randint(1, 255), sport=rng.getrandbits(16),
        se=rng.getrandbits(1), m=rng.getrandbits(1), pkey=rng.getrandbits(16),
        fecn=rng.getrandbits(1), becn=rng.getrandbits(1), ackreq=rng.getrandbits(1),
        va=rng.getrandbits(64), rkey=rng.getrandbits(32), dmalen=rng.getrandbits(32),
        imm=rng.getrandbits(32), syndrome=rng.getrandbits(8), msn=rng.getrandbits(24),
    )
    if opcode == Opcode.CNP:
        kw.update(becn=1, psn=0)
    return RoceFrame(**kw)


def frame_of_size(rng: random.Random, size: int, opcode: int = Opcode.WRITE_MIDDLE,
                  vlan: bool = False) -> bytes:
    """A valid RoCEv2 frame of ``size`` bytes, or the largest one below it.

    Above 60 bytes a RoCEv2 frame's length is the opcode's overhead plus a multiple of 4 (PadCnt
    rounds the payload up), so e.g. an untagged WRITE MIDDLE is always 2 mod 4 bytes long. Use
    :func:`raw_frame` for exact arbitrary sizes.
    """
    over = OVERHEAD[opcode] + (4 if vlan else 0)
    n = max(0, (size - over) & ~3)
    f = random_frame(rng, opcode=opcode, vlan=vlan)
    return f.copy(payload=rng.randbytes(n)).pack()


def raw_frame(rng: random.Random, size: int, ethertype: int = 0x88B5) -> bytes:
    """A non-IP Ethernet frame of exactly ``size`` bytes (EtherType 0x88B5: local experimental)."""
    if size < 14:
        raise ValueError(f"an Ethernet frame needs 14 B of header, asked for {size}")
    return rng.randbytes(12) + ethertype.to_bytes(2, "big") + rng.randbytes(size - 14)


def replace_payload(frame: bytes, payload: bytes) -> bytes:
    """``frame`` with its payload replaced (same length), IPv4 checksum and ICRC recomputed."""
    f = parse(frame)
    if len(payload) != len(f.payload):
        raise ValueError(f"payload of {len(payload)} B for a frame carrying {len(f.payload)} B")
    return f.copy(payload=payload, eth_pad=b"").pack()


def classify(frame: bytes) -> str:
    """``"ok"``, or the :class:`~netreduce.wire.WireError` reason ``parse`` gives the frame."""
    try:
        parse(frame)
    except WireError as e:
        return e.reason
    return "ok"


@dataclass
class Malformed:
    name: str
    frame: bytes
    reason: str  # what netreduce.wire.parse says


def _fix_ip(b: bytearray, l3: int = IPV4_OFF) -> None:
    IPV4.checksum.put(b, 0, l3)
    IPV4.checksum.put(b, ipv4_checksum(b[l3:l3 + IPV4.size]), l3)


def malformed_frames(rng: random.Random) -> list[Malformed]:
    """One frame per failure class, each derived from a valid frame; ``reason`` from ``parse``."""
    base = random_frame(rng, opcode=Opcode.WRITE_ONLY, vlan=False)
    good = bytearray(base.copy(payload=rng.randbytes(64)).pack())
    out = []

    def add(name, b):
        out.append(Malformed(name, bytes(b), classify(bytes(b))))

    b = bytearray(good)
    b[-1] ^= 0x01
    add("bad_icrc", b)
    b = bytearray(good)
    b[-10] ^= 0x80  # payload bit: ICRC no longer matches
    add("payload_bit_flip", b)
    b = bytearray(good)
    IPV4.checksum.put(b, IPV4.checksum.get(b, IPV4_OFF) ^ 0x0100, IPV4_OFF)
    add("bad_ip_checksum", b)
    b = bytearray(good)
    ETH.ethertype.put(b, _ETHERTYPE_IPV6)
    add("ipv6_ethertype", b)
    b = bytearray(good)
    ETH.ethertype.put(b, _ETHERTYPE_ARP)
    add("arp_ethertype", b)
    b = bytearray(good)
    IPV4.protocol.put(b, _IP_PROTO_TCP, IPV4_OFF)
    _fix_ip(b)
    add("tcp", b)
    b = bytearray(good)
    UDP.dport.put(b, ROCEV2_UDP_PORT + 1, UDP_OFF)
    add("other_udp_port", b)
    b = bytearray(good)
    IPV4.ihl.put(b, 6, IPV4_OFF)
    _fix_ip(b)
    add("ihl6", b)
    b = bytearray(good)
    IPV4.flags_frag.put(b, 1 << IPV4.flags.shift, IPV4_OFF)  # MF only (DF cleared)
    _fix_ip(b)
    add("fragment", b)
    b = bytearray(good)
    IPV4.total_length.put(b, IPV4.total_length.get(b, IPV4_OFF) + 8, IPV4_OFF)  # past the end
    _fix_ip(b)
    add("ip_length_long", b)
    b = bytearray(good)
    UDP.length.put(b, UDP.length.get(b, UDP_OFF) - 4, UDP_OFF)
    add("udp_length", b)
    b = bytearray(good)
    BTH.tver.put(b, 1, BTH_OFF)
    add("tver", b)
    b = bytearray(good)
    BTH.opcode.put(b, _RESERVED_OPCODE, BTH_OFF)
    add("unknown_opcode", b)
    add("truncated_in_bth", good[:BTH_OFF + BTH.size // 2])
    add("runt_ethernet", good[:ETH.ethertype.offset])
    return out


def wire_fields(frame: bytes) -> dict:
    """Header fields of a valid frame per :func:`netreduce.wire.parse` (names as RoceFrame)."""
    f = parse(frame)
    return {k: getattr(f, k) for k in (
        "opcode", "dqpn", "psn", "dmac", "smac", "vlan_tci", "src_ip", "dst_ip", "tos", "ttl",
        "ident", "sport", "se", "m", "pkey", "fecn", "becn", "ackreq", "padcnt")} | {
        "payload_len": len(f.payload), "payload_offset": f.payload_offset}


def scapy_fields(frame: bytes) -> dict:
    """The same header fields as :func:`wire_fields`, read by scapy (independent parser)."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Dot1Q, Ether

    p = Ether(frame)
    ip, udp, bth = p[IP], p[UDP], p[BTH]
    return {
        "opcode": bth.opcode, "dqpn": bth.dqpn, "psn": bth.psn,
        "dmac": bytes.fromhex(p.dst.replace(":", "")),
        "smac": bytes.fromhex(p.src.replace(":", "")),
        "vlan_tci": ((p[Dot1Q].prio << 13) | (p[Dot1Q].dei << 12) | p[Dot1Q].vlan)
        if Dot1Q in p else None,
        "src_ip": int.from_bytes(bytes(map(int, ip.src.split("."))), "big"),
        "dst_ip": int.from_bytes(bytes(map(int, ip.dst.split("."))), "big"),
        "tos": ip.tos, "ttl": ip.ttl, "ident": ip.id, "sport": udp.sport,
        "se": bth.solicited, "m": bth.migreq, "pkey": bth.pkey, "fecn": bth.fecn,
        "becn": bth.becn, "ackreq": bth.ackreq, "padcnt": bth.padcount,
    }


def check_icrc(frame: bytes) -> bool:
    """True if the frame's IPv4 checksum and ICRC are those netreduce.wire computes."""
    f = parse(frame, check=False)
    l3 = f.l2_len
    end = l3 + IPV4.total_length.get(frame, l3)
    return (icrc_bytes(memoryview(frame)[l3:end - 4]) == frame[end - 4:end]
            and ipv4_checksum(frame[l3:l3 + IPV4.size]) == IPV4.checksum.get(frame, l3))

