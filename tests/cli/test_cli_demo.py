"""``netreduce demo``: runs, checks its result, validates its options, fails loudly; the engine
RTL on Verilator by default, the model when Verilator cannot run (one line says why)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from netreduce.sim.net import collective
from netreduce.sim.net.simrun import BackendUnavailable, SimConfig, get_backend
from netreduce.sim.rtl import fabric as rtl_fabric
from netreduce.sim.rtl import fastsim

from netreduce.cli import main
from netreduce.cli.demo import OVERRIDE_ENV, demo_rtl_params


def _flat(text: str) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(text.split())


def _demo(*args, backend="model"):
    return CliRunner().invoke(main, ["demo", *args, "--backend", backend])


@pytest.mark.parametrize("args", [
    ["--workers", "3", "--size", "64KiB", "--loss", "0.02"],
    ["--workers", "2", "--size", "10004", "--dtype", "int32", "--pmtu", "256", "--dup", "0.02",
     "--reorder", "0.02", "--seed", "9"],
])
def test_demo_passes(args):
    r = _demo(*args)
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output and "slots left allocated" in r.output
    assert "engine contributions" in r.output  # non-zero engine counters are listed


@pytest.mark.parametrize("args, msg", [
    (["--size", "6"], "multiple of 4"),
    (["--size", "1 parsec"], "cannot read size"),
    (["--workers", "1"], "--workers"),
    (["--loss", "0.9"], "--loss"),
    (["--dtype", "float16"], "--dtype"),
    (["--pmtu", "1500"], "--pmtu"),
    (["--workers", "64", "--size", "256MiB"], "in-process run"),
])
def test_demo_rejects_bad_options(args, msg):
    r = _demo(*args)
    assert r.exit_code == 2 and msg in r.output, r.output


def test_demo_fails_on_a_wrong_result(monkeypatch):
    real = collective.Communicator.allreduce

    def corrupt(self, arrays, progress=None):
        res = real(self, arrays, progress)
        res.results[1][3] += 1
        return res

    monkeypatch.setattr(collective.Communicator, "allreduce", corrupt)
    r = _demo("--workers", "2", "--size", "4KiB", "--dtype", "int32", "--loss", "0")
    assert r.exit_code == 1 and "MISMATCH on ranks [1]" in r.output and "FAIL" in r.output


# ------------------------------------------------------------------------------ RTL / fallback
def test_demo_defaults_to_verilator_and_falls_back_without_it(monkeypatch):
    monkeypatch.setattr(fastsim, "verilator_missing", lambda: "verilator not found (test)")
    r = CliRunner().invoke(main, ["demo", "-n", "2", "-s", "4KiB", "--dtype", "int32"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "not usable" in ln]
    assert len(lines) == 1 and "verilator not found (test)" in lines[0], r.output
    assert "running on the reference model" in lines[0]
    assert "engine: reference model" in _flat(r.output) and "PASS" in r.output


def test_demo_falls_back_on_a_build_failure(monkeypatch, tmp_path):
    def broken(params):
        raise fastsim.BuildError("verilator failed (exit 1); log /x/build.log:\n%Error: boom")

    monkeypatch.setattr(fastsim, "verilator_missing", lambda: None)
    monkeypatch.setattr("netreduce.sim.rtl.backend.engine_module", lambda: object())
    monkeypatch.setattr("netreduce.sim.rtl.backend.engine_top_path",
                        lambda params: tmp_path / "none.json")
    monkeypatch.setattr("netreduce.sim.rtl.backend.engine_top", broken)
    r = _demo("-n", "2", "-s", "4KiB", backend="verilator")
    assert r.exit_code == 0, r.output
    assert "Building the engine RTL" in r.output and "first run only" in _flat(r.output)
    lines = [ln for ln in r.output.splitlines() if "not usable" in ln]
    assert len(lines) == 1 and "build failed: BuildError: verilator failed" in lines[0]
    assert "boom" not in r.output  # one line, not the log
    assert "engine: reference model" in _flat(r.output) and "PASS" in r.output


def test_demo_rtl_params_are_one_port_512_bits():
    p = demo_rtl_params(4, 1024)
    assert p["data_width"] == 512 and p["ports"] == 1
    assert p == {**rtl_fabric.rtl_params(SimConfig(workers=4, ports=1)), "ports": 1}
    # the test override below gives exactly the 64-bit build the other RTL tests share
    assert demo_rtl_params(4, 1024, {"data_width": 64, "ports": 4}) == {
        **rtl_fabric.rtl_params(SimConfig(workers=4)), "data_width": 64, "pmtu_max": 1024}


@pytest.mark.parametrize("text", ["{nope", "[64]", '{"data_width": "wide"}'])
def test_demo_rejects_a_bad_override(monkeypatch, text):
    monkeypatch.setenv(OVERRIDE_ENV, text)
    r = _demo("-n", "2", "-s", "4KiB", backend="verilator")
    assert r.exit_code == 2 and OVERRIDE_ENV in r.output, r.output


@pytest.mark.xdist_group("fastsim_engine")
def test_demo_on_the_engine_rtl(monkeypatch):
    try:
        get_backend("verilator").probe()
    except BackendUnavailable as e:
        pytest.skip(str(e))
    # the 64-bit engine shared with the other RTL tests (the real demo builds the 512-bit one)
    monkeypatch.setenv(OVERRIDE_ENV, json.dumps({"data_width": 64, "ports": 4}))
    # no loss: a tail loss costs an RC timeout (1.05 ms = 338k idle cycles); the pcap tests
    # cover loss on the RTL with a shorter timeout
    r = _demo("-n", "4", "-s", "8KiB", "--dtype", "int32", "--loss", "0", "--dup", "0.02",
              "--reorder", "0.02", "--seed", "2", backend="verilator")
    assert r.exit_code == 0, r.output
    assert "engine: engine RTL on Verilator, 64-bit, 4 ports" in _flat(r.output)
    assert "not usable" not in r.output and "all ranks exact" in r.output
    assert "RTL cycles simulated" in r.output and "PASS" in r.output
