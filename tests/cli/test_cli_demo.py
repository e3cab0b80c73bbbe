"""``netreduce demo``: runs, checks its result, validates its options, fails loudly."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from netreduce.sw_driver import collective

from netreduce.cli import main


def _demo(*args):
    return CliRunner().invoke(main, ["demo", *args])


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
