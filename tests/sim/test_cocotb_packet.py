"""The assembled packet path (parser -> deparser loopback with bypass) under cocotb.

Verilator at 512 bits runs every testbench of sim/cocotb/tb_packet.py (loopback byte for byte,
payload replaced + ECN rewrite with ICRC/IPv4 checksum as netreduce.wire computes them, header
records against netreduce.wire and scapy, malformed frames flagged with parse()'s reason,
idle/backpressure, back-to-back frames of 60..9018 bytes); Icarus at 64 bits a smaller subset.
One build per design (build/cocotb/), one xdist group per design.
"""

import functools
import importlib.util

import pytest
from netreduce.sim.cocotb import build, run, simulator_missing

if importlib.util.find_spec("netreduce.hw.packet.deparser") is None:
    pytest.skip("netreduce.hw.packet (parser, deparser) not available", allow_module_level=True)

from netreduce.sim.cocotb.packet_top import packet_loopback_top  # noqa: E402

TB = "netreduce.sim.cocotb.tb_packet"
ALL = ["test_loopback_byte_for_byte", "test_payload_replaced", "test_malformed_classified",
       "test_idle_and_backpressure", "test_back_to_back_sizes"]


@functools.cache
def loopback(width: int, sim: str):
    reason = simulator_missing(sim)
    if reason:
        pytest.skip(reason)
    return build(packet_loopback_top(width), sim)


@pytest.mark.xdist_group("cocotb_packet512_verilator")
def test_packet_path_verilator_512():
    r = run(loopback(512, "verilator"), TB, testcase=ALL, args={"frames": 40, "seed": 11})
    assert sorted(t["name"] for t in r.tests) == sorted(ALL)
    m = r.metrics
    assert m["loopback"]["header_fields_compared"] > 40 * 20
    b2b = m["back_to_back"]
    assert b2b["frames"] == 12 and b2b["beats_out"] >= b2b["beats_in"] - 12


@pytest.mark.xdist_group("cocotb_packet64_icarus")
def test_packet_path_icarus_64():
    # Icarus runs this netlist at a few cycles per second: a handful of short frames
    subset = ["test_loopback_byte_for_byte", "test_payload_replaced"]
    r = run(loopback(64, "icarus"), TB, testcase=subset,
            args={"frames": 4, "ce_frames": 2, "seed": 12, "max_payload": 100})
    assert sorted(t["name"] for t in r.tests) == sorted(subset)
