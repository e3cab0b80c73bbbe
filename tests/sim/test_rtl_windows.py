"""The RTL fabric's windows (``RtlFabric(windowed=..., threaded=...)``) and the harness's
``send_at`` they rest on: running the engine in windows, in line or in a thread, must give the
outputs of running it event by event, cycle for cycle."""

import functools

import pytest
from netreduce.sim.net import simrun
from netreduce.sim.net.network import Link, LinkConfig, NetConfig
from netreduce.sim.net.scheduler import Scheduler
from netreduce.sim.net.simrun import BackendUnavailable, SimConfig, get_backend, run_sim
from netreduce.sim.rtl import fabric as rtl_fabric
from netreduce.sim.rtl.fabric import RtlFabric
from netreduce.sim.rtl.fastsim import FastSim, verilator_missing
from netreduce.sim.rtl.standin import standin_regmap, standin_top

from netreduce.regmap.clock import CLOCK_HZ, cycles_to_ns

A, B = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")


@functools.cache
def _standin():
    return standin_top(standin_regmap(2, 64))


def _sim():
    reason = verilator_missing()
    if reason:
        pytest.skip(reason)
    return FastSim(_standin())


def _frame(dst, src, n, tag):
    return dst + src + bytes([0x88, 0xB5]) + bytes([tag]) * (n - 14)


# ------------------------------------------------------------------------------ send_at
@pytest.mark.xdist_group("fastsim_standin")
def test_send_at_queues_the_frame_as_send_does_in_that_cycle():
    plan = [(0, 3, _frame(B, A, 100, 1)), (0, 40, _frame(B, A, 64, 2)),
            (1, 41, _frame(A, B, 300, 3)), (0, 41, _frame(B, A, 80, 4))]
    with _sim() as ref, _sim() as fut:
        want = []
        for p, c, f in plan:  # by hand: run to the cycle, then send
            want += ref.run_until(c)
            ref.send(p, f)
        want += ref.run(300 - ref.cycle)
        for p, c, f in plan:
            fut.send_at(p, f, c)
        assert fut.pending() == len(plan) and not fut.idle()
        got = fut.run(300)
        assert got == want and len(got) == len(plan)
        assert fut.idle()


@pytest.mark.xdist_group("fastsim_standin")
def test_send_at_keeps_the_order_of_the_calls_per_port():
    f1, f2 = _frame(B, A, 200, 1), _frame(B, A, 60, 2)
    with _sim() as sim:
        sim.run(10)
        sim.send_at(0, f1, 50)
        sim.send_at(0, f2, 20)  # before f1's cycle: leaves after f1 all the same
        sim.send_at(1, _frame(A, B, 60, 3), 5)  # in the past: queued at once
        got = sim.run(200)
    assert [g.frame for g in got if g.port == 0] == [f1, f2]
    first = next(g for g in got if g.port == 1)
    assert first.cycle < 50


def _load_both(sims, n: int, gap: int) -> None:
    """The same ``n`` frames, alternating ports, one every ``gap`` cycles, on every sim."""
    frames = [_frame(B, A, 100 + 50 * i, i) for i in range(n)]
    for sim in sims:
        for i, f in enumerate(frames):
            sim.send_at(i % 2, f, gap * i)


@pytest.mark.xdist_group("fastsim_standin")
def test_run_async_is_run_in_the_harness_thread():
    with _sim() as ref, _sim() as bg:
        _load_both((ref, bg), 6, 7)
        want = ref.run(150) + ref.run(150)
        bg.run_async(150)
        got = bg.join()
        bg.run_async(150)
        got += bg.join()
        assert bg.join() == []  # nothing in flight: no-op
        assert got == want and bg.cycle == ref.cycle == 300
        assert bg.stats()["run_cpu_seconds"] > 0


@pytest.mark.xdist_group("fastsim_standin")
def test_outputs_of_a_run_are_collected_while_the_next_one_runs():
    with _sim() as ref, _sim() as bg:
        _load_both((ref, bg), 8, 9)
        first, second = ref.run(120), ref.run(180)
        assert first and second
        bg.run_async(120)
        assert bg.join(collect=False) == []
        assert bg.outputs_ready() == len(first)
        bg.run_async(180)  # hands the first run's outputs over as it starts
        assert bg.collect() == first  # while the second run is in flight: only those
        assert bg.collect() == []
        assert bg.join() == second and bg.cycle == ref.cycle == 300
        assert bg.outputs_ready() == 0


def test_link_send_at_an_earlier_time():
    sched = Scheduler()
    got = []
    link = Link(sched, "x", "down", NetConfig(LinkConfig(latency_ns=500, gbps=100.0)), 0,
                lambda f: got.append((sched.now(), f)))
    sched.call_at(1000, lambda: link.send(b"a" * 100, at=700))
    sched.call_at(1000, lambda: link.send(b"b" * 100, at=710))  # queues behind a on the wire
    sched.run_all()
    ser = -(-(100 + 24) * 8 // 100)
    assert got == [(700 + ser + 500, b"a" * 100), (700 + 2 * ser + 500, b"b" * 100)]


# ------------------------------------------------------------------------------ the fabric
def test_window_follows_the_down_latency():
    class _Sim:  # RtlFabric only reads its configuration here
        pass

    net = NetConfig(LinkConfig(latency_ns=500))
    assert RtlFabric(_Sim(), net=net).window_cycles == (498 * CLOCK_HZ // 10**9) // 2
    # 2 windows must fit in the smallest down latency, whatever kind of frame
    fast_acks = NetConfig(LinkConfig(latency_ns=500),
                          overrides={("down", "ack"): LinkConfig(latency_ns=100)})
    w = RtlFabric(_Sim(), net=fast_acks).window_cycles
    assert 0 < w and cycles_to_ns(2 * w, ceil=True) + 1 < 100
    tiny = NetConfig(LinkConfig(latency_ns=20))
    assert RtlFabric(_Sim(), net=tiny).window_cycles == 0  # per event
    with pytest.raises(ValueError, match="latency"):
        RtlFabric(_Sim(), net=NetConfig(LinkConfig(latency_ns=4)), windowed=True)
    with pytest.raises(ValueError, match="send_at"):
        RtlFabric(_Sim(), net=net, threaded=True)


@pytest.mark.xdist_group("fastsim_standin")
def test_windowed_stand_in_matches_per_event_timing():
    """Two ports' bursts both ways through the stand-in: the same frames at the same times."""
    runs, pumps = {}, {}
    for mode, opts in (("event", {"windowed": False}), ("window", {"windowed": True}),
                       ("thread", {"threaded": True})):
        fab = RtlFabric(_sim(), net=NetConfig(LinkConfig(latency_ns=400, gbps=100.0)),
                        port_of=lambda mac: 0 if mac == A else 1, **opts)
        got = []
        for mac in (A, B):
            fab.attach(mac, lambda f, m=mac, fab=fab, got=got: got.append((fab.now(), m, f)))
        for i in range(30):
            fab.call_at(97 * i, fab.send, _frame(B, A, 60 + 41 * i, i))
            fab.call_at(131 * i, fab.send, _frame(A, B, 1400 - 37 * i, i))
        fab.run_all(timeout_ns=10**7)
        runs[mode] = (got, fab.stats["engine_in"], fab.stats["engine_out"],
                      fab.stats["late_outputs"])
        pumps[mode] = fab.stats["pumps"]
        fab.close()
    assert len(runs["event"][0]) == 60 and runs["event"][3] == 0
    assert runs["window"] == runs["event"]
    assert runs["thread"] == runs["event"]
    assert pumps["window"] < pumps["event"] / 2 and pumps["thread"] == pumps["window"]


# ------------------------------------------------------------------------------ end to end
SMALL = dict(data_width=64, pmtu_max=1024)


class _NoSendAt:
    """A FastSim without ``send_at``: the fabric feeds window arrivals itself (as for Icarus)."""

    def __init__(self, sim):
        self._sim = sim

    def __getattr__(self, name):
        if name == "send_at":
            raise AttributeError(name)
        return getattr(self._sim, name)


@pytest.fixture
def engine_backend():
    names = []
    try:
        get_backend("verilator").probe()
    except BackendUnavailable as e:
        pytest.skip(str(e))

    def reg(mode, opts):
        _, make, probe = rtl_fabric.make_rtl_backend("verilator", fabric_options=opts, **SMALL)
        kept = {}

        def mk(cfg, net, cap):
            fab = make(cfg, net, cap)
            if mode == "fallback":
                fab.sim = _NoSendAt(fab.sim)
            assert fab.sim.fast_edge, "the build should allow the fast rising edge"
            if mode == "event":  # the reference runs the model's full eval() at every edge
                assert not fab.sim.set_fast_edge(False)
            kept["fab"] = fab
            return fab

        name = f"verilator-w64-{mode}"
        simrun.register_backend(name, "test", mk, probe)
        names.append(name)
        return name, kept

    yield reg
    for n in names:
        simrun.BACKENDS.pop(n, None)


MODES = {"event": {"windowed": False}, "window": {"windowed": True, "threaded": False},
         "thread": {"threaded": True}, "fallback": {"windowed": True, "threaded": False}}


@pytest.mark.xdist_group("fastsim_engine")
@pytest.mark.parametrize("cfg", [
    dict(workers=4, size=16384, dtype="int32", loss=0.02, dup=0.02, reorder=0.02, seed=3),
    # float: the exponent pass's teardown and the value pass's set-up program the engine over
    # AXI4-Lite in the middle of the run
    dict(workers=3, size=8192, dtype="float32", loss=0.01, seed=2),
], ids=["int32-faults", "float32-loss"])
def test_allreduce_windows_match_per_event_cycle_for_cycle(engine_backend, cfg):
    runs = {}
    for mode, opts in MODES.items():
        name, kept = engine_backend(mode, opts)
        r = run_sim(SimConfig(**cfg, backend=name, timeout_ns=400_000_000))
        fab = kept["fab"]
        assert r.ok, (mode, r.error, r.checks, r.slots_left)
        runs[mode] = dict(sim_ns=r.sim_ns, ins=r.capture.ins, outs=r.capture.outs,
                          counters=r.engine_counters, jobs=r.job_counters, stats=r.stats,
                          links={d: dict(c) for d, c in r.link_stats.items()},
                          late=fab.stats["late_outputs"], pumps=fab.stats["pumps"],
                          window=fab.window_cycles)
    ev = runs.pop("event")
    assert ev["window"] == 0 and ev["late"] == 0 and ev["ins"] and ev["outs"]
    for mode, got in runs.items():
        assert got["window"] > 0, mode  # the windows are what runs
        for k in ("sim_ns", "ins", "outs", "counters", "jobs", "stats", "links", "late"):
            assert got[k] == ev[k], (mode, k)
