"""Logic depth of the aggregation control blocks against the clock plan's budget (docs/engine.md,
"Clock plan": at 250 MHz at most 8 LUT-class cells and 8 CARRY8 per register-to-register path,
Yosys ``synth_xilinx -family xcup``).

The flow table is measured on its own at two sizes (one and two encoder / OR stages: its depth
must not grow with the number of entries); the control path (``ctl``, the flow table a black box)
comes from the engine's block-by-block estimate at the CI parameter set, which
tests/hw/test_boards_estimate.py computes too (cached by design digest: no second run).
"""

import shutil

import pytest
from netreduce.hw.agg.flowtable import FlowTable

LUT_BUDGET, CARRY_BUDGET = 8, 8
SMALL = dict(data_width=64, ports=1, jobs=2, flows=8, slots=8, pmtu_max=256, max_world=4)

pytestmark = pytest.mark.skipif(shutil.which("yosys") is None,
                                reason="needs the native yosys (apt-get install yosys)")


@pytest.mark.parametrize("flows", [8, 40])
def test_flow_table_meets_the_depth_budget(flows):
    from netreduce.hw.pathcheck import levels

    ft = FlowTable(flows, jobs=2, max_world=4)
    lv = levels(ft)
    assert lv["lut_levels"] <= LUT_BUDGET, lv["lut_path"]
    assert lv["carry_max"] <= CARRY_BUDGET, lv
    assert ft.lk_latency == 2 + (flows > 16) + 1 and ft.chk_latency == ft.lk_latency


def test_control_meets_the_depth_budget():
    from netreduce.hw.boards.vcu118 import VCU118Platform
    from netreduce.hw.estimate import estimate_design

    _, blocks = estimate_design("core", family="xcup", capacity=VCU118Platform.capacity, **SMALL)
    ctl = blocks["ctl"]
    assert ctl.carry_max <= CARRY_BUDGET, (ctl.carry_max, ctl.lut_from, ctl.lut_to)
    assert ctl.lut_levels <= LUT_BUDGET, (ctl.lut_levels, ctl.lut_from, ctl.lut_to, ctl.lut_path)
