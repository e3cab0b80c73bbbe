"""Per-port flow control of the board shell: PFC from the RX FIFO's watermarks and ECN marking of
arriving frames while the RX FIFO is congested (issue 22; docs/fabric.md).

:func:`attach_flow_control` adds, for one port, a :class:`.pfcgen.PfcGenerator` between the TX
FIFO and the MAC (MAC clock domain) and a :class:`.cemark.CeMarker` between the link gate and the
core (core domain), configured by the engine's ``PORT.FC_*`` registers (the core's ``fc``
output, :func:`netreduce.hw.ports.fc_layout`; without one, both stay off). The registers are
quasi-static: they cross into the MAC domain through plain two-flop synchronisers, so a change
may take effect bit by bit over a cycle or two. ``congested`` (level >= ``FC_ECN`` with
``ecn_enable``) is computed in the MAC domain and synchronised into the core domain (a frame's
marking follows the level with that delay, which the model's untimed flag does not have); the
generator's ``xoff`` and ``sent`` reach ``PORT.STATUS.xoff`` / ``congested`` and
``PORT.PFC_TX`` (pulses through a pulse synchroniser; PFC frames are at least 60 bytes apart,
so none merge).
"""

from __future__ import annotations

from amaranth.hdl import DomainRenamer, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer, PulseSynchronizer

from netreduce.wire.linklocal import station_mac

from .cemark import CeMarker
from .pfcgen import PfcGenerator

__all__ = ["attach_flow_control"]


def attach_flow_control(m, *, k: int, width: int, dom: str, core_dom: str, rx_fifo, tx_out,
                        rx_in, fc=None, st=None):
    """Port ``k``: ``tx_out`` (the TX FIFO's output, MAC domain) and ``rx_in`` (the link gate's
    RX output, core domain) go through the flow-control blocks; returns ``(tx, rx)``, the
    streams to connect to the MAC and to the core. ``fc``: the core's ``fc[k]`` (or None),
    ``st``: the core's ``shell[k]`` status entry (or None)."""
    nb = width // 8
    pfc = DomainRenamer(dom)(PfcGenerator(width, level_bits=len(rx_fifo.level),
                                          src_mac=station_mac(k)))
    m.submodules[f"pfc{k}"] = pfc
    wiring.connect(m, tx_out, pfc.tx_i)
    mark = DomainRenamer(core_dom)(CeMarker(width))
    m.submodules[f"ce_mark{k}"] = mark
    wiring.connect(m, rx_in, mark.i)
    congested = Signal(name=f"congested{k}")
    if fc is not None:
        cfg = Signal(fc.shape(), name=f"fc_cfg{k}")
        m.submodules[f"fc_sync{k}"] = FFSynchronizer(fc.as_value(), cfg.as_value(),
                                                     o_domain=dom)
        ctrl = cfg.fc_ctrl
        m.d.comb += [pfc.level.eq(rx_fifo.level), pfc.enable.eq(ctrl.pfc_enable),
                     pfc.priority.eq(ctrl.priority), pfc.quanta.eq(ctrl.quanta),
                     pfc.xoff_bytes.eq(cfg.fc_xoff.bytes), pfc.xon_bytes.eq(cfg.fc_xon.bytes)]
        m.d[dom] += congested.eq(ctrl.ecn_enable
                                 & ((rx_fifo.level * nb) >= cfg.fc_ecn.bytes))
    core_cong = Signal(name=f"congested_core{k}")
    m.submodules[f"cong_sync{k}"] = FFSynchronizer(congested, core_cong, o_domain=core_dom)
    m.d.comb += mark.congested.eq(core_cong)
    if st is not None:
        m.d.comb += st.congested.eq(core_cong)
        m.submodules[f"xoff_sync{k}"] = FFSynchronizer(pfc.xoff, st.xoff, o_domain=core_dom)
        ps = PulseSynchronizer(i_domain=dom, o_domain=core_dom)
        m.submodules[f"pfc_tx_sync{k}"] = ps
        m.d.comb += [ps.i.eq(pfc.sent), st.pfc_tx.eq(ps.o)]
    return pfc.tx_o, mark.o
