"""Header layouts of the packet path, derived from :mod:`netreduce.wire.fields` (never restated).

* :func:`header_layout` turns one wire :class:`~netreduce.wire.fields.Header` into an Amaranth
  struct with one member per field (big-endian value, sub-byte fields as their own members).
* :func:`extract` builds those field values from a list of byte values at a given base offset.
* :data:`HDR_CAP` is the largest header NetReduce re-emits: VLAN + IPv4 + UDP + BTH + the longest
  extension-header chain of any opcode in :data:`netreduce.wire.opcodes.OPCODES` (78 bytes).
* :class:`Kind` / :class:`Reason` are the classification; reason names equal the ``reason`` strings
  of :class:`netreduce.wire.errors.WireError` (plus ``mac_error`` for a frame the MAC flagged).
* :func:`header_record_layout` is the parser's per-frame header record, :func:`verdict_layout` its
  per-frame final verdict, :func:`deparse_header_layout` what the deparser takes.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Mux, Value
from amaranth.lib import data, enum

from netreduce.wire import fields as wf
from netreduce.wire.errors import NOT_ROCE_REASONS
from netreduce.wire.opcodes import L4_OFFSET, OPCODES

__all__ = [
    "HDR_CAP", "HEADER_LAYOUTS", "Kind", "Reason", "REASON_NAMES", "NOT_ROCE", "header_layout",
    "extract", "field_value", "header_record_layout", "verdict_layout", "deparse_header_layout",
    "L2_UNTAGGED", "L2_TAGGED", "BTH_END", "hdr_lengths", "payload_offsets", "MIN_L3_LEN",
    "LEN_BITS",
]

L2_UNTAGGED = wf.ETH.size                     # 14: IPv4 header offset of an untagged frame
L2_TAGGED = wf.ETH.size + wf.DOT1Q.size       # 18: ... of a frame with one 802.1Q tag
BTH_END = wf.IPV4.size + wf.UDP.size + wf.BTH.size   # 40: end of the BTH, from the IPv4 header
ICRC_SIZE = 4
MIN_L3_LEN = BTH_END + ICRC_SIZE                  # 44: smallest valid IPv4 total length
_MAX_EXT = max(o.ext_len for o in OPCODES.values())
HDR_CAP = L2_TAGGED + BTH_END + _MAX_EXT          # 78
LEN_BITS = 16  # frame / datagram lengths (the IPv4 total length is 16 bits)

assert L4_OFFSET == L2_UNTAGGED + wf.IPV4.size + wf.UDP.size


def hdr_lengths(*, payload_only: bool = False) -> list[int]:
    """Every header length (Ethernet to the last extension header) the opcode table allows."""
    ops = [o for o in OPCODES.values() if o.has_payload or not payload_only]
    return sorted({l2 + BTH_END + o.ext_len for o in ops for l2 in (L2_UNTAGGED, L2_TAGGED)})


def payload_offsets() -> list[int]:
    """Every payload offset of a data opcode, untagged or tagged (54, 58, 62, 70, 74, 78)."""
    return hdr_lengths(payload_only=True)


# ---------------------------------------------------------------------------------------- fields

def header_layout(h: wf.Header) -> data.StructLayout:
    """One struct member per field of ``h`` (``field.width`` bits, big-endian value)."""
    return data.StructLayout({f.name: f.width for f in h.fields})


HEADER_LAYOUTS = {
    name: header_layout(h) for name, h in (
        ("eth", wf.ETH), ("dot1q", wf.DOT1Q), ("ipv4", wf.IPV4), ("udp", wf.UDP),
        ("bth", wf.BTH), ("reth", wf.RETH), ("immdt", wf.IMMDT), ("aeth", wf.AETH))
}


def field_value(f: wf.Field, byte_at, base: int) -> Value:
    """Value of field ``f`` of a header at byte ``base``; ``byte_at(i)`` gives byte ``i``."""
    raw = Cat(*[byte_at(base + f.offset + i) for i in reversed(range(f.size))])  # big-endian
    return raw[f.shift: f.shift + f.bits] if f.bits else raw


def extract(h: wf.Header, byte_at, base: int, alt_base: int | None = None,
            use_alt: Value | None = None) -> dict[str, Value]:
    """Field values of header ``h`` at ``base`` (or at ``alt_base`` where ``use_alt`` is 1)."""
    out = {}
    for f in h.fields:
        v = field_value(f, byte_at, base)
        if alt_base is not None:
            v = Mux(use_alt, field_value(f, byte_at, alt_base), v)
        out[f.name] = v
    return out


# --------------------------------------------------------------------------------- classification

class Kind(enum.Enum, shape=3):
    """What a frame is. Only ``DATA`` frames produce a payload stream."""

    NOT_ROCE = 0   # not IPv4/UDP/4791 (or IHL != 5, fragment): forward untouched
    MALFORMED = 1  # claims to be RoCEv2 but fails a check (see Reason)
    DATA = 2       # RC SEND or WRITE (what the engine aggregates)
    ACK = 3        # RC ACKNOWLEDGE (ACK, NAK, RNR NAK: see AETH syndrome)
    CNP = 4        # congestion notification packet
    OTHER = 5      # valid RoCEv2 the engine does not aggregate (UC SEND/WRITE)


class Reason(enum.Enum, shape=5):
    """Why a frame is NOT_ROCE or MALFORMED; names equal :class:`WireError` ``reason`` strings."""

    NONE = 0
    TRUNCATED = 1
    ETHERTYPE = 2
    IP_VERSION = 3
    IHL = 4
    FRAGMENT = 5
    PROTOCOL = 6
    UDP_PORT = 7
    IP_LENGTH = 8
    UDP_LENGTH = 9
    IP_CHECKSUM = 10
    TVER = 11
    OPCODE = 12
    PADCNT = 13
    ICRC = 14
    MAC_ERROR = 15  # the input's last beat had ``error`` set (FCS/PHY error reported by the MAC)


REASON_NAMES = {r: r.name.lower() for r in Reason}
NOT_ROCE = frozenset(r for r in Reason if r.name.lower() in NOT_ROCE_REASONS)


def header_record_layout() -> data.StructLayout:
    """The parser's per-frame header record (``Parser.hdr``).

    * ``kind``, ``reason``: classification from the header bytes alone (every check except the
      frame-length, ICRC and MAC-error checks, which need the frame's end: see the verdict).
    * ``vlan``: the frame has one 802.1Q tag (the IPv4 header starts at byte 18, else 14).
    * ``hdr_len``: bytes from the first Ethernet byte to the end of the last extension header
      (= the payload offset); valid for every RoCE kind.
    * ``plen``: payload bytes (without pad) from the IPv4 total length; 0 unless ``kind == DATA``.
    * ``raw``: the first :data:`HDR_CAP` bytes of the frame as received (bytes past ``hdr_len``
      or past the frame's end are don't-care); ``raw[i]`` is frame byte ``i``.
    * ``eth`` ... ``aeth``: every field of every header of :mod:`netreduce.wire.fields` (names as
      there). ``eth.ethertype`` is the EtherType after the tag, ``dot1q`` is valid when ``vlan``;
      ``reth``/``immdt``/``aeth`` are valid when the opcode carries them.
    """
    return data.StructLayout({
        "kind": Kind, "reason": Reason, "vlan": 1,
        "hdr_len": range(HDR_CAP + 1), "plen": LEN_BITS,
        "raw": data.ArrayLayout(8, HDR_CAP),
        **HEADER_LAYOUTS,
    })


def verdict_layout() -> data.StructLayout:
    """The parser's per-frame final verdict (``Parser.verdict``): ``kind``, ``reason`` (the first
    failing check in :func:`netreduce.wire.parse` order, MAC error first) and ``frame_len``
    (bytes, saturating at 2**16 - 1)."""
    return data.StructLayout({"kind": Kind, "reason": Reason, "frame_len": LEN_BITS})


def deparse_header_layout() -> data.StructLayout:
    """What the deparser takes per frame (``Deparser.hdr``).

    * ``raw``: header bytes as in :func:`header_record_layout` (only the first ``hdr_len`` used).
    * ``hdr_len``: one of :func:`hdr_lengths` (the deparser derives the 802.1Q tag from raw).
    * ``plen``: payload bytes of the frame to build (without pad); the payload stream must carry
      exactly this many bytes.
    * ``ce_to_ect0``: rewrite an ECN of CE (0b11) to ECT(0) (0b10); other codepoints unchanged.
    """
    return data.StructLayout({
        "raw": data.ArrayLayout(8, HDR_CAP), "hdr_len": range(HDR_CAP + 1),
        "plen": LEN_BITS, "ce_to_ect0": 1,
    })
