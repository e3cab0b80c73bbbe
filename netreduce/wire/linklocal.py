"""Link-local Ethernet frames: MAC control (PAUSE, PFC) and the IEEE reserved group addresses.

A bridge never forwards these (IEEE 802.1Q-2018 clause 8.6.3, table 8-1: the group addresses
01-80-C2-00-00-00 .. 0F are "filtered" on every port; MAC control frames, EtherType 0x8808, are
consumed by the MAC, IEEE 802.3 clause 31 and annex 31B/31D). The engine sits on a switch port
like a station, so it must not send any of them back: a switch that receives its own PAUSE, LLDP
or spanning-tree BPDU sees a loop. :func:`classify` is the rule the reference model
(:meth:`netreduce.sim.model.Engine.receive`) and the gateware
(:class:`netreduce.hw.packet.linklocal.LinkLocalFilter`) apply; frames it matches are consumed
and counted under :data:`COUNTERS` (``netreduce.regmap``), never forwarded.

Rule (``n`` = frame length without FCS; checked in this order):

1. ``n >= 14`` and EtherType 0x8808 at bytes 12-13: MAC control. ``n >= 16``: opcode at 14-15.
   Opcode 0x0001 (PAUSE, annex 31B) with ``n >= 18``: ``PAUSE``, pause time at 16-17, applying
   to every priority. Opcode 0x0101 (PFC, 802.1Q clause 36 / 802.3 annex 31D) with ``n >= 34``:
   ``PFC``, priority-enable vector at 16-17 (bit i = priority i; the high byte is reserved and
   ignored), pause time of priority i at 18 + 2i. Anything else (other opcodes, a PAUSE or PFC
   too short for its fields): ``MAC_CONTROL``, consumed and not acted on.
2. ``n >= 18``, an 802.1Q tag (0x8100 at 12-13) and 0x8808 at 16-17: ``MAC_CONTROL`` (MAC
   control frames are never tagged: malformed, consumed, not acted on).
3. ``n >= 6`` and destination 01-80-C2-00-00-0x (x = 0..F): ``GROUP`` (STP/RSTP BPDUs at -00,
   LLDP at -0E, 802.1X at -03, ...). The destination decides, whatever follows it.
4. Otherwise ``NONE``: not link-local (frames shorter than 6 bytes included).

Pause times are in quanta of 512 bit times (:data:`PAUSE_QUANTUM_BITS`): 5.12 ns at 100 Gb/s.
A pause time of 0 ends the pause at once (XON).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "ETHERTYPE_MAC_CONTROL", "ETHERTYPE_LLDP", "MAC_CONTROL_PAUSE", "MAC_CONTROL_PFC",
    "LINK_LOCAL_PREFIX", "PAUSE_DA", "LLDP_DA", "STP_DA", "PFC_PRIORITIES",
    "PAUSE_QUANTUM_BITS", "MATCH_BYTES", "LinkLocal", "COUNTERS", "Pause", "classify",
    "pause_frame", "pfc_frame", "lldp_frame", "stp_bpdu", "PFC_FRAME_BYTES", "station_mac",
]

ETHERTYPE_MAC_CONTROL = 0x8808
ETHERTYPE_LLDP = 0x88CC
MAC_CONTROL_PAUSE = 0x0001
MAC_CONTROL_PFC = 0x0101
LINK_LOCAL_PREFIX = bytes.fromhex("0180c20000")  # + one byte 0x00..0x0F
PAUSE_DA = bytes.fromhex("0180c2000001")
STP_DA = bytes.fromhex("0180c2000000")
LLDP_DA = bytes.fromhex("0180c200000e")
PFC_PRIORITIES = 8
PAUSE_QUANTUM_BITS = 512
MATCH_BYTES = 34  # bytes the rule reads: up to the last PFC pause time


class LinkLocal(IntEnum):
    """What :func:`classify` found."""

    NONE = 0
    PAUSE = 1  # 802.3x PAUSE: all priorities
    PFC = 2  # priority flow control
    MAC_CONTROL = 3  # other or malformed MAC control frame
    GROUP = 4  # to a reserved link-local group address (LLDP, STP, ...)


# counter (netreduce.regmap GLOBAL_COUNTERS) of each consumed kind
COUNTERS = {LinkLocal.PAUSE: "ll_pause", LinkLocal.PFC: "ll_pfc",
            LinkLocal.MAC_CONTROL: "ll_mac_control", LinkLocal.GROUP: "ll_group"}


@dataclass(frozen=True)
class Pause:
    """The request of a PAUSE or PFC frame: ``enable`` bit i = priority i affected, ``quanta[i]``
    its pause time (512 bit times; 0 = resume)."""

    enable: int
    quanta: tuple[int, ...]


def classify(frame: bytes) -> tuple[LinkLocal, Pause | None]:
    """The link-local kind of ``frame`` (module doc) and, for PAUSE/PFC, what it asks."""
    n = len(frame)
    if n >= 14 and frame[12] == 0x88 and frame[13] == 0x08:
        if n >= 16:
            op = (frame[14] << 8) | frame[15]
            if op == MAC_CONTROL_PAUSE and n >= 18:
                q = (frame[16] << 8) | frame[17]
                return LinkLocal.PAUSE, Pause(0xFF, (q,) * PFC_PRIORITIES)
            if op == MAC_CONTROL_PFC and n >= MATCH_BYTES:
                qs = tuple((frame[18 + 2 * i] << 8) | frame[19 + 2 * i]
                           for i in range(PFC_PRIORITIES))
                return LinkLocal.PFC, Pause(frame[17], qs)
        return LinkLocal.MAC_CONTROL, None
    if n >= 18 and frame[12] == 0x81 and frame[13] == 0x00 and frame[16] == 0x88 \
            and frame[17] == 0x08:
        return LinkLocal.MAC_CONTROL, None
    if n >= 6 and frame[:5] == LINK_LOCAL_PREFIX and frame[5] < 0x10:
        return LinkLocal.GROUP, None
    return LinkLocal.NONE, None


def _pad(frame: bytes) -> bytes:
    return frame + bytes(max(0, 60 - len(frame)))


def pause_frame(quanta: int, src: bytes = bytes(6)) -> bytes:
    """An 802.3x PAUSE frame (60 bytes, no FCS) asking for ``quanta`` (0..65535)."""
    if not 0 <= quanta <= 0xFFFF:
        raise ValueError(f"pause quanta {quanta} outside 0..65535")
    return _pad(PAUSE_DA + bytes(src) + ETHERTYPE_MAC_CONTROL.to_bytes(2, "big")
                + MAC_CONTROL_PAUSE.to_bytes(2, "big") + quanta.to_bytes(2, "big"))


def pfc_frame(quanta: dict[int, int], src: bytes = bytes(6)) -> bytes:
    """A PFC frame pausing priority p for ``quanta[p]`` (the others not enabled)."""
    qs, en = [0] * PFC_PRIORITIES, 0
    for p, q in quanta.items():
        if not 0 <= p < PFC_PRIORITIES or not 0 <= q <= 0xFFFF:
            raise ValueError(f"PFC priority {p} / quanta {q} outside 0..7 / 0..65535")
        qs[p], en = q, en | 1 << p
    return _pad(PAUSE_DA + bytes(src) + ETHERTYPE_MAC_CONTROL.to_bytes(2, "big")
                + MAC_CONTROL_PFC.to_bytes(2, "big") + en.to_bytes(2, "big")
                + b"".join(q.to_bytes(2, "big") for q in qs))


PFC_FRAME_BYTES = 60  # a PFC frame padded to the Ethernet minimum (no FCS)


def station_mac(port: int) -> bytes:
    """The locally administered source address of the frames engine port ``port`` originates
    itself (the PFC frames of its board shell): 02-4E-52-46-43-<port>."""
    if not 0 <= port < 256:
        raise ValueError(f"port {port} outside 0..255")
    return bytes.fromhex("024e524643") + bytes([port])


def lldp_frame(src: bytes = bytes.fromhex("020000000001"), port: bytes = b"eth0") -> bytes:
    """A minimal LLDPDU (IEEE 802.1AB): chassis ID, port ID, TTL 120, end."""
    def tlv(t: int, v: bytes) -> bytes:
        return ((t << 9) | len(v)).to_bytes(2, "big") + v
    body = tlv(1, b"\x04" + bytes(src)) + tlv(2, b"\x05" + port) + tlv(3, (120).to_bytes(2, "big"))
    return _pad(LLDP_DA + bytes(src) + ETHERTYPE_LLDP.to_bytes(2, "big") + body + tlv(0, b""))


def stp_bpdu(src: bytes = bytes.fromhex("020000000002")) -> bytes:
    """A configuration BPDU (IEEE 802.1D) in 802.3/LLC framing (length field, DSAP/SSAP 0x42)."""
    bpdu = bytes(4) + bytes(1) + bytes([0x80, 0x00]) + bytes(src) + bytes(4) \
        + bytes([0x80, 0x00]) + bytes(src) + bytes([0x80, 0x01]) + bytes(2) \
        + (20 * 256).to_bytes(2, "big") + (2 * 256).to_bytes(2, "big") \
        + (15 * 256).to_bytes(2, "big")
    llc = bytes([0x42, 0x42, 0x03])
    return _pad(STP_DA + bytes(src) + (len(llc) + len(bpdu)).to_bytes(2, "big") + llc + bpdu)
