"""cocotb tests of the assembled packet path: parser -> (payload stage) -> deparser loopback.

The top (:mod:`netreduce.sim.cocotb.packet_top`) takes frames on ``s_axis`` and returns every one
on ``m_axis`` in order. Input ``payload_xor`` XORs every payload byte between parser and deparser
and ``ce_to_ect0`` requests the ECN rewrite, so the deparser's recomputed ICRC and IPv4 checksum
are checked against netreduce.wire.

Expected output per input frame, from :func:`netreduce.wire.parse`:

* valid RC SEND/WRITE (DATA): rebuilt by the deparser: the same bytes with ``payload_xor`` = 0
  and no CE rewrite, else :meth:`RoceFrame.copy` with the new payload / ECN, packed by
  netreduce.wire (lengths, IPv4 checksum, ICRC);
* any other valid RoCEv2 frame, and non-RoCE frames: unchanged (bypass);
* malformed RoCEv2: ``error`` on its last beat; its bytes are the input's (bypass) or, for a frame
  whose header passed, the deparser's rebuild with a fresh ICRC.

Arguments (``tb_args``): ``frames``, ``seed``, ``max_payload``, ``ce_frames``, ``sizes``.
"""

from __future__ import annotations

import random
import time

import cocotb
from cocotb.triggers import ClockCycles

from netreduce.wire import (
    ECN_CE,
    ECN_ECT0,
    NOT_ROCE_REASONS,
    OPCODES,
    Opcode,
    WireError,
    parse,
)

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
from .packets import (
    check_icrc,
    classify,
    frame_of_size,
    malformed_frames,
    random_frame,
    raw_frame,
)
from .tb_parser import check_records, expect, mixed_frames

NOT_ROCE = NOT_ROCE_REASONS


class Bench:
    """Source, sink, and the expectation of each frame sent."""

    def __init__(self, dut, *, src_pause: str = "", sink_pause: str = ""):
        self.dut = dut
        self.args = tb_args()
        self.clk = start_clock(dut)
        self.src = AxisSource(dut, "s_axis")
        self.sink = AxisSink(dut, "m_axis")
        self.hdr = RecordSink(dut, "m_axis_hdr_tap")
        self.verdict = RecordSink(dut, "m_axis_verdict_tap")
        self.fields_compared = 0
        if src_pause:
            self.src.set_pause_generator(cycle_pattern(src_pause))
        if sink_pause:
            self.sink.set_pause_generator(cycle_pattern(sink_pause))
        # (name, acceptable outputs, error flag, rebuilt by the deparser)
        self.expected: list[tuple[str, list[bytes], bool, bool]] = []
        self.inputs: list[bytes] = []
        self.received: list = []
        self.xor = 0
        self.ce_rewrite = 0
        self.counts = {"data": 0, "bypass": 0, "error": 0}  # as the top's counters must show
        dut.payload_xor.value = 0
        dut.ce_to_ect0.value = 0

    async def start(self, xor: int = 0, ce_rewrite: int = 0):
        self.xor, self.ce_rewrite = xor, ce_rewrite
        self.dut.payload_xor.value = xor
        self.dut.ce_to_ect0.value = ce_rewrite
        await reset(self.dut)

    def send(self, name: str, frame: bytes):
        try:
            f = parse(frame)
        except WireError as e:
            f, reason = None, e.reason
        if f is not None:
            if OPCODES[f.opcode].rc_data:
                g = f
                if self.xor or (self.ce_rewrite and f.ecn == ECN_CE):
                    g = f.copy(payload=bytes(x ^ self.xor for x in f.payload))
                    if self.ce_rewrite and f.ecn == ECN_CE:
                        g = g.with_ecn(ECN_ECT0)
                want = [g.pack()] if g is not f else [frame]
                self.expected.append((name, want, False, True))
            else:
                self.expected.append((name, [frame], False, False))
        elif reason in NOT_ROCE:
            self.expected.append((name, [frame], False, False))
        else:
            alts = [frame]
            try:  # a header that passes: the deparser rebuilds it (fresh ICRC), flagged
                g = parse(frame, check=False)
                alts.append(g.copy(payload=bytes(x ^ self.xor for x in g.payload)).pack())
            except WireError:
                pass
            self.expected.append((name, alts, True, False))
        self.inputs.append(frame)
        self.src.send(frame)

    async def check_all(self):
        for i, (name, want, err, data) in enumerate(self.expected):
            rx = await self.sink.recv()
            self.received.append(rx)
            frame = self.inputs[i]
            where = f"frame {i} ({name}, {len(frame)} B)"
            # the parser's header record and verdict of this frame, as tapped
            self.fields_compared += check_records(where, frame, expect(frame),
                                                  await self.hdr.recv(), await self.verdict.recv())
            got = rx.user_last & 1  # the beat layout's one user field: error
            assert got == int(err), f"{where}: error flag {got}, expected {err}"
            # a malformed frame that netreduce.wire cannot rebuild (truncated headers) may come
            # back as the deparser's rebuild of garbage: only its flag and verdict are defined
            if not (err and len(want) == 1 and rx.data != frame):
                assert rx.data in want, f"{where}: {diff(rx.data, want[-1])}"
            if not err and classify(rx.data) == "ok":
                assert check_icrc(rx.data), f"frame {i} ({name}): ICRC/IPv4 checksum wrong"
            self.counts["error"] += err
            if not err:
                self.counts["data" if data else "bypass"] += 1
        await ClockCycles(self.clk, 20)
        assert self.sink.empty(), f"{len(self.sink)} unexpected extra frames out"
        assert not self.hdr.records and not self.verdict.records, "extra hdr/verdict records"
        self.expected.clear()
        self.inputs.clear()
        got = {k: getattr(self.dut, f"{k}_frames").value.to_unsigned() for k in self.counts}
        assert got["error"] == self.counts["error"], f"counters {got}, expected {self.counts}"
        # good DATA frames go through the deparser, other good frames through the bypass
        assert got["data"] >= self.counts["data"] and got["bypass"] >= self.counts["bypass"], (
            f"counters {got}, expected at least {self.counts}")


def _mix(rng: random.Random, n: int, max_payload: int):
    # the packet path's wrapper needs raw frames of at least 60 bytes (a MAC's minimum)
    return mixed_frames(rng, n, max_payload, raw_len=(60, 300))


@cocotb.test()
async def test_loopback_byte_for_byte(dut):
    """Valid RoCEv2 (all opcodes, VLAN, ECN) and non-RoCE frames come back unchanged."""
    b = Bench(dut)
    await b.start()
    rng = random.Random(b.args.get("seed", 1))
    for name, f in _mix(rng, b.args.get("frames", 40), b.args.get("max_payload", 600)):
        b.send(name, f)
    await b.check_all()
    report(loopback={"header_fields_compared": b.fields_compared})


@cocotb.test()
async def test_payload_replaced(dut):
    """Payload changed in between and CE rewritten: ICRC and IPv4 checksum are netreduce.wire's."""
    b = Bench(dut)
    await b.start(xor=0xA5, ce_rewrite=1)
    rng = random.Random(b.args.get("seed", 1) + 1)
    for name, f in _mix(rng, b.args.get("frames", 40) // 2, b.args.get("max_payload", 600)):
        b.send(name, f)
    for _ in range(b.args.get("ce_frames", 6)):  # CE-marked DATA frames for the ECN rewrite
        f = random_frame(rng, opcode=Opcode.WRITE_ONLY, max_payload=300)
        b.send("ce", f.copy(tos=(f.tos & ~3) | ECN_CE).pack())
    await b.check_all()


@cocotb.test()
async def test_malformed_classified(dut):
    """Each malformed class, between good frames: flagged, in order; good frames untouched."""
    b = Bench(dut)
    await b.start()
    rng = random.Random(b.args.get("seed", 1) + 2)
    for m in malformed_frames(rng):
        b.send("good", random_frame(rng, max_payload=100).pack())
        b.send(f"{m.name}({m.reason})", m.frame)
    b.send("good", random_frame(rng, max_payload=100).pack())
    await b.check_all()


@cocotb.test()
async def test_idle_and_backpressure(dut):
    """Idle cycles on the input and stalls on the output, two coprime patterns."""
    b = Bench(dut, src_pause="00101", sink_pause="0110")
    await b.start()
    rng = random.Random(b.args.get("seed", 1) + 3)
    for name, f in _mix(rng, b.args.get("frames", 40) // 2, b.args.get("max_payload", 600)):
        b.send(name, f)
    await b.check_all()


async def _stream(b: Bench, frames: list[tuple[str, bytes]]) -> dict:
    """Send ``frames`` back to back and check them; throughput from first beat in to last out."""
    for name, f in frames:
        b.send(name, f)
    t0 = time.perf_counter()
    b0, r0 = b.src.beats_sent, b.sink.beats_received
    n_sent = len(b.src.sent)
    await b.check_all()
    wall = time.perf_counter() - t0
    first_in = b.src.sent[n_sent][0] if len(b.src.sent) > n_sent else b.src.now()
    cycles = max(1, b.sink.now() - 20 - first_in)  # check_all idles 20 cycles at the end
    beats_in = b.src.beats_sent - b0
    return {"frames": len(frames), "beats_in": beats_in, "beats_out": b.sink.beats_received - r0,
            "cycles": cycles, "beats_in_per_cycle": round(beats_in / cycles, 4),
            "cycles_per_s": round(cycles / wall)}


async def _latency(b: Bench, frame: bytes) -> tuple[int, int]:
    """(first beat in -> first beat out, last beat in -> last beat out) of one frame, idle pipe."""
    b.send("latency", frame)
    await b.check_all()
    rx = b.received[-1]
    first, last = b.src.sent[-1]
    return rx.first_cycle - first, rx.last_cycle - last


@cocotb.test()
async def test_back_to_back_sizes(dut):
    """Back-to-back frames from 60 to 9018 bytes, no idle: nothing lost, merged or split."""
    b = Bench(dut)
    await b.start()
    rng = random.Random(b.args.get("seed", 1) + 4)
    sizes = b.args.get("sizes") or [60, 61, 64, 65, 127, 128, 129, 1500, 4096, 9018, 60, 9000]
    frames = [(f"{n}B", frame_of_size(rng, n) if i % 3 else raw_frame(rng, n))
              for i, n in enumerate(sizes)]
    report(back_to_back=await _stream(b, frames))


@cocotb.test()
async def test_throughput_and_latency(dut):
    """Bench: latency of isolated frames, then many back-to-back frames of 60..9018 bytes."""
    b = Bench(dut)
    await b.start()
    rng = random.Random(b.args.get("seed", 1) + 5)
    lat = {}
    for n in (60, 64, 1082, 4154, 9018):
        lat[n] = await _latency(b, frame_of_size(rng, n))
    frames = [(f"f{i}", frame_of_size(rng, rng.randint(60, 9018)))
              for i in range(b.args.get("frames", 100))]
    t = await _stream(b, frames)
    t["latency_first_to_first_cycles"] = {n: v[0] for n, v in lat.items()}
    t["latency_last_to_last_cycles"] = {n: v[1] for n, v in lat.items()}
    report(throughput=t)
