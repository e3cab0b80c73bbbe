"""libpcap capture files (the classic format, not pcapng), Ethernet link type.

Writes nanosecond-resolution files (magic 0xA1B23C4D) by default, since engine timestamps come
from a 250 MHz cycle count; reads both the microsecond and nanosecond variants in either byte
order. Wireshark, tshark and scapy open both.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PcapWriter", "PcapRecord", "read_pcap", "iter_pcap", "write_pcap", "LINKTYPE_ETHERNET"]

LINKTYPE_ETHERNET = 1
_MAGIC_US = 0xA1B2C3D4
_MAGIC_NS = 0xA1B23C4D
_SNAPLEN = 65535


@dataclass(frozen=True)
class PcapRecord:
    time_ns: int
    data: bytes
    orig_len: int


class PcapWriter:
    """Append frames to a new pcap file. Use as a context manager or call :meth:`close`."""

    def __init__(self, path, *, nanosecond: bool = True, snaplen: int = _SNAPLEN):
        self.path = Path(path)
        self.nanosecond = nanosecond
        self.snaplen = snaplen
        self._f = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._f.write(struct.pack("<IHHiIII", _MAGIC_NS if nanosecond else _MAGIC_US, 2, 4, 0, 0,
                                  snaplen, LINKTYPE_ETHERNET))
        self.count = 0

    def write(self, frame, time_ns: int = 0) -> None:
        if time_ns < 0:
            raise ValueError(f"pcap timestamp must be >= 0, got {time_ns} ns")
        data = bytes(frame)
        sec, frac = divmod(int(time_ns), 1_000_000_000)
        if not self.nanosecond:
            frac //= 1000
        cap = data[: self.snaplen]
        self._f.write(struct.pack("<IIII", sec, frac, len(cap), len(data)))
        self._f.write(cap)
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_pcap(path, frames: Iterable, *, nanosecond: bool = True) -> int:
    """Write ``frames`` (bytes, or (time_ns, bytes) pairs) to ``path``; returns the count."""
    with PcapWriter(path, nanosecond=nanosecond) as w:
        for item in frames:
            if isinstance(item, tuple):
                w.write(item[1], item[0])
            else:
                w.write(item)
        return w.count


def iter_pcap(path) -> Iterator[PcapRecord]:
    """Records of a classic pcap file; raises ValueError on a bad header or a cut record."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise ValueError(f"{path}: {len(head)} B is too short for a pcap header (24 B)")
        for endian in ("<", ">"):
            magic = struct.unpack(endian + "I", head[:4])[0]
            if magic in (_MAGIC_US, _MAGIC_NS):
                break
        else:
            raise ValueError(f"{path}: not a classic pcap file (magic {head[:4].hex()})")
        scale = 1 if magic == _MAGIC_NS else 1000
        linktype = struct.unpack(endian + "I", head[20:24])[0] & 0x0FFFFFFF
        if linktype != LINKTYPE_ETHERNET:
            raise ValueError(f"{path}: link type {linktype}, expected Ethernet (1)")
        rec = struct.Struct(endian + "IIII")
        n = 0
        while True:
            h = f.read(16)
            if not h:
                return
            if len(h) < 16:
                raise ValueError(f"{path}: record {n} header cut short ({len(h)} of 16 B)")
            sec, frac, incl, orig = rec.unpack(h)
            data = f.read(incl)
            if len(data) < incl:
                raise ValueError(f"{path}: record {n} data cut short ({len(data)} of {incl} B)")
            yield PcapRecord(sec * 1_000_000_000 + frac * scale, data, orig)
            n += 1


def read_pcap(path) -> list[PcapRecord]:
    return list(iter_pcap(path))
