"""Board bring-up core: every port's RX straight back to its TX, plus the real register bank.

:class:`LoopbackCore` has exactly the core interface the shell expects
(:func:`.shell.core_signature`), so a board build can be made, timed and brought up before the
engine top exists, and the engine top (docs/design.md section 6, another issue) replaces it with no
change to the shell: ``BoardShell(platform, core=EngineTop(...))``.

Contract: ``tx[i]`` carries exactly the frames of ``rx[i]``, beat for beat (``ready`` and
``valid`` pass straight through: zero latency, backpressure from ``tx`` reaches ``rx``).
``s_axil`` is :class:`netreduce.hw.csr.RegisterBank` built from the project's register map (the
identity / version registers answer, so the management path can be checked on the board). With
``regs=False`` (fast elaboration in tests) ``s_axil`` instead answers every access with ``DECERR``
after one cycle (read data 0): a legal AXI4-Lite slave with no registers.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..csr import AXI4LiteSignature, RegisterBank
from ..stream import beat_signature, check_data_width

__all__ = ["LoopbackCore"]

_DECERR = 0b11


def _decerr_slave(m, bus):
    """AXI4-Lite slave without registers: every write and read gets DECERR (read data 0)."""
    bvalid = Signal()
    rvalid = Signal()
    m.d.comb += [
        bus.awready.eq(~bvalid & bus.awvalid & bus.wvalid),
        bus.wready.eq(~bvalid & bus.awvalid & bus.wvalid),
        bus.bvalid.eq(bvalid), bus.bresp.eq(_DECERR),
        bus.arready.eq(~rvalid),
        bus.rvalid.eq(rvalid), bus.rresp.eq(_DECERR), bus.rdata.eq(0),
    ]
    with m.If(bus.awvalid & bus.wvalid & ~bvalid):
        m.d.sync += bvalid.eq(1)
    with m.Elif(bus.bready):
        m.d.sync += bvalid.eq(0)
    with m.If(bus.arvalid & ~rvalid):
        m.d.sync += rvalid.eq(1)
    with m.Elif(bus.rready):
        m.d.sync += rvalid.eq(0)


class LoopbackCore(wiring.Component):
    """``ports`` RX->TX loopbacks of ``data_width``-bit beats and the register bank."""

    def __init__(self, ports: int = 1, data_width: int = 512, *, regs: bool = True):
        if not isinstance(ports, int) or ports < 1:
            raise ValueError(f"ports = {ports!r}: need at least one port")
        check_data_width(data_width)
        self.ports = ports
        self.data_width = data_width
        self._bank = RegisterBank() if regs else None
        addr_width = self._bank.addr_width if regs else 16
        super().__init__({
            "rx": In(beat_signature(data_width)).array(ports),
            "tx": Out(beat_signature(data_width)).array(ports),
            "s_axil": In(AXI4LiteSignature(addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        if self._bank is not None:
            m.submodules.bank = self._bank
            wiring.connect(m, wiring.flipped(self.s_axil), self._bank.s_axil)
        else:
            _decerr_slave(m, self.s_axil)
        for i in range(self.ports):
            wiring.connect(m, wiring.flipped(self.rx[i]), wiring.flipped(self.tx[i]))
        return m
