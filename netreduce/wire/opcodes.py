"""RC (and CNP) BTH opcodes and the extension headers each one carries (docs/roce.md opcode
table)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .fields import AETH, BTH, CNP_PAD, IMMDT, IPV4, RETH, UDP

__all__ = [
    "Opcode", "OpInfo", "OPCODES", "op_info", "L4_OFFSET", "AckSyndrome",
    "is_data", "is_first", "is_last", "is_write", "is_send",
    "NAK_PSN_SEQ", "NAK_INVALID_REQ", "NAK_REMOTE_ACCESS", "NAK_REMOTE_OP", "ACK_NO_CREDIT",
]


class Opcode(IntEnum):
    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_IMM = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_IMM = 0x05
    WRITE_FIRST = 0x06
    WRITE_MIDDLE = 0x07
    WRITE_LAST = 0x08
    WRITE_LAST_IMM = 0x09
    WRITE_ONLY = 0x0A
    WRITE_ONLY_IMM = 0x0B
    ACK = 0x11
    # Unreliable Connection (transport class 0b001): same operations, no ACKs.
    UC_SEND_FIRST = 0x20
    UC_SEND_MIDDLE = 0x21
    UC_SEND_LAST = 0x22
    UC_SEND_LAST_IMM = 0x23
    UC_SEND_ONLY = 0x24
    UC_SEND_ONLY_IMM = 0x25
    UC_WRITE_FIRST = 0x26
    UC_WRITE_MIDDLE = 0x27
    UC_WRITE_LAST = 0x28
    UC_WRITE_LAST_IMM = 0x29
    UC_WRITE_ONLY = 0x2A
    UC_WRITE_ONLY_IMM = 0x2B
    CNP = 0x81


@dataclass(frozen=True)
class OpInfo:
    """What follows the BTH for one opcode."""

    opcode: Opcode
    kind: str  # "SEND", "WRITE", "ACK" or "CNP"
    position: str  # "FIRST", "MIDDLE", "LAST", "ONLY" or "" (ACK, CNP)
    reth: bool = False
    immdt: bool = False
    aeth: bool = False
    cnp: bool = False
    transport: str = "RC"  # "RC", "UC" or "CNP" (opcode bits 7:5)

    @property
    def rc_data(self) -> bool:
        """An RC WRITE or SEND packet: the only packets NetReduce aggregates."""
        return self.transport == "RC" and self.has_payload

    @property
    def ext_len(self) -> int:
        """Bytes of extension headers between the BTH and the payload."""
        return (RETH.size * self.reth + IMMDT.size * self.immdt + AETH.size * self.aeth
                + CNP_PAD.size * self.cnp)

    @property
    def has_payload(self) -> bool:
        return self.kind in ("SEND", "WRITE")

    @property
    def payload_offset(self) -> int:
        """Offset of the payload from the first Ethernet byte of an untagged frame."""
        return L4_OFFSET + BTH.size + self.ext_len

    @property
    def first(self) -> bool:
        return self.position in ("FIRST", "ONLY")

    @property
    def last(self) -> bool:
        return self.position in ("LAST", "ONLY")


# Offset of the BTH from the first Ethernet byte of an untagged frame (14 + 20 + 8).
L4_OFFSET = 14 + IPV4.size + UDP.size


def _op(code, kind, pos, **kw):
    return OpInfo(Opcode(code), kind, pos, **kw)


OPCODES: dict[int, OpInfo] = {o.opcode: o for o in (
    _op(0x00, "SEND", "FIRST"),
    _op(0x01, "SEND", "MIDDLE"),
    _op(0x02, "SEND", "LAST"),
    _op(0x03, "SEND", "LAST", immdt=True),
    _op(0x04, "SEND", "ONLY"),
    _op(0x05, "SEND", "ONLY", immdt=True),
    _op(0x06, "WRITE", "FIRST", reth=True),
    _op(0x07, "WRITE", "MIDDLE"),
    _op(0x08, "WRITE", "LAST"),
    _op(0x09, "WRITE", "LAST", immdt=True),
    _op(0x0A, "WRITE", "ONLY", reth=True),
    _op(0x0B, "WRITE", "ONLY", reth=True, immdt=True),
    _op(0x11, "ACK", "", aeth=True),
    _op(0x81, "CNP", "", cnp=True, transport="CNP"),
)}
# UC opcodes mirror RC SEND/WRITE at 0x20 + the RC code (IBA 9.2 table 38).
OPCODES.update({
    0x20 + c: OpInfo(Opcode(0x20 + c), o.kind, o.position, o.reth, o.immdt, transport="UC")
    for c, o in list(OPCODES.items()) if o.has_payload
})


def op_info(opcode: int) -> OpInfo | None:
    """The table entry of ``opcode``, or None if NetReduce does not handle it."""
    return OPCODES.get(opcode)


def is_data(opcode: int) -> bool:
    """RC SEND or WRITE (what the engine aggregates)."""
    o = OPCODES.get(opcode)
    return o is not None and o.rc_data


def is_write(opcode: int) -> bool:
    o = OPCODES.get(opcode)
    return o is not None and o.kind == "WRITE"


def is_send(opcode: int) -> bool:
    o = OPCODES.get(opcode)
    return o is not None and o.kind == "SEND"


def is_first(opcode: int) -> bool:
    o = OPCODES.get(opcode)
    return o is not None and o.first


def is_last(opcode: int) -> bool:
    o = OPCODES.get(opcode)
    return o is not None and o.last


class AckSyndrome:
    """AETH syndrome decoding (IBA 9.7.5.1.1): bits 6:5 select ACK / RNR NAK / NAK."""

    ACK = 0b00
    RNR_NAK = 0b01
    NAK = 0b11

    @staticmethod
    def kind(syndrome: int) -> int:
        return (syndrome >> 5) & 0b11

    @staticmethod
    def is_ack(syndrome: int) -> bool:
        return (syndrome >> 5) & 0b11 == 0b00

    @staticmethod
    def is_nak(syndrome: int) -> bool:
        return (syndrome >> 5) & 0b11 == 0b11

    @staticmethod
    def is_rnr(syndrome: int) -> bool:
        return (syndrome >> 5) & 0b11 == 0b01


ACK_NO_CREDIT = 0x1F  # ACK syndrome with the "no credit information" count
NAK_PSN_SEQ = 0x60
NAK_INVALID_REQ = 0x61
NAK_REMOTE_ACCESS = 0x62
NAK_REMOTE_OP = 0x63
