"""LaneALU (netreduce.hw.agg.lanes) against hand-computed values and the numpy model."""

import numpy as np
import pytest
from amaranth.sim import Simulator
from netreduce.hw.agg.lanes import INT32_MAX, INT32_MIN, LaneALU, Op, reference

from netreduce.regmap import Op as RegmapOp

EDGES = [0, 1, -1, 2, -2, INT32_MAX, INT32_MAX - 1, INT32_MIN, INT32_MIN + 1, 1 << 30, -(1 << 30)]


def pack(lanes) -> int:
    """int32 lanes -> beat integer, lane i = bytes 4i..4i+3 little-endian (byte k = bits 8k)."""
    return int.from_bytes(np.asarray(lanes, dtype="<i4").tobytes(), "little")


def unpack(value: int, width: int) -> np.ndarray:
    return np.frombuffer(value.to_bytes(width // 8, "little"), dtype="<i4").astype(np.int32)


def run_alu(width, vectors, *, registered=False):
    """Drive (op, first, acc, contrib) vectors one per cycle; return [(result, sat, op_error)].

    Combinational: outputs sampled in the same cycle. Registered: sampled after the clock edge,
    i.e. while the next vector is already applied (checks latency 1 at full rate).
    """
    dut = LaneALU(width, registered=registered)
    lanes = width // 32
    out = []

    def sample(ctx):
        sat = ctx.get(dut.sat)
        return (unpack(ctx.get(dut.result), width),
                np.array([(sat >> i) & 1 for i in range(lanes)], dtype=bool),
                ctx.get(dut.op_error))

    async def bench(ctx):
        for op, first, acc, contrib in vectors:
            ctx.set(dut.op.as_value(), op.value if isinstance(op, Op) else op)
            ctx.set(dut.first, first)
            ctx.set(dut.acc, pack(acc))
            ctx.set(dut.contrib, pack(contrib))
            if not registered:
                out.append(sample(ctx))
            if registered:
                await ctx.tick()
                out.append(sample(ctx))
            else:
                await ctx.delay(1e-8)

    sim = Simulator(dut)
    if registered:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def lanes_of(width, values):
    """Spread a list of lane values over a beat, cycling."""
    n = width // 32
    return np.array([values[i % len(values)] for i in range(n)], dtype=np.int32)


# Hand-computed per-lane cases: (op, first, acc, contrib, result, sat).
HAND = [
    (Op.SUM_WRAP, 0, INT32_MAX, 1, INT32_MIN, 0),
    (Op.SUM_WRAP, 0, INT32_MIN, -1, INT32_MAX, 0),
    (Op.SUM_WRAP, 0, -7, 3, -4, 0),
    (Op.SUM_SAT, 0, INT32_MAX, 1, INT32_MAX, 1),
    (Op.SUM_SAT, 0, INT32_MAX - 5, 5, INT32_MAX, 0),
    (Op.SUM_SAT, 0, INT32_MIN, -1, INT32_MIN, 1),
    (Op.SUM_SAT, 0, INT32_MIN + 5, -5, INT32_MIN, 0),
    (Op.SUM_SAT, 0, INT32_MIN, INT32_MIN, INT32_MIN, 1),
    (Op.SUM_SAT, 0, INT32_MAX, INT32_MAX, INT32_MAX, 1),
    (Op.SUM_SAT, 0, INT32_MAX, INT32_MIN, -1, 0),
    (Op.SUM_SAT, 0, -100, 30, -70, 0),
    (Op.MAX, 0, -5, -3, -3, 0),
    (Op.MAX, 0, -1, INT32_MIN, -1, 0),
    (Op.MAX, 0, INT32_MIN, 0, 0, 0),
    (Op.MAX, 0, INT32_MAX, -1, INT32_MAX, 0),
    (Op.SUM_SAT, 1, INT32_MAX, INT32_MAX, INT32_MAX, 0),
    (Op.SUM_WRAP, 1, 12345, -9, -9, 0),
    (Op.MAX, 1, 100, -100, -100, 0),
]


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("registered", [False, True])
def test_hand_cases(width, registered):
    # Each case in lane 0, the mirrored case (acc and contrib swapped where the op commutes) in
    # the other lanes, so every lane position is exercised.
    vectors, expected = [], []
    for op, first, a, b, r, sat in HAND:
        acc = lanes_of(width, [a, b] if not first else [a])
        contrib = lanes_of(width, [b, a] if not first else [b])
        vectors.append((op, first, acc, contrib))
        exp_r = lanes_of(width, [r]) if not first else contrib
        expected.append((exp_r, np.full(width // 32, bool(sat))))
    got = run_alu(width, vectors, registered=registered)
    for (op, first, a, b, *_), (res, sat, err), (exp_r, exp_sat) in zip(
            HAND, got, expected, strict=True):
        assert err == 0
        assert np.array_equal(res, exp_r), (op, first, a, b, res, exp_r)
        assert np.array_equal(sat, exp_sat), (op, first, a, b, sat, exp_sat)


def test_reference_matches_hand_cases():
    for op, first, a, b, r, sat in HAND:
        res, s = reference(op, [a], [b], first=bool(first))
        assert int(res[0]) == r and bool(s[0]) == bool(sat), (op, first, a, b)


@pytest.mark.parametrize("width", [64, 512])
def test_random_against_model(width):
    rng = np.random.default_rng(width)
    n = width // 32
    edges = np.array(EDGES, dtype=np.int64)

    def draw():
        pick = rng.integers(0, 3, n)
        small = rng.integers(-1000, 1000, n)
        full = rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True)
        return np.where(pick == 0, rng.choice(edges, n), np.where(pick == 1, small, full)).astype(
            np.int32)

    vectors = [(Op(int(rng.integers(0, 3))), int(rng.random() < 0.15), draw(), draw())
               for _ in range(150 if width == 512 else 400)]
    got = run_alu(width, vectors)
    saw_sat = 0
    for (op, first, acc, contrib), (res, sat, err) in zip(vectors, got, strict=True):
        exp_r, exp_sat = reference(op, acc, contrib, first=bool(first))
        assert err == 0
        assert np.array_equal(res, exp_r), (op, first, acc, contrib)
        assert np.array_equal(sat, exp_sat), (op, first, acc, contrib)
        saw_sat += int(sat.sum())
    assert saw_sat > 0  # the draw must reach the clamps


@pytest.mark.parametrize("first", [0, 1])
def test_undefined_op_keeps_acc(first):
    acc, contrib = lanes_of(64, [5, INT32_MAX]), lanes_of(64, [7, 1])
    (res, sat, err), = run_alu(64, [(3, first, acc, contrib)])
    assert err == 1
    assert np.array_equal(res, acc)
    assert not sat.any()
    with pytest.raises(ValueError, match="undefined operation code 3"):
        reference(3, acc, contrib)


def test_op_codes_come_from_regmap_and_width_check():
    assert {o.name: o.value for o in Op} == {o.name: o.value for o in RegmapOp}
    assert (Op.SUM_WRAP.value, Op.SUM_SAT.value, Op.MAX.value) == (0, 1, 2)
    res, sat = reference(RegmapOp.SUM_SAT, [INT32_MAX], [1])
    assert res.tolist() == [INT32_MAX] and sat.tolist() == [True]
    with pytest.raises(ValueError, match="multiple of 32"):
        LaneALU(48)


# ---- LaneCombine (netreduce.hw.lanes): the lanes' result beats combined as the model's D20 ----

def _combine_frames(rng, P, width, n_frames):
    """Random result frames: (op, lmask, job, count, [beat partials per lane], last bytes)."""
    n = width // 32
    edges = np.array(EDGES, dtype=np.int64)
    frames = []
    for _ in range(n_frames):
        op = int(rng.integers(0, 3))
        lmask = int(rng.integers(1, 1 << P))
        beats = int(rng.integers(1, 4))
        last_bytes = int(rng.integers(1, width // 8 + 1))
        parts = []
        for _ in range(beats):
            pick = rng.integers(0, 2, (P, n))
            big = rng.choice(edges, (P, n))
            small = rng.integers(-1000, 1000, (P, n))
            parts.append(np.where(pick == 0, big, small).astype(np.int32))
        frames.append((op, lmask, int(rng.integers(0, 2)), int(rng.random() < 0.7), parts,
                       last_bytes))
    return frames


def _model_combine(frame, width):
    """(beats of the combined data, clipped combining additions of the frame) per the model."""
    from netreduce.sim.model.lanes import combine

    op, lmask, _job, _count, parts, last_bytes = frame
    lanes = [k for k in range(len(parts[0])) if lmask >> k & 1]
    beats = [combine(op, {k: p[k] for k in lanes})[0] for p in parts]
    # clipping counts over the frame's payload only (lanes whose 4 bytes are all payload)
    kept = width // 32 if last_bytes == width // 8 else last_bytes // 4
    payload = {k: np.concatenate([p[k] for p in parts[:-1]] + [parts[-1][k][:kept]])
               for k in lanes}
    return beats, combine(op, payload)[1]


@pytest.mark.parametrize("lanes", [2, 3, 4])
def test_lane_combine_matches_the_model(lanes):
    from amaranth.lib import data
    from netreduce.hw.lanes import LaneCombine, xtag_layout

    width, jobs, P = 64, 2, lanes
    nbb = 4                                  # bytes of a 64-bit beat: 0..8
    xl = xtag_layout(P, jobs)
    tag_w = nbb + 1 + xl.size + 1
    req_l = data.StructLayout({"slot": 3, "beat": 3, "tag": tag_w})
    res_l = data.StructLayout({"slot": 3, "beat": 3, "tag": tag_w, "bad_slot": 1, "data": width})
    dut = LaneCombine(width, lanes=P, jobs=jobs, req_layout=req_l, res_layout=res_l,
                      nb_bits=nbb, cnt_width=3)
    rng = np.random.default_rng(P)
    frames = _combine_frames(rng, P, width, 40)
    beats = []   # what every lane's result port returns, in order
    for op, lmask, job, count, parts, last_bytes in frames:
        for b, p in enumerate(parts):
            last = b == len(parts) - 1
            xt = lmask | op << P | job << (P + 2)
            tag = (last_bytes if last else width // 8) | int(last) << nbb | xt << (nbb + 1) \
                | count << (nbb + 1 + xl.size)
            beats.append((b, tag, [pack(p[k]) for k in range(P)]))
    got, sat = [], [0] * jobs
    ress = [getattr(dut, f"lane_res{k}") for k in range(P)]

    async def bench(ctx):
        # one process drives both sides: every cycle the lanes' beat (valid 80 %) and the
        # output's ready (70 %), then the handshakes of that cycle
        i, idle, cycles = 0, 0, 0
        while idle < 20 and cycles < 40 * len(beats):
            cycles += 1
            on = i < len(beats) and rng.random() < 0.8
            if i < len(beats):
                beat, tag, datas = beats[i]
                for r, d in zip(ress, datas, strict=True):
                    ctx.set(r.payload, {"slot": 5, "beat": beat, "tag": tag, "bad_slot": 0,
                                        "data": d})
            for r in ress:
                ctx.set(r.valid, on)
            ready = rng.random() < 0.7
            ctx.set(dut.res.ready, ready)
            assert len({ctx.get(r.ready) for r in ress}) == 1   # lock step
            i += on and ctx.get(ress[0].ready)
            if ctx.get(dut.res.valid) and ready:
                got.append(ctx.get(dut.res.payload.data))
            await ctx.tick()
            for j in range(jobs):
                sat[j] += ctx.get(dut.sat_inc[j])
            idle += len(got) == len(beats)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want, want_sat = [], [0] * jobs
    for fr in frames:
        bs, clipped = _model_combine(fr, width)
        want += bs
        if fr[3]:      # count: the release's first result frame
            want_sat[fr[2]] += clipped
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(unpack(g, width), w), (i, unpack(g, width), w)
    assert sat == want_sat and sum(want_sat) > 0


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_min_seq_is_the_oldest_modulo_2_16(n):
    from amaranth.hdl import Module, Signal
    from netreduce.hw.lanes import SEQ_BITS, min_seq

    rng = np.random.default_rng(n)
    vals = [Signal(SEQ_BITS, name=f"v{i}") for i in range(n)]
    out = Signal(SEQ_BITS)
    m = Module()
    m.d.comb += out.eq(min_seq(vals))
    cases = []
    for _ in range(300):
        base = int(rng.integers(0, 1 << SEQ_BITS))
        offs = [int(rng.integers(0, 1 << 15)) for _ in range(n)]
        if n > 1 and rng.random() < 0.3:
            offs[-1] = offs[0]                      # a tie
        cases.append(([(base + o) % (1 << SEQ_BITS) for o in offs], (base + min(offs))
                      % (1 << SEQ_BITS)))

    async def bench(ctx):
        for vs, want in cases:
            for s, v in zip(vals, vs, strict=True):
                ctx.set(s, v)
            assert ctx.get(out) == want, (vs, want)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
