"""`netreduce sim --datapath-gbps/--pfc/--ecn/--dcqcn` (issue 22): a 2:1 overloaded engine port
from the command line; the report carries the input buffers' drops and PFC frames."""

import json

from click.testing import CliRunner

from netreduce.cli import main

BASE = ["sim", "-n", "2", "--ports", "2", "--port-gbps", "100", "--datapath-gbps", "50",
        "--size", "128KiB", "--dtype", "int32"]


def _sim(tmp_path, *extra):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(main, [*BASE, *extra, "--json", str(out)], prog_name="netreduce")
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_pfc_run_has_no_drops(tmp_path):
    r, rep = _sim(tmp_path, "--pfc", "--ecn", "--dcqcn")
    assert r.exit_code == 0, r.output
    ein = rep["links"]["engine_in"]
    assert ein["rx_drop_full"] == ein["lost"] == 0 and ein["pfc_tx"] > 0
    assert "--pfc --ecn --dcqcn" in rep["command"]
    assert "engine input buffers" in r.output


def test_without_reaction_drops_are_counted_and_recovered(tmp_path):
    r, rep = _sim(tmp_path, "--no-pfc")
    assert r.exit_code == 0, r.output  # RC retransmission completes the all-reduce
    ein = rep["links"]["engine_in"]
    assert ein["rx_drop_full"] > 0 and ein["pfc_tx"] == 0
    assert rep["recovery"]["retransmitted"] > 0 and "--no-pfc" in rep["command"]


def test_pfc_needs_a_limited_datapath():
    r = CliRunner().invoke(main, ["sim", "--pfc"], prog_name="netreduce")
    assert r.exit_code == 2 and "datapath_gbps" in r.output
    r = CliRunner().invoke(main, ["sim", "--datapath-gbps", "50", "--port-gbps", "0"],
                           prog_name="netreduce")
    assert r.exit_code == 2 and "ToR" in r.output
