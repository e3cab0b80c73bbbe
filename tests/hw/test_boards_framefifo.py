"""FrameFifo: store-and-forward, whole-frame drops, no bubbles inside a committed frame."""

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.boards.framefifo import FrameFifo

W = 64  # 8 bytes per beat keeps the simulation fast


def _frames(rng, n, max_beats):
    out = []
    for _ in range(n):
        nb = rng.randint(1, max_beats)
        beats = []
        for k in range(nb):
            last = k == nb - 1
            nbytes = rng.randint(1, W // 8) if last else W // 8
            beats.append((rng.getrandbits(W), (1 << nbytes) - 1, int(last), int(last and
                                                                              rng.random() < .2)))
        out.append(beats)
    return out


def _run(dut, frames, *, in_gap, out_ready_p, cycles):
    got, drops, bubbles = [], [0], [0]

    async def source(ctx):
        for f in frames:
            for b in f:
                while in_gap and random.random() < in_gap:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                d, k, last, err = b
                ctx.set(dut.i.payload.data, d)
                ctx.set(dut.i.payload.keep, k)
                ctx.set(dut.i.payload.last, last)
                ctx.set(dut.i.payload.error, err)
                ctx.set(dut.i.valid, 1)
                await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        cur, in_frame = [], False
        for _ in range(cycles):
            rdy = random.random() < out_ready_p
            ctx.set(dut.o.ready, rdy)
            await ctx.delay(1e-9)
            if rdy and in_frame and not ctx.get(dut.o.valid):
                bubbles[0] += 1
            if ctx.get(dut.drop):
                drops[0] += 1
            if rdy and ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                assert p.first == (not in_frame)
                cur.append((p.data, p.keep, p.last, p.error))
                in_frame = not p.last
                if p.last:
                    got.append(cur)
                    cur = []
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return got, drops[0], bubbles[0]


def _is_subsequence(sub, full):
    it = iter(full)
    return all(any(x == y for y in it) for x in sub)


def test_tx_mode_passes_everything_in_order():
    rng = random.Random(1)
    random.seed(1)
    frames = _frames(rng, 40, 12)
    got, drops, bubbles = _run(FrameFifo(W, 16, drop_when_full=False), frames,
                               in_gap=0.3, out_ready_p=1.0, cycles=1500)
    assert got == frames
    assert drops == 0
    assert bubbles == 0  # store and forward: a committed frame never has a gap


def test_tx_mode_backpressure_random_ready():
    rng = random.Random(2)
    random.seed(2)
    frames = _frames(rng, 40, 10)
    got, drops, _ = _run(FrameFifo(W, 16, drop_when_full=False), frames,
                         in_gap=0.0, out_ready_p=0.5, cycles=3000)
    assert got == frames and drops == 0


def test_tx_mode_oversize_frame_dropped_not_deadlocked():
    rng = random.Random(3)
    random.seed(3)
    frames = _frames(rng, 6, 4)
    big = [(1, 0xff, 0, 0)] * 20 + [(2, 0xff, 1, 0)]
    frames.insert(3, big)
    got, drops, _ = _run(FrameFifo(W, 8, drop_when_full=False), frames,
                         in_gap=0.0, out_ready_p=1.0, cycles=400)
    assert drops == 1
    assert got == frames[:3] + frames[4:]


def test_rx_mode_drops_whole_frames_and_keeps_order():
    rng = random.Random(4)
    random.seed(4)
    frames = _frames(rng, 60, 6)
    got, drops, bubbles = _run(FrameFifo(W, 8, drop_when_full=True), frames,
                               in_gap=0.0, out_ready_p=0.3, cycles=2000)
    assert drops > 0, "the slow sink must force drops"
    assert len(got) + drops == len(frames)
    assert _is_subsequence(got, frames)


def test_rx_mode_no_drop_when_fast():
    rng = random.Random(5)
    random.seed(5)
    frames = _frames(rng, 30, 6)
    got, drops, _ = _run(FrameFifo(W, 16, drop_when_full=True), frames,
                         in_gap=0.0, out_ready_p=1.0, cycles=600)
    assert got == frames and drops == 0


@pytest.mark.parametrize("depth", [3, 6, 0])
def test_bad_depth(depth):
    with pytest.raises(ValueError, match="power of two"):
        FrameFifo(W, depth, drop_when_full=True)


def test_rx_mode_drops_errored_frames_when_asked():
    """drop_errors (the shell's RX FIFO): a frame the MAC flagged (bad FCS, too long) is rolled
    back and counted on drop_error, never delivered; clean frames pass in order."""
    rng = random.Random(6)
    random.seed(6)
    frames = _frames(rng, 40, 6)
    errored = [f for f in frames if f[-1][3]]
    assert errored
    dut = FrameFifo(W, 16, drop_when_full=True, drop_errors=True)
    seen = [0]

    async def count(ctx):
        while True:
            await ctx.tick()
            seen[0] += ctx.get(dut.drop_error)

    got, drops, _ = _run_with(dut, frames, count)
    assert got == [f for f in frames if not f[-1][3]] and drops == 0
    assert seen[0] == len(errored)


def _run_with(dut, frames, extra):
    orig = Simulator.add_testbench
    added = []

    def add(self, fn, *, background=False):
        if not added:
            added.append(True)
            orig(self, extra, background=True)
        return orig(self, fn, background=background)

    Simulator.add_testbench = add
    try:
        return _run(dut, frames, in_gap=0.0, out_ready_p=1.0, cycles=800)
    finally:
        Simulator.add_testbench = orig


class _RefFifo:
    """The FIFO's contract, cycle by cycle: ``full`` is level == depth, a frame is shown on ``o``
    from the cycle after the one its commit is visible in (``o.valid`` = commit of the previous
    cycle != rd), a frame that finds the FIFO full is dropped whole."""

    def __init__(self, depth, drop_when_full, drop_errors):
        self.D, self.dwf, self.de = depth, drop_when_full, drop_errors
        self.mem = [None] * depth
        self.rd = self.wr = self.commit = self.commit_prev = 0
        self.dropping, self.first = False, 1
        self.drop = self.drop_error = 0

    def outputs(self):
        level = (self.wr - self.rd) % (2 * self.D)
        full, complete = level == self.D, self.commit != self.rd
        return {"i_ready": 1 if self.dwf else int(not full or not complete),
                "o_valid": int(self.commit_prev != self.rd), "level": level,
                "drop": self.drop, "drop_error": self.drop_error}

    def step(self, valid, beat, o_ready):
        out = self.outputs()
        full = out["level"] == self.D
        self.commit_prev = self.commit
        self.drop = self.drop_error = 0
        M = 2 * self.D
        if valid and out["i_ready"]:
            last, err = beat[2], beat[3]
            if self.dropping:
                self.dropping = not last
            elif not full:
                self.mem[self.wr % self.D] = beat
                self.wr = (self.wr + 1) % M
                if last:
                    if self.de and err:
                        self.wr, self.drop_error = self.commit, 1
                    else:
                        self.commit = self.wr
            else:
                self.wr, self.drop = self.commit, 1
                self.dropping = not last
        if out["o_valid"] and o_ready:
            self.first = self.mem[self.rd % self.D][2]
            self.rd = (self.rd + 1) % M


@pytest.mark.parametrize("drop_when_full,drop_errors,p_in,p_out", [
    (False, False, 0.9, 0.5), (False, False, 0.6, 0.9), (True, False, 0.9, 0.4),
    (True, True, 0.9, 0.6), (True, True, 0.5, 1.0)])
def test_cycle_accurate_against_the_reference(drop_when_full, drop_errors, p_in, p_out):
    """Every output, every cycle, equals the reference (the registered full / valid flags of
    the logic-depth rework included), with random input gaps and output backpressure."""
    depth = 8
    rng = random.Random(hash((drop_when_full, drop_errors, p_in, p_out)) & 0xffff)
    dut = FrameFifo(W, depth, drop_when_full=drop_when_full, drop_errors=drop_errors)
    ref = _RefFifo(depth, drop_when_full, drop_errors)
    stream = [b for f in _frames(rng, 400, 11) for b in f]   # frames longer than the FIFO too
    checked = [0]

    async def bench(ctx):
        k = 0
        for _ in range(3000):
            valid = int(k < len(stream) and rng.random() < p_in)
            beat = stream[k] if k < len(stream) else (0, 0, 0, 0)
            o_ready = int(rng.random() < p_out)
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload.data, beat[0])
            ctx.set(dut.i.payload.keep, beat[1])
            ctx.set(dut.i.payload.last, beat[2])
            ctx.set(dut.i.payload.error, beat[3])
            ctx.set(dut.o.ready, o_ready)
            want = ref.outputs()
            got = {"i_ready": ctx.get(dut.i.ready), "o_valid": ctx.get(dut.o.valid),
                   "level": ctx.get(dut.level), "drop": ctx.get(dut.drop),
                   "drop_error": ctx.get(dut.drop_error)}
            assert got == want, (checked[0], got, want)
            if want["o_valid"]:
                p = ctx.get(dut.o.payload)
                assert (p.data, p.keep, p.last, p.error) == ref.mem[ref.rd % depth]
                assert p.first == ref.first
            if valid and want["i_ready"]:
                k += 1
            ref.step(valid, beat, o_ready)
            checked[0] += 1
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert checked[0] == 3000
