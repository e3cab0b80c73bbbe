"""The engine top against the reference model: whole-engine scoreboard (issue 5).

* cocotb (``sim/cocotb/tb_engine.py``) on Verilator: one log per contract rule
  (:func:`netreduce.sim.verif.scenarios.unit_logs`: duplicate, re-emit, window, opcode/length
  mismatch, job isolation, disable mid-flight, SUM_SAT saturation and MAX, malformed/unregistered
  frames, CNP rate limit, PSN wrap) and the recorded closed-loop scenario library
  (:data:`netreduce.sim.verif.scenarios.SCENARIOS`: N 2..32, PMTU 256/1024/4096, loss/dup/reorder
  per direction, CE, PSN wrap, 2-4 jobs, float32 MAX + SUM_SAT passes, junk and spoofed frames),
  registers programmed through cocotbext-axi's AxiLiteMaster exactly as the driver programmed them.
  Every emitted frame is compared byte for byte per port and flow with the model, and so is every
  counter and state register; at the end all slots are free and the counters balance. All logs play
  in one simulator run (a reset between logs). Icarus plays a subset.
* FastSim (the frame-level Verilator harness of sim/rtl) through
  :class:`~netreduce.sim.verif.scenarios.FastSimBackend`: opt-in
  (``NETREDUCE_FASTSIM_SCENARIOS=1``),
  since it needs a second Verilator build of the engine and the cocotb run already plays the
  library.

One build per simulator and parameter set (:data:`ENGINE_PARAMS`); the tests of one simulator
share an xdist group, so the build and the played results are made once.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import pytest
from netreduce.sim.verif.scenarios import ENGINE_PARAMS, SCENARIOS, record, unit_logs
from netreduce.sim.verif.scoreboard import EventLog, check, replay

PARAMS = ENGINE_PARAMS
TB = "netreduce.sim.cocotb.tb_engine"
UNITS = list(unit_logs(PARAMS))
LIBRARY = list(SCENARIOS)
ICARUS_UNITS = ["reemit", "malformed"]


def _need_engine():
    try:
        import netreduce.hw.engine  # noqa: F401
    except ImportError as e:
        pytest.skip(f"engine top not available: {e}")


@functools.cache
def _logs() -> dict[str, tuple[EventLog, dict, bool]]:
    out = {n: (u.log, u.expect, u.end_state) for n, u in unit_logs(PARAMS).items()}
    for n in LIBRARY:
        sc, junk = SCENARIOS[n]
        r = record(sc, junk_every_ns=junk)
        assert r.report.ok, r.report.violations
        out[n] = (r.log, {}, True)
    return out


@functools.cache
def _cocotb_build(sim: str):
    from netreduce.sim.cocotb import build, simulator_missing
    from netreduce.sim.cocotb.tb_engine import icarus_top

    _need_engine()
    reason = simulator_missing(sim)
    if reason:
        pytest.skip(reason)
    from netreduce.sim.rtl.fabric import engine_top

    top = engine_top(PARAMS)
    if sim == "icarus":
        return build(icarus_top(top), sim)
    return build(top, sim, extra_args=("--output-split", "0"))


@functools.cache
def _played(sim: str, names: tuple[str, ...]) -> dict[str, tuple[EventLog, list, dict, list]]:
    """Play ``names`` in one simulator run; name -> (log as fed, outputs, state, errors)."""
    from netreduce.sim.cocotb import run

    b = _cocotb_build(sim)
    d = Path(tempfile.mkdtemp(prefix=f"nr-engine-{sim}-"))
    paths = []
    for n in names:
        p = d / f"{n}.jsonl"
        _logs()[n][0].save(p)
        paths.append(str(p))
    # Icarus skips the driver's recorded reads (table scans; they change nothing): it is slow
    r = run(b, TB, args={"params": PARAMS, "logs": paths, "outdir": str(d), "quiet": 256,
                         "reads": sim != "icarus"},
            tag=f"play-{len(names)}", timeout_s=1500)
    assert r.metrics["logs"] == len(names)
    out = {}
    for n in names:
        fed = EventLog.load(d / f"{n}.fed.jsonl")
        o = json.loads((d / f"{n}.out.json").read_text())
        outs = [(p, bytes.fromhex(h), c) for p, h, c in o["outs"]]
        out[n] = (fed, outs, o["state"], o["errors"])
    return out


def _score(sim: str, names: tuple[str, ...], name: str) -> None:
    log, expect, end_state = _logs()[name]
    c = replay(log).engine.counters()  # the log exercises its rule (on the model)
    assert {k: c[k] for k in expect} == expect
    fed, outs, state, errors = _played(sim, names)[name]
    assert not errors, errors
    assert len(fed.frames) == len(log.frames)
    rep = check(fed, outs, state, end_state=end_state)
    rep.assert_ok()


@pytest.mark.xdist_group("engine_cocotb_verilator")
@pytest.mark.parametrize("name", UNITS + LIBRARY)
def test_engine_verilator(name):
    _score("verilator", tuple(UNITS + LIBRARY), name)


@pytest.mark.xdist_group("engine_cocotb_icarus")
@pytest.mark.parametrize("name", ICARUS_UNITS)
def test_engine_icarus(name):
    _score("icarus", tuple(ICARUS_UNITS), name)


# ------------------------------------------------------------------------ FastSim library
@functools.cache
def _fastsim():
    _need_engine()
    from netreduce.sim.rtl.fabric import engine_top
    from netreduce.sim.rtl.fastsim import FastSim, verilator_missing

    reason = verilator_missing()
    if reason:
        pytest.skip(reason)
    return engine_top(PARAMS), FastSim


@pytest.mark.skipif(os.environ.get("NETREDUCE_FASTSIM_SCENARIOS") != "1",
                    reason="opt-in: NETREDUCE_FASTSIM_SCENARIOS=1 (a second engine build)")
@pytest.mark.xdist_group("engine_fastsim")
@pytest.mark.parametrize("name", LIBRARY)
def test_engine_scenario_fastsim(name):
    from netreduce.sim.verif.scenarios import FastSimBackend, score_backend

    top, FastSim = _fastsim()
    sc, junk = SCENARIOS[name]
    r = record(sc, junk_every_ns=junk)
    assert r.report.ok, r.report.violations
    with FastSim(top) as sim:
        rep = score_backend(FastSimBackend(sim, PARAMS), r.log)
    rep.assert_ok()
