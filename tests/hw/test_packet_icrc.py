"""ICRC datapath: the full-width CRC step against amaranth.lib.crc and zlib; the checker."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest
from amaranth.hdl import Fragment, Module, Signal
from amaranth.sim import Simulator
from netreduce.hw.packet.icrc import (
    ALGO_INIT0,
    IcrcChecker,
    crc_matrices,
    crc_next,
    crc_output,
    crc_rows,
    reflect32,
    residue_table,
    unshift_matrix,
)
from netreduce.hw.packet.testing import StreamSource as Src
from netreduce.hw.packet.testing import _sim, frame_to_beats

from netreduce.wire import IPV4, UDP, icrc_bytes, ipv4_checksum

VECTORS = Path(__file__).resolve().parents[1] / "data" / "roce_vectors.json"


def _parity(x: int) -> int:
    return bin(x).count("1") & 1


def _model_step(reg: int, word: int, width: int) -> int:
    f, g = crc_matrices(width)
    return sum((_parity(reg & f[i]) ^ _parity(word & g[i])) << i for i in range(32))


@pytest.mark.parametrize("width", [8, 64, 512])
def test_packet_crc_matrices_match_zlib(width):
    """Stepping whole words with the init-0 trick equals zlib.crc32 over the bytes."""
    rng = random.Random(width)
    nb = width // 8
    msg = bytes(rng.getrandbits(8) for _ in range(nb * 5))
    reg = 0
    for i in range(0, len(msg), nb):
        reg = _model_step(reg, int.from_bytes(msg[i:i + nb], "little"), width)
    got = reflect32(reg) ^ 0xFFFFFFFF
    # init 0 over the message = init 0xFFFFFFFF over it with the first 32 bits complemented
    assert got == zlib.crc32(bytes(b ^ 0xFF for b in msg[:4]) + msg[4:])
    assert got == ALGO_INIT0(8).compute(msg)


@pytest.mark.parametrize("masks", ["constants", "rom"])
def test_packet_crc_step_matches_lib_crc_processor(masks):
    """The hardware step equals amaranth.lib.crc.Processor cycle by cycle (64-bit words), with
    its data masks inline or read from the ROM of crc_rows (what the checker and deparser use)."""
    width = 64
    m = Module()
    m.submodules.ref = ref = ALGO_INIT0(width).create()
    data = Signal(width)
    start = Signal()
    reg = Signal(32)
    m.d.comb += [ref.data.eq(data), ref.valid.eq(1), ref.start.eq(start)]
    rows = crc_rows(m, width) if masks == "rom" else None
    m.d.sync += reg.eq(crc_next(reg & ~start.replicate(32), data, rows))
    out = Signal(32)
    m.d.comb += out.eq(crc_output(reg))
    rng = random.Random(3)
    words = [rng.getrandbits(width) for _ in range(40)]
    mismatches = []

    async def tb(ctx):
        for i, w in enumerate(words):
            ctx.set(data, w)
            ctx.set(start, i % 13 == 0)
            await ctx.tick()
            if ctx.get(out) != ctx.get(ref.crc):
                mismatches.append(i)

    sim = Simulator(m)
    sim.add_clock(1e-9)
    sim.add_testbench(tb)
    sim.run()
    assert mismatches == []


def test_packet_crc_rows_are_whole_words():
    """crc_rows gives 32 values of the word's width (the ROM reads); crc_next refuses others."""
    m = Module()
    rows = crc_rows(m, 512)
    assert len(rows) == 32 and all(len(r) == 512 for r in rows)
    with pytest.raises(ValueError, match="32 values of 64 bits"):
        crc_next(Signal(32), Signal(64), rows)
    Fragment.get(m, None)  # elaborated (the ROM is a submodule of m)


def test_packet_crc_unshift_and_residues():
    rng = random.Random(1)
    p = ALGO_INIT0(8)
    for k in (1, 2, 7, 33, 63):
        msg = bytes(rng.getrandbits(8) for _ in range(20))
        # register after msg + k zeros, un-shifted, equals the register after msg
        def reg_of(b):
            r = 0
            for byte in b:
                r = _model_step(r, byte, 8)
            return r
        shifted = reg_of(msg + bytes(k))
        mat = unshift_matrix(k)
        unshifted = sum(_parity(mat[i] & shifted) << i for i in range(32))
        assert unshifted == reg_of(msg)
    table = residue_table(64)
    code = b"\xff" * 4 + b"abc"
    code += p.compute(code).to_bytes(4, "little")
    assert table[0] == p.compute(code) and table[5] == p.compute(code + bytes(5))


def _expected_flags(frame: bytes, mac_error=False) -> dict:
    l2 = 18 if frame[12:14] == b"\x81\x00" else 14
    total = IPV4.total_length.get(frame, l2)
    end = l2 + total
    n = len(frame)
    return {
        "icrc_ok": int(44 <= total and end <= n
                       and frame[end - 4:end] == icrc_bytes(memoryview(frame)[l2:end - 4])),
        "ip_csum_ok": int(ipv4_checksum(frame[l2:l2 + 20]) == IPV4.checksum.get(frame, l2)),
        "ip_len_min_ok": int(total >= 44),
        "ip_len_ok": int(end <= n and not (end < n and n > 60)),
        "udp_len_ok": int(UDP.length.get(frame, l2 + 20) == total - 20),
        "mac_error": int(mac_error), "frame_len": n,
    }


@pytest.mark.parametrize("width", [64, 512])
def test_packet_icrc_checker(width):
    if not VECTORS.exists():
        pytest.skip(f"no vector file at {VECTORS}")
    from netreduce.hw.packet.testing import random_frame

    frames = [bytes.fromhex(v["frame_hex"]) for v in json.loads(VECTORS.read_text())["vectors"]]
    rng = random.Random(width)
    for _ in range(8 if width == 512 else 16):
        f = bytearray(random_frame(rng, max_plen=150).pack())
        what = rng.randrange(5)
        if what == 1:
            f[rng.randrange(14, len(f))] ^= 1 << rng.randrange(8)    # ICRC / checksum broken
        elif what == 2:
            f += bytes(rng.randrange(1, 9))                          # trailing bytes
        elif what == 3:
            f = f[:rng.randrange(40, len(f))]                        # truncated
        frames.append(bytes(f))
    mac = [i % 7 == 3 for i in range(len(frames))]
    dut = IcrcChecker(width)
    nb = width // 8
    src = Src(dut.i, [b for f, e in zip(frames, mac, strict=True)
                      for b in frame_to_beats(f, nb, e)], idle=0.2, seed=4)
    results = []

    async def monitor(ctx):
        while True:
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid:
                results.append({name: int(payload[name]) for name in _expected_flags(b"\0" * 60)})

    _sim(dut, [src], [], watch=monitor)
    assert len(results) == len(frames)
    for i, (f, got) in enumerate(zip(frames, results, strict=True)):
        assert got == _expected_flags(f, mac[i]), f"frame {i}: {f.hex()}"


