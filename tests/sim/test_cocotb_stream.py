"""cocotb infrastructure on the demo skid pass-through: generated top, runner, driver/monitor.

Verilator (default) and Icarus, 64 and 512 bits; cocotbext-axi as the protocol reference. Each
design is built once (build/cocotb/, cached by the Verilog hash); the xdist group keeps one
design's tests on one worker.
"""

import functools

import pytest
from netreduce.hw.verilog import generate
from netreduce.sim.cocotb import CocotbFailure, build, run, simulator_missing
from netreduce.sim.cocotb.demo import SkidPassThrough

TB = "netreduce.sim.cocotb.tb_stream"


@functools.cache
def skid(width: int, sim: str, faulty: bool = False):
    reason = simulator_missing(sim)
    if reason:
        pytest.skip(reason)
    name = f"skid{width}" + ("_faulty" if faulty else "")
    return build(generate(SkidPassThrough(width, faulty=faulty), name), sim)


def design(sim: str, width: int, *extra):
    """A parameter with the design's xdist group: one worker builds and uses each design."""
    return pytest.param(sim, width, *extra, id=f"{sim}-{width}",
                        marks=pytest.mark.xdist_group(f"cocotb_skid{width}_{sim}"))


@pytest.mark.parametrize("sim,width", [design(s, w) for s in ("verilator", "icarus")
                                       for w in (64, 512)])
def test_skid_loopback(sim, width):
    b = skid(width, sim)
    r = run(b, TB, args={"frames": 60, "max_len": 9 * width // 8, "seed": width})
    assert {t["name"] for t in r.tests} == {
        "test_back_to_back", "test_idle_and_backpressure", "test_random_backpressure",
        "test_stuck_sink_times_out"}
    m = r.metrics
    # the demo DUT moves one beat per cycle when nothing stalls it, a third with a 1-in-3 sink
    assert m["back_to_back"]["beats_per_cycle"] > 0.9
    assert m["idle_backpressure"]["beats_per_cycle"] == pytest.approx(1 / 3, abs=0.02)
    assert m["back_to_back"]["frames"] == 60


@pytest.mark.parametrize("sim,width", [design("verilator", 512), design("icarus", 64)])
def test_cocotbext_axi_protocol(sim, width):
    r = run(skid(width, sim), "netreduce.sim.cocotb.tb_cocotbext", args={"frames": 6})
    assert len(r.tests) == 3


@pytest.mark.xdist_group("cocotb_skid64_faulty")
def test_faulty_dut_is_caught():
    """A pass-through that ignores backpressure loses beats: the harness must fail the run."""
    b = skid(64, "verilator", faulty=True)
    with pytest.raises(CocotbFailure, match="test_idle_and_backpressure: failed"):
        run(b, TB, args={"frames": 20, "seed": 5}, testcase="test_idle_and_backpressure")


@pytest.mark.xdist_group("cocotb_skid64_verilator")
def test_missing_cocotb_test_is_a_failure():
    b = skid(64, "verilator")
    with pytest.raises(CocotbFailure, match="no cocotb test ran"):
        run(b, TB, testcase="test_does_not_exist")
    again = build(b.top, "verilator")  # same Verilog: the cached build, not a new one
    assert again.build_dir == b.build_dir and (again.cached or again is b)
