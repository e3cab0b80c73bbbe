"""Per-port status and counters of the engine (register table ``PORT``; issue 22).

:class:`PortStats` keeps, per port, the counters of :data:`netreduce.regmap.PORT_COUNTERS`:

* engine side (the reference model counts the same, :mod:`netreduce.sim.model.ports`):
  ``rx_frames`` / ``rx_bytes`` at the engine's input ``i_p<k>`` (every frame, management and
  link-local ones included), ``tx_frames`` / ``tx_bytes`` at its output ``o_p<k>`` (bytes without
  FCS), ``pause_rx`` (PAUSE/PFC frames acted on, from the link-local filter), ``tx_drop_held``
  (frames the port's :class:`~netreduce.hw.txhold.TxHoldGate` dropped or cut, input ``hold_drop``);
* shell side, from the engine's ``shell`` input (:data:`SHELL_LAYOUT` per port, driven by the
  board shell around the MAC; 0 when nothing drives it): ``link_up``, ``rsfec_lock``,
  ``tx_paused``, ``xoff`` and ``congested`` levels for ``PORT.STATUS``, and one-cycle strobes
  ``rx_errors``, ``rx_drop_full``, ``rx_cut``, ``tx_drop_down``, ``pfc_tx`` (the shell's RX
  FIFO, link gate and PFC generator, :mod:`netreduce.hw.boards`).

The other way, the engine's ``fc`` output (:func:`fc_layout` per port) hands the shell the
``PORT.FC_*`` registers (PFC watermarks, priority, quanta, ECN threshold; docs/fabric.md).

Counters are 32 bits, wrap, and clear with ``GLOBAL.CONTROL.clear_counters`` (an increment in the
clearing cycle still counts). The frame and strobe counts pass one register stage before the
counters, so a register read sees them two cycles late; the byte counts three stages (their
priority encoder split by 8-byte groups), four cycles late, and a clear empties the stages
holding earlier beats. A read issued after a clear's B handshake sees the cleared values (the
register bank samples in the cycle after the AR handshake at the earliest).
:func:`attach_ports` builds it inside the engine's ``elaborate`` and drives the register bank's
``port_status``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from netreduce.regmap import PORT_COUNTERS

from .stream import keep_count

__all__ = ["SHELL_LAYOUT", "SHELL_STROBES", "SHELL_LEVELS", "PortStats", "attach_ports",
           "fc_layout"]

SHELL_STROBES = tuple(n for n, src, _ in PORT_COUNTERS if src == "shell")
SHELL_LEVELS = ("link_up", "rsfec_lock", "tx_paused", "xoff", "congested")  # PORT.STATUS
SHELL_LAYOUT = data.StructLayout({**{n: 1 for n in SHELL_LEVELS},
                                  **{n: 1 for n in SHELL_STROBES}})


def fc_layout(bank):
    """One port's entry of the register bank's ``port_cfg`` (the ``PORT.FC_*`` RW fields)."""
    shape = bank.signature.members["port_cfg"].shape
    return shape.elem_shape if isinstance(shape, data.ArrayLayout) else shape


class PortStats(wiring.Component):
    """One port's counters. Inputs: ``rx_beat`` / ``tx_beat`` (a beat handshaked on the port:
    ``valid``, ``keep``, ``last``), ``pause`` and ``hold_drop`` (strobes), ``shell``
    (:data:`SHELL_LAYOUT`), ``clear``; output ``value``: the bank's ``port_status`` entry layout."""

    def __init__(self, width: int, status_layout):
        self.width = width
        beat = data.StructLayout({"valid": 1, "keep": width // 8, "last": 1})
        super().__init__({"rx_beat": In(beat), "tx_beat": In(beat), "pause": In(1),
                          "hold_drop": In(1),
                          "shell": In(SHELL_LAYOUT), "clear": In(1),
                          "value": Out(status_layout)})

    def elaborate(self, platform):
        m = Module()
        v = self.value
        # One register stage in front of the frame and strobe counters, so an increment and a
        # clear keep their order. The byte counts (a priority encoder on keep: 10 LUT levels on
        # its own at 512 bits) go through three stages of their own: the beat's keep, then per
        # 8-byte group "any byte" and its candidate count (8 g + the group's count), then the
        # highest group's candidate; a clear empties the two stages whose beats came before it
        # and zeroes the counter at once, so it still erases exactly the beats before it.
        rx, tx = self.rx_beat, self.tx_beat
        strobes = {"pause_rx": self.pause, "tx_drop_held": self.hold_drop,
                   **{n: getattr(self.shell, n) for n in SHELL_STROBES}}
        s1 = {"rx_frames": Signal(name="rx_frames_s1"), "tx_frames": Signal(name="tx_frames_s1"),
              **{n: Signal(name=f"{n}_s1") for n in strobes}}
        clear1 = Signal(name="clear_s1")
        m.d.sync += [s1["rx_frames"].eq(rx.valid & rx.last),
                     s1["tx_frames"].eq(tx.valid & tx.last),
                     clear1.eq(self.clear),
                     *(s1[n].eq(x) for n, x in strobes.items())]
        for reg, inc in s1.items():
            c = getattr(v, reg).count
            m.d.sync += c.eq(c + inc)
            with m.If(clear1):
                m.d.sync += c.eq(inc)
        for reg, beat in (("rx_bytes", rx), ("tx_bytes", tx)):
            self._bytes(m, reg, beat, getattr(v, reg).count)
        m.d.sync += [getattr(v.status, n).eq(getattr(self.shell, n)) for n in SHELL_LEVELS]
        return m

    def _bytes(self, m, name, beat, count):
        """``count`` += the bytes of every beat (:func:`keep_count`: highest valid byte + 1),
        three cycles late; ``clear`` (combinational) zeroes it and drops the beats before it."""
        nb = self.width // 8
        groups = max(1, nb // 8)
        gb = nb // groups
        nbits = nb.bit_length()
        keep = Signal(nb, name=f"{name}_keep")          # stage 1: the beat's keep (0: no beat)
        m.d.sync += keep.eq(Mux(beat.valid, beat.keep, 0))
        anyb = Signal(groups, name=f"{name}_any")       # stage 2: per group
        cand = [Signal(nbits, name=f"{name}_cand{g}") for g in range(groups)]
        for g in range(groups):
            kg = keep[g * gb:(g + 1) * gb]
            m.d.sync += [anyb[g].eq(kg.any() & ~self.clear), cand[g].eq(g * gb + keep_count(kg))]
        inc = Signal(nbits, name=f"{name}_inc")        # stage 3: the highest group's count
        top = [anyb[g] & ~anyb[g + 1:].any() for g in range(groups - 1)] + [anyb[groups - 1]]
        sel = 0
        for g in range(groups):
            sel = sel | (cand[g] & top[g].replicate(nbits))
        m.d.sync += inc.eq(Mux(self.clear, 0, sel))
        m.d.sync += count.eq(Mux(self.clear, 0, count + inc))


def attach_ports(m: Module, engine, bank, pause_valid: list) -> list[PortStats]:
    """One :class:`PortStats` per port of ``engine`` observing its ``i_p<k>`` / ``o_p<k>``
    handshakes, ``pause_valid[k]`` and ``engine.shell[k]``, driving ``bank.port_status[k]``;
    ``engine.fc[k]`` from ``bank.port_cfg[k]``."""
    status, cfg = bank.port_status, bank.port_cfg
    arr = isinstance(status.shape(), data.ArrayLayout)   # a one-entry table is not an array
    lay = status.shape().elem_shape if arr else status.shape()
    out = []
    for k in range(engine.ports):
        ps = PortStats(engine.width, lay)
        m.submodules[f"port_stats{k}"] = ps
        for name, s in (("rx_beat", getattr(engine, f"i_p{k}")),
                        ("tx_beat", getattr(engine, f"o_p{k}"))):
            b = getattr(ps, name)
            m.d.comb += [b.valid.eq(s.valid & s.ready), b.keep.eq(s.payload.keep),
                         b.last.eq(s.payload.last)]
        m.d.comb += [ps.pause.eq(pause_valid[k]), ps.shell.eq(engine.shell[k]),
                     ps.clear.eq(bank.global_pulse.control.clear_counters),
                     (status[k] if arr else status).eq(ps.value),
                     engine.fc[k].eq(cfg[k] if arr else cfg)]
        out.append(ps)
    return out
