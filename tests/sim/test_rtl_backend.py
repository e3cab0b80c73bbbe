"""The RTL fabric and the ``verilator`` / ``icarus`` backends of ``netreduce sim``.

Fabric timing and the register bus run on the engine stand-in (a FIFO per port plus the register
bank: quick to build); the end-to-end all-reduce runs on the real engine top when
netreduce.hw.engine exists (its build is cached under build/fastsim/)."""

import functools

import pytest
from netreduce.sim.net import simrun
from netreduce.sim.net.network import LinkConfig, NetConfig
from netreduce.sim.net.simrun import BackendUnavailable, Capture, SimConfig, get_backend, run_sim
from netreduce.sim.rtl import fabric as rtl_fabric
from netreduce.sim.rtl.fabric import RtlFabric
from netreduce.sim.rtl.fastsim import FastSim, verilator_missing
from netreduce.sim.rtl.icarus import IcarusSim, icarus_missing
from netreduce.sim.rtl.standin import standin_regmap, standin_top
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import MAGIC, BusError, build_regmap
from netreduce.regmap.clock import cycles_to_ns, ns_to_cycles

A, B = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
LAT, GBPS = 500, 100.0


@functools.cache
def _top():
    return standin_top(standin_regmap(2, 64))


def _dut(kind):
    reason = verilator_missing() if kind == "verilator" else icarus_missing()
    if reason:
        pytest.skip(reason)
    return (FastSim if kind == "verilator" else IcarusSim)(_top())


def _fabric(kind):
    cap = Capture()
    net = NetConfig(LinkConfig(latency_ns=LAT, gbps=GBPS))
    fab = RtlFabric(_dut(kind), net=net, capture=cap, port_of=lambda mac: 0 if mac == A else 1)
    got = {A: [], B: []}
    for mac in (A, B):
        fab.attach(mac, lambda f, m=mac: got[m].append((fab.now(), f)))
    return fab, cap, got


def _frame(dst, src, n, tag):
    return dst + src + bytes([0x88, 0xB5]) + bytes([tag]) * (n - 14)


def _ser(n):
    return -(-(n + 24) * 8 // int(GBPS))


@pytest.mark.xdist_group("fastsim_standin")
@pytest.mark.parametrize("kind", ["verilator", "icarus"])
def test_frame_timing_through_the_rtl(kind):
    fab, cap, got = _fabric(kind)
    f = _frame(B, A, 100, 1)
    fab.send(f)
    fab.run_all(timeout_ns=10**6)
    # up link, queued at the arrival cycle, 13 beats + 2 cycles through the stand-in, down link
    arrive = _ser(100) + LAT
    c_in = ns_to_cycles(arrive)
    c_out = c_in + 12 + 2
    assert got[B] == [(cycles_to_ns(c_out, ceil=True) + _ser(100) + LAT, f)]
    assert [r[0] for r in cap.ins] == [] and cap.other_in == 1 and cap.other_out == 1
    assert fab.stats["engine_in"] == fab.stats["engine_out"] == 1
    assert fab.stats["late_outputs"] == 0
    fab.close()


@pytest.mark.xdist_group("fastsim_standin")
def test_burst_both_ways_arrives_intact_and_the_pump_stops():
    fab, cap, got = _fabric("verilator")
    sent = {A: [], B: []}
    for i in range(40):
        fa, fb = _frame(B, A, 60 + 37 * i, i), _frame(A, B, 1500 - 29 * i, i)
        fab.send(fa)
        fab.send(fb)
        sent[B].append(fa)
        sent[A].append(fb)
    fab.run_all(timeout_ns=10**7)  # terminates: the pump stops once the RTL is quiet
    for mac in (A, B):
        assert [f for _, f in got[mac]] == sent[mac]
        times = [t for t, _ in got[mac]]
        assert times == sorted(times)
    assert fab.stats["late_outputs"] == 0 and fab.stats["unroutable"] == 0
    assert fab.sim.idle()
    # the links serialise at 100 Gb/s: the last frame arrives no earlier than the wire allows
    assert got[A][-1][0] >= sum(_ser(len(f)) for f in sent[A]) + 2 * LAT


@pytest.mark.xdist_group("fastsim_standin")
def test_bus_programs_the_bank_through_axi_lite():
    fab, _, _ = _fabric("verilator")
    ctrl = EngineControl(fab.bus)
    info = ctrl.identify()
    assert (info.ports, info.data_width, info.jobs) == (2, 64, 2)
    assert fab.sim.cycle > 0 and fab.now() == 0  # register accesses take RTL cycles
    rm = standin_regmap(2, 64)
    fab.bus.write(rm.addr("GLOBAL.SCRATCH"), 0xA5A5_0F0F)
    assert fab.bus.read(rm.addr("GLOBAL.SCRATCH")) == 0xA5A5_0F0F
    with pytest.raises(BusError, match="DECERR"):
        fab.bus.read(rm.size + 0x40)
    with pytest.raises(BusError):
        fab.bus.write(rm.addr("GLOBAL.SCRATCH"), 1 << 32)


# ------------------------------------------------------------------------------ registry
def test_rtl_backends_are_registered():
    for name in ("verilator", "icarus"):
        b = get_backend(name)
        assert name.capitalize()[:4].lower() in b.description.lower()


@pytest.mark.parametrize("name", ["verilator", "icarus"])
def test_probe_says_in_one_line_when_the_engine_is_missing(monkeypatch, name):
    monkeypatch.setattr("netreduce.sim.rtl.backend.engine_module", lambda: None)
    monkeypatch.setattr("netreduce.sim.rtl.fastsim.verilator_missing", lambda: None)
    monkeypatch.setattr("netreduce.sim.rtl.icarus.icarus_missing", lambda: None)
    with pytest.raises(BackendUnavailable) as e:
        get_backend(name).probe()
    msg = str(e.value)
    assert "\n" not in msg and "netreduce.hw.engine" in msg and name in msg
    with pytest.raises(BackendUnavailable):
        run_sim(SimConfig(workers=2, size=64, backend=name))


def test_probe_says_in_one_line_when_the_simulator_is_missing(monkeypatch):
    monkeypatch.setattr("netreduce.sim.rtl.fastsim.verilator_missing",
                        lambda: "verilator not found (test)")
    monkeypatch.setattr("netreduce.sim.rtl.icarus.icarus_missing",
                        lambda: "Icarus Verilog (iverilog, vvp) is not installed")
    with pytest.raises(BackendUnavailable, match="verilator not found") as e:
        get_backend("verilator").probe()
    assert "\n" not in str(e.value)
    with pytest.raises(BackendUnavailable, match="iverilog"):
        get_backend("icarus").probe()


def test_rtl_params_cover_the_run():
    p = rtl_fabric.rtl_params(SimConfig(workers=8, jobs=2))
    assert p["ports"] == 8 and p["flows"] >= 2 * 8 * 2 and p["jobs"] >= 4
    assert p["slots"] >= 2 * (256 + 64) and p["max_world"] >= 8
    assert rtl_fabric.rtl_params(SimConfig(workers=3)) == rtl_fabric.rtl_params(
        SimConfig(workers=4, ports=3))  # powers of two: similar runs share a build


# ------------------------------------------------------------------------------ end to end
# A 64-bit engine (the 512-bit one takes many minutes to elaborate and compile); the backend
# code is the same, only the build parameters differ.
SMALL = dict(data_width=64, pmtu_max=1024)


@pytest.fixture
def small_backend():
    names = []

    def reg(sim):
        try:
            get_backend(sim).probe()
        except BackendUnavailable as e:
            pytest.skip(str(e))
        name = f"{sim}-w64"
        simrun.register_backend(name, *rtl_fabric.make_rtl_backend(sim, **SMALL))
        names.append(name)
        return name

    yield reg
    for n in names:
        simrun.BACKENDS.pop(n, None)


@pytest.mark.xdist_group("fastsim_engine")
@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_allreduce_through_the_engine_rtl(small_backend, dtype):
    r = run_sim(SimConfig(workers=4, size=16384, dtype=dtype, backend=small_backend("verilator"),
                          timeout_ns=50_000_000))
    assert r.error is None, r.error
    assert r.ok, (r.checks, r.slots_left)
    assert r.engine_counters["drop_icrc"] == 0
    assert r.engine_counters["contributions"] > 0
    assert r.capture.outs and len(r.capture.outs) >= len(r.capture.ins) // 2


@pytest.mark.xdist_group("fastsim_engine")
def test_allreduce_through_the_engine_rtl_with_faults(small_backend):
    r = run_sim(SimConfig(workers=4, size=16384, dtype="int32",
                          backend=small_backend("verilator"), loss=0.02, dup=0.02, reorder=0.02,
                          seed=3, timeout_ns=200_000_000))
    assert r.ok, (r.error, r.checks, r.slots_left)
    assert r.link_stats["up"]["lost"] + r.link_stats["down"]["lost"] > 0


@pytest.mark.xdist_group("fastsim_engine_icarus")
def test_allreduce_through_the_engine_on_icarus(small_backend):
    # Icarus runs this engine at ~1.3k idle / ~350 busy-port cycles per CPU second: a small
    # run (2 ranks, 1 KiB, ~2k cycles) on the build every 64-bit RTL test shares (4 ports)
    r = run_sim(SimConfig(workers=2, ports=4, size=1024, dtype="int32",
                          backend=small_backend("icarus"), timeout_ns=50_000_000))
    assert r.ok, (r.error, r.checks, r.slots_left)
    assert r.engine_counters["contributions"] == 2 and r.engine_counters["released"] == 1


def _small_engine_top():
    try:
        get_backend("verilator").probe()
    except BackendUnavailable as e:
        pytest.skip(str(e))
    return rtl_fabric.engine_top({**rtl_fabric.rtl_params(SimConfig(workers=4)), **SMALL})


@pytest.mark.xdist_group("fastsim_engine_icarus")
def test_engine_on_icarus_matches_verilator_cycle_for_cycle():
    """The engine top on both simulators: identity over AXI4-Lite, and non-RoCE frames
    forwarded unchanged on their port, leaving in the same cycles."""
    if icarus_missing():
        pytest.skip(icarus_missing())
    top = _small_engine_top()
    rm = build_regmap(**{**rtl_fabric.rtl_params(SimConfig(workers=4)), **SMALL})
    frames = [(1, B + A + bytes([0x08, 0x06]) + bytes(range(46))),
              (3, A + B + bytes([0x88, 0xB5]) + bytes(100))]
    outs = {}
    for kind, cls in (("verilator", FastSim), ("icarus", IcarusSim)):
        with cls(top) as sim:
            assert sim.axil_read(rm.addr("GLOBAL.MAGIC")) == MAGIC
            assert sim.axil_read(rm.addr("GLOBAL.PORTS")) == 4
            for p, f in frames:
                sim.send(p, f)
            got = sim.run(400)
            assert sorted((g.port, g.frame) for g in got) == sorted(frames), kind
            assert sim.axil_read(rm.addr("CNT.FWD_NOT_ROCE")) == 2
            outs[kind] = sorted(got)
    assert outs["verilator"] == outs["icarus"]
