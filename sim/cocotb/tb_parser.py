"""cocotb tests of netreduce.hw.packet.parser.Parser behind its generated AXI-Stream top.

Ports: ``s_axis`` frames in; ``m_axis_frame`` (bypass copy), ``m_axis_payload`` (realigned DATA
payload), ``m_axis_hdr`` and ``m_axis_verdict`` (records, decoded with the top's port map).

Every expectation comes from :mod:`netreduce.wire` (field tables, ``parse``) and, for the header
fields, scapy as the independent reader:

* ``frame``: every input frame, unchanged and in order;
* ``verdict``: one per frame, ``reason`` = ``parse``'s reason (``none`` when it parses), ``kind``
  from the opcode table, ``frame_len`` = the frame's length;
* ``hdr``: one per frame; for RoCEv2 frames every field of every header equals the field table
  read of the frame, ``hdr_len`` the payload offset, ``plen`` the payload length (DATA), ``raw``
  the frame's first bytes;
* ``payload``: for DATA frames, ``parse``'s payload; ``error`` on its last beat iff the verdict is
  not clean.

Arguments (``tb_args``): ``frames``, ``seed``, ``max_payload``, ``sizes``.
"""

from __future__ import annotations

import random
import time

import cocotb
from cocotb.triggers import ClockCycles
from netreduce.hw.packet.layout import HDR_CAP, Kind, Reason

from netreduce.wire import AETH, BTH, DOT1Q, ETH, IMMDT, IPV4, OPCODES, RETH, UDP, WireError, parse

from .axis import (
    AxisSink,
    AxisSource,
    RecordSink,
    cycle_pattern,
    diff,
    report,
    reset,
    start_clock,
    tb_args,
)
from .packets import frame_of_size, malformed_frames, random_frame, raw_frame, scapy_fields

_REASON = {r.name.lower(): r.value for r in Reason}
_NOT_ROCE = {"ethertype", "ip_version", "ihl", "protocol", "fragment", "udp_port"}


def expect(frame: bytes) -> dict:
    """What the parser must report for ``frame``, from netreduce.wire."""
    try:
        f = parse(frame)
        reason = "none"
    except WireError as e:
        f, reason = None, e.reason
    if f is not None:
        info = OPCODES[f.opcode]
        kind = (Kind.DATA if info.rc_data else
                {"ACK": Kind.ACK, "CNP": Kind.CNP}.get(info.kind, Kind.OTHER))
    elif reason in _NOT_ROCE:
        kind = Kind.NOT_ROCE
    else:
        kind = Kind.MALFORMED
    return {"frame": f, "reason": reason, "kind": kind.value}


def header_fields(frame: bytes, f) -> dict[str, int]:
    """Every field the hdr record must hold for a valid RoCEv2 frame (field-table reads)."""
    l3 = f.l2_len
    out = {}
    eth = ETH.unpack(frame, 0)
    eth["ethertype"] = ETH.ethertype.get(frame, l3 - ETH.size)  # the EtherType after the tag
    heads = [("eth", eth), ("ipv4", IPV4.unpack(frame, l3)),
             ("udp", UDP.unpack(frame, l3 + IPV4.size)),
             ("bth", BTH.unpack(frame, l3 + IPV4.size + UDP.size))]
    if f.vlan_tci is not None:
        heads.append(("dot1q", DOT1Q.unpack(frame, 12)))
    x = l3 + IPV4.size + UDP.size + BTH.size
    info = OPCODES[f.opcode]
    for flag, name, h in ((info.reth, "reth", RETH), (info.immdt, "immdt", IMMDT),
                          (info.aeth, "aeth", AETH)):
        if flag:
            heads.append((name, h.unpack(frame, x)))
            x += h.size
    for name, values in heads:
        for k, v in values.items():
            out[f"{name}.{k}"] = v
    out["vlan"] = int(f.vlan_tci is not None)
    out["hdr_len"] = f.payload_offset
    return out


def check_records(where: str, frame: bytes, e: dict, h: dict, v: dict) -> int:
    """Check one frame's header record ``h`` and verdict ``v``; returns the fields compared."""
    got = Reason(v["reason"]).name.lower()
    assert got == e["reason"], f"{where}: verdict reason {got}, wire says {e['reason']}"
    assert v["kind"] == e["kind"], (
        f"{where}: verdict kind {Kind(v['kind']).name}, expected {Kind(e['kind']).name}")
    assert v["frame_len"] == len(frame), f"{where}: frame_len {v['frame_len']}"
    f = e["frame"]
    if f is None:
        return 0
    assert h["kind"] == e["kind"], f"{where}: hdr kind {Kind(h['kind']).name}"
    want = header_fields(frame, f)
    for k, val in want.items():
        assert h.get(k) == val, f"{where}: hdr {k} = {h.get(k)!r}, expected {val}"
    if e["kind"] == Kind.DATA.value:
        assert h["plen"] == len(f.payload), f"{where}: plen {h['plen']} != {len(f.payload)}"
    s = scapy_fields(frame)  # the independent reading agrees with the record
    for k, field in (("bth.psn", "psn"), ("bth.dqpn", "dqpn"), ("bth.opcode", "opcode"),
                     ("ipv4.src", "src_ip"), ("ipv4.dst", "dst_ip"), ("ipv4.tos", "tos"),
                     ("ipv4.ttl", "ttl"), ("udp.sport", "sport"), ("bth.pkey", "pkey"),
                     ("bth.ackreq", "ackreq"), ("bth.becn", "becn"), ("bth.padcnt", "padcnt")):
        assert h[k] == s[field], f"{where}: hdr {k} = {h[k]}, scapy {s[field]}"
    n = min(f.payload_offset, len(frame), HDR_CAP)
    raw = h["raw"].to_bytes(HDR_CAP, "little")[:n]
    assert raw == frame[:n], f"{where}: hdr raw bytes differ: {diff(raw, frame[:n])}"
    return len(want) + 12


class ParserBench:
    def __init__(self, dut, pauses: dict[str, str] | None = None):
        pauses = pauses or {}
        self.dut, self.args = dut, tb_args()
        self.clk = start_clock(dut)
        self.src = AxisSource(dut, "s_axis")
        self.frame = AxisSink(dut, "m_axis_frame")
        self.payload = AxisSink(dut, "m_axis_payload", allow_empty_last=True)
        self.hdr = RecordSink(dut, "m_axis_hdr")
        self.verdict = RecordSink(dut, "m_axis_verdict")
        for port, pattern in pauses.items():
            if pattern:
                getattr(self, port).set_pause_generator(cycle_pattern(pattern))
        self.sent: list[tuple[str, bytes]] = []
        self.err_bit = 0  # the beat layout's only user field: error

    def send(self, name: str, frame: bytes) -> None:
        self.sent.append((name, frame))
        self.src.send(frame)

    async def check(self) -> int:
        """Check every output for every frame sent; returns the header fields compared."""
        compared = 0
        n_data = 0
        for i, (name, frame) in enumerate(self.sent):
            where = f"frame {i} ({name}, {len(frame)} B)"
            e = expect(frame)
            rx = await self.frame.recv()
            assert rx.data == frame, f"{where}: bypass copy differs: {diff(rx.data, frame)}"
            v = await self.verdict.recv()
            h = await self.hdr.recv()
            compared += check_records(where, frame, e, h, v)
            f = e["frame"]
            if h["kind"] == Kind.DATA.value:
                n_data += 1
                p = await self.payload.recv()
                if f is not None:
                    assert h["plen"] == len(f.payload), f"{where}: plen {h['plen']}"
                    assert p.data == f.payload, f"{where}: payload {diff(p.data, f.payload)}"
                bad = (p.user_last >> self.err_bit) & 1
                assert bad == int(e["reason"] != "none"), (
                    f"{where}: payload error flag {bad}, verdict {e['reason']}")
        await ClockCycles(self.clk, 20)
        for port in ("frame", "payload"):
            assert getattr(self, port).empty(), f"extra frames on m_axis_{port}"
        assert not self.hdr.records and not self.verdict.records, "extra hdr/verdict records"
        self.sent.clear()
        return compared


def mixed_frames(rng: random.Random, n: int, max_payload: int,
                 raw_len: tuple[int, int] = (14, 200)) -> list[tuple[str, bytes]]:
    """n named frames: 80% random valid RoCEv2, 20% raw non-RoCE frames of raw_len bytes."""
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.8:
            out.append((f"roce{i}", random_frame(rng, max_payload=max_payload).pack()))
        else:
            out.append((f"raw{i}", raw_frame(rng, rng.randint(*raw_len))))
    return out


@cocotb.test()
async def test_parse_valid_frames(dut):
    """All opcodes, VLAN or not, every ECN, random headers; plus non-RoCE frames."""
    b = ParserBench(dut)
    await reset(dut)
    rng = random.Random(b.args.get("seed", 1))
    for name, f in mixed_frames(rng, b.args.get("frames", 40), b.args.get("max_payload", 600)):
        b.send(name, f)
    report(valid={"header_fields_compared": await b.check()})


@cocotb.test()
async def test_parse_malformed(dut):
    """Each malformed class between good frames: the verdict names netreduce.wire's reason."""
    b = ParserBench(dut)
    await reset(dut)
    rng = random.Random(b.args.get("seed", 1) + 1)
    for m in malformed_frames(rng):
        b.send("good", random_frame(rng, max_payload=100).pack())
        b.send(f"{m.name}({m.reason})", m.frame)
    b.send("good", random_frame(rng, max_payload=100).pack())
    await b.check()


@cocotb.test()
async def test_parse_backpressure(dut):
    """Idle input cycles and independent stalls on all four outputs."""
    b = ParserBench(dut, {"src": "00101", "frame": "0110", "payload": "01",
                          "hdr": "", "verdict": ""})
    await reset(dut)
    rng = random.Random(b.args.get("seed", 1) + 2)
    for name, f in mixed_frames(rng, b.args.get("frames", 40) // 2, b.args.get("max_payload", 600)):
        b.send(name, f)
    await b.check()


@cocotb.test()
async def test_parse_back_to_back_sizes(dut):
    """Frames of 60..9018 bytes back to back, outputs always ready: input beats per cycle."""
    b = ParserBench(dut)
    await reset(dut)
    rng = random.Random(b.args.get("seed", 1) + 3)
    sizes = b.args.get("sizes") or [60, 61, 64, 65, 127, 128, 129, 1500, 4096, 9018, 60, 9000]
    for i, n in enumerate(sizes):
        b.send(f"{n}B", frame_of_size(rng, n) if i % 3 else raw_frame(rng, n))
    t0, c0 = time.perf_counter(), b.src.now()
    await b.check()
    first_in = b.src.sent[0][0]
    cycles = b.frame.now() - 20 - first_in
    report(back_to_back={"frames": len(sizes), "beats_in": b.src.beats_sent, "cycles": cycles,
                         "beats_in_per_cycle": round(b.src.beats_sent / cycles, 4),
                         "wall_s": round(time.perf_counter() - t0, 2), "c0": c0})
