"""RTLIL -> Verilog conversion (netreduce.hw.verilog.to_verilog): native Yosys when installed, the
built-in WebAssembly Yosys otherwise (said in the progress text), large RAMs without initial
content and with ram_style (netreduce.hw.rams)."""

import re
import shutil

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from netreduce.hw.rams import large_ram_attrs, large_ram_style, omit_large_ram_init
from netreduce.hw.verilog import ConversionError, generate, native_yosys, rtlil_to_verilog


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
    assert set(timings) == {"elaborate_s", "rtlil_s", "yosys_s", "rtlil_bytes"}
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
