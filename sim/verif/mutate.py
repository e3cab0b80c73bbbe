"""Frame mutations for fuzzing the engine (the model and the RTL take the same ones).

A mutation is a tuple, so that hypothesis can draw and shrink it and a failing input can be kept
as a literal regression:

* ``("flip", i, bit)``: flip bit ``bit`` of byte ``i mod len``;
* ``("trunc", n)``: keep the first ``n mod (len + 1)`` bytes;
* ``("extend", data)``: append ``data``;
* ``("field", k, value)``: write ``value`` (masked to the field) into field ``k mod len(FIELDS)``
  of :data:`FIELDS`, if the frame is long enough to hold it;
* ``("splice", j, cut)``: the first ``cut mod (len + 1)`` bytes, then the rest of frame ``j`` of
  the pool (the first bytes of one frame, the rest of another);
* ``("linklocal", how, value)``: make the frame link-local or nearly so
  (:mod:`netreduce.wire.linklocal`), ``how mod 4``: 0 destination MAC 01-80-C2-00-00-xx with
  xx = ``value mod 32`` (0x10 and up are not link-local); 1 EtherType 0x8808 with MAC control
  opcode PAUSE, PFC or ``value`` (16 bits) and the pause times from ``value``; 2 an 802.1Q tag
  followed by 0x8808; 3 a PAUSE or PFC frame (by ``value``'s parity) cut to
  ``value mod 64`` bytes.

:func:`mutate` applies a list of them and, with ``fix``, recomputes the IPv4 header checksum and
the ICRC where the lengths allow it (:func:`fixup`): a well-formed forgery rather than a
corrupted frame. :func:`impersonates` says whether a frame is RC data on one of a set of
forward keys, which is what the worker itself would send (the engine trusts the switch's
steering for those, docs/guarantees.md A1).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from netreduce.wire import OPCODES, WireError, parse
from netreduce.wire.fields import AETH, BTH, ETH, ETHERTYPE_VLAN, IPV4, RETH, UDP
from netreduce.wire.icrc import icrc_bytes, ipv4_checksum
from netreduce.wire.linklocal import (
    ETHERTYPE_MAC_CONTROL,
    LINK_LOCAL_PREFIX,
    MAC_CONTROL_PAUSE,
    MAC_CONTROL_PFC,
    pause_frame,
    pfc_frame,
)
from netreduce.wire.view import BTH_AT, IPV4_OFF

__all__ = ["FIELDS", "KINDS", "fixup", "mutate", "impersonates"]

KINDS = ("flip", "trunc", "extend", "field", "splice", "linklocal")
# (header, field, offset of the header in an untagged RoCEv2 frame)
FIELDS = ([(ETH, f, 0) for f in ETH.fields] + [(IPV4, f, 14) for f in IPV4.fields]
          + [(UDP, f, 34) for f in UDP.fields] + [(BTH, f, 42) for f in BTH.fields]
          + [(RETH, f, 54) for f in RETH.fields] + [(AETH, f, 54) for f in AETH.fields])


def fixup(b: bytearray) -> None:
    """Recompute the IPv4 checksum and the ICRC of ``b`` in place where its lengths allow it
    (an untagged IPv4 frame whose total length lies within the bytes)."""
    l3 = IPV4_OFF
    if len(b) < l3 + IPV4.size or IPV4.version.get(b, l3) != 4 or IPV4.ihl.get(b, l3) != 5:
        return
    IPV4.checksum.put(b, 0, l3)
    IPV4.checksum.put(b, ipv4_checksum(bytes(b[l3:l3 + IPV4.size])), l3)
    end = l3 + IPV4.total_length.get(b, l3)
    if l3 + BTH_AT + BTH.size <= end <= len(b):
        b[end - 4:end] = icrc_bytes(bytes(b[l3:end - 4]))


def mutate(src: bytes, muts, fix: bool, pool: Sequence[bytes] = ()) -> bytes:
    """``src`` with the mutations ``muts`` applied in order (``splice`` takes its tail from
    ``pool``), then :func:`fixup` if ``fix``."""
    b = bytearray(src)
    for m in muts:
        kind = m[0]
        if kind == "flip":
            if b:
                b[m[1] % len(b)] ^= 1 << (m[2] % 8)
        elif kind == "trunc":
            b = b[:m[1] % (len(b) + 1)]
        elif kind == "extend":
            b += m[1]
        elif kind == "field":
            _, k, value = m
            _, f, base = FIELDS[k % len(FIELDS)]
            if base + f.offset + f.size <= len(b):
                f.put(b, value & f.mask, base)
        elif kind == "splice":
            if not pool:
                raise ValueError("a splice needs a pool of frames")
            other = pool[m[1] % len(pool)]
            cut = m[2] % (len(b) + 1)
            b = b[:cut] + bytearray(other[cut:])
        elif kind == "linklocal":
            b = _linklocal(b, m[1] % 4, m[2])
        else:
            raise ValueError(f"unknown mutation {kind!r}; expected one of {KINDS}")
    if fix:
        fixup(b)
    return bytes(b)


def _linklocal(b: bytearray, how: int, value: int) -> bytearray:
    v = value & 0xFFFF_FFFF
    if how == 0:
        b[:ETH.src.offset] = LINK_LOCAL_PREFIX + bytes([v % 32])
        return b
    if how == 1:
        op = (MAC_CONTROL_PAUSE, MAC_CONTROL_PFC, v & 0xFFFF)[v % 3]
        et = ETH.ethertype.offset
        b[et:et + 4] = ETHERTYPE_MAC_CONTROL.to_bytes(2, "big") + op.to_bytes(2, "big")
        return b
    if how == 2:
        et = ETH.ethertype.offset
        b[et:et + 6] = ETHERTYPE_VLAN.to_bytes(2, "big") + (v & 0xFFF).to_bytes(2, "big") \
            + ETHERTYPE_MAC_CONTROL.to_bytes(2, "big")
        return b
    f = pause_frame(v & 0xFFFF) if v % 2 else pfc_frame({(v >> 1) % 8: (v >> 4) & 0xFFFF})
    return bytearray(f[:v % 64])


def impersonates(frame: bytes, fwd_keys: Collection[tuple[bytes, int]]) -> bool:
    """Whether ``frame`` parses as RC data on a forward key ``(source IP, DestQP)`` of
    ``fwd_keys``."""
    try:
        f = parse(frame)
    except WireError:
        return False
    info = OPCODES.get(f.opcode)
    return info is not None and info.rc_data and (f.src_ip, f.dqpn) in fwd_keys
