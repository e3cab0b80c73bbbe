"""PFC from the RX FIFO's watermarks: the engine's port pauses the switch before its FIFO drops.

:class:`PfcGenerator` sits in a port's MAC clock domain, between the TX FIFO and the MAC. It
watches the RX FIFO's fill level (beats) and sends 802.1Qbb PFC frames for one priority (the
RoCE class, ``PORT.FC_CTRL.priority``; frame format :func:`netreduce.wire.linklocal.pfc_frame`):

* **XOFF** when ``enable`` and the level reaches ``xoff_bytes`` (level x bytes per beat >=
  ``xoff_bytes``): a PFC frame with the priority's enable bit and pause time ``quanta``. While
  XOFF, the request is repeated every ``quanta`` cycles (a quantum is 512 bit times, 5.12 ns at
  100 Gb/s, longer than one cycle of any MAC clock the shell uses, so the pause never lapses
  while the FIFO stays above XON). ``quanta`` = 0 sends no repeats.
* **XON** when XOFF and the level has fallen to ``xon_bytes`` (and below ``xoff_bytes``, so a
  misconfigured XON >= XOFF cannot make it flap every cycle), or ``enable`` falls: the same
  frame with pause time 0.
* Hysteresis: between the two watermarks nothing is sent. ``xoff`` (Out) is the state, ``sent``
  (Out) pulses once per PFC frame sent (``PORT.PFC_TX``).

TX insertion: frames from ``tx_i`` pass to ``tx_o`` unchanged; a PFC frame goes out only
between two frames (never inside one: the MAC must get every frame without a gap), ahead of the
next frame of ``tx_i``, at one beat per cycle (60 bytes: 1 beat at 512 bits, 8 at 64). The
latest request wins: a request made while another waits replaces it (an XON after an unsent
XOFF sends just the XON). The frame's fields are taken when it starts. Latency: a request is
made 2 cycles after the level crosses (the comparison is registered), sent from the next frame
boundary plus one cycle. Logic depth (``hw/estimate.py``, 512 bits): within the MAC clock's
budget of 6 LUT levels.
Source address: ``src_mac`` (default :func:`netreduce.wire.linklocal.station_mac`).
Reset: synchronous, XON state, nothing pending.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from netreduce.wire.linklocal import (
    ETHERTYPE_MAC_CONTROL,
    MAC_CONTROL_PFC,
    PAUSE_DA,
    PFC_FRAME_BYTES,
    PFC_PRIORITIES,
    station_mac,
)

from ..stream import beat_signature, check_data_width

__all__ = ["PfcGenerator"]


class PfcGenerator(wiring.Component):
    """See the module docstring. Parameters: ``width`` (bits per beat), ``level_bits`` (width of
    the RX FIFO level input), ``src_mac`` (6 bytes). Ports: ``level`` (In, beats), ``enable``,
    ``priority`` (3), ``quanta`` (16), ``xoff_bytes`` / ``xon_bytes`` (24) (In, the
    ``PORT.FC_*`` registers), ``tx_i`` (In) / ``tx_o`` (Out) beat streams, ``xoff``, ``sent``
    (Out)."""

    def __init__(self, width: int = 512, level_bits: int = 16, src_mac: bytes | None = None):
        self.width = check_data_width(width)
        self.src_mac = bytes(station_mac(0) if src_mac is None else src_mac)
        if len(self.src_mac) != 6:
            self._MustUse__silence = True
            raise ValueError(f"src_mac {self.src_mac.hex()} is not 6 bytes")
        super().__init__({
            "level": In(level_bits),
            "enable": In(1), "priority": In(3), "quanta": In(16),
            "xoff_bytes": In(24), "xon_bytes": In(24),
            "tx_i": In(beat_signature(width)), "tx_o": Out(beat_signature(width)),
            "xoff": Out(1), "sent": Out(1),
        })

    def _frame_bytes(self, pri, q) -> list:
        """The PFC frame's 60 bytes (Values) for priority ``pri`` and pause time ``q``."""
        const = list(PAUSE_DA) + list(self.src_mac) + list(ETHERTYPE_MAC_CONTROL.to_bytes(2, "big"))
        const += list(MAC_CONTROL_PFC.to_bytes(2, "big"))
        out = [Const(b, 8) for b in const]
        out += [Const(0, 8), (Const(1, 8) << pri)[:8]]  # class enable vector (high byte reserved)
        for i in range(PFC_PRIORITIES):
            qi = Mux(pri == i, q, 0)
            out += [qi[8:16], qi[0:8]]  # big-endian pause time of priority i
        return out + [Const(0, 8)] * (PFC_FRAME_BYTES - len(out))

    def elaborate(self, platform):
        m = Module()
        nb = self.width // 8
        shift = nb.bit_length() - 1
        lvl = Signal(len(self.level) + shift)
        m.d.comb += lvl.eq(self.level << shift)
        # the watermark comparisons are registered (one cycle later: logic depth)
        above, low = Signal(), Signal()
        m.d.sync += [above.eq(lvl >= self.xoff_bytes),
                     low.eq((lvl <= self.xon_bytes) & (lvl < self.xoff_bytes))]

        # ---- state: XOFF/XON with hysteresis, refresh timer, one pending request
        xoff = Signal()
        refresh = Signal(16)
        pending = Signal()
        pend_q = Signal(16)
        m.d.comb += self.xoff.eq(xoff)
        with m.If(~xoff & self.enable & above):
            m.d.sync += [xoff.eq(1), pending.eq(1), pend_q.eq(self.quanta),
                         refresh.eq(self.quanta)]
        with m.Elif(xoff & (~self.enable | low)):
            m.d.sync += [xoff.eq(0), pending.eq(1), pend_q.eq(0)]
        with m.Elif(xoff & (self.quanta != 0)):
            with m.If(refresh == 0):
                m.d.sync += [pending.eq(1), pend_q.eq(self.quanta), refresh.eq(self.quanta)]
            with m.Else():
                m.d.sync += refresh.eq(refresh - 1)

        # ---- TX: PFC frames between the frames of tx_i
        ti, to = self.tx_i, self.tx_o
        in_frame = Signal()      # tx_i's current frame has started on tx_o
        sending = Signal()
        nbeats = -(-PFC_FRAME_BYTES // nb)
        beat = Signal(range(max(nbeats, 2)))
        # the frame is built into a register when a request is taken (logic depth)
        frame = Signal(nbeats * nb * 8)
        fb = self._frame_bytes(self.priority, pend_q)
        fb += [Const(0, 8)] * (nbeats * nb - len(fb))
        beats = Array(frame[k * nb * 8:(k + 1) * nb * 8] for k in range(nbeats))
        tail = PFC_FRAME_BYTES - (nbeats - 1) * nb
        is_last = beat == nbeats - 1
        m.d.sync += self.sent.eq(0)
        with m.If(sending):
            m.d.comb += [to.valid.eq(1), to.payload.data.eq(beats[beat]),
                         to.payload.keep.eq(Mux(is_last, (1 << tail) - 1, (1 << nb) - 1)),
                         to.payload.first.eq(beat == 0), to.payload.last.eq(is_last),
                         ti.ready.eq(0)]
            with m.If(to.ready):
                m.d.sync += beat.eq(beat + 1)
                with m.If(is_last):
                    m.d.sync += [sending.eq(0), beat.eq(0), self.sent.eq(1)]
        with m.Elif(pending & ~in_frame):
            # take the request: the frame's fields now, its first beat next cycle
            m.d.sync += [sending.eq(1), pending.eq(0), frame.eq(Cat(*fb))]
            m.d.comb += [to.valid.eq(0), ti.ready.eq(0)]
        with m.Else():
            m.d.comb += [to.valid.eq(ti.valid), to.payload.eq(ti.payload), ti.ready.eq(to.ready)]
            with m.If(ti.valid & ti.ready):
                m.d.sync += in_frame.eq(~ti.payload.last)
        # a request taken in the same cycle as a new one: the new one stays pending
        with m.If(~xoff & self.enable & above | xoff & (~self.enable | low)):
            m.d.sync += pending.eq(1)
        return m
