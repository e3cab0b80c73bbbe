"""A stand-in for the engine top: the engine's port names and register bank, no aggregation.

:class:`StandIn` has the members of :class:`netreduce.hw.engine.NetReduceEngine` (``i_p<k>``,
``o_p<k>`` beat streams, ``s_axil``) so the fast harness, the RTL fabric and their tests run
before (and independently of) the real engine:

* every frame entering ``i_p<k>`` leaves ``o_p<k>`` unchanged, ``error`` flag included, through a
  ``depth``-beat FIFO (latency 2 cycles from input beat to output beat; ``tready`` low when the
  FIFO is full, i.e. only under output backpressure);
* the register bank of ``regmap`` on ``s_axil``; ``JOB.STATUS.enabled`` follows
  ``JOB.CTRL.enable`` (so :class:`~netreduce.sw_driver.control.EngineControl` can add jobs),
  ``CNT.rx_frames`` / ``CNT.tx_frames`` count last beats in / out, everything else reads 0.

:func:`standin_top` generates the Verilog top with the engine's names (``netreduce_engine``,
``s_axis_p<k>`` / ``m_axis_p<k>``).
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from netreduce.hw.csr import RegisterBank
from netreduce.hw.csr.axil import AXI4LiteSignature
from netreduce.hw.csr.bank import min_addr_width
from netreduce.hw.stream import beat_layout, beat_signature
from netreduce.hw.verilog import AxisTop, generate

from netreduce.regmap import RegMap, build_regmap

__all__ = ["StandIn", "standin_top", "standin_regmap", "engine_stream_names"]


def standin_regmap(ports: int = 2, data_width: int = 64, **kw) -> RegMap:
    """A small register map for tests (few jobs/flows/slots: a quick build)."""
    p = dict(jobs=2, flows=16, slots=64, pmtu_max=1024, max_world=8)
    p.update(kw)
    return build_regmap(ports=ports, data_width=data_width, **p)


def engine_stream_names(ports: int) -> dict[str, str]:
    """The engine top's AXI-Stream prefixes: ``i_p<k>`` -> ``s_axis_p<k>``, ``o_p<k>`` ->
    ``m_axis_p<k>``."""
    names = {}
    for k in range(ports):
        names[f"i_p{k}"] = f"s_axis_p{k}"
        names[f"o_p{k}"] = f"m_axis_p{k}"
    return names


class StandIn(wiring.Component):
    """Per-port FIFO pass-through plus the register bank (see the module docstring)."""

    def __init__(self, regmap: RegMap, depth: int = 16):
        self.regmap = regmap
        self.depth = depth
        self.nports, self.data_width = regmap.params["ports"], regmap.params["data_width"]
        ports, w = self.nports, self.data_width
        self.bank = RegisterBank(regmap)
        members = {}
        for k in range(ports):
            members[f"i_p{k}"] = In(beat_signature(w))
            members[f"o_p{k}"] = Out(beat_signature(w))
        members["s_axil"] = In(AXI4LiteSignature(min_addr_width(regmap)))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank = bank = self.bank
        wiring.connect(m, wiring.flipped(self.s_axil), bank.s_axil)
        lay = beat_layout(self.data_width)
        rx = []
        tx = []
        for k in range(self.nports):
            f = SyncFIFOBuffered(width=lay.size, depth=self.depth)
            m.submodules[f"fifo{k}"] = f
            i, o = getattr(self, f"i_p{k}"), getattr(self, f"o_p{k}")
            m.d.comb += [
                f.w_data.eq(i.payload.as_value()),
                f.w_en.eq(i.valid),
                i.ready.eq(f.w_rdy),
                o.payload.eq(f.r_data),
                o.valid.eq(f.r_rdy),
                f.r_en.eq(o.ready),
            ]
            rx.append(i.valid & i.ready & i.payload.last)
            tx.append(o.valid & o.ready & o.payload.last)
        # the bank's increments are 1-bit strobes: frames ending on two ports in the same cycle
        # count once (a stand-in simplification; tests of the counters use one port)
        m.d.comb += [
            bank.cnt_inc.rx_frames.eq(_any(rx)),
            bank.cnt_inc.tx_frames.eq(_any(tx)),
        ]
        for j in range(len(bank.job_status)):
            m.d.comb += bank.job_status[j].status.enabled.eq(bank.job_cfg[j].ctrl.enable)
        return m


def _any(xs):
    v = xs[0]
    for x in xs[1:]:
        v = v | x
    return v


def standin_top(regmap: RegMap, depth: int = 16) -> AxisTop:
    """The stand-in as a Verilog top named like the engine's (``netreduce_engine``), cached under
    by the map's parameters and the source digest of this module (:mod:`netreduce.hw.cache`)."""
    from .cache import cache_key, cached_top, source_digest

    src = source_digest(__name__)
    key = cache_key([sorted(regmap.params.items()), depth, src])

    def make():
        dut = StandIn(regmap, depth)
        return generate(dut, "netreduce_engine", stream_names=engine_stream_names(dut.nports))
    return cached_top("standin", key, make)
