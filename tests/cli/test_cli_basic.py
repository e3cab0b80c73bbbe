"""The command line: --help lists exactly COMMANDS, --version, `decode`, entry points."""

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from netreduce import __version__
from netreduce.cli import COMMANDS, main
from netreduce.wire import Opcode, RoceFrame
from netreduce.wire.pcap import write_pcap

ENTRY = Path(sys.executable).parent / "netreduce"
WIDE = {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}


def _listed(help_text: str) -> list[str]:
    """Command names of the Commands section of a click --help text, in order."""
    section = help_text.split("Commands:", 1)[1]
    return re.findall(r"^  (\S+)", section, re.M)


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **WIDE}, **kw)


def test_help_lists_exactly_the_commands():
    r = CliRunner().invoke(main, ["--help"], prog_name="netreduce")
    assert r.exit_code == 0, r.output
    assert _listed(r.output) == list(COMMANDS)
    for name, (_, _, help_) in COMMANDS.items():
        assert help_.split()[0] in r.output, name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_help(name):
    mod, attr, _ = COMMANDS[name]
    cmd = main.get_command(None, name)
    assert isinstance(cmd, click.Command), f"{mod}.{attr} is not a click command"
    r = CliRunner().invoke(main, [name, "--help"], prog_name="netreduce")
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"Usage: netreduce {name}")


def test_unknown_command_fails():
    r = CliRunner().invoke(main, ["no-such-command"], prog_name="netreduce")
    assert r.exit_code == 2 and "No such command" in r.output


def test_version():
    for flag in ("--version", "-V"):
        r = CliRunner().invoke(main, [flag], prog_name="netreduce")
        assert r.exit_code == 0
        assert r.output.strip() == f"netreduce, version {__version__}"


@pytest.mark.skipif(not ENTRY.exists(), reason=f"no installed entry point at {ENTRY}")
def test_installed_entry_point():
    r = _run([str(ENTRY), "--help"])
    assert r.returncode == 0, r.stderr
    assert _listed(r.stdout) == list(COMMANDS)
    r = _run([str(ENTRY), "--version"])
    assert r.returncode == 0 and __version__ in r.stdout


def test_python_dash_m():
    r = _run([sys.executable, "-m", "netreduce", "--help"])
    assert r.returncode == 0, r.stderr
    assert _listed(r.stdout) == list(COMMANDS)


# ---------------------------------------------------------------------------------- decode
FRAMES = [
    RoceFrame(opcode=Opcode.WRITE_ONLY_IMM, psn=0xFFFFFF, dqpn=0xAB, payload=b"\x01" * 64,
              imm=5, src_ip=0x0A000007, tos=0x03),
    RoceFrame.ack(psn=123456, msn=1, dqpn=0xCD),
]


def _decode(path, *extra):
    return CliRunner().invoke(main, ["decode", str(path), *extra], prog_name="netreduce",
                              env=WIDE)


def test_decode_pcap(tmp_path):
    path = tmp_path / "ok.pcap"
    write_pcap(path, [(i * 1000, f.pack()) for i, f in enumerate(FRAMES)])
    r = _decode(path)
    assert r.exit_code == 0, r.output
    for word in ("WRITE_ONLY_IMM", "16777215", "0x0000ab", "10.0.0.7", "ECN 3", "ACK",
                 "123456", "0x0000cd"):
        assert word in r.output, word
    r = _decode(path, "--limit", "1")
    assert r.exit_code == 0 and "WRITE_ONLY_IMM" in r.output and "123456" not in r.output


def test_decode_reports_bad_frames(tmp_path):
    good = FRAMES[0].pack()
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # ICRC
    ipv6 = good[:12] + b"\x86\xdd" + good[14:]
    path = tmp_path / "bad.pcap"
    write_pcap(path, [good, bytes(bad), ipv6])
    r = _decode(path)
    assert r.exit_code == 1  # a malformed RoCEv2 frame is an error
    assert "malformed: icrc" in r.output and "not RoCEv2: ethertype" in r.output
    assert _decode(path, "--no-check").exit_code == 0
    path2 = tmp_path / "other.pcap"
    write_pcap(path2, [good, ipv6])
    assert _decode(path2).exit_code == 0  # non-RoCE traffic is only listed


@pytest.mark.parametrize(("content", "message"), [
    (b"this is not a capture at all", "not a classic pcap file"),
    (b"\xd4\xc3", "too short for a pcap header"),
    (None, "data cut short"),
])
def test_decode_bad_file(tmp_path, content, message):
    path = tmp_path / "x.pcap"
    if content is None:
        write_pcap(path, [f.pack() for f in FRAMES])
        content = path.read_bytes()[:-3]
    path.write_bytes(content)
    r = _decode(path)
    assert r.exit_code == 1
    assert "Error:" in r.output and message in r.output
    assert isinstance(r.exception, SystemExit)  # a clean click error, no traceback
    assert "Traceback" not in r.output


def test_decode_missing_file(tmp_path):
    r = _decode(tmp_path / "missing.pcap")
    assert r.exit_code == 2 and "does not exist" in r.output
