"""LinkGate (issue 22, reset domains): a link flap never hands the core a broken or merged frame
and a down port never stalls the core; the shell resets its core from the board reset only."""

from __future__ import annotations

import random

from netreduce.hw.boards.linkgate import LinkGate
from netreduce.hw.packet.testing import (
    StreamSink,
    StreamSource,
    _sim,
    beats_to_frames,
    frame_to_beats,
)

NB = 8


def _frames(seed, n=40):
    rng = random.Random(seed)
    return [bytes([i]) + bytes(rng.getrandbits(8) for _ in range(rng.randrange(8, 90)))
            for i in range(n)]


def _flap(dut, downs):
    async def watch(ctx):
        cycle = 0
        while True:
            ctx.set(dut.up, not any(a <= cycle < b for a, b in downs))
            await ctx.tick()
            cycle += 1
    return watch


def _check(frames, got, pad=0):
    whole = cut = 0
    for f, last in got:
        if last["error"]:
            f = f[:len(f) - pad]   # TX terminator: one byte (keep = 1) behind the prefix
            assert any(g.startswith(f) for g in frames), f"cut frame is no input's prefix: {f}"
            cut += 1
        else:
            assert f in frames, f"merged or changed frame: {f.hex()}"
            whole += 1
    return whole, cut


def test_rx_flap_cuts_frames_cleanly():
    frames = _frames(1)
    dut = LinkGate(64)
    beats = [b for f in frames for b in frame_to_beats(f, NB)]
    src = StreamSource(dut.rx_i, beats, idle=0.1, seed=1)
    sink = StreamSink(dut.rx_o, stall=0.2, seed=2)
    tsrc = StreamSource(dut.tx_i, [])
    _sim(dut, [src, tsrc], [sink], watch=_flap(dut, [(37, 61), (150, 152), (240, 300)]))
    whole, cut = _check(frames, beats_to_frames(sink.items, NB))
    assert cut >= 2 and whole >= len(frames) // 2


def test_rx_fifo_reset_mid_frame_is_not_merged():
    """A FIFO reset under a frame: its rest never comes, the next frame starts (first = 1)."""
    frames = [bytes(range(80))] + _frames(2, 6)[1:]
    beats = [b for f in frames for b in frame_to_beats(f, NB)]
    n0 = len(frame_to_beats(frames[0], NB))
    del beats[2:n0]        # frame 0 loses its tail, frame 1 follows at once
    dut = LinkGate(64)
    src = StreamSource(dut.rx_i, beats)
    sink = StreamSink(dut.rx_o)
    _sim(dut, [src, StreamSource(dut.tx_i, [])], [sink], watch=_flap(dut, []))
    got = beats_to_frames(sink.items, NB)
    assert [f for f, _ in got] == [frames[0][:2 * NB]] + frames[1:]
    assert got[0][1]["error"] == 1


def test_tx_down_port_drops_whole_frames_without_stalling():
    frames = _frames(3)
    dut = LinkGate(64)
    beats = [b for f in frames for b in frame_to_beats(f, NB)]
    src = StreamSource(dut.tx_i, beats)
    sink = StreamSink(dut.tx_o, stall=0.0)
    cycles = _sim(dut, [src, StreamSource(dut.rx_i, [])], [sink],
                  watch=_flap(dut, [(20, 120), (200, 205)]))
    assert cycles <= len(beats) + 5          # the core was never held back
    whole, cut = _check(frames, beats_to_frames(sink.items, NB), pad=1)
    assert whole + cut < len(frames) and cut >= 1


def test_shell_core_reset_is_the_board_reset_not_a_mac_reset():
    from amaranth.hdl import Fragment
    from amaranth.lib.cdc import ResetSynchronizer
    from netreduce.hw.boards.bringup import LoopbackCore
    from netreduce.hw.boards.coreclock import CoreClock
    from netreduce.hw.boards.shell import BoardShell
    from netreduce.hw.boards.vcu118 import VCU118Platform

    plat = VCU118Platform()
    core = LoopbackCore(2, regs=False)
    shell = BoardShell(plat, core, ports=[0, 1])
    shell._MustUse__silence = True   # elaborated by hand below
    m = shell.elaborate(plat)
    subs = {k: v[0] for k, v in m._named_submodules.items()}
    # the core domain's clock and reset come from the MMCM (board reset, lock), and every MAC
    # reset synchroniser resets its own MAC domain only
    assert isinstance(subs["core_clock"], CoreClock) and subs["core_clock"].domain == "core"
    for c in (0, 1):
        rst = subs[f"mac{c}_rst"]
        assert isinstance(rst, ResetSynchronizer) and rst._domain == f"mac{c}"
        assert rst.arst is subs[f"mac{c}"].mac_reset
        assert f"link_gate{c}" in subs and f"link_up{c}" in subs   # a LinkGate per port
    Fragment.get(m, plat)   # elaborates the rest (the whole shell builds)

