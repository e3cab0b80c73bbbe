"""Byte-offset field tables of the RoCEv2 (IPv4) wire format, in network byte order.

This is the single definition of every header NetReduce touches. The host pack/unpack
(:mod:`netreduce.wire.frame`), the batch packetiser, the reference model and the gateware's header
layouts (``netreduce.hw``) are all derived from these tables.

Standards followed:

* Ethernet II: IEEE 802.3 clause 3.  802.1Q tag: IEEE 802.1Q-2018 clause 9.
* IPv4: RFC 791 (header checksum RFC 1071), DSCP/ECN byte RFC 2474 / RFC 3168.
* UDP: RFC 768 (destination port 4791 assigned to RoCEv2 by IANA).
* BTH, RETH, ImmDt, AETH: InfiniBand Architecture Specification vol. 1 rel. 1.4, ch. 9.2-9.3;
  RoCEv2 (UDP encapsulation) and CNP: IBA Annex A17.

Offsets are relative to the start of their own header. A field is ``size`` whole bytes read as a
big-endian integer; sub-byte fields additionally give ``bits`` and ``shift`` (LSB position inside
that integer).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Field", "Header", "ETH", "DOT1Q", "IPV4", "UDP", "BTH", "RETH", "IMMDT", "AETH", "CNP_PAD",
    "HEADERS", "ETHERTYPE_IPV4", "ETHERTYPE_VLAN", "ETHERTYPE_QINQ", "IP_PROTO_UDP",
    "ROCEV2_UDP_PORT",
    "ECN_NOT_ECT", "ECN_ECT1", "ECN_ECT0", "ECN_CE",
]

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_VLAN = 0x8100
ETHERTYPE_QINQ = 0x88A8  # 802.1ad service tag (stacked VLANs; the engine does not parse it)
IP_PROTO_UDP = 17
ROCEV2_UDP_PORT = 4791

ECN_NOT_ECT = 0b00
ECN_ECT1 = 0b01
ECN_ECT0 = 0b10
ECN_CE = 0b11


@dataclass(frozen=True)
class Field:
    """One header field: ``size`` bytes at ``offset`` (big-endian); optionally a bit sub-field."""

    name: str
    offset: int
    size: int
    bits: int = 0  # 0: the whole `size` bytes; else the width of the sub-field
    shift: int = 0  # LSB position of the sub-field inside the big-endian integer

    @property
    def width(self) -> int:
        """Width of the field's value in bits."""
        return self.bits or 8 * self.size

    @property
    def mask(self) -> int:
        return (1 << self.width) - 1

    def get(self, buf, base: int = 0) -> int:
        raw = int.from_bytes(buf[base + self.offset: base + self.offset + self.size], "big")
        return (raw >> self.shift) & self.mask if self.bits else raw

    def put(self, buf: bytearray, value: int, base: int = 0) -> None:
        if not 0 <= value <= self.mask:
            raise ValueError(f"{self.name} = {value} does not fit in {self.width} bits")
        lo, hi = base + self.offset, base + self.offset + self.size
        if self.bits:
            raw = int.from_bytes(buf[lo:hi], "big")
            raw = (raw & ~(self.mask << self.shift)) | (value << self.shift)
            value = raw
        buf[lo:hi] = value.to_bytes(self.size, "big")


@dataclass(frozen=True)
class Header:
    """A fixed-size header: its name, the standard it follows, its size and its fields."""

    name: str
    standard: str
    size: int
    fields: tuple[Field, ...]

    def __post_init__(self):
        for f in self.fields:
            if f.offset + f.size > self.size:
                raise ValueError(f"{self.name}.{f.name} runs past the header ({self.size} B)")

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name!r}")

    def __getattr__(self, name: str) -> Field:
        # Convenience: BTH.psn is BTH["psn"]. Dataclass attributes are found first.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def unpack(self, buf, base: int = 0) -> dict[str, int]:
        return {f.name: f.get(buf, base) for f in self.fields}

    def pack_into(self, buf: bytearray, base: int = 0, **values: int) -> None:
        for name, v in values.items():
            self[name].put(buf, v, base)

    def pack(self, **values: int) -> bytes:
        buf = bytearray(self.size)
        self.pack_into(buf, 0, **values)
        return bytes(buf)


def _h(name, standard, size, *fields):
    return Header(name, standard, size, tuple(Field(*f) for f in fields))


ETH = _h("ETH", "IEEE 802.3 Ethernet II", 14,
         ("dst", 0, 6), ("src", 6, 6), ("ethertype", 12, 2))

# The 802.1Q tag sits between ETH.src and ETH.ethertype: a tagged frame has the tag at byte 12 and
# the EtherType at byte 16.
DOT1Q = _h("DOT1Q", "IEEE 802.1Q tag", 4,
           ("tpid", 0, 2), ("pcp", 2, 2, 3, 13), ("dei", 2, 2, 1, 12), ("vid", 2, 2, 12, 0),
           ("tci", 2, 2))

IPV4 = _h("IPV4", "RFC 791 (IHL 5, no options)", 20,
          ("version", 0, 1, 4, 4), ("ihl", 0, 1, 4, 0),
          ("tos", 1, 1), ("dscp", 1, 1, 6, 2), ("ecn", 1, 1, 2, 0),
          ("total_length", 2, 2), ("identification", 4, 2),
          ("flags", 6, 2, 3, 13), ("frag_offset", 6, 2, 13, 0), ("flags_frag", 6, 2),
          ("ttl", 8, 1), ("protocol", 9, 1), ("checksum", 10, 2),
          ("src", 12, 4), ("dst", 16, 4))

UDP = _h("UDP", "RFC 768", 8,
         ("sport", 0, 2), ("dport", 2, 2), ("length", 4, 2), ("checksum", 6, 2))

BTH = _h("BTH", "IBA vol.1 9.2 Base Transport Header", 12,
         ("opcode", 0, 1), ("se", 1, 1, 1, 7), ("m", 1, 1, 1, 6), ("padcnt", 1, 1, 2, 4),
         ("tver", 1, 1, 4, 0), ("pkey", 2, 2),
         ("fecn", 4, 1, 1, 7), ("becn", 4, 1, 1, 6), ("resv6", 4, 1, 6, 0),
         ("dqpn", 5, 3), ("ackreq", 8, 1, 1, 7), ("resv7", 8, 1, 7, 0), ("psn", 9, 3))

RETH = _h("RETH", "IBA vol.1 9.3.3 RDMA Extended Transport Header", 16,
          ("va", 0, 8), ("rkey", 8, 4), ("dmalen", 12, 4))

IMMDT = _h("IMMDT", "IBA vol.1 9.3.6 Immediate Data", 4, ("imm", 0, 4))

AETH = _h("AETH", "IBA vol.1 9.3.5 ACK Extended Transport Header", 4,
          ("syndrome", 0, 1), ("msn", 1, 3))

CNP_PAD = _h("CNP_PAD", "IBA Annex A17 CNP (16 reserved bytes)", 16, ("reserved", 0, 16))

HEADERS = {h.name: h for h in (ETH, DOT1Q, IPV4, UDP, BTH, RETH, IMMDT, AETH, CNP_PAD)}
