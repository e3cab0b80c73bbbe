"""`netreduce regs`: the register reference generated from the map; docs/registers.md is current."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from netreduce.cli import COMMANDS, main
from netreduce.regmap import DEFAULT_PARAMS, MAGIC, build_regmap, constants, to_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "registers.md"


def _regs(*args):
    return CliRunner().invoke(main, ["regs", *args], prog_name="netreduce")


def test_registered_command():
    assert COMMANDS["regs"][:2] == ("netreduce.cli.regs", "regs")


def test_committed_docs_are_the_generated_reference():
    """docs/registers.md cannot go stale: it must equal `netreduce regs` byte for byte
    (regenerate with `netreduce regs -o docs/registers.md`)."""
    r = _regs()
    assert r.exit_code == 0, r.output
    assert r.output == to_markdown(build_regmap())
    assert DOC.read_text() == r.output, "docs/registers.md is stale: run netreduce regs -o " \
        "docs/registers.md"
    r = _regs("--check", str(DOC))
    assert r.exit_code == 0 and "up to date" in r.output


def test_check_reports_a_stale_file(tmp_path):
    stale = tmp_path / "registers.md"
    stale.write_text(DOC.read_text().replace("| FLOW | 0x8000", "| FLOW | 0x9000"))
    r = _regs("--check", str(stale), "--jobs", "8")
    assert r.exit_code == 1
    assert "-| FLOW | 0x9000" in r.output and "+| FLOW | 0x8000" in r.output
    assert "--jobs 8 -o" in r.output


@pytest.mark.parametrize("params", [{}, {"jobs": 2, "flows": 16, "pmtu_max": 1024}])
def test_formats_follow_the_parameters(params, tmp_path):
    args = [x for k, v in params.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    rm = build_regmap(**params)
    md = _regs(*args).output
    for k, v in {**DEFAULT_PARAMS, **params}.items():
        assert f"{k} = {v}" in md
    assert f"| FLOW | 0x8000 | 0x20 | {rm.params['flows']} |" in md

    data = json.loads(_regs("-f", "json", *args).output)
    assert data["params"] == rm.params
    assert {t["name"]: t["count"] for t in data["tables"]}["JOB"] == rm.params["jobs"]

    ns: dict = {}
    exec(_regs("--format", "python", *args).output, ns)  # noqa: S102 - our own generated text
    assert {k: ns[k] for k in constants(rm)} == constants(rm)
    assert ns["GLOBAL_MAGIC"] == 0 and MAGIC == rm.reg("GLOBAL.MAGIC").reset

    out = tmp_path / "nr.h"
    r = _regs("-f", "c", "-o", str(out), *args)
    assert r.exit_code == 0 and r.output == ""
    h = out.read_text()
    assert f"#define NR_FLOW_COUNT 0x{rm.params['flows']:X}u" in h
    assert f"#define NR_JOB_CTRL 0x{rm.addr('JOB.CTRL'):X}u" in h


def test_bad_parameters_are_clear_errors():
    r = _regs("--jobs", "99")
    assert r.exit_code == 1 and "jobs = 99" in r.output
    r = _regs("--pmtu-max", "1500")
    assert r.exit_code == 1 and "pmtu_max = 1500" in r.output
    r = _regs("--format", "yaml")
    assert r.exit_code == 2 and "yaml" in r.output
