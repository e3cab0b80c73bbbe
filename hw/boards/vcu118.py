"""Xilinx VCU118 evaluation board (Virtex UltraScale+ XCVU9P-L2FLGA2104E): Amaranth platform.

Part ``xcvu9p-flga2104-2L-e``. Only what NetReduce uses is described: the 125 MHz system clock
(and the 300 MHz one), the CPU reset button, the eight user LEDs, the USB UART and the two QSFP28
cages (GTY quads 231 and 232, each served by its own CMACE4).

Sources (every pin group below names the one it comes from):

* [CORUNDUM] Corundum, ``fpga/mqnic/VCU118/fpga_100g/fpga.xdc`` (github.com/corundum/corundum),
  the 100G NIC design for this board: clocks, LEDs, UART, QSFP28 GT and sideband pins, with the
  GTYE4 channel of every lane in its comments.
* [CORUNDUM-IP] Corundum, ``fpga/mqnic/VCU118/fpga_100g/ip/cmac_usplus_0.tcl`` and
  ``cmac_usplus_1.tcl``: CMAC site, GT group and the 156.25 MHz reference clock of each cage.
* [LITEX] LiteX-Boards, ``litex_boards/platforms/xilinx_vcu118.py``
  (github.com/litex-hub/litex-boards): clocks, ``cpu_reset``, LEDs, ``serial``. Every pin of a
  group cited with both sources agrees between them.
* Xilinx UG1224 (VCU118 Evaluation Board User Guide) is the primary document; its tables were not
  reachable from this environment, so the pins are cross-checked between the two independent
  designs above instead. The QSFP28 pins appear in [CORUNDUM] only (also reproduced, identical, in
  Netnod's ``FPGA_NTP_SERVER/FPGA/targets/ntps_vcu118/constr/network_phys.xdc``).
"""

from __future__ import annotations

from amaranth.build import Attrs, Clock, DiffPairs, Pins, PinsN, Resource, Subsignal

from .platforms import DeviceCapacity, NetReducePlatform, QsfpCage

__all__ = ["VCU118Platform"]


def _qsfp(n, rx_p, rx_n, tx_p, tx_n, ref_p, ref_n, modsel, reset, modprs, int_, lpmode):
    # GT pins carry no IOSTANDARD (dedicated transceiver pins); sideband pins are LVCMOS18
    # [CORUNDUM]. modsel/reset/modprs/int are active low on the QSFP connector (SFF-8679 names
    # them ModSelL, ResetL, ModPrsL, IntL), hence PinsN.
    return Resource(
        "qsfp", n,
        Subsignal("rx", DiffPairs(rx_p, rx_n, dir="i")),
        Subsignal("tx", DiffPairs(tx_p, tx_n, dir="o")),
        Subsignal("refclk", DiffPairs(ref_p, ref_n, dir="i")),
        Subsignal("modsel", PinsN(modsel, dir="o"), Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW",
                                                          DRIVE="8")),
        Subsignal("reset", PinsN(reset, dir="o"), Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW",
                                                        DRIVE="8")),
        Subsignal("modprs", PinsN(modprs, dir="i"), Attrs(IOSTANDARD="LVCMOS18", PULLUP="TRUE")),
        Subsignal("int", PinsN(int_, dir="i"), Attrs(IOSTANDARD="LVCMOS18", PULLUP="TRUE")),
        Subsignal("lpmode", Pins(lpmode, dir="o"), Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW",
                                                         DRIVE="8")),
    )


class VCU118Platform(NetReducePlatform):
    """VCU118 (xcvu9p-flga2104-2L-e). ``qsfp`` 0 is the board's QSFP1 cage, ``qsfp`` 1 is QSFP2."""

    board = "vcu118"
    device = "xcvu9p"
    package = "flga2104"
    speed = "2L-e"
    cmac_ip = "cmac_usplus"
    default_clk = "clk125"
    default_rst = "cpu_reset"

    resources = [
        # 125 MHz LVDS system clock, AY24/AY23 [CORUNDUM "clk_125mhz"] [LITEX "clk125"].
        Resource("clk125", 0, DiffPairs("AY24", "AY23", dir="i"), Clock(125e6),
                 Attrs(IOSTANDARD="LVDS")),
        # 300 MHz DDR4 reference, G31/F31 DIFF_SSTL12 [CORUNDUM (commented) "clk_300mhz"]
        # [LITEX "clk300"].
        Resource("clk300", 0, DiffPairs("G31", "F31", dir="i"), Clock(300e6),
                 Attrs(IOSTANDARD="DIFF_SSTL12")),
        # CPU_RESET push button, L19 LVCMOS12, active high [LITEX "cpu_reset", used active high
        # by its VCU118 target] [CORUNDUM (commented) "reset" L19].
        Resource("cpu_reset", 0, Pins("L19", dir="i"), Attrs(IOSTANDARD="LVCMOS12")),
        # User LEDs GPIO_LED_0..7 [CORUNDUM "led[0..7]"] [LITEX "user_led" 0..7]: same 8 pins.
        *[Resource("led", i, Pins(p, dir="o"), Attrs(IOSTANDARD="LVCMOS12"))
          for i, p in enumerate("AT32 AV34 AY30 BB32 BF32 AU37 AV36 BA37".split())],
        # USB UART (CP2105 bridge); tx/rts are FPGA outputs [LITEX "serial": tx BB21, rx AW25,
        # rts BB22, cts AY25] [CORUNDUM (commented) uart_txd BB21, uart_rxd AW25, uart_rts BB22,
        # uart_cts AY25].
        Resource("uart", 0,
                 Subsignal("tx", Pins("BB21", dir="o")),
                 Subsignal("rx", Pins("AW25", dir="i")),
                 Subsignal("rts", Pins("BB22", dir="o")),
                 Subsignal("cts", Pins("AY25", dir="i")),
                 Attrs(IOSTANDARD="LVCMOS18")),
        # QSFP1: GTY quad 231, lanes 1..4 = GTYE4_CHANNEL_X1Y48..X1Y51 (MGTY{RX,TX}{P,N}0..3_231);
        # MGTREFCLK0_231 W9/W8 (from U38). Sideband: ModSelL AM21, ResetL BA22, ModPrsL AL21,
        # IntL AP21, LPMode AN21. All [CORUNDUM].
        _qsfp(0, "Y2 W4 V2 U4", "Y1 W3 V1 U3", "V7 T7 P7 M7", "V6 T6 P6 M6", "W9", "W8",
              "AM21", "BA22", "AL21", "AP21", "AN21"),
        # QSFP2: GTY quad 232, lanes 1..4 = GTYE4_CHANNEL_X1Y52..X1Y55; MGTREFCLK0_232 R9/R8
        # (from U104). Sideband: ModSelL AN23, ResetL AY22, ModPrsL AN24, IntL AT21, LPMode AT24.
        # All [CORUNDUM].
        _qsfp(1, "T2 R4 P2 M2", "T1 R3 P1 M1", "L5 K7 J5 H7", "L4 K6 J4 H6", "R9", "R8",
              "AN23", "AY22", "AN24", "AT21", "AT24"),
    ]

    qsfp_cages = (
        QsfpCage(0, ("X1Y48", "X1Y49", "X1Y50", "X1Y51"), "CMACE4_X0Y7", 156.25e6,
                 source="[CORUNDUM] fpga.xdc lane comments; [CORUNDUM-IP] cmac_usplus_0.tcl "
                        "(CMAC_CORE_SELECT CMACE4_X0Y7, GT_GROUP_SELECT X1Y48~X1Y51, "
                        "GT_REF_CLK_FREQ 156.25)"),
        QsfpCage(1, ("X1Y52", "X1Y53", "X1Y54", "X1Y55"), "CMACE4_X0Y8", 156.25e6,
                 source="[CORUNDUM] fpga.xdc lane comments; [CORUNDUM-IP] cmac_usplus_1.tcl "
                        "(CMAC_CORE_SELECT CMACE4_X0Y8, GT_GROUP_SELECT X1Y52~X1Y55, "
                        "GT_REF_CLK_FREQ 156.25)"),
    )

    # XCVU9P: Xilinx DS923 (Virtex UltraScale+ product table) gives 1,182,240 CLB LUTs,
    # 2,364,480 flip-flops, 6,840 DSP slices, 2,160 36Kb block RAMs, 960 UltraRAMs. DS923 itself
    # was not reachable here; the same five figures appear in public utilisation scripts for this
    # part (e.g. "FPGA_tot_resources = [1182240, 2364480, 2160, 960, 6840]" and
    # "AVAILABLE = {LUT: 1182240, FD: 2364480, DSP: 6840, BRAM: 2160, URAM: 960}" for
    # XCVU9P-L2-FLGA2104E, found by code search).
    capacity = DeviceCapacity("xcvu9p-flga2104-2L-e", lut=1_182_240, ff=2_364_480, dsp=6_840,
                              bram36=2_160, uram=960, carry8=1_182_240 // 8,
                              source="Xilinx DS923 (figures cross-checked in public "
                                     "utilisation scripts for XCVU9P); CARRY8 = LUT/8 "
                                     "(one per 8-LUT CLB, UG574)")

    # Configuration of the board's dual QSPI flash (x8, 32-bit addressing), as [CORUNDUM] sets it.
    bitstream_props = (
        ("CFGBVS", "GND"),
        ("CONFIG_VOLTAGE", "1.8"),
        ("BITSTREAM.GENERAL.COMPRESS", "true"),
        ("BITSTREAM.CONFIG.EXTMASTERCCLK_EN", "{DIV-1}"),
        ("BITSTREAM.CONFIG.SPI_32BIT_ADDR", "YES"),
        ("BITSTREAM.CONFIG.SPI_BUSWIDTH", "8"),
        ("BITSTREAM.CONFIG.SPI_FALL_EDGE", "YES"),
    )
