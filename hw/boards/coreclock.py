"""The core's own clock and the per-port crossings between it and the MAC clocks.

Clock plan (arithmetic in docs/engine.md, "Clock plan"): the core runs at
:data:`CORE_HZ` (250 MHz), like Corundum's 512-bit 100G core, not on the CMAC's 322.27 MHz user
clock. 250 MHz x 512 bits carries every RoCEv2 frame size at 100 Gb/s line rate except
sustained runs of 65-75-byte frames, and gives each register-to-register path 4 ns: 8 LUT levels
plus 8 CARRY8 in the budget, against 6 at 322 MHz.

:class:`CoreClock` makes the ``core`` domain from the board's 125 MHz ``sync`` clock with an
MMCM (``MMCME4_BASE`` on UltraScale+, ``MMCME3_BASE`` on UltraScale; both UG974): VCO
125 MHz x 10 = 1250 MHz (inside the VCO range of both families, DS892 / DS923), divided
by 5. The core is held in reset until the MMCM locks, through a reset synchroniser.

:class:`PortCrossing` moves one port's beat streams between a MAC domain and the core domain:
an :class:`~amaranth.lib.fifo.AsyncFIFOBuffered` each way (Gray-coded pointers through
two-flip-flop synchronisers, and an output register: the reader's ``valid`` and data come from
flip-flops, not from the pointer compare and the distributed RAM, so the next block's logic does
not add to it; logic depth). Latency: a few cycles of each clock; throughput one beat per cycle of
the slower side. It has ordinary ready/valid on all four streams; the shell's frame FIFOs sit
on the MAC side of it (the MAC cannot wait on RX and must not see a gap on TX).
"""

from __future__ import annotations

from amaranth.hdl import ClockSignal, Instance, Module, ResetSignal, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.fifo import AsyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from netreduce.regmap import CLOCK_HZ

from ..stream import beat_layout, beat_signature

__all__ = ["CORE_HZ", "CoreClock", "PortCrossing", "MMCM_PRIMITIVE", "mmcm_params"]

CORE_HZ = float(CLOCK_HZ)  # the register map's GLOBAL.CLOCK_HZ default: 250 MHz
MMCM_PRIMITIVE = {"xcup": "MMCME4_BASE", "xcu": "MMCME3_BASE"}
_VCO_RANGE = (800e6, 1440e6)  # inside the MMCM VCO range of both UltraScale (600-1440 MHz)
# and UltraScale+ (800-1600 MHz), DS892 / DS923


def mmcm_params(in_hz: float, out_hz: float) -> tuple[float, int, float]:
    """``(CLKFBOUT_MULT_F, DIVCLK_DIVIDE, CLKOUT0_DIVIDE_F)`` for ``out_hz`` from ``in_hz``
    exactly, with the VCO in range: integer multiplier and divider preferred, then the highest
    VCO (least jitter); ``ValueError`` if there is no such setting."""
    found = []
    for d in range(1, 5):
        for m8 in range(2 * 8, 128 * 8 + 1):   # CLKFBOUT_MULT_F in 1/8 steps
            vco = in_hz * m8 / 8 / d
            if not _VCO_RANGE[0] <= vco <= _VCO_RANGE[1]:
                continue
            o8 = vco * 8 / out_hz
            if abs(o8 - round(o8)) < 1e-9 and 8 <= round(o8) <= 128 * 8:
                o8 = round(o8)
                found.append(((m8 % 8 != 0, o8 % 8 != 0, -vco, d), (m8 / 8, d, o8 / 8)))
    if not found:
        raise ValueError(f"no MMCM setting makes {out_hz / 1e6:g} MHz from {in_hz / 1e6:g} MHz")
    return min(found)[1]


class CoreClock(wiring.Component):
    """Drives the clock and reset of ``domain`` (default ``core``; its parent defines the
    domain, as Amaranth wants) at ``out_hz`` from the ``sync`` clock (``in_hz``) through
    an MMCM of ``family`` (``xcup`` or ``xcu``); reset while ``sync`` is in reset or the MMCM is
    not locked. ``locked`` (``sync`` domain, asynchronous) is the MMCM's lock output."""

    def __init__(self, family: str, *, in_hz: float = 125e6, out_hz: float = CORE_HZ,
                 domain: str = "core"):
        if family not in MMCM_PRIMITIVE:
            self._MustUse__silence = True  # rejected: no "created but never used" warning
            raise ValueError(f"family {family!r}: expected one of {sorted(MMCM_PRIMITIVE)}")
        self.family = family
        self.in_hz, self.out_hz, self.domain = in_hz, out_hz, domain
        self.mult, self.divclk, self.out_div = mmcm_params(in_hz, out_hz)
        super().__init__({"locked": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fb, clkout = Signal(), Signal()
        m.submodules.mmcm = Instance(
            MMCM_PRIMITIVE[self.family],
            p_CLKIN1_PERIOD=round(1e9 / self.in_hz, 3),
            p_CLKFBOUT_MULT_F=self.mult,
            p_DIVCLK_DIVIDE=self.divclk,
            p_CLKOUT0_DIVIDE_F=self.out_div,
            i_CLKIN1=ClockSignal("sync"),
            i_RST=ResetSignal("sync"),
            i_PWRDWN=0,
            i_CLKFBIN=fb,
            o_CLKFBOUT=fb,
            o_CLKOUT0=clkout,
            o_LOCKED=self.locked,
        )
        m.submodules.bufg = Instance("BUFG", i_I=clkout, o_O=ClockSignal(self.domain))
        m.submodules.rst_sync = ResetSynchronizer(ResetSignal("sync") | ~self.locked,
                                                  domain=self.domain)
        return m


class PortCrossing(wiring.Component):
    """One port's RX and TX beat streams between ``mac_domain`` and ``core_domain``.

    ``mac_rx`` (In, MAC side) -> ``core_rx`` (Out, core side); ``core_tx`` (In, core side) ->
    ``mac_tx`` (Out, MAC side). ``depth`` entries per direction (rounded to a power of two, plus
    the output register): enough to cover the pointer synchronisation round trip (about 3 cycles of
    each clock) at one beat per cycle; frame-sized buffering is the frame FIFOs' job. Beats keep
    their order and content (``first`` included); there is no frame awareness and no drop.
    """

    def __init__(self, data_width: int = 512, *, mac_domain: str, core_domain: str = "core",
                 depth: int = 16):
        self.layout = beat_layout(data_width)
        self.mac_domain, self.core_domain, self.depth = mac_domain, core_domain, depth
        super().__init__({
            "mac_rx": In(beat_signature(data_width)),
            "core_rx": Out(beat_signature(data_width)),
            "core_tx": In(beat_signature(data_width)),
            "mac_tx": Out(beat_signature(data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.layout.size
        n = self.depth + 1   # AsyncFIFOBuffered: a power of two plus the output register
        m.submodules.rx = rx = AsyncFIFOBuffered(width=w, depth=n, w_domain=self.mac_domain,
                                                 r_domain=self.core_domain)
        m.submodules.tx = tx = AsyncFIFOBuffered(width=w, depth=n, w_domain=self.core_domain,
                                                 r_domain=self.mac_domain)
        for src, fifo, dst in ((self.mac_rx, rx, self.core_rx), (self.core_tx, tx, self.mac_tx)):
            m.d.comb += [
                fifo.w_data.eq(Value.cast(src.payload)),
                fifo.w_en.eq(src.valid),
                src.ready.eq(fifo.w_rdy),
                dst.payload.eq(self.layout(fifo.r_data)),
                dst.valid.eq(fifo.r_rdy),
                fifo.r_en.eq(dst.ready),
            ]
        return m
