"""The ToR topology (netreduce.sim.net.topology) and striping (netreduce.sim.net.stripe): no engine
port carries more than its rate (simulated time >= N x S / (P x C)) on the timed model and on
the RTL; stripes are bit-exact and recover their own losses; the engine timing comes from the
RTL's measured figures."""

import json

import pytest
from click.testing import CliRunner
from netreduce.sim.net import simrun
from netreduce.sim.net.simrun import BackendUnavailable, SimConfig, get_backend, run_sim
from netreduce.sim.net.stripe import stripe_bounds
from netreduce.sim.net.topology import EngineTiming, engine_timing, lower_bound_ns
from netreduce.sim.rtl import fabric as rtl_fabric

from netreduce.cli import main
from netreduce.regmap import CLOCK_HZ


def _bound(cfg):
    return lower_bound_ns(cfg.workers * cfg.jobs, cfg.size, cfg.nports, cfg.port_gbps)


def _data_ns(r):
    """From the first frame entering the engine to the last leaving it (register programming,
    which takes bus cycles on the RTL, excluded)."""
    ins = [c[0] for c in r.capture.ins]
    outs = [c[0] for c in r.capture.outs]
    return (max(outs) - min(ins)) * 1e9 / CLOCK_HZ


def _frame_ns(cfg):
    return (cfg.pmtu + 82) * 8 / cfg.port_gbps


@pytest.mark.parametrize("workers,ports,port_gbps,link_gbps,stripes", [
    (8, 1, 100, 100, 1), (8, 2, 100, 25, 1), (4, 1, 25, 100, 1), (8, 2, 100, 100, 2),
    (4, 2, 400, 400, 2)])
def test_no_engine_port_beyond_its_rate_on_the_model(workers, ports, port_gbps, link_gbps,
                                                     stripes):
    cfg = SimConfig(workers=workers, size=128 << 10, dtype="int32", pmtu=4096, ports=ports,
                    port_gbps=port_gbps, link_gbps=link_gbps, stripes=stripes)
    r = run_sim(cfg)
    assert r.ok, (r.error, r.checks)
    bound = _bound(cfg)
    # the datapath (512 bit x 250 MHz = 128 Gb/s per port) binds above it
    dp = lower_bound_ns(cfg.workers, cfg.size, cfg.nports, engine_timing().port_gbps)
    assert r.sim_ns >= max(bound, dp)
    assert _data_ns(r) >= max(bound, dp) - 2 * _frame_ns(cfg)
    assert r.sim_ns <= 1.6 * max(bound, dp, cfg.size * 8 / link_gbps)  # and it is no crawl
    assert r.stats["retransmitted"] == 0


def test_striping_bit_exact_float_and_per_stripe_recovery():
    cfg = SimConfig(workers=4, size=64 << 10, dtype="float32", pmtu=1024, ports=2,
                    port_gbps=100, stripes=2)
    r = run_sim(cfg)
    assert r.ok, (r.error, r.checks)
    assert {f.port for f in r.flows} == {0, 1}  # each stripe's flows on its own port
    lossy = run_sim(SimConfig(workers=4, size=64 << 10, dtype="int32", pmtu=1024, ports=2,
                              port_gbps=100, stripes=3, loss=0.02, seed=5))
    assert lossy.ok, (lossy.error, lossy.checks)
    assert lossy.stats["retransmitted"] > 0 and lossy.checks[0]["mismatched_elements"] == 0


def test_striping_across_two_engines():
    """Stripes round-robin over two engines on the same switch (each job registered on its
    engine): bit-exact, both engines used, the capacity of both counted."""
    cfg = SimConfig(workers=8, size=128 << 10, dtype="int32", pmtu=4096, ports=1,
                    port_gbps=100, stripes=2, engines=2)
    r = run_sim(cfg)
    assert r.ok, (r.error, r.checks)
    assert {f.port for f in r.flows} == {0, 1} and r.engine_counters["released"] == 32
    assert _bound(cfg) <= r.sim_ns < 0.7 * _bound(SimConfig(workers=8, size=128 << 10, ports=1,
                                                            port_gbps=100))
    with pytest.raises(ValueError, match="engines 2: several engines need"):
        SimConfig(engines=2, port_gbps=0)


def test_stripe_bounds_and_bad_options():
    assert stripe_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError, match="3 stripes for 2"):
        stripe_bounds(2, 3)
    with pytest.raises(ValueError, match="stripes must be 1..8, got 0"):
        SimConfig(stripes=0)
    with pytest.raises(ValueError, match="port_gbps .* got -1"):
        SimConfig(port_gbps=-1)
    r = CliRunner().invoke(main, ["sim", "--gbps", "33"])
    assert r.exit_code == 2 and "'33'" in r.output


def test_engine_timing_is_read_from_the_rtl_figures(tmp_path):
    tm = engine_timing()
    assert tm.data_width == 512 and 0 < tm.beats_per_cycle <= 1 and tm.latency_base > 0
    # bench/engine.py's format: a PMTU-256 WRITE ONLY contribution is 256 + 74 bytes = 42 beats
    # of 8 bytes, so 52 cycles of release latency fit base 10
    d = {"command": "x", "params": {"1": {"data_width": 64}}, "rows": [
        {"pmtu": 256, "in_beats_per_cycle_per_port": [0.5],
         "release_latency_unloaded_cycles": {"median": 52}}]}
    p = tmp_path / "e.json"
    p.write_text(json.dumps(d))
    t = EngineTiming.from_json(p)
    assert (t.data_width, t.beats_per_cycle, t.latency_base) == (64, 0.5, 10)
    assert t.beats(64) == 16  # 8 beats of 8 bytes at half a beat per cycle
    # a row with the bench's header_law: the contribution's beats as the bench built the frame
    d["rows"][0]["header_law"] = {"data_beats": 44}
    p.write_text(json.dumps(d))
    assert EngineTiming.from_json(p).latency_base == 8


def test_cli_report_carries_the_topology(tmp_path):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["sim", "-n", "4", "-s", "64KiB", "--dtype", "int32", "--pmtu",
                                  "4096", "--ports", "1", "--gbps", "25", "--port-gbps", "100",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    t = rep["topology"]
    assert (t["kind"], t["link_gbps"], t["engine_ports"], t["port_gbps"]) == ("tor", 25, 1, 100)
    assert t["time_over_bound"] >= 1
    assert rep["goodput"]["ports"][0]["gbps"] <= 100


@pytest.mark.xdist_group("fastsim_engine")
def test_no_engine_port_beyond_its_rate_on_the_rtl():
    """A small RTL run (the 64-bit build the RTL tests share: 4 ports): 4 ranks x 16 KiB through
    4 engine ports of 10 Gb/s, stripes on 2 of them."""
    try:
        get_backend("verilator").probe()
    except BackendUnavailable as e:
        pytest.skip(str(e))
    # slots=512 (int32 stripes need 2 x 256): the build test_rtl_backend.py already made
    simrun.register_backend("verilator-w64t", *rtl_fabric.make_rtl_backend(
        "verilator", data_width=64, pmtu_max=1024, slots=512))
    try:
        for stripes in (1, 2):
            cfg = SimConfig(workers=4, size=16384, dtype="int32", backend="verilator-w64t",
                            ports=4, port_gbps=10, stripes=stripes, timeout_ns=50_000_000)
            r = run_sim(cfg)
            assert r.ok, (r.error, r.checks)
            used = 4 if stripes == 1 else 2
            bound = lower_bound_ns(4, 16384, used, 10)
            assert r.sim_ns >= bound
            assert _data_ns(r) >= bound - 2 * _frame_ns(cfg)
    finally:
        simrun.BACKENDS.pop("verilator-w64t", None)
