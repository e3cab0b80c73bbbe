"""The independently verified RoCEv2 vectors (tests/data): parse, re-serialise, right ICRC."""

import zlib

import pytest
from conftest import reference_icrc, roce_vectors

from netreduce.wire import RoceFrame, icrc, icrc_bytes, parse


def _vectors():
    return [pytest.param(v, id=v["name"]) for v in roce_vectors()]


_independent_icrc = reference_icrc  # docs/roce.md's ICRC, without the library's tables


@pytest.mark.parametrize("vec", _vectors())
def test_vector_parses_and_repacks(vec):
    frame = bytes.fromhex(vec["frame_hex"])
    f = parse(frame)
    assert isinstance(f, RoceFrame)
    assert f.icrc.hex() == vec["icrc_wire_hex"]
    # copy() drops every wire-derived value, so pack() recomputes lengths, checksum and ICRC.
    assert f.copy().pack() == frame
    assert f.pack() == frame


@pytest.mark.parametrize("vec", _vectors())
def test_vector_icrc(vec):
    frame = bytes.fromhex(vec["frame_hex"])
    l3 = 18 if frame[12:14] == b"\x81\x00" else 14
    end = l3 + int.from_bytes(frame[l3 + 2:l3 + 4], "big")
    wire = bytes.fromhex(vec["icrc_wire_hex"])
    assert frame[end - 4:end] == wire
    assert icrc_bytes(frame[l3:end - 4]) == wire
    assert icrc(frame[l3:end - 4]) == int.from_bytes(wire, "little")
    assert _independent_icrc(frame[l3:end - 4]) == wire
    # CRC-32 residue: data followed by its ICRC leaves the usual register value.
    masked = bytearray(frame[l3:end])
    for i in (1, 8, 10, 11, 26, 27, 32):
        masked[i] = 0xFF
    assert zlib.crc32(b"\xff" * 8 + bytes(masked)) == 0x2144DF1C


@pytest.mark.parametrize("vec", _vectors())
def test_vector_any_bit_flip_is_caught(vec):
    """Flipping any covered, unmasked bit makes parse() reject the frame (never silently accept)."""
    frame = bytes.fromhex(vec["frame_hex"])
    l3 = 18 if frame[12:14] == b"\x81\x00" else 14
    end = l3 + int.from_bytes(frame[l3 + 2:l3 + 4], "big")
    for pos in range(l3 + 40, end):
        bad = bytearray(frame)
        bad[pos] ^= 0x01
        with pytest.raises(ValueError):
            parse(bytes(bad))
