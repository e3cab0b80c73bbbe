"""RTLIL -> Verilog conversion (netreduce.hw.verilog.to_verilog): native Yosys when installed, the
built-in WebAssembly Yosys otherwise (said in the progress text), large RAMs without initial
content and with ram_style (netreduce.hw.rams)."""

import re
import shutil

import pytest
from amaranth.hdl import Array, Cat, Const, Module, Signal
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from netreduce.hw.rams import large_ram_attrs, large_ram_style, omit_large_ram_init
from netreduce.hw.verilog import (
    ConversionError,
    generate,
    native_yosys,
    no_gc,
    rtlil_modules,
    rtlil_to_verilog,
    shared_lowering,
    to_verilog,
    yosys_jobs,
)


class _Rams(wiring.Component):
    """A large RAM (zero contents, ram_style) next to a small one with contents."""

    addr: In(4)
    data: Out(8)
    rom_data: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.big = big = Memory(shape=8, depth=16, init=[], attrs=large_ram_attrs())
        m.submodules.rom = rom = Memory(shape=8, depth=16, init=range(1, 17))
        w = big.write_port()
        r, rr = big.read_port(), rom.read_port()
        m.d.comb += [w.addr.eq(self.addr), w.data.eq(self.addr), w.en.eq(1),
                     r.addr.eq(self.addr), rr.addr.eq(self.addr), self.data.eq(r.data),
                     self.rom_data.eq(rr.data)]
        return m


def _check(text, style="ultra"):
    assert re.search(rf'\(\* ram_style = "{style}" \*\)\s*reg \[7:0\] big \[15:0\];', text)
    assert not re.search(r"^\s*big\[\d+\] = ", text, re.M)      # no initial content
    assert re.search(r"^\s*rom\[\d+\] = 8'h10;", text, re.M)    # the small ROM keeps its own


@pytest.mark.skipif(native_yosys() is None, reason="no native yosys >= 0.23 installed")
def test_native_conversion_reports_its_phases():
    said = []
    timings = {}
    top = generate(_Rams(), "rams", progress=lambda phase, text: said.append((phase, text)),
                   timings=timings)
    assert [p for p, _ in said] == ["elaborate", "rtlil", "yosys"]
    assert "native Yosys" in said[-1][1]
    assert set(timings) == {"elaborate_s", "rtlil_s", "yosys_s", "elaborate_cpu_s",
                            "rtlil_cpu_s", "yosys_cpu_s", "rtlil_bytes", "yosys_processes"}
    _check(top.verilog)


def test_without_native_yosys_the_builtin_one_converts_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("NETREDUCE_YOSYS", str(tmp_path / "no-yosys"))
    assert native_yosys() is None
    said = []
    with large_ram_style("block"):
        top = generate(_Rams(), "rams", progress=lambda phase, text: said.append(text))
    assert "built-in WebAssembly Yosys" in said[-1] and "slow" in said[-1]
    _check(top.verilog, "block")
    with pytest.raises(ConversionError, match="no native Yosys"):
        rtlil_to_verilog("", yosys="native")


def test_large_ram_rules():
    with pytest.raises(ValueError, match="large RAM style"):
        with large_ram_style("distributed"):
            pass
    from amaranth.back import rtlil

    class Bad(_Rams):
        def elaborate(self, platform):
            m = Module()
            m.submodules.big = Memory(shape=8, depth=4, init=[1], attrs=large_ram_attrs())
            m.d.comb += self.data.eq(Signal(8))
            return m

    with pytest.raises(ValueError, match="non-zero initial contents"):
        with omit_large_ram_init():
            rtlil.convert(Bad(), name="bad")


@pytest.mark.skipif(shutil.which("yosys") is None, reason="no native yosys")
def test_native_yosys_failure_is_one_error_with_the_log():
    with pytest.raises(ConversionError, match="failed"):
        rtlil_to_verilog("this is not rtlil\n", yosys="native")


class _Reversed(wiring.Component):
    """``n`` parities of table lookups, bit-reversed: each output bit slices the whole ``Cat``."""

    k: In(3)
    x: In(8)
    o: Out(8)

    def __init__(self, n=8):
        self._n = n
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        lookups = Cat(*[(self.x & Array(Const((i * 37 + j * 11) & 0xFF, 8)
                                          for j in range(8))[self.k]).xor()
                        for i in range(self._n)])
        m.d.comb += self.o.eq(lookups[::-1])
        return m


def test_shared_lowering_keeps_an_expression_used_many_times_one_netlist_node():
    from amaranth.back import rtlil
    from amaranth.hdl._xfrm import DomainLowerer

    plain = rtlil.convert(_Reversed(), name="t", emit_src=False)
    orig = DomainLowerer.on_value
    with shared_lowering(), shared_lowering():  # re-entrant
        shared = rtlil.convert(_Reversed(), name="t", emit_src=False)
    assert DomainLowerer.on_value is orig
    # 8 lookups; without the memo, each of the 8 output bits re-lowered all 8 of them
    assert shared.count("switch") == 8 and plain.count("switch") == 64


@pytest.mark.skipif(native_yosys() is None or shutil.which("iverilog") is None,
                    reason="needs a native yosys and Icarus")
def test_shared_lowering_is_the_same_logic(tmp_path):
    import subprocess

    (tmp_path / "rev.v").write_text(generate(_Reversed(), "rev").verilog)
    (tmp_path / "tb.v").write_text("""`timescale 1ns/1ps
module tb; reg clk = 0, rst = 0; reg [2:0] k; reg [7:0] r; wire [7:0] o; integer i, j;
rev dut(.clk(clk), .rst(rst), .k(k), .x(r), .o(o));
initial begin for (i = 0; i < 8; i = i + 1) for (j = 0; j < 256; j = j + 1) begin
k = i; r = j; #1 $display("%0d %0d %0d", i, j, o); end $finish; end endmodule
""")
    subprocess.run(["iverilog", "-o", "sim", "tb.v", "rev.v"], cwd=tmp_path, check=True)
    lines = subprocess.run(["vvp", "-n", "sim"], cwd=tmp_path, check=True, capture_output=True,
                           text=True).stdout.split("\n")
    got = {(int(a), int(b)): int(c) for a, b, c in (ln.split() for ln in lines
                                                     if ln.count(" ") == 2)}
    assert len(got) == 8 * 256
    for (k, reg), o in got.items():  # the parities, computed here
        bits = [bin(reg & ((i * 37 + k * 11) & 0xFF)).count("1") & 1 for i in range(8)]
        assert o == sum(b << (7 - i) for i, b in enumerate(bits)), (k, reg)


def test_no_gc_restores_the_collector():
    import gc

    assert gc.isenabled()
    with no_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Tree(wiring.Component):
    """A top with three submodules of different sizes (one nested)."""

    a: In(16)
    o: Out(16)

    def elaborate(self, platform):
        m = Module()
        subs = []
        for i, width in enumerate((16, 8, 4)):
            s = Module()
            acc = Signal(16, name=f"acc{i}")
            s.d.sync += acc.eq(acc + (self.a[:width] ^ i))
            if i == 2:
                inner = Module()
                t = Signal(16, name="t")
                inner.d.comb += t.eq(acc.rotate_left(3) + 1)
                s.submodules.inner = inner
                acc = t
            subs.append(acc)
            m.submodules[f"s{i}"] = s
        m.d.comb += self.o.eq(subs[0] ^ subs[1] ^ subs[2])
        return m


def _ports(top):
    return {"a": (top.a, PortDirection.Input), "o": (top.o, PortDirection.Output)}


def test_rtlil_modules_are_amaranths_rtlil_cut_at_module_boundaries():
    from amaranth.back import rtlil
    from amaranth.hdl._ir import Fragment

    top = _Tree()
    mods = rtlil_modules(Fragment.get(top, None), _ports(top), "tree")
    whole, _ = rtlil.convert_fragment(Fragment.get(top, None), _ports(top), "tree",
                                      emit_src=False)
    assert len(mods) == 5 and all(m.lstrip().startswith(("attribute", "module")) for m in mods)
    assert "".join(mods) == whole


@pytest.mark.skipif(native_yosys() is None, reason="no native yosys >= 0.23 installed")
def test_parallel_yosys_writes_the_same_verilog(monkeypatch):
    out = {}
    for jobs in ("1", "3"):
        monkeypatch.setenv("NETREDUCE_YOSYS_JOBS", jobs)
        top, timings = _Tree(), {}
        out[jobs] = to_verilog(top, "tree", _ports(top), timings=timings)
        assert timings["yosys_processes"] == int(jobs)
    # the same modules; only Yosys's internal numbering ($procmux$17...) may differ
    def norm(v):
        return sorted(re.sub(r"\$\d+", "$N", v).splitlines())

    assert norm(out["1"]) == norm(out["3"])
    assert out["3"].count("Generated by Yosys") == 1


def test_yosys_jobs_setting(monkeypatch):
    monkeypatch.setenv("NETREDUCE_YOSYS_JOBS", "2")
    assert yosys_jobs() == 2
    monkeypatch.delenv("NETREDUCE_YOSYS_JOBS")
    assert 1 <= yosys_jobs() <= 4
    for bad in ("0", "two"):
        monkeypatch.setenv("NETREDUCE_YOSYS_JOBS", bad)
        with pytest.raises(ValueError, match=f"NETREDUCE_YOSYS_JOBS='{bad}'"):
            yosys_jobs()
