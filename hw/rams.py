"""How the large RAMs reach UltraRAM / block RAM in a vendor flow.

The two large memories of the engine, the slot memory (two copies of ``slots x pmtu_max`` bytes)
and the header store (``slots x 2**ceil(log2(max_world))`` entries of ~632 bits), are created
with :func:`large_ram_attrs`: a Verilog ``ram_style`` attribute on the memory declaration (the
way Vivado synthesis is told to infer UltraRAM or block RAM, UG901 "RAM HDL Coding Techniques"),
``"ultra"`` by default (UltraScale+, e.g. the xcvu9p of the VCU118) or ``"block"`` inside
:func:`large_ram_style` (UltraScale without URAM, e.g. the xcvu095 of the VCU108).

Such a memory has *no initial content* in the RTLIL and Verilog (:func:`omit_large_ram_init`):

* UltraRAM cannot be initialised from the bitstream (UG573, "UltraRAM"), so a memory with an
  ``initial`` block would not map to URAM;
* block RAM comes out of configuration zeroed without an ``INIT`` anyway;
* the logic never reads a word it has not written (a slot's first contribution overwrites, a
  header entry is stored before its slot can be released), so an X in a four-state simulator
  never reaches an output;
* Amaranth writes all-zero contents bit by bit: 2 x 65,536 x 512 bits of the default slot
  memory plus the header store made a >100 MB RTLIL file that took many minutes to write and to
  read back.

Every other memory (FIFOs, tables, CRC ROMs) keeps its contents: they are small, map to LUT RAM
or BRAM, and some rely on starting at zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["URAM", "BRAM", "LARGE_RAM_STYLES", "large_ram_attrs", "large_ram_style",
           "omit_large_ram_init", "skip_meminit"]

URAM = "ultra"
BRAM = "block"
LARGE_RAM_STYLES = (URAM, BRAM)

_STYLE: ContextVar[str] = ContextVar("netreduce_large_ram_style", default=URAM)


def large_ram_attrs() -> dict[str, str]:
    """Attributes for a large memory (``Memory(..., attrs=large_ram_attrs())``), read at
    elaboration time: ``{"ram_style": "ultra"}`` unless inside :func:`large_ram_style`."""
    return {"ram_style": _STYLE.get()}


@contextlib.contextmanager
def large_ram_style(style: str):
    """Elaborate the large memories for ``style`` (``"ultra"`` or ``"block"``) inside this
    block: a board without UltraRAM builds under ``large_ram_style("block")``."""
    if style not in LARGE_RAM_STYLES:
        raise ValueError(f"large RAM style {style!r}: expected one of {LARGE_RAM_STYLES}")
    token = _STYLE.set(style)
    try:
        yield
    finally:
        _STYLE.reset(token)


def _is_large(attributes) -> bool:
    return attributes.get("ram_style") in LARGE_RAM_STYLES


@contextlib.contextmanager
def skip_meminit(skip: Callable):
    """While active, Amaranth's RTLIL back end writes no ``$meminit_v2`` cell (the memory's
    initial contents) for a memory cell where ``skip(cell)`` is true; nests."""
    from amaranth.back import rtlil

    emitter = rtlil.ModuleEmitter
    orig = emitter.emit_memory

    def emit_memory(self, cell_idx, cell):
        if not skip(cell):
            orig(self, cell_idx, cell)

    emitter.emit_memory = emit_memory
    try:
        yield
    finally:
        emitter.emit_memory = orig


@contextlib.contextmanager
def omit_large_ram_init():
    """While active, Amaranth's RTLIL back end writes no ``$meminit_v2`` cell (no ``initial``
    block in the Verilog) for a memory made with :func:`large_ram_attrs` whose contents are all
    zero. A large memory with non-zero contents is an error (it could not be a URAM)."""

    def large(cell) -> bool:
        if not _is_large(cell.attributes):
            return False
        if any(cell.init):
            raise ValueError(f"memory {cell.name!r} targets {cell.attributes['ram_style']} "
                             "RAM and has non-zero initial contents (UltraRAM takes none)")
        return True

    with skip_meminit(large):
        yield
