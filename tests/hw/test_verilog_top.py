# amaranth: UnusedElaboratable=no
"""netreduce.hw.verilog.generate: AXI-Stream port names and payload bit mapping (no simulator).

The cocotb tests (tests/sim/test_cocotb_stream.py) prove the generated tops in simulation.
"""

import re

import pytest
from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from netreduce.hw.verilog import generate
from netreduce.sim.cocotb.demo import SkidPassThrough


def top_ports(verilog: str, name: str) -> dict[str, tuple[str, int]]:
    m = re.search(rf"^module {name} \((.*?)\);", verilog, re.S | re.M)
    assert m, f"no module {name}"
    out = {}
    for line in m.group(1).split(","):
        d = re.match(r"\s*(input|output) wire (?:\[(\d+):0\] )?(\w+)", line)
        out[d.group(3)] = (d.group(1), int(d.group(2)) + 1 if d.group(2) else 1)
    return out


class Multi(wiring.Component):
    """Two stream inputs, a plain-payload output, a nested signature and a plain port."""

    def __init__(self):
        beat = data.StructLayout({"data": 32, "keep": 4, "last": 1, "flag": 1})
        super().__init__({
            "i_rx": In(stream.Signature(beat)),
            "i_loop": In(stream.Signature(beat)),
            "o": Out(stream.Signature(16)),
            "stats": Out(wiring.Signature({"drops": Out(8), "clear": In(1)})),
            "enable": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.payload.eq(self.i_rx.payload.data[:16] ^ self.i_loop.payload.data),
                     self.o.valid.eq(self.i_rx.valid & self.enable),
                     self.i_rx.ready.eq(self.o.ready), self.i_loop.ready.eq(self.o.ready)]
        m.d.sync += self.stats.drops.eq(self.stats.drops + self.stats.clear)
        return m


def test_single_stream_names_and_widths():
    top = generate(SkidPassThrough(64), "skid")
    assert top.verilog.splitlines()[0] == "`timescale 1ns/1ps"
    p = top_ports(top.verilog, "skid")
    assert p == {
        "clk": ("input", 1), "rst": ("input", 1),
        "s_axis_tdata": ("input", 64), "s_axis_tkeep": ("input", 8),
        "s_axis_tlast": ("input", 1), "s_axis_tuser": ("input", 4),
        "s_axis_tvalid": ("input", 1), "s_axis_tready": ("output", 1),
        "m_axis_tdata": ("output", 64), "m_axis_tkeep": ("output", 8),
        "m_axis_tlast": ("output", 1), "m_axis_tuser": ("output", 4),
        "m_axis_tvalid": ("output", 1), "m_axis_tready": ("input", 1),
        "frames": ("output", 32), "beats": ("output", 32),
    }
    assert p == top.ports
    s = top.stream("s_axis")
    assert (s.direction, s.has_first, s.has_last) == ("in", True, True)
    assert s.user_bit("user.err") == (0, 1) and s.user_bit("user.tag") == (1, 3)
    with pytest.raises(KeyError, match="no user field"):
        s.user_bit("nope")
    # the inner module is the Amaranth core, instantiated once
    assert "module skid_core(" in top.verilog
    assert top.verilog.count("skid_core core (") == 1


def test_payload_bits_follow_the_layout():
    top = generate(SkidPassThrough(64), "skid")
    v = top.verilog
    # layout: data 0..63, keep 64..71, first 72, last 73, user.err 74, user.tag 75..77
    assert "assign s_axis_payload[63:0] = s_axis_tdata;" in v
    assert "assign s_axis_payload[71:64] = s_axis_tkeep;" in v
    assert "assign s_axis_payload[72:72] = !s_axis_in_frame;" in v
    assert "assign s_axis_payload[77:75] = s_axis_tuser[3:1];" in v
    assert "assign m_axis_tlast = m_axis_payload[73:73];" in v
    assert "m_axis_payload[72" not in v  # an output's first flag is dropped


def test_several_streams_nested_and_plain_ports():
    top = generate(Multi(), "multi")
    p = top_ports(top.verilog, "multi")
    for pre in ("s_axis_rx", "s_axis_loop"):
        assert p[f"{pre}_tdata"] == ("input", 32)
        assert p[f"{pre}_tkeep"] == ("input", 4)
        assert p[f"{pre}_tuser"] == ("input", 1)
        assert p[f"{pre}_tready"] == ("output", 1)
    assert p["m_axis_tdata"] == ("output", 16)
    assert "m_axis_tkeep" not in p and "m_axis_tlast" not in p and "m_axis_tuser" not in p
    assert p["stats_drops"] == ("output", 8) and p["stats_clear"] == ("input", 1)
    assert p["enable"] == ("input", 1)
    assert ".stats__drops(stats_drops)" in top.verilog


def test_stream_name_override():
    top = generate(Multi(), "multi", stream_names={"i_rx": "rx_axis", "o": "tx_axis"})
    p = top_ports(top.verilog, "multi")
    assert "rx_axis_tdata" in p and "tx_axis_tdata" in p and "s_axis_loop_tdata" in p


class _Bad(wiring.Component):
    def __init__(self, layout):
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.eq(self.i.valid), self.i.ready.eq(1)]
        return m


def test_first_without_last_is_refused():
    with pytest.raises(ValueError, match="'first' flag needs a 'last'"):
        generate(_Bad(data.StructLayout({"data": 8, "first": 1})), "bad")


def test_payload_without_data_is_refused():
    with pytest.raises(ValueError, match="no 'data' field"):
        generate(_Bad(data.StructLayout({"bytes": 8, "last": 1})), "bad")


def test_field_name_override():
    top = generate(_Bad(data.StructLayout({"bytes": 8, "eop": 1})), "ok",
                   fields={"data": "bytes", "last": "eop"})
    assert top.stream("s_axis").has_last and top.stream("s_axis").data_width == 8


def test_bad_top_name():
    with pytest.raises(ValueError, match="not a plain Verilog identifier"):
        generate(SkidPassThrough(8), "a-b")


def test_digest_follows_the_design():
    a = generate(SkidPassThrough(64), "skid")
    assert a.digest == generate(SkidPassThrough(64), "skid").digest
    assert a.digest != generate(SkidPassThrough(128), "skid").digest


class _BeatLoop(wiring.Component):
    """Pass-through on the project's beat signature (hw.stream)."""

    def __init__(self, width):
        from netreduce.hw.stream import beat_signature
        super().__init__({"i": In(beat_signature(width)), "o": Out(beat_signature(width))})

    def elaborate(self, platform):
        m = Module()
        wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
        return m


def test_project_beat_layout_maps_error_to_tuser():
    top = generate(_BeatLoop(512), "beats")
    s, o = top.stream("s_axis"), top.stream("m_axis")
    assert (s.data_width, s.keep_width, s.user_width, s.has_first, s.has_last) == (
        512, 64, 1, True, True)
    assert s.user_fields == (("error", 0, 1),) and o.user_fields == s.user_fields
    assert top.ports["m_axis_tuser"] == ("output", 1)


def test_record_stream_is_all_tdata():
    rec = data.StructLayout({"opcode": 8, "psn": 24, "ip": data.StructLayout({"ttl": 8})})
    top = generate(_Bad(rec), "rec")
    s = top.stream("s_axis")
    assert (s.data_width, s.keep_width, s.user_width, s.has_last) == (40, 0, 0, False)
    assert s.data_fields == (("opcode", 0, 8), ("psn", 8, 24), ("ip.ttl", 32, 8))


class _Arrays(wiring.Component):
    def __init__(self):
        super().__init__({"i": In(stream.Signature(8)).array(2),
                          "o": Out(stream.Signature(8, always_ready=True)),
                          "ports": Out(wiring.Signature({"a": Out(2)})).array(2)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.o.payload.eq(self.i[0].payload ^ self.i[1].payload),
                     self.ports[1].a.eq(1)]
        return m


def test_arrays_and_constant_handshakes():
    top = generate(_Arrays(), "arr")
    p = top.ports
    assert p["s_axis_0_tdata"] == ("input", 8) and p["s_axis_1_tready"] == ("output", 1)
    assert p["ports_1_a"] == ("output", 2)
    assert "m_axis_tready" not in p and not top.stream("m_axis").has_ready  # always_ready
