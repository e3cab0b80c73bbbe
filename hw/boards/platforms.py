"""Shared pieces of the NetReduce board platforms (VCU118, VCU108).

A board platform is an Amaranth :class:`~amaranth.vendor.XilinxPlatform` subclass plus the facts the
shell needs beyond pins: which QSFP28 cage sits on which transceiver quad, which integrated 100G
MAC (CMAC) site serves it, and the frequency of the cage's GT reference clock. Those facts are
:class:`QsfpCage` records in :attr:`NetReducePlatform.qsfp_cages`, in cage order (the shell's port
``i`` is cage ``i``).

Every pin and every transceiver / CMAC location in the board files names its public source in a
comment next to it. What could not be confirmed from a public source is said so there as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.vendor import XilinxPlatform

__all__ = ["QsfpCage", "DeviceCapacity", "NetReducePlatform", "CMAC_DATAPATH_HZ"]

# The CMAC's user clock (gt_txusrclk2) for 100GBASE-R over CAUI-4 (4 x 25.78125 Gb/s): the lane
# rate over the GT's 80-bit interface, 25.78125 GHz / 80. At 512 bits per cycle it carries 165 Gb/s,
# so a 100 Gb/s stream leaves idle cycles (docs/design.md section 6).
CMAC_DATAPATH_HZ = 322_265_625


@dataclass(frozen=True)
class QsfpCage:
    """One QSFP28 cage and the hard blocks that serve it.

    ``gt_channels``: the four transceiver channels, lane 1..4 (``"X1Y48"`` ...), as the CMAC IP's
    ``LANEn_GT_LOC`` wants them. ``cmac_site``: the CMAC site (``CMACE4_X0Y7`` on UltraScale+,
    ``CMAC_SITE_X0Y0`` on UltraScale). ``refclk_hz``: the GT reference clock frequency the board
    delivers to the cage's quad. ``source``: where these facts come from.
    """

    index: int
    gt_channels: tuple[str, str, str, str]
    cmac_site: str
    refclk_hz: float
    source: str
    confirmed: bool = True  # False: some fact (named in ``note``) is not from a public source
    note: str = ""

    @property
    def gt_group(self) -> str:
        """The CMAC IP's ``GT_GROUP_SELECT`` value: ``"<first>~<last>"``."""
        return f"{self.gt_channels[0]}~{self.gt_channels[-1]}"


@dataclass(frozen=True)
class DeviceCapacity:
    """Resources of an FPGA device, for utilisation percentages (see :mod:`..estimate`)."""

    part: str
    lut: int
    ff: int
    dsp: int
    bram36: int
    uram: int
    carry8: int | None = None  # CARRY8 (UltraScale+) / CARRY8 (UltraScale) = LUT / 8
    source: str = ""

    def as_dict(self) -> dict:
        return {"part": self.part, "LUT": self.lut, "FF": self.ff, "DSP": self.dsp,
                "BRAM36": self.bram36, "URAM": self.uram, "CARRY8": self.carry8,
                "source": self.source}


class NetReducePlatform(XilinxPlatform):
    """Base of the NetReduce boards: a Vivado-flow Xilinx platform that knows its QSFP28 cages.

    Subclasses set ``device``/``package``/``speed``, ``resources``, ``qsfp_cages``, ``capacity``,
    ``cmac_ip`` (``"cmac_usplus"`` or ``"cmac"``), ``board`` (short name) and ``bitstream_props``
    (the configuration properties of the board's flash, for ``device.xdc``).
    """

    board: str = ""
    qsfp_cages: tuple[QsfpCage, ...] = ()
    capacity: DeviceCapacity
    cmac_ip: str = ""
    bitstream_props: tuple[tuple[str, str], ...] = ()
    connectors = []

    def __init__(self, *, toolchain: str = "Vivado"):
        super().__init__(toolchain=toolchain)

    @property
    def part(self) -> str:
        return self._part

    def cage(self, index: int) -> QsfpCage:
        for c in self.qsfp_cages:
            if c.index == index:
                return c
        raise ValueError(f"{self.board} has no QSFP28 cage {index}; it has "
                         f"{[c.index for c in self.qsfp_cages]}")
