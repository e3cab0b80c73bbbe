"""cocotb: the 2-port per-port-lanes engine (``lanes = 2``, model D20; issue 17) against the model.

One closed-loop scenario recorded on the model (netreduce.sim.verif.scenarios.record): two jobs
(N = 3, PMTU 256 and N = 2, PMTU 512) whose endpoints spread over both ports, loss and
duplication on every direction, so both ports carry contributions, duplicates and
retransmissions of both jobs. The engine top (64-bit, the soak's lanes build
``soak_params(lanes=2)``) plays the log under cocotb on Verilator (sim/cocotb/tb_engine.py);
every frame it sends is compared byte for byte per port and flow with the model's, and so is every
counter and state register; at the end every slot is free.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest
from netreduce.sim.net.network import NetConfig
from netreduce.sim.rtl.soak_rtl import soak_params
from netreduce.sim.verif.scenarios import record
from netreduce.sim.verif.scoreboard import EventLog, check
from netreduce.sim.verif.soak import JobSpec, Scenario

PARAMS = soak_params(lanes=2)
TB = "netreduce.sim.cocotb.tb_engine"
SCENARIO = Scenario(
    "lanes2_loss_dup", 17, NetConfig.faulty(loss=0.04, dup=0.04),
    (JobSpec(world=3, elems=300, pmtu=256, window=8, msg_packets=2, timeout=4),
     JobSpec(world=2, elems=400, pmtu=512, window=8, msg_packets=2, timeout=4)),
    (), 0, dict(PARAMS), 5 * 10**6)


@functools.cache
def _recorded():
    r = record(SCENARIO, params=PARAMS)
    assert r.report.ok, r.report.violations
    return r


@functools.cache
def _played():
    from netreduce.sim.cocotb import build, run, simulator_missing
    from netreduce.sim.rtl.fabric import engine_top

    reason = simulator_missing("verilator")
    if reason:
        pytest.skip(reason)
    b = build(engine_top(PARAMS), "verilator", extra_args=("--output-split", "0"))
    d = Path(tempfile.mkdtemp(prefix="nr-lanes-"))
    log = _recorded().log
    log.save(d / "lanes.jsonl")
    r = run(b, TB, args={"params": PARAMS, "logs": [str(d / "lanes.jsonl")], "outdir": str(d),
                         "quiet": 256, "reads": True}, tag="lanes", timeout_s=1500)
    assert r.metrics["logs"] == 1
    fed = EventLog.load(d / f"{log.name}.fed.jsonl")
    o = json.loads((d / f"{log.name}.out.json").read_text())
    return fed, [(p, bytes.fromhex(h), c) for p, h, c in o["outs"]], o["state"], o["errors"]


def test_lanes_scenario_exercises_both_ports():
    """On the model: loss and duplication happened, and frames entered on both ports."""
    r = _recorded()
    links = r.report.links
    assert links["up"].get("lost", 0) + links["down"].get("lost", 0) > 0
    assert links["up"].get("duplicated", 0) + links["down"].get("duplicated", 0) > 0
    c = r.report.counters
    assert c["duplicates"] + c["reemits"] > 0 and c["released"] == c["freed"] > 0
    ports = {}
    for e in r.log.frames:
        ports.setdefault(e.a, 0)
        ports[e.a] += 1
    assert set(ports) == {0, 1}, ports


@pytest.mark.xdist_group("engine_cocotb_lanes")
def test_cocotb_lanes_two_ports_loss_dup():
    fed, outs, state, errors = _played()
    assert not errors, errors
    log = _recorded().log
    assert len(fed.frames) == len(log.frames)
    assert {p for p, _, _ in outs} == {0, 1}
    check(fed, outs, state, end_state=True).assert_ok()
