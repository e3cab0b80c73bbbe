"""Logic depth of the management agent (netreduce.hw.mgmt.MgmtAgent) against the clock plan's
budget (docs/engine.md, "Clock plan": at 250 MHz at most 8 LUT-class cells and 8 CARRY8 per
register-to-register path, Yosys ``synth_xilinx -family xcup``).

Measured on its own at the CI register map (``hw/pathcheck.py`` ``levels()``: LUT and MUXF
cells on the worst path, CARRY8 on any path). The agent reads and answers byte-serially; what
keeps it shallow is described in its docstring (shift registers instead of byte muxes, half a
SipRound per cycle).
"""

import shutil

import pytest
from netreduce.hw.mgmt import MgmtAgent

from netreduce.regmap import build_regmap

LUT_BUDGET, CARRY_BUDGET = 8, 8
CI = dict(data_width=64, ports=1, jobs=2, flows=8, slots=8, pmtu_max=256, max_world=4)

# about a minute of Yosys on an idle 2-core machine: in `make test`, not in `make test-quick`
pytestmark = [pytest.mark.skipif(shutil.which("yosys") is None,
                                 reason="needs the native yosys (apt-get install yosys)"),
              pytest.mark.slow]


def test_mgmt_agent_meets_the_depth_budget():
    from netreduce.hw.pathcheck import levels

    lv = levels(MgmtAgent(build_regmap(**CI)))
    assert lv["lut_levels"] <= LUT_BUDGET, lv["lut_path"]
    assert lv["carry_max"] <= CARRY_BUDGET, lv
