"""Xilinx VCU108 evaluation board (Virtex UltraScale XCVU095-2FFVA2104E): Amaranth platform.

Part ``xcvu095-ffva2104-2-e``. Only what NetReduce uses is described: the 125 MHz system clock
(and the 300 MHz one), the CPU reset button, the eight user LEDs, the USB UART and the one QSFP28
cage (GTY quad 127).

Sources (every pin group below names the one it comes from):

* [VE] verilog-ethernet, ``example/VCU108/fpga_10g/fpga.xdc`` (github.com/alexforencich/
  verilog-ethernet): clocks, reset, LEDs, UART, QSFP28 GT pins with their GTYE3 channels,
  reference clock and sideband pins.
* [CORUNDUM] Corundum, ``fpga/mqnic/VCU108/fpga_25g/fpga.xdc`` (github.com/corundum/corundum):
  the same pins again (same author, later revision); every pin used here agrees between the two.
* [XCMAC] Xilinx's CMAC example-design XDC (public copies on GitHub, "CMAC example design-level
  XDC file"), which names the VCU108 (xcvu095-ffva2104-2-e) default CMAC placement:
  ``CMAC_SITE_X0Y0`` with GT group ``X0Y4~X0Y13`` (CAUI-10).
* Xilinx UG1066 (VCU108 Evaluation Board User Guide) is the primary document; its tables were not
  reachable from this environment.

Not confirmed from a public source: the CMAC site for CAUI-4 on the QSFP28 quad (GTYE3 channels
X0Y12..X0Y15). [XCMAC] shows that ``CMAC_SITE_X0Y0`` reaches channels up to X0Y13 at least; this
file uses ``CMAC_SITE_X0Y0`` for the cage on that evidence. The IP rejects an unreachable
site / GT group pair when ``create_ip``'s ``set_property`` runs, so a wrong choice fails loudly in
the first step of the Vivado build (then try ``CMAC_SITE_X0Y1``: pass ``cmac_site=`` to
:class:`~.shell.BoardShell`).

Reference clock: [VE] and [CORUNDUM] run the quad from MGTREFCLK0_127 at 156.25 MHz (10G/25G
designs). 100GBASE-R needs 25.78125 Gb/s per lane, which a 156.25 MHz reference cannot give on
the UltraScale GTYE3 (its QPLL multiplies by an integer: 25.78125 GHz / 2 / 156.25 MHz = 82.5);
161.1328125 MHz gives exactly 80. The CMAC here is therefore configured for 161.1328125 MHz and
the board's Si570 (U32, programmable over I2C, 156.25 MHz at power-on) must be set to
161.1328125 MHz before the link can come up (with the board's system controller, or an I2C
init, which is not part of this shell).
"""

from __future__ import annotations

from amaranth.build import Attrs, Clock, DiffPairs, Pins, PinsN, Resource, Subsignal

from .platforms import DeviceCapacity, NetReducePlatform, QsfpCage

__all__ = ["VCU108Platform"]


class VCU108Platform(NetReducePlatform):
    """VCU108 (xcvu095-ffva2104-2-e). ``qsfp`` 0 is the board's QSFP28 cage."""

    board = "vcu108"
    device = "xcvu095"
    package = "ffva2104"
    speed = "2-e"
    cmac_ip = "cmac"
    default_clk = "clk125"
    default_rst = "cpu_reset"

    resources = [
        # 125 MHz LVDS system clock, BC9/BC8 [VE "clk_125mhz"] [CORUNDUM "clk_125mhz"].
        Resource("clk125", 0, DiffPairs("BC9", "BC8", dir="i"), Clock(125e6),
                 Attrs(IOSTANDARD="LVDS")),
        # 300 MHz, G31/F31 DIFF_SSTL12 [VE (commented) "clk_300mhz_1"] [CORUNDUM "clk_300mhz_1"].
        Resource("clk300", 0, DiffPairs("G31", "F31", dir="i"), Clock(300e6),
                 Attrs(IOSTANDARD="DIFF_SSTL12")),
        # CPU reset push button, E36 LVCMOS12, active high [VE "reset"] [CORUNDUM (commented)].
        Resource("cpu_reset", 0, Pins("E36", dir="i"), Attrs(IOSTANDARD="LVCMOS12")),
        # User LEDs [VE "led[0..7]"] [CORUNDUM "led[0..7]"].
        *[Resource("led", i, Pins(p, dir="o"), Attrs(IOSTANDARD="LVCMOS12"))
          for i, p in enumerate("AT32 AV34 AY30 BB32 BF32 AV36 AY35 BA37".split())],
        # USB UART: uart_txd BE24 (FPGA output), uart_rxd BC24, uart_rts BF24, uart_cts BD22
        # [VE] [CORUNDUM (commented)].
        Resource("uart", 0,
                 Subsignal("tx", Pins("BE24", dir="o")),
                 Subsignal("rx", Pins("BC24", dir="i")),
                 Subsignal("rts", Pins("BF24", dir="o")),
                 Subsignal("cts", Pins("BD22", dir="i")),
                 Attrs(IOSTANDARD="LVCMOS18")),
        # QSFP28: GTY quad 127, lanes 1..4 = GTYE3_CHANNEL_X0Y12..X0Y15 (MGTY{RX,TX}{P,N}0..3_127);
        # MGTREFCLK0_127 AF38/AF39 from the U32 Si570 through the U102 SI53340 buffer, 156.25 MHz
        # (the designs' create_clock -period 6.400). Sideband ModSelL AL24, ResetL AM24,
        # ModPrsL AL25, IntL AL21, LPMode AM21, LVCMOS18. All [VE] [CORUNDUM].
        Resource(
            "qsfp", 0,
            Subsignal("rx", DiffPairs("AG45 AF43 AE45 AD43", "AG46 AF44 AE46 AD44", dir="i")),
            Subsignal("tx", DiffPairs("AK42 AJ40 AG40 AE40", "AK43 AJ41 AG41 AE41", dir="o")),
            Subsignal("refclk", DiffPairs("AF38", "AF39", dir="i")),
            Subsignal("modsel", PinsN("AL24", dir="o"),
                      Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="8")),
            Subsignal("reset", PinsN("AM24", dir="o"),
                      Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="8")),
            Subsignal("modprs", PinsN("AL25", dir="i"), Attrs(IOSTANDARD="LVCMOS18",
                                                              PULLUP="TRUE")),
            Subsignal("int", PinsN("AL21", dir="i"), Attrs(IOSTANDARD="LVCMOS18", PULLUP="TRUE")),
            Subsignal("lpmode", Pins("AM21", dir="o"),
                      Attrs(IOSTANDARD="LVCMOS18", SLEW="SLOW", DRIVE="8")),
        ),
    ]

    qsfp_cages = (
        QsfpCage(0, ("X0Y12", "X0Y13", "X0Y14", "X0Y15"), "CMAC_SITE_X0Y0", 161.1328125e6,
                 source="[VE]/[CORUNDUM] fpga.xdc lane comments (GTYE3_CHANNEL_X0Y12..15); "
                        "CMAC site and reference clock: see module doc",
                 confirmed=False,
                 note="CMAC site CMAC_SITE_X0Y0 for GT group X0Y12~X0Y15 is inferred from "
                      "Xilinx's example XDC (X0Y0 reaches X0Y4~X0Y13), not confirmed; the "
                      "Si570 must be set to 161.1328125 MHz (its 156.25 MHz default cannot "
                      "make 25.78125 Gb/s on an integer-N GTYE3 QPLL)"),
    )

    # XCVU095: Xilinx DS890 (UltraScale architecture overview, Virtex UltraScale table) gives
    # 537,600 CLB LUTs, 1,075,200 flip-flops, 768 DSP slices, 1,728 36Kb block RAMs and no
    # UltraRAM (UltraRAM is an UltraScale+ feature). Not confirmed here: DS890 was not reachable
    # from this environment and no independent public copy of the figures was found.
    capacity = DeviceCapacity("xcvu095-ffva2104-2-e", lut=537_600, ff=1_075_200, dsp=768,
                              bram36=1_728, uram=0, carry8=537_600 // 8,
                              source="Xilinx DS890 (not confirmed from a reachable public "
                                     "copy); CARRY8 = LUT/8 (UG574)")

    # Configuration of the board's BPI x16 flash, as [CORUNDUM] sets it.
    bitstream_props = (
        ("CFGBVS", "GND"),
        ("CONFIG_VOLTAGE", "1.8"),
        ("BITSTREAM.GENERAL.COMPRESS", "true"),
        ("BITSTREAM.CONFIG.EXTMASTERCCLK_EN", "{DIV-1}"),
        ("BITSTREAM.CONFIG.BPI_SYNC_MODE", "Type1"),
        ("CONFIG_MODE", "BPI16"),
    )
