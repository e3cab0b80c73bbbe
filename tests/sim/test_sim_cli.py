"""``netreduce sim``: runs, reports (JSON schema, summary, plot), checks its result, fails loudly
(mismatch, slot leak, hang) and rejects bad arguments with one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from netreduce.sim.net import simrun
from netreduce.sim.net.report import SCHEMA

from netreduce.cli import main
from netreduce.regmap import CLOCK_HZ


def _sim(*args):
    return CliRunner().invoke(main, ["sim", *args])


def test_sim_int32_report(tmp_path):
    rep_path, png = tmp_path / "r.json", tmp_path / "p.png"
    r = _sim("-n", "4", "-s", "64KiB", "--dtype", "int32", "--pmtu", "4096", "--json",
             str(rep_path), "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output and "netreduce sim summary" in r.output
    rep = json.loads(rep_path.read_text())
    assert rep["schema"] == SCHEMA and rep["ok"] and rep["clock_hz"] == CLOCK_HZ
    assert rep["config"]["workers"] == 4 and rep["config"]["size"] == 65536
    assert rep["simulated"]["cycles"] == rep["simulated"]["ns"] * CLOCK_HZ // 10**9 > 0
    assert rep["wire_limit"]["gbps"] == pytest.approx(100 * 4096 / (4096 + 82), abs=1e-3)
    ports = rep["goodput"]["ports"]
    assert [p["port"] for p in ports] == [0, 1, 2, 3]
    for p in ports:  # every rank's 64 KiB result left its port within the simulated time
        assert p["result_payload_bytes"] == 65536
        assert p["gbps"] == pytest.approx(65536 * 8 / rep["simulated"]["ns"], rel=0.01)
        assert 0 < p["fraction_of_wire_limit"] <= 1.0
    assert rep["slot_latency_ns"]["count"] == 16 and rep["slots"]["indices_started"] == 16
    assert rep["slots"]["left_allocated"] == 0
    assert rep["engine_counters"]["contributions"] == 64
    assert rep["check"]["results"][0]["ok"] and rep["check"]["error"] is None
    assert rep["recovery"]["retransmitted"] == 0
    assert len(rep["timeline"]["t_ns"]) == len(rep["timeline"]["slots_in_flight"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_float_lossy_jobs(tmp_path):
    rep_path = tmp_path / "r.json"
    r = _sim("-n", "3", "-s", "40000", "--loss", "0.02", "--dup", "0.01", "--reorder", "0.01",
             "--jobs", "2", "--pmtu", "256", "--seed", "3", "--json", str(rep_path))
    assert r.exit_code == 0, r.output
    rep = json.loads(rep_path.read_text())
    assert len(rep["check"]["results"]) == 2
    for c in rep["check"]["results"]:
        assert c["ok"] and c["worst_error_over_bound"] <= 1.0
    assert rep["recovery"]["retransmitted"] > 0 and rep["links"]["up"]["lost"] > 0
    assert {f["pass_id"] for f in rep["flows"]} == {"g0.exp", "g0.sum", "g1.exp", "g1.sum"}


def test_sim_fails_on_a_wrong_result(monkeypatch, tmp_path):
    real = simrun.make_inputs

    def racy(cfg, off=0):  # the check compares with other inputs than the ranks sent
        xs = real(cfg, off)
        out = [x.copy() for x in xs]
        xs[1][5] += np.int32(1)
        return _Swap(out, xs)

    class _Swap(list):
        def __init__(self, sent, checked):
            super().__init__(checked)
            self.sent = sent

    real_async = simrun.Communicator.allreduce_async
    monkeypatch.setattr(simrun, "make_inputs", racy)
    monkeypatch.setattr(simrun.Communicator, "allreduce_async",
                        lambda self, arrays: real_async(self, arrays.sent))
    rep_path = tmp_path / "r.json"
    r = _sim("-n", "2", "-s", "4KiB", "--dtype", "int32", "--json", str(rep_path))
    assert r.exit_code == 1 and "FAIL" in r.output and "bit-exact" in r.output, r.output
    rep = json.loads(rep_path.read_text())
    assert not rep["ok"] and rep["check"]["results"][0]["mismatched_elements"] == 1


def test_sim_fails_on_a_slot_leak(monkeypatch):
    monkeypatch.setattr(simrun.EngineControl, "slots_in_use", lambda self, job=None: 3)
    r = _sim("-n", "2", "-s", "4KiB", "--dtype", "int32")
    assert r.exit_code == 1 and "slots left allocated" in r.output, r.output


def test_sim_watchdog_on_hang(tmp_path):
    # every frame lost half the time and a 1 ms watchdog: the QP timeout (1 ms) cannot recover
    rep_path = tmp_path / "r.json"
    r = _sim("-n", "2", "-s", "64KiB", "--loss", "0.5", "--timeout-ms", "1", "--json",
             str(rep_path))
    assert r.exit_code == 3, r.output
    assert "watchdog" in r.output and "simulated-time limit" in r.output
    rep = json.loads(rep_path.read_text())
    assert rep["check"]["error_kind"] == "hang" and not rep["ok"]


@pytest.mark.parametrize("backend, probe", [("verilator", "fastsim.verilator_missing"),
                                            ("icarus", "icarus.icarus_missing")])
def test_sim_rtl_backend_without_simulator_is_one_line(backend, probe, monkeypatch):
    """An RTL backend whose simulator is missing fails in one line (exit 2), before building."""
    import importlib

    mod, attr = probe.split(".")
    monkeypatch.setattr(importlib.import_module(f"netreduce.sim.rtl.{mod}"), attr,
                        lambda: f"{backend} not found on PATH")
    r = _sim("--backend", backend, "-n", "2", "-s", "4KiB")
    assert r.exit_code == 2
    assert f"{backend} not found on PATH" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, msg", [
    (["--size", "6"], "multiple of 4"),
    (["--size", "1 parsec"], "cannot read size"),
    (["--workers", "1"], "--workers"),
    (["--loss", "0.9"], "--loss"),
    (["--dtype", "float16"], "--dtype"),
    (["--pmtu", "1500"], "--pmtu"),
    (["--jobs", "0"], "--jobs"),
    (["--backend", "vcs"], "--backend"),
    (["--workers", "64", "--size", "256MiB"], "in-process run"),
    (["--plot", "x.jpg"], ".png"),
    (["--frobnicate"], "--frobnicate"),
])
def test_sim_rejects_bad_options_in_one_line(args, msg):
    r = _sim(*args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and msg in lines[0], r.output


def test_sim_bad_pcap_prefix_is_one_line(tmp_path):
    r = _sim("-n", "2", "-s", "4KiB", "--pcap", str(tmp_path / "no" / "such" / "dir" / "x"))
    assert r.exit_code == 2 and "cannot write capture" in r.output, r.output
    assert "Traceback" not in r.output


def test_backend_registry():
    from netreduce.sim.backend import BACKENDS

    assert {"model", "verilator", "icarus"} <= set(BACKENDS)
    for name in BACKENDS:   # simrun has no list of its own: every engine backend is there
        assert simrun.get_backend(name).name == name
    with pytest.raises(ValueError, match="unknown backend 'x'"):
        simrun.get_backend("x")
    import netreduce.sim.rtl.icarus as icarus

    real = icarus.icarus_missing
    icarus.icarus_missing = lambda: "iverilog not found"
    try:
        with pytest.raises(simrun.BackendUnavailable, match="iverilog not found"):
            simrun.run_sim(simrun.SimConfig(workers=2, size=64, backend="icarus"))
    finally:
        icarus.icarus_missing = real
    with pytest.raises(ValueError, match="workers must be"):
        simrun.SimConfig(workers=1)
