"""RoCEv2 frames: parse, pack and build.

A frame here is an Ethernet frame without preamble and FCS (what an AXI-Stream MAC interface
carries): Ethernet header, optional 802.1Q tag, IPv4 (IHL 5), UDP to port 4791, BTH, extension
headers, payload, pad, ICRC, and possibly Ethernet padding up to 60 bytes.

:func:`parse` raises :class:`~netreduce.wire.errors.WireError` for every truncated or inconsistent
frame; its ``reason`` tells "not RoCEv2 at all" (``err.not_roce``) from "broken RoCEv2".
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

from .errors import WireError
from .fields import (
    AETH,
    BTH,
    DOT1Q,
    ETH,
    ETHERTYPE_IPV4,
    ETHERTYPE_VLAN,
    IMMDT,
    IP_PROTO_UDP,
    IPV4,
    RETH,
    ROCEV2_UDP_PORT,
    UDP,
)
from .icrc import icrc_bytes, ipv4_checksum
from .opcodes import ACK_NO_CREDIT, NAK_PSN_SEQ, OPCODES, Opcode, OpInfo

__all__ = ["RoceFrame", "parse", "ip", "ip_str", "MIN_FRAME", "PSN_MOD", "psn_add", "psn_diff"]

MIN_FRAME = 60  # minimum Ethernet frame without FCS; shorter frames are padded to this
PSN_MOD = 1 << 24


def psn_add(psn: int, n: int) -> int:
    return (psn + n) % PSN_MOD


def psn_diff(a: int, b: int) -> int:
    """Signed 24-bit distance a - b (IBA PSN comparison): positive when a is after b."""
    d = (a - b) % PSN_MOD
    return d - PSN_MOD if d >= PSN_MOD // 2 else d


def ip(addr) -> int:
    """An IPv4 address as an int, from an int, a dotted string or 4 bytes."""
    if isinstance(addr, int):
        return addr
    if isinstance(addr, bytes | bytearray):
        return int.from_bytes(addr, "big")
    return int(ipaddress.IPv4Address(addr))


def ip_str(addr: int) -> str:
    return str(ipaddress.IPv4Address(addr))


@dataclass
class RoceFrame:
    """One RoCEv2 frame, field by field (values as integers, MACs and payload as bytes).

    Lengths (IPv4 total length, UDP length), PadCnt, the IPv4 checksum and the ICRC are derived by
    :meth:`pack`; after :func:`parse` they hold what was on the wire.
    """

    opcode: int
    dqpn: int = 0
    psn: int = 0
    payload: bytes = b""
    # Ethernet / 802.1Q
    dmac: bytes = b"\x02\x00\x00\x00\x00\x02"
    smac: bytes = b"\x02\x00\x00\x00\x00\x01"
    vlan_tci: int | None = None  # None: untagged
    # IPv4
    src_ip: int = 0x0A000001
    dst_ip: int = 0x0A000002
    tos: int = 0
    ident: int = 0
    flags_frag: int = 0x4000
    ttl: int = 64
    # UDP
    sport: int = 0xC000
    udp_checksum: int = 0  # RoCEv2 senders send 0; the ICRC masks it, so it is kept as found
    # BTH
    se: int = 0
    m: int = 0
    tver: int = 0
    pkey: int = 0xFFFF
    fecn: int = 0
    becn: int = 0
    ackreq: int = 0
    # extension headers (only those the opcode carries are used)
    va: int = 0
    rkey: int = 0
    dmalen: int = 0
    imm: int = 0
    syndrome: int = 0
    msn: int = 0
    # as found on the wire by parse(); pack() recomputes them
    padcnt: int | None = None
    ip_checksum: int | None = None
    icrc: bytes | None = None
    eth_pad: bytes = field(default=b"", repr=False)

    # ------------------------------------------------------------------ derived properties
    @property
    def info(self) -> OpInfo:
        o = OPCODES.get(self.opcode)
        if o is None:
            raise WireError("opcode", "BTH.opcode", self.opcode, detail="not an RC/UC/CNP opcode")
        return o

    @property
    def ecn(self) -> int:
        return self.tos & 0b11

    @property
    def l2_len(self) -> int:
        return ETH.size + (DOT1Q.size if self.vlan_tci is not None else 0)

    @property
    def payload_offset(self) -> int:
        """Offset of the payload from the first Ethernet byte of this frame."""
        return self.l2_len + IPV4.size + UDP.size + BTH.size + self.info.ext_len

    @property
    def pad(self) -> int:
        return (-len(self.payload)) & 3

    def with_ecn(self, ecn: int) -> RoceFrame:
        return replace(self, tos=(self.tos & ~0b11) | ecn, ip_checksum=None, icrc=None)

    def copy(self, **changes) -> RoceFrame:
        """A copy with ``changes``; derived wire values are recomputed on pack()."""
        return replace(self, **changes, padcnt=None, ip_checksum=None, icrc=None)

    # ------------------------------------------------------------------ serialisation
    def headers(self) -> bytearray:
        """Ethernet .. last extension header, with lengths and IPv4 checksum filled in."""
        o = self.info
        plen = len(self.payload)
        pad = (-plen) & 3
        l4_len = UDP.size + BTH.size + o.ext_len + plen + pad + 4
        buf = bytearray(self.payload_offset)
        ETH.pack_into(buf, 0, dst=int.from_bytes(self.dmac, "big"),
                      src=int.from_bytes(self.smac, "big"))
        l3 = ETH.size
        if self.vlan_tci is not None:
            DOT1Q.pack_into(buf, 12, tpid=ETHERTYPE_VLAN, tci=self.vlan_tci)
            l3 += DOT1Q.size
        ETH.ethertype.put(buf, ETHERTYPE_IPV4, l3 - ETH.size)
        IPV4.pack_into(buf, l3, version=4, ihl=5, tos=self.tos, total_length=IPV4.size + l4_len,
                       identification=self.ident, flags_frag=self.flags_frag, ttl=self.ttl,
                       protocol=IP_PROTO_UDP, src=self.src_ip, dst=self.dst_ip)
        IPV4.checksum.put(buf, ipv4_checksum(buf[l3:l3 + IPV4.size]), l3)
        u = l3 + IPV4.size
        UDP.pack_into(buf, u, sport=self.sport, dport=ROCEV2_UDP_PORT, length=l4_len,
                       checksum=self.udp_checksum)
        b = u + UDP.size
        BTH.pack_into(buf, b, opcode=self.opcode, se=self.se, m=self.m, padcnt=pad,
                      tver=self.tver, pkey=self.pkey, fecn=self.fecn, becn=self.becn,
                      dqpn=self.dqpn, ackreq=self.ackreq, psn=self.psn)
        x = b + BTH.size
        if o.reth:
            RETH.pack_into(buf, x, va=self.va, rkey=self.rkey, dmalen=self.dmalen)
            x += RETH.size
        if o.immdt:
            IMMDT.pack_into(buf, x, imm=self.imm)
            x += IMMDT.size
        if o.aeth:
            AETH.pack_into(buf, x, syndrome=self.syndrome, msn=self.msn)
            x += AETH.size
        return buf

    def pack(self) -> bytes:
        """The frame's bytes with lengths, PadCnt, IPv4 checksum and ICRC computed.

        Frames shorter than 60 bytes get Ethernet padding (zeros), as a MAC would add.
        """
        buf = self.headers()
        buf += self.payload
        buf += bytes(self.pad)
        buf += icrc_bytes(memoryview(buf)[self.l2_len:])
        if len(buf) < MIN_FRAME:
            buf += bytes(MIN_FRAME - len(buf))
        return bytes(buf)

    # ------------------------------------------------------------------ builders
    @classmethod
    def ack(cls, psn: int, msn: int = 0, syndrome: int = ACK_NO_CREDIT, **kw) -> RoceFrame:
        return cls(opcode=Opcode.ACK, psn=psn, msn=msn, syndrome=syndrome, **kw)

    @classmethod
    def nak_seq(cls, psn: int, msn: int = 0, **kw) -> RoceFrame:
        return cls(opcode=Opcode.ACK, psn=psn, msn=msn, syndrome=NAK_PSN_SEQ, **kw)

    @classmethod
    def cnp(cls, **kw) -> RoceFrame:
        return cls(opcode=Opcode.CNP, psn=0, becn=1, **kw)


def parse(frame, *, check: bool = True) -> RoceFrame:
    """Parse an Ethernet frame (no FCS) as RoCEv2.

    Structural checks always run: EtherType, IPv4 version/IHL, fragment, protocol, UDP port,
    truncation inside any header, IPv4 and UDP lengths against the frame, TVer, a known opcode,
    PadCnt against the payload. With ``check`` (default) the IPv4 checksum and the ICRC are
    verified too. Every failure raises :class:`WireError` naming the field and the values.
    """
    buf = bytes(frame)
    n = len(buf)

    def need(end: int, hdr: str):
        if n < end:
            raise WireError("truncated", hdr, n, end, detail=f"frame of {n} B ends inside {hdr}")

    need(ETH.size, "ETH")
    kw: dict = {"dmac": buf[0:6], "smac": buf[6:12]}
    et = ETH.ethertype.get(buf)
    l3 = ETH.size
    if et == ETHERTYPE_VLAN:
        need(ETH.size + DOT1Q.size, "DOT1Q")
        kw["vlan_tci"] = DOT1Q.tci.get(buf, 12)
        et = ETH.ethertype.get(buf, DOT1Q.size)
        l3 += DOT1Q.size
    if et != ETHERTYPE_IPV4:
        raise WireError("ethertype", "ETH.ethertype", et, ETHERTYPE_IPV4)
    need(l3 + 1, "IPV4")
    if IPV4.version.get(buf, l3) != 4:
        raise WireError("ip_version", "IPV4.version", IPV4.version.get(buf, l3), 4)
    if IPV4.ihl.get(buf, l3) != 5:
        raise WireError("ihl", "IPV4.ihl", IPV4.ihl.get(buf, l3), 5)
    need(l3 + IPV4.size, "IPV4")
    ipf = IPV4.unpack(buf, l3)
    if ipf["frag_offset"] or (ipf["flags"] & 0b001):
        raise WireError("fragment", "IPV4.flags_frag", ipf["flags_frag"], 0x4000)
    if ipf["protocol"] != IP_PROTO_UDP:
        raise WireError("protocol", "IPV4.protocol", ipf["protocol"], IP_PROTO_UDP)
    u = l3 + IPV4.size
    need(u + UDP.size, "UDP")
    udp = UDP.unpack(buf, u)
    if udp["dport"] != ROCEV2_UDP_PORT:
        raise WireError("udp_port", "UDP.dport", udp["dport"], ROCEV2_UDP_PORT)
    total = ipf["total_length"]
    end = l3 + total  # end of the IPv4 datagram = end of the ICRC
    if total < IPV4.size + UDP.size + BTH.size + 4:
        raise WireError("ip_length", "IPV4.total_length", total,
                        detail=f"less than the {IPV4.size + UDP.size + BTH.size + 4} B minimum")
    if end > n:
        raise WireError("ip_length", "IPV4.total_length", total, n - l3,
                        detail="datagram runs past the end of the frame")
    if end < n and n > MIN_FRAME:
        raise WireError("ip_length", "IPV4.total_length", total, n - l3,
                        detail="trailing bytes after the datagram in a frame above 60 B")
    if udp["length"] != total - IPV4.size:
        raise WireError("udp_length", "UDP.length", udp["length"], total - IPV4.size)
    if check:
        csum = ipv4_checksum(buf[l3:u])
        if csum != ipf["checksum"]:
            raise WireError("ip_checksum", "IPV4.checksum", ipf["checksum"], csum)
    b = u + UDP.size
    need(b + BTH.size, "BTH")
    bth = BTH.unpack(buf, b)
    if bth["tver"] != 0:
        raise WireError("tver", "BTH.tver", bth["tver"], 0)
    info = OPCODES.get(bth["opcode"])
    if info is None:
        raise WireError("opcode", "BTH.opcode", bth["opcode"], detail="not an RC/UC/CNP opcode")
    x = b + BTH.size
    pay_end = end - 4
    if x + info.ext_len > pay_end:
        raise WireError("truncated", "BTH.opcode", bth["opcode"],
                        detail=f"{info.ext_len} B of extension headers do not fit the datagram")
    if info.reth:
        kw.update(RETH.unpack(buf, x))
        x += RETH.size
    if info.immdt:
        kw["imm"] = IMMDT.imm.get(buf, x)
        x += IMMDT.size
    if info.aeth:
        kw.update(AETH.unpack(buf, x))
        x += AETH.size
    if info.cnp:
        x += 16
    padded = pay_end - x
    pad = bth["padcnt"]
    if not info.has_payload:
        if padded != 0 or pad != 0:
            raise WireError("ip_length", "IPV4.total_length", total, total - padded,
                            detail=f"{Opcode(info.opcode).name} carries no payload")
    elif pad > padded:
        raise WireError("padcnt", "BTH.padcnt", pad, detail=f"only {padded} B after the headers")
    payload = buf[x:pay_end - pad]
    if check:
        want = icrc_bytes(memoryview(buf)[l3:pay_end])
        if want != buf[pay_end:end]:
            raise WireError("icrc", "ICRC", buf[pay_end:end], want)
    for k in ("resv6", "resv7"):
        bth.pop(k)
    return RoceFrame(
        payload=payload, src_ip=ipf["src"], dst_ip=ipf["dst"], tos=ipf["tos"],
        ident=ipf["identification"], flags_frag=ipf["flags_frag"], ttl=ipf["ttl"],
        sport=udp["sport"], udp_checksum=udp["checksum"], ip_checksum=ipf["checksum"],
        icrc=buf[pay_end:end], eth_pad=buf[end:], **bth, **kw,
    )

