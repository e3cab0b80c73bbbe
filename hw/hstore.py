"""The engine's header store: each rank's stored header, per slot, for its result frame."""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .packet.layout import HDR_CAP
from .rams import large_ram_attrs

__all__ = ["HeaderStore", "header_entry_layout"]


def header_entry_layout() -> data.StructLayout:
    """One stored header: the frame's header bytes and their length."""
    return data.StructLayout({"raw": data.ArrayLayout(8, HDR_CAP),
                              "hdr_len": range(HDR_CAP + 1)})


class HeaderStore(wiring.Component):
    """``slots x 2**ceil(log2(max_world))`` stored headers, addressed ``(slot, rank)`` as
    ``Cat(rank, slot)``. It needs no initial content: the first contribution of a slot writes its
    rank's entry before a release can read it.

    Ports: write (``w_en``, ``w_addr``, ``w_data``), read (``r_en``, ``r_addr`` -> ``r_data``).

    Contract: one write and one read per cycle; read latency 1 (``r_data`` is the entry addressed
    in the last cycle with ``r_en``, held otherwise; a write in the same cycle is not seen).
    No backpressure, no errors.
    """

    def __init__(self, slots: int, max_world: int):
        self.slots, self.max_world = slots, max_world
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
                     rd.en.eq(self.r_en), rd.addr.eq(self.r_addr), self.r_data.eq(rd.data)]
        return m
