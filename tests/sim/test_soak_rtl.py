"""Bounded soak on the engine RTL (issue 9): the soak scenarios through the Verilog engine top
(Verilator, 64-bit build of netreduce.sim.rtl.soak_rtl.soak_params) inside the network model.

Each named scenario (netreduce.sim.verif.soak.rtl_ci_scenarios) runs two concurrent jobs of
different N and PMTU with one fault style: loss/dup/reorder on every direction and kind of traffic,
a burst outage, ACK-only loss, PSN wrap (with a float32 job), CE marks, the adversary. After each,
the same checks as on the model (run_scenario): every all-reduce bit-exact, every slot freed, the
counters balance (read over AXI4-Lite), the fabric and the links agree with the counters. Plus: the
fault really happened, and the harness saw no AXI-Stream protocol error or error-flagged output. Two
seeds of the random "rtl" profile run too.
"""

from __future__ import annotations

import pytest
from netreduce.sim.backend import BackendUnavailable, probe_backend
from netreduce.sim.rtl.soak_rtl import misfits, rtl_backend, soak_params
from netreduce.sim.verif.soak import (
    RTL_ENGINE,
    JobSpec,
    Scenario,
    random_scenario,
    rtl_ci_scenarios,
    run_scenario,
)

SCENARIOS = rtl_ci_scenarios()


@pytest.fixture(scope="module")
def backend():
    try:
        probe_backend("verilator")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    return rtl_backend()


def _run_ok(sc: Scenario, backend):
    rep = run_scenario(sc, backend)
    assert rep.violations == [], (sc.name, rep.violations)
    assert rep.ok and rep.allreduces == sum(j.rounds for j in sc.jobs)
    b = rep.backend
    assert b["backend"] == "verilator" and b["cycles"] > 0
    assert b["protocol_errors"] == 0 and b["engine_out_error"] == 0, b
    return rep


def _lost(links, kind):
    return links["up"].get(f"{kind}_lost", 0) + links["down"].get(f"{kind}_lost", 0)


@pytest.mark.xdist_group("fastsim_engine")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_rtl_soak_scenario(backend, name):
    sc = SCENARIOS[name]
    rep = _run_ok(sc, backend)
    links, c = rep.links, rep.counters
    assert len({j.world for j in sc.jobs}) == len({j.pmtu for j in sc.jobs}) == 2
    assert c["freed"] == c["released"] > 0
    if name == "rtl-every-direction":
        for d in ("up", "down"):
            assert links[d].get("lost", 0) > 0, (d, dict(links[d]))
        for what in ("duplicated", "reordered"):
            assert links["up"].get(what, 0) + links["down"].get(what, 0) > 0, what
        assert _lost(links, "data") > 0 and _lost(links, "ack") > 0
        assert rep.endpoint["retransmitted"] > 0 and c["reemits"] + c["duplicates"] > 0
    elif name == "rtl-burst-outage":
        assert set(links["outage_drops"]) == {"up", "down"}
        assert rep.endpoint["retransmitted"] > 0
    elif name == "rtl-ack-only-loss":
        assert _lost(links, "ack") > 0 and _lost(links, "data") == 0
    elif name == "rtl-psn-wrap":
        assert all(j.wrap for j in sc.jobs) and any(j.dtype == "float32" for j in sc.jobs)
        assert rep.allreduces == 3
    elif name == "rtl-ce-marks":
        assert c["cnp_sent"] > 0
    elif name == "rtl-adversary":
        assert sum(rep.adversary.values()) == links["injected"] > 0
        assert c["fwd_unregistered"] > 0 and len(rep.adversary) >= 4, rep.adversary


@pytest.mark.xdist_group("fastsim_engine")
@pytest.mark.parametrize("seed", [1, 3])
def test_rtl_soak_random_profile(backend, seed):
    sc = random_scenario(seed, "rtl")
    assert misfits(sc, backend.params) == []
    _run_ok(sc, backend)


def test_rtl_profile_fits_the_build():
    """Every scenario meant for the RTL fits its build (checked without building it)."""
    params = soak_params()
    assert {k: params[k] for k in RTL_ENGINE} == RTL_ENGINE
    for sc in [*SCENARIOS.values(), *(random_scenario(s, "rtl") for s in range(40))]:
        assert misfits(sc, params) == [], sc.name
        assert sc.engine == RTL_ENGINE


def test_a_scenario_that_does_not_fit_is_refused_in_one_line():
    sc = Scenario("too-big", 1, SCENARIOS["rtl-ce-marks"].net,
                  (JobSpec(world=12, elems=10, pmtu=4096), JobSpec(world=3, elems=10),
                   JobSpec(world=2, elems=10)))
    bad = misfits(sc, soak_params())
    assert any("3 concurrent jobs" in b for b in bad) and any("max_world" in b for b in bad)
    assert any("pmtu_max" in b for b in bad)
    with pytest.raises(ValueError, match="does not fit the RTL build") as e:
        rtl_backend()(sc, sc.net)
    assert "\n" not in str(e.value)


@pytest.mark.xdist_group("fastsim_lanes_soak")
def test_rtl_soak_lanes_every_direction():
    """The soak on the 2-port per-port-lanes build (soak_params(lanes=2), model D20; issue 17):
    two jobs (N = 3 and 5) whose endpoints alternate between the two ports, loss, duplication
    and reordering on every direction and kind of traffic. Same checks as the one-lane soak."""
    try:
        probe_backend("verilator")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    params = soak_params(lanes=2)
    assert params["ports"] == params["lanes"] == 2
    sc = SCENARIOS["rtl-every-direction"]
    assert misfits(sc, params) == []
    rep = _run_ok(sc, rtl_backend(params))
    links = rep.links
    for d in ("up", "down"):
        assert links[d].get("lost", 0) > 0, (d, dict(links[d]))
    assert links["up"].get("duplicated", 0) + links["down"].get("duplicated", 0) > 0
    assert rep.endpoint["retransmitted"] > 0 and rep.backend["params"]["lanes"] == 2
