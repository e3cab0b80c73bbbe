"""RoCEv2 wire format: field tables, frames, ICRC, checksums, batch packetiser, pcap (numpy only).

The one definition of the wire format in NetReduce; see :mod:`netreduce.wire.fields`.
"""

from .batch import (
    FrameBatch,
    WriteBatch,
    WriteMessage,
    packetise_write,
    parse_write_batch,
)
from .errors import NOT_ROCE_REASONS, WireError
from .fields import (
    AETH,
    BTH,
    CNP_PAD,
    DOT1Q,
    ECN_CE,
    ECN_ECT0,
    ECN_ECT1,
    ECN_NOT_ECT,
    ETH,
    ETHERTYPE_IPV4,
    ETHERTYPE_VLAN,
    HEADERS,
    IMMDT,
    IP_PROTO_UDP,
    IPV4,
    RETH,
    ROCEV2_UDP_PORT,
    UDP,
    Field,
    Header,
)
from .frame import MIN_FRAME, PSN_MOD, RoceFrame, ip, ip_str, parse, psn_add, psn_diff
from .icrc import ICRC_BYTES, ICRC_MASKED_BYTES, icrc, icrc_bytes, ipv4_checksum
from .opcodes import (
    ACK_NO_CREDIT,
    NAK_INVALID_REQ,
    NAK_PSN_SEQ,
    NAK_REMOTE_ACCESS,
    NAK_REMOTE_OP,
    OPCODES,
    AckSyndrome,
    Opcode,
    OpInfo,
    op_info,
)

__all__ = [
    "WireError", "NOT_ROCE_REASONS", "Field", "Header", "ETH", "DOT1Q", "IPV4", "UDP", "BTH",
    "RETH", "IMMDT", "AETH", "CNP_PAD", "HEADERS", "ETHERTYPE_IPV4", "ETHERTYPE_VLAN",
    "IP_PROTO_UDP", "ROCEV2_UDP_PORT", "ECN_NOT_ECT", "ECN_ECT0", "ECN_ECT1", "ECN_CE",
    "RoceFrame", "parse", "ip", "ip_str", "MIN_FRAME", "PSN_MOD", "psn_add", "psn_diff",
    "icrc", "icrc_bytes", "ipv4_checksum", "ICRC_BYTES", "ICRC_MASKED_BYTES",
    "Opcode", "OpInfo", "OPCODES", "op_info", "AckSyndrome", "ACK_NO_CREDIT", "NAK_PSN_SEQ",
    "NAK_INVALID_REQ", "NAK_REMOTE_ACCESS", "NAK_REMOTE_OP",
    "FrameBatch", "WriteBatch", "WriteMessage", "packetise_write", "parse_write_batch",
]
