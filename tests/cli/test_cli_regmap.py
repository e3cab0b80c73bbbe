"""``netreduce regmap``: generated docs and constants come from netreduce.regmap."""

from __future__ import annotations

import json

from click.testing import CliRunner

from netreduce.cli import main
from netreduce.regmap import build_regmap, constants


def test_regmap_markdown_and_params():
    r = CliRunner().invoke(main, ["regmap", "--param", "jobs=4"])
    assert r.exit_code == 0, r.output
    assert "| JOB | 0x1000 | 0x40 | 4 |" in r.output and "## FLOW" in r.output


def test_regmap_python_constants_match(tmp_path):
    out = tmp_path / "regs.py"
    r = CliRunner().invoke(main, ["regmap", "--format", "py", "-o", str(out)])
    assert r.exit_code == 0, r.output
    ns: dict = {}
    exec(out.read_text(), ns)  # noqa: S102 - our own generated text
    c = constants(build_regmap())
    assert {k: ns[k] for k in c} == c


def test_regmap_json_and_bad_param():
    r = CliRunner().invoke(main, ["regmap", "--format", "json"])
    assert json.loads(r.output)["tables"][2]["name"] == "JOB"
    r = CliRunner().invoke(main, ["regmap", "--param", "jobs=99"])
    assert r.exit_code != 0 and "jobs = 99" in r.output
    r = CliRunner().invoke(main, ["regmap", "--param", "lanes"])
    assert r.exit_code != 0 and "NAME=INTEGER" in r.output
