"""The 100G Ethernet MACs: CMAC black-box instances and the Tcl that creates their IP.

One integrated 100G MAC per QSFP28 port in use:

* UltraScale+ (VCU118): ``cmac_usplus`` (Xilinx PG203), configured with the AXI4-Stream user
  interface (512-bit, no ``tready`` on RX). :class:`CmacUsPlus` wraps the instance.
* UltraScale (VCU108): ``cmac`` (Xilinx PG165), whose user interface is the 4 x 128-bit segmented
  LBUS only (public designs put ``axi_to_lbus`` / ``lbus_to_axi`` converters around it).
  :class:`CmacUs` wraps the instance together with the converters of :mod:`.lbus`, so the shell
  sees the same beat streams on both families.

Both wrappers present the same Amaranth-side contract:

* ``rx`` (Out, :func:`~netreduce.hw.stream.beat_signature`): received frames, FCS stripped;
  ``error`` set on the last beat of a frame the MAC flagged (bad FCS, too long ...). There is no
  backpressure: ``rx.ready`` is ignored (the shell puts a dropping :class:`~.framefifo.FrameFifo`
  behind it). ``first`` is driven.
* ``tx`` (In): frames to send; ``tx.ready`` is the MAC's ready. Once a frame is started its beats
  must follow without gaps (a gap is a MAC underflow); the shell feeds ``tx`` from a
  store-and-forward :class:`~.framefifo.FrameFifo`. A beat with ``error`` on a last beat makes the
  MAC send the frame with a bad FCS.
* Both streams are in the MAC clock domain ``domain`` (322.265625 MHz, the GT's
  ``gt_txusrclk2``, driven by the wrapper; RX is clocked by it too via ``rx_clk``).
* ``init_clk`` domain ``init_domain`` (the board's free-running 125 MHz): ``sys_reset`` (In) is
  synchronous to it and holds the whole MAC and its transceivers in reset.
* ``mac_reset`` (Out, async to everything: the IP's ``usr_tx_reset | usr_rx_reset``): the user
  side of the MAC is in reset; the shell synchronises it into ``domain``.
* ``aligned`` (Out, ``domain``): ``stat_rx_aligned``, the RX PCS is locked and lane-aligned.
* ``tx_enable`` (In, ``domain``): drives ``ctl_tx_enable``; while 0 the MAC sends remote fault
  (``ctl_tx_send_rfi``) as PG203 / PG165 bring-up describes.
* ``tx_error`` (Out, ``domain``): a TX overflow or underflow (``tx_ovfout`` / ``tx_unfout``).

:func:`cmac_config` builds the IP configuration of a port from its :class:`~.platforms.QsfpCage`,
:func:`validate_config` checks it against the keys the IP documents, :func:`ip_tcl` writes the
``create_ip`` / ``set_property`` script.
"""

from __future__ import annotations

import re

from amaranth.hdl import ClockSignal, Const, DomainRenamer, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import beat_signature
from .platforms import QsfpCage

__all__ = [
    "CMAC_USPLUS_KEYS", "CMAC_US_KEYS", "IP_VLNV", "cmac_config", "validate_config", "ip_tcl",
    "CmacUsPlus", "CmacUs", "cmac_for",
]

DATA_WIDTH = 512

# Configuration keys (CONFIG.<key>) of cmac_usplus: the PARAM_VALUE entries of the IP's .xci as
# Vivado writes it (Corundum, fpga/mqnic/VCU118/fpga_100g/ip/cmac_usplus_0.xci, cmac_usplus 2.6),
# which is the IP's full user-parameter list; PG203's "User Parameters" section defers to the IP.
CMAC_USPLUS_KEYS = frozenset("""
ADD_GT_CNRL_STS_PORTS CLOCKING_MODE CMAC_CAUI4_MODE CMAC_CORE_SELECT DIFFCLK_BOARD_INTERFACE
ENABLE_AXIS ENABLE_AXI_INTERFACE ENABLE_PIPELINE_REG ENABLE_TIME_STAMPING
ETHERNET_BOARD_INTERFACE FAST_SIM_MODE GT_DRP_CLK GT_GROUP_SELECT GT_LOCATION GT_REF_CLK_FREQ
GT_RX_BUFFER_BYPASS GT_TYPE INCLUDE_AUTO_NEG_LT_LOGIC INCLUDE_RS_FEC INCLUDE_SHARED_LOGIC
INCLUDE_STATISTICS_COUNTERS INS_LOSS_NYQ LANE1_GT_LOC LANE2_GT_LOC LANE3_GT_LOC LANE4_GT_LOC
LANE5_GT_LOC LANE6_GT_LOC LANE7_GT_LOC LANE8_GT_LOC LANE9_GT_LOC LANE10_GT_LOC NUM_LANES
OPERATING_MODE PLL_TYPE PTP_TRANSPCLK_MODE RS_FEC_CORE_SEL RS_FEC_TRANSCODE_BYPASS RX_CHECK_ACK
RX_CHECK_PREAMBLE RX_CHECK_SFD RX_EQ_MODE RX_ETYPE_GCP RX_ETYPE_GPP RX_ETYPE_PCP RX_ETYPE_PPP
RX_FLOW_CONTROL RX_FORWARD_CONTROL_FRAMES RX_FRAME_CRC_CHECKING RX_GT_BUFFER RX_MAX_PACKET_LEN
RX_MIN_PACKET_LEN RX_OPCODE_GPP RX_OPCODE_MAX_GCP RX_OPCODE_MAX_PCP RX_OPCODE_MIN_GCP
RX_OPCODE_MIN_PCP RX_OPCODE_PPP RX_PAUSE_DA_MCAST RX_PAUSE_DA_UCAST RX_PAUSE_SA RX_PROCESS_LFI
STATISTICS_REGS_TYPE TX_DA_GPP TX_DA_PPP TX_ETHERTYPE_GPP TX_ETHERTYPE_PPP TX_FLOW_CONTROL
TX_FRAME_CRC_CHECKING TX_IPG_VALUE TX_LANE0_VLM_BIP7_OVERRIDE TX_OPCODE_GPP TX_OPCODE_PPP
TX_OTN_INTERFACE TX_PTP_1STEP_ENABLE TX_PTP_LATENCY_ADJUST TX_PTP_VLANE_ADJUST_MODE TX_SA_GPP
TX_SA_PPP UPDATE_LT_COEFF USER_INTERFACE USE_BOARD_FLOW
""".split())

# Configuration keys of cmac (UltraScale) that a public design sets on xilinx.com:ip:cmac:2.2 (a
# Vivado-written block-design Tcl on GitHub: "create_bd_cell -type ip -vlnv
# xilinx.com:ip:cmac:2.2 cmac_0" with these CONFIG keys). No .xci of this IP was found, so this
# is the subset of its parameters confirmed public; the generator uses nothing else.
CMAC_US_KEYS = frozenset("""
ADD_GT_CNRL_STS_PORTS CMAC_CAUI4_MODE CMAC_CORE_SELECT ENABLE_AXI_INTERFACE ENABLE_PIPELINE_REG
GT_GROUP_SELECT GT_REF_CLK_FREQ INCLUDE_AUTO_NEG_LT_LOGIC INCLUDE_RS_FEC INS_LOSS_NYQ
LANE1_GT_LOC LANE2_GT_LOC LANE3_GT_LOC LANE4_GT_LOC LANE5_GT_LOC LANE6_GT_LOC LANE7_GT_LOC
LANE8_GT_LOC LANE9_GT_LOC LANE10_GT_LOC NUM_LANES RX_EQ_MODE RX_FLOW_CONTROL TX_FLOW_CONTROL
""".split())

IP_VLNV = {"cmac_usplus": ("xilinx.com", "ip", "cmac_usplus"), "cmac": ("xilinx.com", "ip", "cmac")}
_KEYS = {"cmac_usplus": CMAC_USPLUS_KEYS, "cmac": CMAC_US_KEYS}
_SITE_RE = {"cmac_usplus": re.compile(r"CMACE4_X\d+Y\d+"),
            "cmac": re.compile(r"CMAC_SITE_X\d+Y\d+")}
_GT_RE = re.compile(r"X\d+Y\d+")


def _freq_mhz(hz: float) -> str:
    """A frequency as the IP spells it: MHz without trailing zeros (156.25, 161.1328125)."""
    s = f"{hz / 1e6:.7f}".rstrip("0").rstrip(".")
    return s


def cmac_config(ip: str, cage: QsfpCage, *, init_clk_hz: float = 125e6, rs_fec: bool | None = None,
                cmac_site: str | None = None, max_packet_len: int | None = None
                ) -> dict[str, str]:
    """The IP configuration (``CONFIG.<key>`` -> value) of the MAC serving ``cage``.

    CAUI-4 (4 x 25.78125 Gb/s), no AXI4-Lite control (the shell drives the ``ctl_*`` inputs),
    pipeline registers on. Flow control: on ``cmac_usplus`` the RX pause logic is included
    (``RX_FLOW_CONTROL``): the MAC honours received 802.3x PAUSE and PFC frames by holding its
    transmitter (:class:`CmacUsPlus` enables it for every priority: a switch sends PFC only for
    its lossless priorities, RoCE's among them); the TX pause logic is included but never asked
    to send (``ctl_tx_pause_req`` 0). On ``cmac`` both stay off (its pause ports are not
    confirmed from a public source). ``rs_fec``: include the RS-FEC (IEEE 802.3 clause
    91); default on for UltraScale+ (hard RS-FEC in the CMACE4) and off for UltraScale (the IP
    implements it in fabric there). The switch port must be set to the same FEC mode.
    ``max_packet_len``: the largest frame the MAC accepts, FCS included (``RX_MAX_PACKET_LEN``;
    default :func:`.limits.frame_limits`: the engine's ``max_frame`` + 4); longer frames are
    flagged bad by the MAC. Set on ``cmac_usplus`` only: the key is not among the confirmed
    public parameters of ``cmac`` (there the shell's RX FIFO drops what the engine cannot hold).
    """
    from .limits import frame_limits

    mpl = frame_limits().cmac_max_packet_len if max_packet_len is None else max_packet_len
    if ip not in _KEYS:
        raise ValueError(f"unknown CMAC IP {ip!r}; expected one of {sorted(_KEYS)}")
    rs_fec = (ip == "cmac_usplus") if rs_fec is None else rs_fec
    site = cmac_site or cage.cmac_site
    cfg = {
        "CMAC_CAUI4_MODE": "1",
        "CMAC_CORE_SELECT": site,
        "GT_GROUP_SELECT": cage.gt_group,
        "GT_REF_CLK_FREQ": _freq_mhz(cage.refclk_hz),
        "TX_FLOW_CONTROL": "0",
        "RX_FLOW_CONTROL": "0",
        "INCLUDE_RS_FEC": "1" if rs_fec else "0",
        "ENABLE_AXI_INTERFACE": "0",
        "ENABLE_PIPELINE_REG": "1",
    }
    for n, loc in enumerate(cage.gt_channels, 1):
        cfg[f"LANE{n}_GT_LOC"] = loc
    for n in range(5, 11):
        cfg[f"LANE{n}_GT_LOC"] = "NA"
    if ip == "cmac_usplus":
        cfg.update({
            "RX_FLOW_CONTROL": "1",
            "TX_FLOW_CONTROL": "1",
            "NUM_LANES": "4x25",
            "USER_INTERFACE": "AXIS",
            "GT_DRP_CLK": _freq_mhz(init_clk_hz),
            "INCLUDE_STATISTICS_COUNTERS": "0",
            "RX_MAX_PACKET_LEN": str(mpl),
        })
    else:
        cfg["NUM_LANES"] = "4"
    validate_config(ip, cfg)
    return cfg


def validate_config(ip: str, cfg: dict[str, str]) -> None:
    """Raise ``ValueError`` naming the offender if ``cfg`` uses a key the IP does not document,
    or if the site, the GT group and the lane locations are malformed or disagree."""
    keys = _KEYS.get(ip)
    if keys is None:
        raise ValueError(f"unknown CMAC IP {ip!r}; expected one of {sorted(_KEYS)}")
    unknown = sorted(set(cfg) - keys)
    if unknown:
        raise ValueError(f"{ip}: configuration keys {unknown} are not parameters of the IP")
    site = cfg.get("CMAC_CORE_SELECT", "")
    if not _SITE_RE[ip].fullmatch(site):
        raise ValueError(f"{ip}: CMAC_CORE_SELECT {site!r} is not a site name of this family "
                         f"(pattern {_SITE_RE[ip].pattern})")
    group = cfg.get("GT_GROUP_SELECT", "")
    ends = group.split("~")
    if len(ends) != 2 or not all(_GT_RE.fullmatch(e) for e in ends):
        raise ValueError(f"{ip}: GT_GROUP_SELECT {group!r} is not '<XaYb>~<XcYd>'")
    lanes = [cfg.get(f"LANE{n}_GT_LOC") for n in range(1, 5)]
    x0, y0 = map(int, re.findall(r"\d+", ends[0]))
    want = [f"X{x0}Y{y0 + k}" for k in range(4)]
    if lanes != want or ends[1] != want[-1]:
        raise ValueError(f"{ip}: lanes {lanes} do not match GT group {group!r} (want {want})")
    for k, v in cfg.items():
        if not re.fullmatch(r"[A-Za-z0-9_.~\-]+", v):
            raise ValueError(f"{ip}: value {v!r} of {k} is not a plain Tcl word")


def ip_tcl(ip: str, module_name: str, cfg: dict[str, str], ip_dir: str = "ip") -> str:
    """``create_ip`` + ``set_property -dict`` for one MAC (sourced by the build's Tcl)."""
    validate_config(ip, cfg)
    vendor, library, name = IP_VLNV[ip]
    lines = [
        f"# {module_name}: {name} configured by netreduce.hw.boards.cmac.cmac_config",
        f"create_ip -name {name} -vendor {vendor} -library {library} "
        f"-module_name {module_name} -dir {ip_dir}",
        "set_property -dict [list \\",
        *[f"    CONFIG.{k} {{{v}}} \\" for k, v in sorted(cfg.items())],
        f"] [get_ips {module_name}]",
        "",
    ]
    return "\n".join(lines)


def _beat_members():
    return {
        "rx": Out(beat_signature(DATA_WIDTH)),
        "tx": In(beat_signature(DATA_WIDTH)),
        "sys_reset": In(1),
        "mac_reset": Out(1),
        "aligned": Out(1),
        "tx_enable": In(1),
        "tx_error": Out(1),
        "rsfec_lock": Out(1),
        "pause_req": Out(9),  # the MAC is holding TX for priority i (8: global PAUSE)
    }


class _Cmac(wiring.Component):
    def __init__(self, module_name: str, pins, *, domain: str, init_domain: str = "sync",
                 rs_fec: bool = False):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", module_name):
            raise ValueError(f"module name {module_name!r} is not a Verilog identifier")
        self.module_name = module_name
        self.pins = pins
        self.domain = domain
        self.init_domain = init_domain
        self.rs_fec = rs_fec  # the RS-FEC control ports exist only when the IP includes it
        super().__init__(_beat_members())

    def _common_ports(self):
        p = self.pins
        return dict(
            i_gt_rxp_in=p.rx.p, i_gt_rxn_in=p.rx.n, o_gt_txp_out=p.tx.p, o_gt_txn_out=p.tx.n,
            i_gt_ref_clk_p=p.refclk.p, i_gt_ref_clk_n=p.refclk.n,
            i_init_clk=ClockSignal(self.init_domain), i_sys_reset=self.sys_reset,
            o_gt_txusrclk2=ClockSignal(self.domain), i_rx_clk=ClockSignal(self.domain),
            i_gtwiz_reset_tx_datapath=Const(0, 1), i_gtwiz_reset_rx_datapath=Const(0, 1),
            i_core_rx_reset=Const(0, 1), i_core_tx_reset=Const(0, 1),
            i_core_drp_reset=Const(0, 1),
            i_ctl_rx_enable=Const(1, 1),
            i_ctl_tx_enable=self.tx_enable, i_ctl_tx_send_rfi=~self.tx_enable,
            i_ctl_tx_send_idle=Const(0, 1),
            o_stat_rx_aligned=self.aligned,
        )


class CmacUsPlus(_Cmac):
    """``cmac_usplus`` instance (module ``module_name``) with the AXI4-Stream user interface.

    ``pins``: the QSFP resource requested with ``dir="-"`` (``rx``, ``tx``, ``refclk`` pairs). See
    the module docstring for the port contract. Port names follow public instantiations of the
    IP with ``USER_INTERFACE AXIS`` (e.g. Corundum's VCU118 100G design).
    """

    def elaborate(self, platform):
        m = Module()
        usr_rx_reset = Signal()
        usr_tx_reset = Signal()
        ovf = Signal()
        unf = Signal()
        rx_first = Signal(init=1)
        ports = self._common_ports()
        ports.update(
            i_gt_loopback_in=Const(0, 12),
            i_ctl_tx_send_lfi=Const(0, 1), i_ctl_tx_test_pattern=Const(0, 1),
            i_ctl_rx_force_resync=Const(0, 1), i_ctl_rx_test_pattern=Const(0, 1),
            i_tx_preamblein=Const(0, 56),
            i_drp_clk=Const(0, 1), i_drp_addr=Const(0, 10), i_drp_di=Const(0, 16),
            i_drp_en=Const(0, 1), i_drp_we=Const(0, 1),
            o_usr_rx_reset=usr_rx_reset, o_usr_tx_reset=usr_tx_reset,
            o_rx_axis_tvalid=self.rx.valid, o_rx_axis_tdata=self.rx.payload.data,
            o_rx_axis_tkeep=self.rx.payload.keep, o_rx_axis_tlast=self.rx.payload.last,
            o_rx_axis_tuser=self.rx.payload.error,
            o_tx_axis_tready=self.tx.ready, i_tx_axis_tvalid=self.tx.valid,
            i_tx_axis_tdata=self.tx.payload.data, i_tx_axis_tkeep=self.tx.payload.keep,
            i_tx_axis_tlast=self.tx.payload.last, i_tx_axis_tuser=self.tx.payload.error,
            o_tx_ovfout=ovf, o_tx_unfout=unf,
        )
        # flow control (RX_FLOW_CONTROL / TX_FLOW_CONTROL on, cmac_config): honour received
        # PAUSE (global, index 8) and PFC (priorities 0-7) by holding TX; check EtherType, opcode
        # and the multicast destination; never send pause frames. Port names as in public
        # instantiations of the CMACE4 with pause logic (Forencich's taxi 100G MAC wrapper).
        for kind in ("gcp", "gpp", "pcp", "ppp"):
            ports.update({f"i_ctl_rx_enable_{kind}": Const(1, 1),
                          f"i_ctl_rx_check_etype_{kind}": Const(1, 1),
                          f"i_ctl_rx_check_opcode_{kind}": Const(1, 1),
                          f"i_ctl_rx_check_mcast_{kind}": Const(1, 1),
                          f"i_ctl_rx_check_ucast_{kind}": Const(0, 1),
                          f"i_ctl_rx_check_sa_{kind}": Const(0, 1)})
        ports.update(i_ctl_rx_pause_enable=Const(0x1FF, 9), i_ctl_rx_pause_ack=Const(0, 9),
                     i_ctl_tx_pause_enable=Const(0, 9), i_ctl_tx_pause_req=Const(0, 9),
                     i_ctl_tx_resend_pause=Const(0, 1), o_stat_rx_pause_req=self.pause_req)
        for q in range(9):
            ports.update({f"i_ctl_tx_pause_quanta{q}": Const(0, 16),
                          f"i_ctl_tx_pause_refresh_timer{q}": Const(0, 16)})
        if self.rs_fec:
            ports.update(
                i_ctl_tx_rsfec_enable=Const(1, 1), i_ctl_rx_rsfec_enable=Const(1, 1),
                i_ctl_rsfec_ieee_error_indication_mode=Const(0, 1),
                i_ctl_rx_rsfec_enable_correction=Const(1, 1),
                i_ctl_rx_rsfec_enable_indication=Const(1, 1),
                o_stat_rx_rsfec_lane_alignment_status=self.rsfec_lock,
            )
        m.submodules.cmac = Instance(self.module_name, **ports)
        m.d.comb += [
            self.mac_reset.eq(usr_rx_reset | usr_tx_reset),
            self.tx_error.eq(ovf | unf),
            self.rx.payload.first.eq(rx_first),
        ]
        with m.If(self.rx.valid):
            m.d[self.domain] += rx_first.eq(self.rx.payload.last)
        return m


class CmacUs(_Cmac):
    """``cmac`` (UltraScale) instance with its LBUS converted to beat streams (:mod:`.lbus`).

    Same contract as :class:`CmacUsPlus`. ``rx_overflow`` (Out, ``domain``): the LBUS-to-beat
    converter had to drop segments (cannot happen at line rate, see :class:`.lbus.LbusToBeats`).
    Port names follow a public block design around ``xilinx.com:ip:cmac:2.2``.
    """

    def __init__(self, module_name, pins, *, domain, init_domain="sync", rs_fec=False):
        # with the (fabric) RS-FEC of this IP its control ports are not known from a public
        # source, so none are connected: the IP's defaults apply
        super().__init__(module_name, pins, domain=domain, init_domain=init_domain,
                         rs_fec=rs_fec)
        self.rx_overflow = Signal()

    def elaborate(self, platform):
        from .lbus import BeatsToLbus, LbusToBeats

        m = Module()
        dom = self.domain
        m.submodules.rx_conv = rxc = DomainRenamer(dom)(LbusToBeats())
        m.submodules.tx_conv = txc = DomainRenamer(dom)(BeatsToLbus())
        wiring.connect(m, wiring.flipped(self.tx), txc.i)
        # rxc.o has no real backpressure: the MAC cannot wait
        m.d.comb += [
            self.rx.valid.eq(rxc.o.valid),
            self.rx.payload.eq(rxc.o.payload),
            rxc.o.ready.eq(1),
            self.rx_overflow.eq(rxc.overflow),
        ]
        usr_rx_reset = Signal()
        usr_tx_reset = Signal()
        ovf = Signal()
        unf = Signal()
        ports = self._common_ports()
        ports.update(o_usr_rx_reset=usr_rx_reset, o_usr_tx_reset=usr_tx_reset,
                     i_gt_loopback_in=Const(0, 12),
                     o_tx_rdyout=txc.rdy, o_tx_ovfout=ovf, o_tx_unfout=unf)
        for s in range(4):
            ports.update({
                f"o_rx_dataout{s}": rxc.seg[s].data, f"o_rx_enaout{s}": rxc.seg[s].ena,
                f"o_rx_sopout{s}": rxc.seg[s].sop, f"o_rx_eopout{s}": rxc.seg[s].eop,
                f"o_rx_errout{s}": rxc.seg[s].err, f"o_rx_mtyout{s}": rxc.seg[s].mty,
                f"i_tx_datain{s}": txc.seg[s].data, f"i_tx_enain{s}": txc.seg[s].ena,
                f"i_tx_sopin{s}": txc.seg[s].sop, f"i_tx_eopin{s}": txc.seg[s].eop,
                f"i_tx_errin{s}": txc.seg[s].err, f"i_tx_mtyin{s}": txc.seg[s].mty,
            })
        m.submodules.cmac = Instance(self.module_name, **ports)
        m.d.comb += [
            self.mac_reset.eq(usr_rx_reset | usr_tx_reset),
            self.tx_error.eq(ovf | unf),
        ]
        return m


def cmac_for(ip: str):
    """The wrapper class for IP ``ip`` (``"cmac_usplus"`` or ``"cmac"``)."""
    try:
        return {"cmac_usplus": CmacUsPlus, "cmac": CmacUs}[ip]
    except KeyError:
        raise ValueError(f"unknown CMAC IP {ip!r}; expected 'cmac_usplus' or 'cmac'") from None
