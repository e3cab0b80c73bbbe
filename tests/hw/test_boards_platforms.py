"""VCU118 / VCU108 platforms: pins, QSFP28 cages, capacities, sources cited."""

import inspect
import re

import pytest
from netreduce.hw.boards import vcu108, vcu118
from netreduce.hw.boards.vcu108 import VCU108Platform
from netreduce.hw.boards.vcu118 import VCU118Platform

PLATFORMS = [VCU118Platform, VCU108Platform]


def _pins(platform):
    """(resource, pin) for every package pin the platform names."""
    out = []
    for (name, number), res in platform.resources.items():
        stack = [res]
        while stack:
            r = stack.pop()
            for io in r.ios:
                if hasattr(io, "ios"):          # Subsignal
                    stack.append(io)
                elif hasattr(io, "p"):          # DiffPairs
                    out += [(f"{name}{number}", p) for p in io.p.names + io.n.names]
                else:                           # Pins
                    out += [(f"{name}{number}", p) for p in io.names]
    return out


@pytest.mark.parametrize("P", PLATFORMS)
def test_no_pin_used_twice(P):
    pins = _pins(P())
    seen = {}
    for res, pin in pins:
        assert pin not in seen, f"{pin} used by {seen[pin]} and {res}"
        seen[pin] = res
    assert all(re.fullmatch(r"[A-Z]{1,2}\d{1,2}", p) for _, p in pins)


@pytest.mark.parametrize("P", PLATFORMS)
def test_cages_match_qsfp_resources(P):
    p = P()
    qsfp = sorted(n for (name, n) in p.resources if name == "qsfp")
    assert qsfp == [c.index for c in p.qsfp_cages]
    for cage in p.qsfp_cages:
        # four consecutive channels of one quad, lane 1 first
        xs = {re.match(r"X(\d+)Y(\d+)", ch).group(1) for ch in cage.gt_channels}
        ys = [int(re.match(r"X\d+Y(\d+)", ch).group(1)) for ch in cage.gt_channels]
        assert len(xs) == 1 and ys == list(range(ys[0], ys[0] + 4)) and ys[0] % 4 == 0
        assert cage.refclk_hz in (156.25e6, 161.1328125e6)
        assert cage.gt_group == f"{cage.gt_channels[0]}~{cage.gt_channels[3]}"
        assert cage.source


def test_known_pins_vcu118():
    pins = dict((p, r) for r, p in _pins(VCU118Platform()))
    # spot checks against [CORUNDUM] fpga_100g/fpga.xdc
    assert pins["Y2"] == "qsfp0" and pins["W9"] == "qsfp0" and pins["R9"] == "qsfp1"
    assert pins["AY24"] == "clk1250" and pins["BB21"] == "uart0"
    assert VCU118Platform().qsfp_cages[0].cmac_site == "CMACE4_X0Y7"


def test_known_pins_vcu108():
    pins = dict((p, r) for r, p in _pins(VCU108Platform()))
    assert pins["AG45"] == "qsfp0" and pins["AF38"] == "qsfp0" and pins["BC9"] == "clk1250"
    cage = VCU108Platform().qsfp_cages[0]
    assert not cage.confirmed and "not confirmed" in cage.note  # said so, not guessed silently


@pytest.mark.parametrize("mod", [vcu118, vcu108])
def test_every_pin_group_cites_a_source(mod):
    src = inspect.getsource(mod)
    body = src[src.index("resources = ["):src.index("qsfp_cages = (")]
    # every Resource(...) / _qsfp(...) entry is preceded by a comment naming a source tag
    entries = [m.start() for m in re.finditer(r"^\s+(Resource\(|_qsfp\(|\*\[Resource)", body,
                                               re.M)]
    for pos in entries:
        before = body[:pos].rstrip().splitlines()
        comment = []
        for line in reversed(before):
            if line.strip().startswith("#"):
                comment.append(line)
            else:
                break
        assert re.search(r"\[(CORUNDUM|LITEX|VE)[\] ]", " ".join(comment)), body[pos:pos + 60]


@pytest.mark.parametrize("P,part,lut,uram", [
    (VCU118Platform, "xcvu9p-flga2104-2L-e", 1_182_240, 960),
    (VCU108Platform, "xcvu095-ffva2104-2-e", 537_600, 0),
])
def test_parts_and_capacity(P, part, lut, uram):
    p = P()
    assert p.part == part and p.capacity.part == part
    assert p.capacity.lut == lut and p.capacity.uram == uram
    assert p.capacity.ff == 2 * lut and p.capacity.source


def test_unknown_cage():
    with pytest.raises(ValueError, match="no QSFP28 cage 1"):
        VCU108Platform().cage(1)
