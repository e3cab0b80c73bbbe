"""The engine's pair wiring (HeaderArbiter side records -> control -> LaneSplit ``dec2``),
end to end against the model, with a stand-in for the pairing control path.

``SerialPairs`` has the interface of ``AggControl(pairs=True)`` (``hdr`` with a ``side``
record, ``dec2``) and is built around the real ``AggControl``: it hands a pair's two headers to
it one after the other and gives their two decisions back together (``dec``, ``dec2``), so the
control's decisions, release ordinals and counters are the real ones, one decision per cycle.
The engine's arbiter forms the pairs, ``LaneSplit`` splits them into the lanes: outputs and
counters must equal the model's, and pairs must have been made.
"""

from __future__ import annotations

import importlib.util
import inspect
import random
import sys
from pathlib import Path

import pytest
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from netreduce.hw.agg import control as control_mod
from netreduce.hw.agg.decide import OP_ACK
from netreduce.hw.agg.types import FrameError, HdrClass
from netreduce.hw.lanes import pair_layout
from netreduce.sim.model.kit import RingJob


def _load(name: str):
    """A sibling test module by path (the suite imports with --import-mode=importlib)."""
    key = f"_pairs_harness_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(name))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


top = _load("test_engine_top.py")


class SerialPairs(wiring.Component):
    """``AggControl(pairs=True)``'s interface around the real control, one header at a time."""

    def __init__(self, regmap=None, *, pairs: bool = False, **kw):
        assert pairs
        self.inner = inner = control_mod.AggControl(regmap, **kw)
        port_bits = inner.port_bits
        self.side_layout = data.StructLayout({"v": 1, "src_ip": 32, "dqpn": 24, "psn": 24,
                                              "syndrome": 8, "plen": 16, "port": port_bits})
        self.hdr_layout = data.StructLayout({**{n: f.shape for n, f in inner.hdr_layout},
                                             "side": self.side_layout})
        members = dict(inner.signature.members)
        members["hdr"] = In(stream.Signature(self.hdr_layout))
        members["dec2"] = Out(pair_layout(inner.dec_layout))
        super().__init__(members)
        SerialPairs.last = self

    def __getattr__(self, name):   # layouts and sizes: the control's (not its members)
        if name.startswith("_") or name in ("inner", "dec2") or \
                name in self.inner.signature.members:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def elaborate(self, platform):
        m = Module()
        inner = self.inner
        m.submodules.inner = inner
        for name, mem in inner.signature.members.items():
            if name in ("hdr", "dec"):
                continue
            a, b = getattr(self, name), getattr(inner, name)
            if mem.is_port:
                m.d.comb += (b.eq(a) if mem.flow == In else a.eq(b))
            else:
                wiring.connect(m, wiring.flipped(a), b)
        # headers: the main one, then (second) the side one built from the side record
        h, ih = self.hdr.payload, inner.hdr
        second = Signal()
        side = Signal(inner.hdr_layout)
        m.d.comb += [side.cls.eq(HdrClass.ROCE), side.err.eq(FrameError.NONE),
                     side.opcode.eq(OP_ACK), side.time.eq(h.time)]
        m.d.comb += [side[n].eq(h.side[n]) for n, _ in self.side_layout if n != "v"]
        tags = fifo.SyncFIFO(width=1, depth=64)   # per header given: first of a pair
        m.submodules.tags = tags
        m.d.comb += [ih.valid.eq(self.hdr.valid & tags.w_rdy),
                     tags.w_en.eq(ih.valid & ih.ready),
                     tags.w_data.eq(~second & h.side.v)]
        with m.If(second):
            m.d.comb += ih.payload.eq(side)
        with m.Else():
            m.d.comb += [ih.payload[n].eq(h[n]) for n, _ in inner.hdr_layout]
        m.d.comb += self.hdr.ready.eq(ih.ready & tags.w_rdy & (second | ~h.side.v))
        with m.If(ih.valid & ih.ready):
            m.d.sync += second.eq(~second & h.side.v)
        # decisions: the first of a pair waits in ``held`` for the second
        d, held, hold = inner.dec, Signal(inner.dec_layout), Signal()
        first = tags.r_data[0] & ~hold
        m.d.comb += [tags.r_en.eq(d.valid & d.ready),
                     self.dec.valid.eq(d.valid & ~first),
                     self.dec.payload.eq(Mux(hold, held.as_value(), d.payload.as_value())),
                     self.dec2.v.eq(hold), self.dec2.d.eq(d.payload),
                     d.ready.eq(first | self.dec.ready)]
        with m.If(d.valid & first):
            m.d.sync += [held.eq(d.payload), hold.eq(1)]
        with m.If(d.valid & d.ready & hold):
            m.d.sync += hold.eq(0)
        return m


class CountingSim(Simulator):
    """The engine test's simulator, counting the transfers that carry a side record and the
    decisions handed over in pairs."""

    counts: dict = {}

    def __init__(self, dut):
        super().__init__(dut)
        ctl = dut.ctl
        CountingSim.counts = c = {"side": 0, "dec2": 0}

        async def count(ctx):
            async for *_, hv, hr, sv, dv, dr, d2 in ctx.tick().sample(
                    ctl.hdr.valid, ctl.hdr.ready, ctl.hdr.payload.side.v,
                    ctl.dec.valid, ctl.dec.ready, ctl.dec2.v):
                c["side"] += hv and hr and sv
                c["dec2"] += dv and dr and d2

        self.add_process(count)


@pytest.fixture
def pairing(monkeypatch):
    import netreduce.hw.engine as engine_mod

    assert "pairs" in inspect.signature(SerialPairs).parameters
    monkeypatch.setattr(engine_mod, "AggControl", SerialPairs)
    monkeypatch.setattr(top, "Simulator", CountingSim)
    return CountingSim


@pytest.mark.parametrize("width,seed", [(512, 1), (64, 2)])
def test_lanes_pairs_of_acks_match_the_model(pairing, width, seed):
    """Four ports, one rank per port, every port sending at once: its data frames and, two
    indices behind, its receiver's ACK (a NAK now and then). The ACKs of different ports arrive
    together and go to the control in pairs; outputs and counters equal the model's."""
    rng = random.Random(seed)
    sc = top.Scenario(ports=4, lanes=4, data_width=width, flows=8, slots=16, max_world=4,
                      pmtu_max=256)
    job = sc.add(RingJob(job=0, world=4, window=16, slot_base=0, pmtu=256))
    for k in range(14):
        for r in range(4):
            sc.frame(job.data_bytes(r, k, rng.randbytes(256)), r)
            if k >= 2:
                sc.frame(job.ack(r, k - 2, nak=rng.random() < 0.1), r)
    got = top.check(sc, stall=0.2, seed=seed, parallel=True)
    assert len(got) == 14 * 4 + 12 * 4
    c = pairing.counts
    assert c["side"] > 5 and c["side"] == c["dec2"], c
