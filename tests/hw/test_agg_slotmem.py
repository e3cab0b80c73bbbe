"""SlotMemory (netreduce.hw.agg.slotmem): read-modify-write with hazard forwarding, result port.

Every run is checked cycle by cycle against a model that applies the contributions in order with
the numpy lane model (netreduce.hw.agg.lanes.reference) and answers each result read with the
memory as it was when the read was accepted (contributions accepted at least read_latency + 1
cycles earlier).
"""

from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth.hdl import Const, Fragment
from amaranth.sim import Simulator
from netreduce.hw.agg.lanes import INT32_MAX, INT32_MIN, Op, reference
from netreduce.hw.agg.slotmem import SlotMemory

BAD_OP = 3  # the one undefined 2-bit operation code


class NoForwardSlotMemory(SlotMemory):
    """The design with hazard forwarding removed: reads are stale within read_latency cycles."""

    _forwarding = False


def pack_lanes(lanes) -> int:
    """int32 lanes -> beat integer: lane i = bytes 4i..4i+3 little-endian, byte k = bits 8k."""
    return int.from_bytes(np.asarray(lanes, dtype="<i4").tobytes(), "little")


def unpack_lanes(value: int, width: int) -> np.ndarray:
    return np.frombuffer(value.to_bytes(width // 8, "little"), dtype="<i4").astype(np.int32)


def keep_of(c, width) -> int:
    """Thermometer keep: every byte of a full beat, else the bytes of ``kept_lanes`` lanes."""
    nbytes = width // 8 if c.kept_lanes is None else 4 * c.kept_lanes
    return (1 << nbytes) - 1


def pack(layout, **fields) -> int:
    return sum((int(v) << layout[k].offset) for k, v in fields.items())


def unpack(layout, value: int) -> dict:
    return {name: (value >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


@dataclass
class Contrib:
    slot: int
    beat: int
    op: int
    data: np.ndarray
    overwrite: int = 0
    last: int = 0
    tag: int = 0
    kept_lanes: int | None = None  # None: a full beat; else keep covers this many lanes


@dataclass
class Run:
    """What a simulation saw: acceptance cycles and raw outputs."""

    contribs: list = field(default_factory=list)   # (cycle, Contrib)
    reads: list = field(default_factory=list)      # (cycle, slot, beat, tag)
    results: list = field(default_factory=list)    # (cycle, fields)
    events: list = field(default_factory=list)     # (cycle, fields)
    result_trace: list = field(default_factory=list)  # (valid, ready, raw payload) per cycle


def simulate(dut, plan, *, ready_prob=1.0, seed=0):
    """Run ``plan``: a list of per-cycle (Contrib or None, (slot, beat, tag) or None) entries.

    A read request is held (valid, stable payload) until accepted, so later planned reads queue
    up behind it. ``result.ready`` is high with probability ``ready_prob`` each cycle. After the
    plan, the bench keeps clocking with ready high until every read is answered.
    """
    rng = np.random.default_rng(seed)
    run = Run()
    c_layout, r_layout = dut.contrib_layout, dut.result_req_layout
    res_layout, ev_layout = dut.result_layout, dut.event_layout

    async def bench(ctx):
        queue = []
        cycle = 0
        drain = 0  # cycles with nothing left to send: the pipelines empty out
        while drain < dut.read_latency + 3:
            contrib, read = plan[cycle] if cycle < len(plan) else (None, None)
            drain = 0 if cycle < len(plan) or queue else drain + 1
            if read is not None:
                queue.append(read)
            ctx.set(dut.contrib.valid, contrib is not None)
            if contrib is not None:
                ctx.set(dut.contrib.payload.as_value(), pack(
                    c_layout, slot=contrib.slot, beat=contrib.beat, op=contrib.op,
                    overwrite=contrib.overwrite, last=contrib.last, tag=contrib.tag,
                    data=pack_lanes(contrib.data), keep=keep_of(contrib, dut.width)))
            ctx.set(dut.result_req.valid, bool(queue))
            if queue:
                slot, beat, tag = queue[0]
                ctx.set(dut.result_req.payload.as_value(),
                        pack(r_layout, slot=slot, beat=beat, tag=tag))
            ready = cycle >= len(plan) or rng.random() < ready_prob
            ctx.set(dut.result.ready, ready)

            assert ctx.get(dut.contrib.ready) == 1  # never stalls
            if contrib is not None:
                run.contribs.append((cycle, contrib))
            if queue and ctx.get(dut.result_req.ready):
                run.reads.append((cycle, *queue.pop(0)))
            r_valid = ctx.get(dut.result.valid)
            r_raw = ctx.get(dut.result.payload.as_value())
            run.result_trace.append((r_valid, ready, r_raw))
            if r_valid and ready:
                run.results.append((cycle, unpack(res_layout, r_raw)))
            if ctx.get(dut.events.valid):
                raw = ctx.get(dut.events.payload.as_value())
                run.events.append((cycle, unpack(ev_layout, raw)))
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return run


def check(dut, run, *, full_rate_reads):
    """Compare ``run`` with the model; return a list of mismatch descriptions (empty = pass).

    Protocol facts (latencies, stream stability) are asserted directly.
    """
    L, W = dut.read_latency, dut.width
    errors = []
    mem = {}
    expected_events = []
    ci = 0

    def apply(c):
        bad_slot = c.slot >= dut.slots
        bad_op = c.op not in (o.value for o in Op)
        ev = dict(slot=c.slot, beat=c.beat, overwrite=c.overwrite, last=c.last, tag=c.tag,
                  sat=0, saturated=0, bad_slot=int(bad_slot), bad_op=int(bad_op))
        if not (bad_slot or bad_op):
            addr = (c.slot, c.beat)
            old = mem.get(addr, np.zeros(W // 32, dtype=np.int32))
            new, sat = reference(c.op, old, c.data, first=bool(c.overwrite))
            mem[addr] = new
            kept = W // 32 if c.kept_lanes is None else c.kept_lanes
            ev["sat"] = sum(1 << i for i, s in enumerate(sat[:kept]) if s)
            ev["saturated"] = int(ev["sat"] != 0)
        expected_events.append(ev)

    # Reads in acceptance order; each sees the contributions accepted <= L + 1 cycles before.
    expected_results = []
    for r_cycle, slot, beat, tag in run.reads:
        while ci < len(run.contribs) and run.contribs[ci][0] <= r_cycle - L - 1:
            apply(run.contribs[ci][1])
            ci += 1
        bad = slot >= dut.slots
        value = np.zeros(W // 32, np.int32) if bad else mem.get(
            (slot, beat), np.zeros(W // 32, np.int32))
        expected_results.append((r_cycle, dict(slot=slot, beat=beat, tag=tag, bad_slot=int(bad)),
                                 value))
    while ci < len(run.contribs):
        apply(run.contribs[ci][1])
        ci += 1

    assert len(run.events) == len(run.contribs)
    for (e_cycle, got), (c_cycle, c), exp in zip(run.events, run.contribs, expected_events,
                                                  strict=True):
        assert e_cycle == c_cycle + L + 1, "event latency"
        if got != exp:
            errors.append(f"event for {c} at cycle {c_cycle}: got {got}, expected {exp}")

    assert len(run.results) == len(run.reads)
    for (res_cycle, got), (r_cycle, exp_meta, exp_value) in zip(run.results, expected_results,
                                                                strict=True):
        if full_rate_reads:
            assert res_cycle == r_cycle + L, "result latency"
        got = dict(got)
        data = got.pop("data")
        assert got == exp_meta
        value = unpack_lanes(data, W)
        if not np.array_equal(value, exp_value):
            errors.append(f"read {exp_meta} accepted at {r_cycle}: got {value}, "
                          f"expected {exp_value}")

    # A stalled result must hold: valid & ~ready implies the same valid payload next cycle.
    trace = run.result_trace
    for (v0, rdy0, p0), (v1, _, p1) in zip(trace, trace[1:], strict=False):
        if v0 and not rdy0:
            assert v1 and p1 == p0, "result changed while stalled"
    return errors


def lane_values(rng, n, *, extremes=0.3):
    pick = rng.random(n)
    edge = rng.choice(np.array([INT32_MAX, INT32_MIN, INT32_MAX - 3, INT32_MIN + 3, -1, 1, 0],
                               dtype=np.int64), n)
    big = rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True)
    small = rng.integers(-50, 50, n)
    return np.where(pick < extremes, edge, np.where(pick < 0.65, big, small)).astype(np.int32)


def random_plan(dut, rng, cycles, *, p_contrib=0.85, p_read=0.5, p_bad=0.03):
    """Random contributions over a tiny address space (so hazards at every distance are common),
    random ops, overwrites, idle cycles, occasional bad slot/op, and random reads."""
    n = dut.width // 32
    slot_space = 2 ** dut.slot_bits
    plan = []
    for _ in range(cycles):
        contrib = read = None
        if rng.random() < p_contrib:
            slot = int(rng.integers(0, dut.slots))
            op = int(rng.integers(0, 3))
            if rng.random() < p_bad:
                if slot_space > dut.slots and rng.random() < 0.5:
                    slot = int(rng.integers(dut.slots, slot_space))
                else:
                    op = BAD_OP
            contrib = Contrib(slot=slot, beat=int(rng.integers(0, dut.beats_per_slot)), op=op,
                              data=lane_values(rng, n), overwrite=int(rng.random() < 0.1),
                              last=int(rng.random() < 0.3),
                              tag=int(rng.integers(0, 2 ** dut.tag_width)))
            if contrib.last and rng.random() < 0.5:  # a short last beat
                contrib.kept_lanes = int(rng.integers(0, n))
        if rng.random() < p_read:
            read = (int(rng.integers(0, slot_space)), int(rng.integers(0, dut.beats_per_slot)),
                    int(rng.integers(0, 2 ** dut.tag_width)))
        plan.append((contrib, read))
    # Finally read back every address once the pipeline is empty.
    plan += [(None, None)] * (dut.read_latency + 2)
    plan += [(None, (s, b, 0)) for s in range(slot_space) for b in range(dut.beats_per_slot)]
    return plan


def small_dut(width, read_latency, cls=SlotMemory, slots=3):
    # 2 beats per slot; slots=3 is not a power of two, so slot 3 is a bad slot.
    return cls(width, slots=slots, pmtu_max=2 * width // 8, read_latency=read_latency,
               tag_width=3)


@pytest.mark.parametrize("width,read_latency,slots,cycles", [
    (64, 1, 3, 2000), (64, 2, 3, 2000), (64, 3, 3, 2000), (64, 4, 5, 1500),
    (512, 1, 3, 500), (512, 2, 3, 800), (512, 3, 5, 500),
])
def test_random_contributions_and_reads(width, read_latency, slots, cycles):
    dut = small_dut(width, read_latency, slots=slots)
    rng = np.random.default_rng(1000 * width + read_latency)
    run = simulate(dut, random_plan(dut, rng, cycles))
    assert check(dut, run, full_rate_reads=True) == []
    # The sequence must have exercised what it claims to.
    events = [e for _, e in run.events]
    assert any(e["saturated"] for e in events)
    assert any(e["bad_slot"] for e in events) and any(e["bad_op"] for e in events)
    assert hazard_distances(run) >= set(range(1, read_latency + 1))


@pytest.mark.parametrize("read_latency", [1, 2])
def test_random_with_result_backpressure(read_latency):
    dut = small_dut(64, read_latency)
    rng = np.random.default_rng(7 + read_latency)
    run = simulate(dut, random_plan(dut, rng, 400, p_read=0.7), ready_prob=0.5, seed=3)
    assert check(dut, run, full_rate_reads=False) == []
    stalls = sum(1 for v, rdy, _ in run.result_trace if v and not rdy)
    assert stalls > 20


def hazard_distances(run):
    """Distances (in cycles) between consecutive contributions to the same address."""
    last_seen, dists = {}, set()
    for cycle, c in run.contribs:
        key = (c.slot, c.beat)
        if key in last_seen:
            dists.add(cycle - last_seen[key])
        last_seen[key] = cycle
    return dists


def hazard_plan(dut, distance, *, op=Op.SUM_WRAP.value, filler_slot=1):
    """Initialise address (0, 0), then contributions to it ``distance`` cycles apart (a chain of
    four), with contributions to another address or idle cycles in between; then read back."""
    n = dut.width // 32
    rng = np.random.default_rng(distance)
    plan = [(Contrib(0, 0, op, lane_values(rng, n, extremes=0), overwrite=1), None)]
    plan += [(None, None)] * (dut.read_latency + 1)
    for i in range(4):
        plan.append((Contrib(0, 0, op, lane_values(rng, n, extremes=0)), None))
        for j in range(distance - 1):
            filler = Contrib(filler_slot, j % dut.beats_per_slot, op, lane_values(rng, n),
                             overwrite=1)  # independent of stale reads
            plan.append((filler if (i + j) % 2 == 0 else None, None))
    plan += [(None, None)] * (dut.read_latency + 1)
    plan += [(None, (0, 0, 0)), (None, (filler_slot, 0, 0))]
    return plan


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("read_latency", [1, 2, 3])
@pytest.mark.parametrize("op", [Op.SUM_WRAP.value, Op.SUM_SAT.value, Op.MAX.value])
def test_hazard_every_distance(width, read_latency, op):
    for distance in range(1, read_latency + 3):
        dut = small_dut(width, read_latency)
        run = simulate(dut, hazard_plan(dut, distance, op=op))
        assert check(dut, run, full_rate_reads=True) == [], f"distance {distance}"


@pytest.mark.parametrize("read_latency", [1, 2, 3])
def test_hazard_tests_catch_missing_forwarding(read_latency):
    """Without forwarding, every distance up to read_latency gives a wrong sum and longer ones
    are right: the hazard window is exactly read_latency, and the tests above would notice."""
    for distance in range(1, read_latency + 3):
        dut = small_dut(64, read_latency, cls=NoForwardSlotMemory)
        errors = check(dut, simulate(dut, hazard_plan(dut, distance)), full_rate_reads=True)
        if distance <= read_latency:
            assert errors, f"distance {distance}: stale read went unnoticed"
        else:
            assert errors == [], f"distance {distance}"
    dut = small_dut(64, read_latency, cls=NoForwardSlotMemory)
    rng = np.random.default_rng(5)
    run = simulate(dut, random_plan(dut, rng, 200))
    assert check(dut, run, full_rate_reads=True)


def test_arithmetic_edges_through_memory():
    """Hand-computed lane results through the RMW path, same address back to back."""
    W = 64
    dut = small_dut(W, 2)
    seq = [  # (op, overwrite, lanes in, expected lanes after, expected sat mask)
        (Op.SUM_SAT, 1, [INT32_MAX - 1, INT32_MIN + 1], [INT32_MAX - 1, INT32_MIN + 1], 0),
        (Op.SUM_SAT, 0, [5, -5], [INT32_MAX, INT32_MIN], 0b11),
        (Op.SUM_SAT, 0, [-3, 3], [INT32_MAX - 3, INT32_MIN + 3], 0),
        (Op.SUM_WRAP, 0, [4, -4], [INT32_MIN, INT32_MAX], 0),
        (Op.MAX, 0, [-7, -7], [-7, INT32_MAX], 0),
        (Op.MAX, 0, [-9, INT32_MIN], [-7, INT32_MAX], 0),
        (Op.SUM_WRAP, 1, [-2, 9], [-2, 9], 0),
        (Op.SUM_SAT, 0, [INT32_MIN, -9], [INT32_MIN, 0], 0b01),
    ]
    plan = []
    for op, ow, lanes, _, _ in seq:
        plan.append((Contrib(2, 1, op.value, np.array(lanes, np.int32), overwrite=ow), None))
        plan.append((None, (2, 1, 0)))  # read racing the writes: sees an older value
    plan += [(None, None)] * 4 + [(None, (2, 1, 5))]
    run = simulate(dut, plan)
    assert check(dut, run, full_rate_reads=True) == []
    for (_, ev), (_, _, _, _, sat) in zip(run.events, seq, strict=True):
        assert ev["sat"] == sat and ev["saturated"] == int(sat != 0)
    final = unpack_lanes(run.results[-1][1]["data"], W)
    assert final.tolist() == seq[-1][3]


def test_bad_input_leaves_memory_alone():
    dut = small_dut(64, 2)
    plan = [
        (Contrib(1, 0, Op.SUM_WRAP.value, np.array([10, 20], np.int32), overwrite=1), None),
        (Contrib(1, 0, BAD_OP, np.array([1, 1], np.int32)), None),
        (Contrib(1, 0, BAD_OP, np.array([1, 1], np.int32), overwrite=1), None),
        (Contrib(3, 0, Op.SUM_WRAP.value, np.array([5, 5], np.int32), overwrite=1), None),
        (Contrib(1, 0, Op.SUM_SAT.value, np.array([INT32_MAX, 0], np.int32)), None),
    ] + [(None, None)] * 4 + [(None, (1, 0, 0)), (None, (3, 0, 1))]
    run = simulate(dut, plan)
    assert check(dut, run, full_rate_reads=True) == []
    flags = [(e["bad_op"], e["bad_slot"], e["saturated"]) for _, e in run.events]
    assert flags == [(0, 0, 0), (1, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    (_, good), (_, bad) = run.results
    assert unpack_lanes(good["data"], 64).tolist() == [INT32_MAX, 20]
    assert bad["bad_slot"] == 1 and bad["data"] == 0 and bad["tag"] == 1


def test_interface_contract():
    dut = SlotMemory()
    assert (dut.beats_per_slot, dut.depth, dut.lanes) == (64, 65536, 16)
    assert dut.depth * dut.width // 8 == 4 * 2**20
    assert dut.contrib.signature.always_ready and dut.events.signature.always_ready
    assert not dut.result.signature.always_ready
    assert isinstance(dut.contrib.ready, Const)
    Fragment.get(dut, None)  # the default geometry elaborates (and the object counts as used)
    for kwargs, msg in [
        (dict(width=96), "data_width = 96"),  # the stream width rule (hw/stream.py)
        (dict(pmtu_max=96, width=512), "multiple of the beat size"),
        (dict(pmtu_max=192, width=512), "power of two"),
        (dict(read_latency=0), "read_latency"),
        (dict(slots=0), "slots"),
    ]:
        with pytest.raises(ValueError, match=msg):
            SlotMemory(**kwargs)


def test_padding_lanes_never_saturate():
    """Lanes outside keep (a short last beat) never raise saturation flags; kept lanes do."""
    dut = small_dut(64, 2)
    plan = [
        (Contrib(0, 1, Op.SUM_SAT.value, np.array([0, INT32_MAX], np.int32), overwrite=1), None),
        (Contrib(0, 1, Op.SUM_SAT.value, np.array([1, 1], np.int32), kept_lanes=1, last=1), None),
        (Contrib(0, 1, Op.SUM_SAT.value, np.array([INT32_MAX, 1], np.int32), kept_lanes=1),
         None),
        (Contrib(0, 1, Op.SUM_SAT.value, np.array([1, 1], np.int32), kept_lanes=0), None),
        (Contrib(0, 1, Op.SUM_SAT.value, np.array([1, 1], np.int32)), None),
    ] + [(None, None)] * 4 + [(None, (0, 1, 0))]
    run = simulate(dut, plan)
    assert check(dut, run, full_rate_reads=True) == []
    assert [(e["sat"], e["saturated"]) for _, e in run.events] == [
        (0, 0), (0, 0), (0b01, 1), (0, 0), (0b11, 1)]
    # Padding lanes are still combined (don't-care values that are never sent).
    assert unpack_lanes(run.results[0][1]["data"], 64).tolist() == [INT32_MAX, INT32_MAX]


def test_power_of_two_slots_without_tag():
    """Default-style parameters (no tag, every slot number valid, 4 beats per slot)."""
    dut = SlotMemory(64, slots=4, pmtu_max=32, read_latency=2)
    assert (dut.tag_width, dut.beats_per_slot) == (0, 4)
    rng = np.random.default_rng(11)
    run = simulate(dut, random_plan(dut, rng, 800))
    assert check(dut, run, full_rate_reads=True) == []
    assert not any(e["bad_slot"] for _, e in run.events)
