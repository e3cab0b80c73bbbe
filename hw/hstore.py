"""The engine's header store: each rank's stored header, per slot, for its result frame."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .packet.layout import HDR_CAP
from .rams import large_ram_attrs

__all__ = ["HeaderStore", "header_entry_layout", "READ_LATENCY"]

# the read latency the engine builds the header store with (its output register, see HeaderStore)
READ_LATENCY = 2


def header_entry_layout() -> data.StructLayout:
    """One stored header: the frame's header bytes and their length."""
    return data.StructLayout({"raw": data.ArrayLayout(8, HDR_CAP),
                              "hdr_len": range(HDR_CAP + 1)})


class HeaderStore(wiring.Component):
    """``slots x 2**ceil(log2(max_world))`` stored headers, addressed ``(slot, rank)`` as
    ``Cat(rank, slot)``. It needs no initial content: the first contribution of a slot writes its
    rank's entry before a release can read it.

    Ports: write (``w_en``, ``w_addr``, ``w_data``), read (``r_en``, ``r_addr`` -> ``r_data``).

    Contract: one write and one read per cycle; read latency ``read_latency`` (``r_data`` is the
    entry addressed ``read_latency`` cycles before, in a cycle with ``r_en``; a write in the
    same cycle is not seen). The memory's own read register (enabled by ``r_en``) is followed
    by ``read_latency - 1`` free-running output registers: a cascaded UltraRAM / block RAM at the
    core clock needs the second one (Vivado puts it into the RAM's output register, ``OREG`` /
    ``DOB_REG``), so the engine's emitter reads with ``read_latency`` = 2 (:data:`READ_LATENCY`).
    No backpressure, no errors.
    """

    def __init__(self, slots: int, max_world: int, *, read_latency: int = 1):
        if not isinstance(read_latency, int) or read_latency < 1:
            raise ValueError(f"header store read_latency = {read_latency!r}: must be >= 1")
        self.slots, self.max_world = slots, max_world
        self.read_latency = read_latency
        self.rank_bits = max(1, ceil_log2(max_world))
        self.depth = slots * (1 << self.rank_bits)
        self.layout = header_entry_layout()
        abits = ceil_log2(self.depth)
        super().__init__({"w_en": In(1), "w_addr": In(abits), "w_data": In(self.layout),
                          "r_en": In(1), "r_addr": In(abits), "r_data": Out(self.layout)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.hstore = mem = Memory(shape=self.layout, depth=self.depth, init=[],
                                        attrs=large_ram_attrs())
        wr, rd = mem.write_port(), mem.read_port()
        m.d.comb += [wr.en.eq(self.w_en), wr.addr.eq(self.w_addr), wr.data.eq(self.w_data),
                     rd.en.eq(self.r_en), rd.addr.eq(self.r_addr)]
        out = rd.data
        for i in range(1, self.read_latency):
            reg = Signal(self.layout, name=f"r_data_reg{i}", reset_less=True)
            m.d.sync += reg.eq(out)
            out = reg
        m.d.comb += self.r_data.eq(out)
        return m
