"""Link-local frames (issue 22, model D18): the filter against netreduce.wire.linklocal.classify,
and the whole engine at 64 bits against the model (nothing link-local leaves, counters equal)."""

from __future__ import annotations

import random

import pytest
from netreduce.hw.packet.linklocal import LinkLocalFilter
from netreduce.hw.packet.testing import (
    StreamSink,
    StreamSource,
    _sim,
    beats_to_frames,
    frame_to_beats,
    random_frame,
)

from netreduce.wire.linklocal import (
    PAUSE_DA,
    LinkLocal,
    classify,
    lldp_frame,
    pause_frame,
    pfc_frame,
    stp_bpdu,
)


def link_local_frames(rng: random.Random, n: int = 60) -> list[bytes]:
    """A mix of link-local frames (valid, truncated, tagged, near misses) and ordinary ones."""
    out = [pause_frame(0x1234), pfc_frame({3: 77, 5: 0}), lldp_frame(), stp_bpdu(),
           pause_frame(0)[:17], pause_frame(9)[:18], pfc_frame({0: 1})[:33],
           pfc_frame({7: 0xFFFF})[:34], PAUSE_DA[:5], PAUSE_DA, bytes.fromhex("0180c2000010") * 3,
           bytes(12) + b"\x88\x08", bytes(12) + b"\x81\x00\x00\x05\x88\x08" + bytes(40),
           bytes(12) + b"\x81\x00\x00\x05\x88", bytes(12) + b"\x88\x08\x00\x02" + bytes(44)]
    for _ in range(n):
        f = bytearray(random_frame(rng, max_plen=80).pack())
        r = rng.random()
        if r < 0.25:
            f[0:6] = bytes.fromhex("0180c20000") + bytes([rng.randrange(0x20)])
        elif r < 0.5:
            f[12:16] = b"\x88\x08" + rng.choice([b"\x00\x01", b"\x01\x01", b"\x00\x02"])
        elif r < 0.6:
            f = f[:rng.randrange(1, 40)]
        out.append(bytes(f))
    return out


@pytest.mark.parametrize("width", [64, 512])
def test_filter_drops_like_the_model(width):
    rng = random.Random(width)
    frames = link_local_frames(rng)
    kinds = [classify(f) for f in frames]
    want = [f for f, (k, _) in zip(frames, kinds, strict=True) if k == LinkLocal.NONE]
    assert 10 < len(want) < len(frames) - 10
    nb = width // 8
    dut = LinkLocalFilter(width)
    err = {i for i in range(len(frames)) if i % 7 == 3}   # MAC error: consumed, not acted on
    beats = [b for i, f in enumerate(frames) for b in frame_to_beats(f, nb, error=i in err)]
    src = StreamSource(dut.i, beats, idle=0.2, seed=1)
    sink = StreamSink(dut.o, stall=0.3, seed=2)
    seen = {"inc": {}, "pause": []}

    async def watch(ctx):
        while True:
            await ctx.tick()
            for name in ("ll_pause", "ll_pfc", "ll_mac_control", "ll_group"):
                if ctx.get(getattr(dut.inc, name)):
                    seen["inc"][name] = seen["inc"].get(name, 0) + 1
            if ctx.get(dut.pause_valid):
                seen["pause"].append((ctx.get(dut.pause.enable),
                                      tuple(ctx.get(dut.pause.quanta[p]) for p in range(8))))

    _sim(dut, [src], [sink], watch=watch)
    got = [f for f, _ in beats_to_frames(sink.items, nb)]
    assert got == want
    counts: dict = {}
    for k, _ in kinds:
        if k:
            name = {1: "ll_pause", 2: "ll_pfc", 3: "ll_mac_control", 4: "ll_group"}[k]
            counts[name] = counts.get(name, 0) + 1
    assert seen["inc"] == counts
    want_p = [(p.enable, p.quanta) for i, (k, p) in enumerate(kinds)
              if p is not None and i not in err]
    assert seen["pause"] == want_p


def test_filter_line_rate():
    frames = [lldp_frame(), bytes(range(64)), pause_frame(5), bytes(range(100))] * 5
    dut = LinkLocalFilter(64)
    beats = [b for f in frames for b in frame_to_beats(f, 8)]
    src = StreamSource(dut.i, beats)
    sink = StreamSink(dut.o)
    _sim(dut, [src], [sink])
    assert src.cycles[-1] - src.cycles[0] + 1 == len(beats)   # one beat per cycle in
    assert len(beats_to_frames(sink.items, 8)) == 10


def test_engine_consumes_link_local_frames_like_the_model():
    """The engine top (64 bits, management on) against the model: link-local frames among a job's
    traffic are consumed (none leaves), counted per reason, and the job's results are exact."""
    import importlib.util
    from pathlib import Path

    from netreduce.sim.model.kit import RingJob

    spec = importlib.util.spec_from_file_location(
        "_engine_top_harness", Path(__file__).with_name("test_engine_top.py"))
    top = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(top)
    Scenario, check = top.Scenario, top.check

    rng = random.Random(5)
    sc = Scenario(ports=2)
    job = sc.add(RingJob(job=0, world=2, window=4, slot_base=0, pmtu=256))
    ll = link_local_frames(rng, 10)
    for k in range(3):
        for r in range(2):
            sc.frame(job.data_bytes(r, k, [rng.randrange(-2**31, 2**31) for _ in range(6)]), r)
            sc.frame(ll[(2 * k + r) % len(ll)], r)
    for f in ll:
        sc.frame(f, rng.randrange(2))
    got = check(sc, gap=0.1, stall=0.2, seed=1)
    c = sc.eng.counters()
    assert c["ll_pause"] and c["ll_pfc"] and c["ll_group"] and c["ll_mac_control"]
    assert not [f for _, f in got if classify(f)[0]]
