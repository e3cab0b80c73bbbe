"""Deparser and parser -> deparser loopback (Amaranth simulator), against netreduce.wire.

Loopback with the payload unchanged must reproduce every frame byte for byte; with the payload
replaced (or ECN CE rewritten) the frame must equal what RoceFrame.pack() builds, so the IPv4
checksum, lengths, PadCnt and ICRC equal the Python library's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from netreduce.hw.packet.testing import (
    deparse_header,
    random_frame,
    run_deparser,
    run_loopback,
)

from netreduce.wire import ECN_CE, ECN_ECT0, OPCODES, icrc_bytes, ipv4_checksum, parse

VECTORS = Path(__file__).resolve().parents[1] / "data" / "roce_vectors.json"
DATA_OPS = sorted(op for op, info in OPCODES.items() if info.rc_data)


def _data_vectors() -> list[bytes]:
    if not VECTORS.exists():
        pytest.skip(f"no vector file at {VECTORS}")
    frames = [bytes.fromhex(v["frame_hex"]) for v in json.loads(VECTORS.read_text())["vectors"]]
    return [f for f in frames if OPCODES[parse(f).opcode].rc_data]


@pytest.mark.parametrize("width,count,idle,stall", [
    (64, 26, 0.3, 0.3), (512, 26, 0.2, 0.3)])
def test_packet_loopback_byte_exact(width, count, idle, stall):
    rng = random.Random(count + width)
    frames = _data_vectors()
    for op in DATA_OPS:
        for vlan in (False, True):
            frames.append(random_frame(rng, opcode=op, vlan=vlan, max_plen=150).pack())
    frames += [random_frame(rng, opcode=rng.choice(DATA_OPS), plen=rng.randrange(300)).pack()
               for _ in range(count - len(frames))]
    out = run_loopback(width, frames, idle=idle, stall=stall, seed=count)
    assert len(out["o"]) == len(frames)
    for i, (f, (o, last)) in enumerate(zip(frames, out["o"], strict=True)):
        assert o == f, f"frame {i}: {len(f)} B in, {len(o)} B out"
        assert not last["error"]


def _replace_cases(rng: random.Random, n: int):
    """(original frame, new payload, ce_to_ect0) cases."""
    cases = []
    for i in range(n):
        r = random_frame(rng, opcode=rng.choice(DATA_OPS), max_plen=200)
        if i % 3 == 0:
            r = r.copy(tos=(r.tos & ~3) | ECN_CE)
        new = bytes(rng.getrandbits(8) for _ in range(rng.choice(
            [len(r.payload), 0, 1, 2, 3, rng.randrange(400)])))
        cases.append((r, new, i % 2 == 0))
    return cases


@pytest.mark.parametrize("width,idle,stall", [(64, 0.2, 0.3), (512, 0.2, 0.2)])
def test_packet_deparser_payload_replaced(width, idle, stall):
    rng = random.Random(width)
    cases = _replace_cases(rng, 24 if width == 64 else 14)
    items, want = [], []
    for r, new, ce in cases:
        frame = r.pack()
        hl = r.payload_offset
        items.append((deparse_header(frame[:hl], hl, len(new), ce), new))
        exp = r.copy(payload=new)
        if ce and r.ecn == ECN_CE:
            exp = exp.copy(tos=(r.tos & ~3) | ECN_ECT0)
        want.append(exp.pack())
    out = run_deparser(width, items, idle=idle, stall=stall, seed=2)
    assert len(out["o"]) == len(want)
    for i, ((o, last), w) in enumerate(zip(out["o"], want, strict=True)):
        assert o == w, f"case {i}: {o.hex()} != {w.hex()}"
        assert not last["error"]
        # and the ICRC / checksum agree with the Python library on the produced frame
        l2 = 18 if o[12:14] == b"\x81\x00" else 14
        total = int.from_bytes(o[l2 + 2:l2 + 4], "big")
        assert o[l2 + total - 4:l2 + total] == icrc_bytes(memoryview(o)[l2:l2 + total - 4])
        assert int.from_bytes(o[l2 + 10:l2 + 12], "big") == ipv4_checksum(o[l2:l2 + 20])


@pytest.mark.parametrize("width", [64, 512])
def test_packet_deparser_no_payload_and_length_mismatch(width):
    """ACK/CNP rebuilt from headers; a payload of the wrong length flags the frame only."""
    rng = random.Random(5)
    ack = random_frame(rng, opcode=0x11).pack()
    cnp = random_frame(rng, opcode=0x81, vlan=True).pack()
    good = random_frame(rng, opcode=0x0A, plen=100)
    gf = good.pack()
    hl = good.payload_offset
    items = [
        (deparse_header(ack, 58 + (ack[12:14] == b"\x81\x00") * 4, 0), b""),
        (deparse_header(cnp, 74, 0), b""),
        (deparse_header(gf, hl, 100), good.payload[:60]),     # stream shorter than plen
        (deparse_header(gf, hl, 100), good.payload),
        (deparse_header(gf, hl, 20), good.payload),           # stream longer than plen
        (deparse_header(gf, hl, 100), good.payload),
    ]
    out = run_deparser(width, items, stall=0.2, seed=9)
    got = [(o, bool(last["error"])) for o, last in out["o"]]
    assert got[0] == (ack, False) and got[1] == (cnp, False)
    assert got[2][1] and got[3] == (gf, False)
    assert got[4][1] and len(got[4][0]) == len(good.copy(payload=good.payload[:20]).pack())
    assert got[5] == (gf, False)


@pytest.mark.parametrize("width", [64, 512])
def test_packet_deparser_line_rate(width):
    """Output beats leave in consecutive cycles for back-to-back minimum and maximum frames."""
    rng = random.Random(2)
    for plens in ([0] * 16 + [4] * 8, [4096 if width > 64 else 1024] + [0, 7, 1]):
        items = []
        for plen in plens:
            r = random_frame(rng, opcode=0x0A, plen=plen, vlan=False)
            f = r.pack()
            items.append((deparse_header(f, r.payload_offset, plen), r.payload))
        out = run_deparser(width, items)
        cycles = out["sink"].cycles
        assert cycles[-1] - cycles[0] + 1 == out["out_beats"]
        assert len(out["o"]) == len(items)


@pytest.mark.parametrize("width", [64, 512])
def test_packet_loopback_line_rate(width):
    """Parser -> deparser loopback keeps one output beat per cycle with back-to-back frames."""
    rng = random.Random(4)
    frames = [random_frame(rng, opcode=0x0A, plen=0, vlan=False).pack() for _ in range(12)]
    frames += [random_frame(rng, opcode=0x07, plen=1024 if width > 64 else 512).pack()]
    frames += [random_frame(rng, opcode=0x04, plen=0, vlan=False).pack() for _ in range(4)]
    out = run_loopback(width, frames)
    assert [o for o, _ in out["o"]] == frames
    cyc = out["out_cycles"]
    assert cyc[-1] - cyc[0] + 1 == len(cyc)
