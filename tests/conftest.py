"""Shared test helpers and the suite's markers.

Helpers (import them with ``from conftest import ...``: ``tests/`` is on the test path, see
pyproject ``[tool.pytest.ini_options]``):

* :data:`DATA` / :data:`VECTORS`: the project's test data, and the independently verified RoCEv2
  frame vectors (``tests/data/roce_vectors.json``; ``A_*``/``B_*`` are ConnectX captures);
  :func:`roce_vectors` loads them.
* :func:`reference_icrc`: the ICRC of docs/roce.md written out once more, without netreduce.wire
  (a second, independent implementation for the tests that check the library and the gateware).

Markers (registered in pyproject): ``rtl`` (builds or runs the engine's Verilog: Verilator,
Icarus, cocotb), ``vmlab`` (boots QEMU guests), ``slow`` (minutes of Python on 2 cores).
``make test-quick`` deselects all three; ``make test`` runs everything. Files are marked here by
name (a new ``test_*_rtl.py`` or ``test_cocotb_*.py`` is marked too), and so is any test whose name
says it runs the RTL (``rtl``, ``verilator``, ``icarus``, ``fastsim``, ``cocotb``, ``standin``).
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
VECTORS = DATA / "roce_vectors.json"


def roce_vectors() -> list[dict]:
    """The verified vectors: dicts with ``name``, ``frame_hex`` and the expected fields."""
    return json.loads(VECTORS.read_text())["vectors"]


def reference_icrc(l3: bytes) -> bytes:
    """ICRC of ``l3`` (IPv4 header .. end of pad, ICRC excluded, IHL 5), as docs/roce.md prints
    it: CRC-32 over 8 x 0xFF and the masked headers, sent least-significant byte first."""
    b = bytearray(l3)
    b[1] = b[8] = 0xFF  # TOS, TTL
    b[10:12] = b[26:28] = b"\xff\xff"  # IPv4 header checksum, UDP checksum
    b[32] = 0xFF  # BTH FECN/BECN/reserved
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(b)))


# ------------------------------------------------------------------------------ markers
# Files that build or run the engine's RTL (Verilator / Icarus / cocotb) and are not named so.
RTL_FILES = {
    "test_rtl_backend.py", "test_rtl_fastsim.py", "test_rtl_windows.py", "test_fuzz_rtl.py",
    "test_soak_rtl.py", "test_switch_rtl.py", "test_pcap_check_sim.py", "test_mgmt_agent_rtl.py",
    "test_verilog_top.py", "test_engine_top.py", "test_engine_fast_retx.py", "test_mgmt_path.py",
}
VMLAB_FILES = {"test_vmlab_lab.py"}
# Pure-Python or Amaranth-simulator files that take minutes on 2 cores.
SLOW_FILES = {
    "test_boards_shell.py", "test_boards_estimate.py", "test_torch_ddp.py", "test_soak_ci.py",
    "test_agg_control.py", "test_packet_parser.py", "test_packet_deparser.py",
}


def _kind(name: str) -> str | None:
    if name in VMLAB_FILES:
        return "vmlab"
    if name in RTL_FILES or name.startswith("test_cocotb_") or name.endswith("_rtl.py"):
        return "rtl"
    if name in SLOW_FILES:
        return "slow"
    return None


# A test elsewhere whose name says it runs the RTL (e.g. ``test_demo_on_the_rtl``, ``[verilator]``).
RTL_WORDS = ("rtl", "verilator", "icarus", "fastsim", "cocotb", "standin")


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = _kind(item.path.name)
        if kind is None and any(w in item.name.lower() for w in RTL_WORDS):
            kind = "rtl"
        if kind is not None:
            item.add_marker(getattr(pytest.mark, kind))
