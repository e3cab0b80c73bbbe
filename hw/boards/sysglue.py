"""The shell's logic on the board's 125 MHz ``sync`` clock (the management clock domain).

:class:`SysGlue` holds all of it, so its logic depth can be estimated on its own (design
``sysglue`` of :mod:`netreduce.hw.estimate`):

* the CMAC reset hold: ``cmac_sys_reset`` is high for :data:`SYS_RESET_CYCLES` cycles after the
  ``sync`` reset (a down-counter, registered output), then low;
* the LED heartbeat: ``leds[0]`` is the top bit of a 27-bit free-running counter (about 1 Hz
  blinking at 125 MHz);
* the status LEDs: ``leds[1 + i]`` is ``status[i]`` (a level from any clock domain) through a
  two-flip-flop synchroniser.

Contract: no input-to-output combinational path; every output a flip-flop.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["SYS_RESET_CYCLES", "HEARTBEAT_BITS", "SysGlue"]

SYS_RESET_CYCLES = 1024   # 8 us of CMAC sys_reset at 125 MHz
HEARTBEAT_BITS = 27       # 2**27 / 125 MHz = 1.07 s per heartbeat period


class SysGlue(wiring.Component):
    """Ports (``sync`` domain): ``status`` (In, ``n_status`` asynchronous levels),
    ``cmac_sys_reset`` (Out, high while the CMACs are held in reset), ``leds`` (Out,
    ``1 + n_status``: the heartbeat, then the synchronised ``status``)."""

    def __init__(self, n_status: int):
        self._n = n_status
        super().__init__({
            "status": In(n_status),
            "cmac_sys_reset": Out(1, init=1),
            "leds": Out(1 + n_status),
        })

    def elaborate(self, platform):
        m = Module()
        hold = Signal(range(SYS_RESET_CYCLES + 1), init=SYS_RESET_CYCLES)
        with m.If(hold != 0):
            m.d.sync += hold.eq(hold - 1)
        m.d.sync += self.cmac_sys_reset.eq(hold != 0)
        heartbeat = Signal(HEARTBEAT_BITS)
        m.d.sync += heartbeat.eq(heartbeat + 1)
        m.d.comb += self.leds[0].eq(heartbeat[-1])
        for i in range(self._n):
            m.submodules[f"status_sync{i}"] = FFSynchronizer(self.status[i], self.leds[1 + i])
        return m
