"""FastSim (Verilator + C++ frame harness) on the engine stand-in: frames through, back to back,
backpressure, AXI4-Lite against the model's RegisterFile, data widths 64 and 512.

One build per data width (cached under build/fastsim/, shared by the xdist workers)."""

import functools
import random

import pytest
from netreduce.sim.rtl.fastsim import AxilError, FastSim, verilator_missing
from netreduce.sim.rtl.icarus import IcarusSim, icarus_missing
from netreduce.sim.rtl.standin import standin_regmap, standin_top

from netreduce.regmap import Access, RegisterFile

PORTS = 2


@functools.cache
def _top(width):
    return standin_top(standin_regmap(PORTS, width))


def _sim(width, kind="verilator", **kw):
    reason = verilator_missing() if kind == "verilator" else icarus_missing()
    if reason:
        pytest.skip(reason)
    return (FastSim if kind == "verilator" else IcarusSim)(_top(width), **kw)


def _frames(rng, n, lo=1, hi=300):
    return [(rng.randrange(PORTS), bytes(rng.randrange(256) for _ in range(rng.randint(lo, hi))),
             rng.random() < 0.2) for _ in range(n)]


def _run_all(sim, expect, limit=100_000):
    got = []
    while len(got) < expect and sim.cycle < limit:
        got += sim.run(1000)
    return got


@pytest.mark.xdist_group("fastsim_standin")
@pytest.mark.parametrize("width,kind", [(64, "verilator"), (512, "verilator"), (64, "icarus")])
def test_frames_through_in_order_with_error_flags(width, kind):
    rng = random.Random(width)
    frames = _frames(rng, 60, hi=1500 if width == 512 else 300)
    with _sim(width, kind) as sim:
        for p, f, e in frames:
            sim.send(p, f, error=e)
        got = _run_all(sim, len(frames))
        assert sim.idle()
        for p in range(PORTS):
            sent = [(f, e) for q, f, e in frames if q == p]
            recv = [(g.frame, g.error) for g in got if g.port == p]
            assert recv == sent, f"port {p}"
        st = sim.stats()
        assert st["frames_in"] == st["frames_out"] == len(frames)
        assert st["protocol_errors"] == 0
        bpb = width // 8
        assert st["beats_in"] == sum(-(-len(f) // bpb) for _, f, _ in frames)


@pytest.mark.xdist_group("fastsim_standin")
def test_back_to_back_one_beat_per_cycle():
    rng = random.Random(3)
    sizes = [rng.randint(1, 200) for _ in range(40)]
    with _sim(64) as sim:
        for n in sizes:
            sim.send(0, bytes(n))
        got = _run_all(sim, len(sizes))
        beats = [-(-n // 8) for n in sizes]
        # the FIFO passes one beat per cycle: last beats are exactly the next frame's beats apart
        gaps = [b.cycle - a.cycle for a, b in zip(got, got[1:], strict=False)]
        assert gaps == beats[1:]
        assert got[0].cycle == beats[0] - 1 + 2  # stand-in latency: 2 cycles


@pytest.mark.xdist_group("fastsim_standin")
@pytest.mark.parametrize("kind", ["verilator", "icarus"])
def test_tready_and_tvalid_duty_keep_frames_intact(kind):
    rng = random.Random(5)
    frames = _frames(rng, 80)
    with _sim(64, kind, seed=11) as sim:
        sim.set_ready_duty(0, 1, 3)
        sim.set_ready_duty(1, 2, 3)
        if kind == "verilator":
            sim.set_valid_duty(1, 1, 2)
        for p, f, e in frames:
            sim.send(p, f, error=e)
        got = _run_all(sim, len(frames))
        for p in range(PORTS):
            assert [(g.frame, g.error) for g in got if g.port == p] == \
                [(f, e) for q, f, e in frames if q == p]
        assert sim.protocol_errors == 0
        # port 0's sink accepts a third of the cycles: at least 3 cycles per beat of port 0
        b0 = sum(-(-len(f) // 8) for q, f, _ in frames if q == 0)
        assert max(g.cycle for g in got if g.port == 0) > 2 * b0
    with pytest.raises(ValueError):
        sim.set_ready_duty(0, 4, 3)


@pytest.mark.xdist_group("fastsim_standin")
@pytest.mark.parametrize("kind", ["verilator", "icarus"])
def test_run_until_output_stops_at_the_frame(kind):
    with _sim(64, kind) as sim:
        sim.send(0, bytes(64))
        sim.send(1, bytes(16))
        first = sim.run(1000, until_output=True)
        assert len(first) == 1 and first[0].port == 1
        assert sim.cycle == first[0].cycle + 1
        rest = sim.run(1000, until_output=True)
        assert [g.port for g in rest] == [0]
        sim.run(5000, until_idle=True, quiet=10)
        assert sim.idle() and sim.cycle < 100


@pytest.mark.xdist_group("fastsim_standin")
@pytest.mark.parametrize("width,kind", [(64, "verilator"), (512, "verilator"), (64, "icarus")])
def test_axil_against_register_file(width, kind):
    rm = standin_regmap(PORTS, width)
    rf = RegisterFile(rm)
    rng = random.Random(width + 1)
    insts = list(rm.instances())
    # RW registers outside the job control (the stand-in's JOB.STATUS follows JOB.CTRL)
    rw = [i for i in insts if i.reg.name != "CTRL" and i.table.name not in ("CNT", "JOB_CNT")
          and any(f.access == Access.RW for f in i.reg.fields)]
    with _sim(width, kind) as sim:
        for i in insts:
            if i.table.name == "GLOBAL":
                assert sim.axil_read(i.addr) == rf.read(i.addr), i.name
        for _ in range(150):
            i = rng.choice(rw)
            v = rng.getrandbits(32)
            sim.axil_write(i.addr, v)
            rf.write(i.addr, v)
            j = rng.choice(rw)
            assert sim.axil_read(j.addr) == rf.read(j.addr), j.name
        for i in rw:
            assert sim.axil_read(i.addr) == rf.read(i.addr), i.name
        # an unmapped / unaligned address answers DECERR
        with pytest.raises(AxilError, match="DECERR"):
            sim.axil_read(rm.size + 0x100)
        with pytest.raises(AxilError, match="DECERR"):
            sim.axil_write(2, 1)
        assert sim.axil_write(2, 1, check=False) == 3


@pytest.mark.xdist_group("fastsim_standin")
def test_counters_count_frames_through_the_bus():
    rm = standin_regmap(PORTS, 64)
    with _sim(64) as sim:
        for n in (10, 70, 3, 200):
            sim.send(0, bytes(n))
        sim.run(500)
        assert sim.axil_read(rm.addr("CNT.RX_FRAMES")) == 4
        assert sim.axil_read(rm.addr("CNT.TX_FRAMES")) == 4
        # JOB.CTRL.enable drives the stand-in's JOB.STATUS.enabled
        en = rm.field("JOB.STATUS.enabled")
        sim.axil_write(rm.addr("JOB.CTRL", 1), 1)
        assert en.get(sim.axil_read(rm.addr("JOB.STATUS", 1)))
        assert not en.get(sim.axil_read(rm.addr("JOB.STATUS", 0)))


@pytest.mark.xdist_group("fastsim_standin")
@pytest.mark.parametrize("width", [64, 512])
def test_fast_rising_edge_changes_nothing(width):
    """The harness's rising edge without Verilator's input-combinational region (the default)
    against the model's full eval() at every edge: the same frames in the same cycles with
    random tvalid/tready patterns, and the same register reads and writes."""
    rm = standin_regmap(PORTS, width)
    rng = random.Random(21)
    frames = _frames(rng, 80, hi=700)
    runs = []
    for fast in (True, False):
        with _sim(width, seed=4, fast_edge=fast) as sim:
            assert sim.fast_edge is fast
            sim.set_ready_duty(0, 2, 3)
            sim.set_valid_duty(1, 3, 4)
            for p, f, e in frames[:40]:
                sim.send(p, f, error=e)
            got = sim.run(300)
            sim.axil_write(rm.addr("JOB.CTRL", 1), 1)  # AXI4-Lite while frames flow
            regs = [sim.axil_read(rm.addr("JOB.STATUS", 1)),
                    sim.axil_read(rm.addr("CNT.RX_FRAMES"))]
            for p, f, e in frames[40:]:
                sim.send(p, f, error=e)
            got += _run_all(sim, len(frames) - len(got))
            regs += [sim.axil_read(rm.addr("CNT.RX_FRAMES")),
                     sim.axil_read(rm.addr("CNT.TX_FRAMES"))]
            st = {k: v for k, v in sim.stats().items() if not k.endswith("seconds")}
            runs.append(([tuple(g) for g in got], regs, sim.cycle, st))
    assert len(runs[0][0]) == len(frames)
    assert runs[0] == runs[1]


@pytest.mark.xdist_group("fastsim_standin")
def test_bad_calls_raise_clear_errors():
    with _sim(64) as sim:
        with pytest.raises(ValueError, match="no input port 5"):
            sim.send(5, b"x")
        with pytest.raises(ValueError, match="empty frame"):
            sim.send(0, b"")
        with pytest.raises(TypeError):
            sim.send(0, "text")
        sim.send("s_axis_p1", b"abc")  # by prefix
        assert [g.port for g in sim.run(50)] == [1]
