"""One port of the board shell as a component of its own, for logic-depth estimates.

A block's logic depth on its own misses the paths that run through several blocks: the link
gate is combinational between the clock crossing and the CE marker, the TX enable gate between
the PFC generator and the MAC, and the frame FIFOs' ``ready`` comes from the next block. So
:class:`ShellPortPaths` wires the per-port blocks of :class:`.shell.BoardShell` the way the
shell does (RX: [LBUS converter ->] dropping FrameFifo -> PortCrossing -> LinkGate -> CeMarker;
TX: LinkGate -> PortCrossing -> FrameFifo -> PfcGenerator -> TX enable gate [-> LBUS
converter]; the ECN ``congested`` compare; the synchronisers of ``up`` and ``congested``) with
the MAC and the core as ports, in two clock domains, ``mac`` (the CMAC's 322.27 MHz user clock)
and ``core`` (250 MHz). The CMAC instance, the management bus, the reset and LED glue (2-flop
synchronisers and sticky flags) are left out: they add no logic levels between registers.

Only for ``hw/estimate.py`` (designs ``shell_port`` / ``shell_port_lbus``): every path of the
netlist counts, so its ``lut_levels`` is the maximum over both domains and must meet the tighter
budget, the MAC clock's 6 LUT levels.
"""

from __future__ import annotations

from amaranth.hdl import Cat, DomainRenamer, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from netreduce.wire.linklocal import station_mac

from ..stream import beat_signature
from .cemark import CeMarker
from .coreclock import PortCrossing
from .framefifo import FrameFifo
from .lbus import NSEG, SEGMENT, BeatsToLbus, LbusToBeats
from .linkgate import LinkGate
from .pfcgen import PfcGenerator

__all__ = ["ShellPortPaths"]


class ShellPortPaths(wiring.Component):
    """Ports: MAC side (``mac`` domain) ``mac_rx`` / ``mac_tx`` beat streams, or with ``lbus``
    the UltraScale CMAC's ``rx_seg`` / ``tx_seg`` segments and ``tx_rdy``; ``aligned``; the
    flow-control configuration (``pfc_enable``, ``priority``, ``quanta``, ``xoff_bytes``,
    ``xon_bytes``, ``ecn_enable``, ``ecn_bytes``: registers after their synchronisers in the
    shell); core side (``core`` domain) ``core_rx`` / ``core_tx``."""

    def __init__(self, width: int = 512, fifo_depth: int = 512, *, lbus: bool = False,
                 cdc_depth: int = 16):
        self.width, self.fifo_depth, self.lbus, self.cdc_depth = width, fifo_depth, lbus, cdc_depth
        mac = ({"rx_seg": In(SEGMENT).array(NSEG), "tx_seg": Out(SEGMENT).array(NSEG),
                "tx_rdy": In(1)} if lbus else
               {"mac_rx": In(beat_signature(width)), "mac_tx": Out(beat_signature(width))})
        super().__init__({
            **mac, "aligned": In(1),
            "pfc_enable": In(1), "priority": In(3), "quanta": In(16), "xoff_bytes": In(24),
            "xon_bytes": In(24), "ecn_enable": In(1), "ecn_bytes": In(24),
            "core_rx": Out(beat_signature(width)), "core_tx": In(beat_signature(width)),
            "drops": Out(3), "level": Out(fifo_depth.bit_length()),
        })

    def elaborate(self, platform):
        m = Module()
        w, nb = self.width, self.width // 8
        mac, core = "mac", "core"

        def dom(d, c):
            return DomainRenamer(d)(c)

        rx_fifo = dom(mac, FrameFifo(w, self.fifo_depth, drop_when_full=True, drop_errors=True))
        tx_fifo = dom(mac, FrameFifo(w, self.fifo_depth, drop_when_full=False))
        m.submodules.rx_fifo, m.submodules.tx_fifo = rx_fifo, tx_fifo
        if self.lbus:
            m.submodules.rx_conv = rxc = dom(mac, LbusToBeats())
            m.submodules.tx_conv = txc = dom(mac, BeatsToLbus())
            for s in range(NSEG):
                m.d.comb += [rxc.seg[s].eq(self.rx_seg[s]), self.tx_seg[s].eq(txc.seg[s])]
            m.d.comb += [rxc.o.ready.eq(1), txc.rdy.eq(self.tx_rdy)]
            mac_rx, mac_tx = rxc.o, txc.i
        else:
            mac_rx, mac_tx = self.mac_rx, self.mac_tx
        m.d.comb += [rx_fifo.i.valid.eq(mac_rx.valid), rx_fifo.i.payload.eq(mac_rx.payload),
                     self.level.eq(rx_fifo.level),
                     self.drops.eq(Cat(rx_fifo.drop, rx_fifo.drop_error, tx_fifo.drop))]

        # flow control, as .flowctl.attach_flow_control wires it
        pfc = dom(mac, PfcGenerator(w, level_bits=len(rx_fifo.level), src_mac=station_mac(0)))
        m.submodules.pfc = pfc
        wiring.connect(m, tx_fifo.o, pfc.tx_i)
        m.d.comb += [pfc.level.eq(rx_fifo.level), pfc.enable.eq(self.pfc_enable),
                     pfc.priority.eq(self.priority), pfc.quanta.eq(self.quanta),
                     pfc.xoff_bytes.eq(self.xoff_bytes), pfc.xon_bytes.eq(self.xon_bytes)]
        congested = Signal()
        m.d[mac] += congested.eq(self.ecn_enable & ((rx_fifo.level * nb) >= self.ecn_bytes))

        # TX enable gate, as BoardShell: a frame starts only while the transmitter is enabled
        aligned, tx_in_frame = Signal(), Signal()
        m.d[mac] += aligned.eq(self.aligned)
        go = aligned | tx_in_frame
        src = pfc.tx_o
        if self.lbus:
            m.d.comb += [mac_tx.valid.eq(src.valid & go), mac_tx.payload.eq(src.payload),
                         src.ready.eq(mac_tx.ready & go)]
        else:
            m.d.comb += [self.mac_tx.valid.eq(src.valid & go),
                         self.mac_tx.payload.eq(src.payload),
                         src.ready.eq(self.mac_tx.ready & go)]
        with m.If(src.valid & src.ready):
            m.d[mac] += tx_in_frame.eq(~src.payload.last)

        m.submodules.cdc = xing = PortCrossing(w, mac_domain=mac, core_domain=core,
                                               depth=self.cdc_depth)
        wiring.connect(m, rx_fifo.o, xing.mac_rx)
        wiring.connect(m, xing.mac_tx, tx_fifo.i)
        gate = dom(core, LinkGate(w))
        mark = dom(core, CeMarker(w))
        m.submodules.link_gate, m.submodules.ce_mark = gate, mark
        m.submodules.link_up = FFSynchronizer(aligned, gate.up, o_domain=core)
        m.submodules.cong_sync = FFSynchronizer(congested, mark.congested, o_domain=core)
        wiring.connect(m, xing.core_rx, gate.rx_i)
        wiring.connect(m, gate.rx_o, mark.i)
        wiring.connect(m, mark.o, wiring.flipped(self.core_rx))
        wiring.connect(m, wiring.flipped(self.core_tx), gate.tx_i)
        wiring.connect(m, gate.tx_o, xing.core_tx)
        return m

