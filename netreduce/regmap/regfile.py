"""A memory-backed register bank with AXI4-Lite access semantics (for models and tests).

Bus side (:meth:`RegisterFile.read` / :meth:`RegisterFile.write`) behaves like the gateware's
register bank: RW bits hold what was written, RO bits ignore writes, W1C bits clear where a 1 is
written, WO bits read 0 and only trigger the write hooks, reserved bits read 0. Unmapped or
unaligned addresses raise :class:`BusError` (the gateware answers DECERR).

Hardware side: :meth:`peek` / :meth:`poke` bypass the access rules; :meth:`bind` attaches a
getter that supplies a register's value live (counters and pointers kept by a model);
:meth:`on_write` registers a callback run after every bus write to an address.
"""

from __future__ import annotations

from collections.abc import Callable

from .types import BusError, RegInstance, RegMap

__all__ = ["RegisterFile"]

_U32 = 0xFFFFFFFF


class RegisterFile:
    """Implements :class:`~netreduce.regmap.types.RegisterBus` over a :class:`RegMap`."""

    def __init__(self, regmap: RegMap):
        self.map = regmap
        self._mem: dict[int, int] = {i.addr: i.reg.reset for i in regmap.instances()}
        self._getters: dict[int, Callable[[], int]] = {}
        self._hooks: dict[int, list[Callable[[RegInstance, int, int], None]]] = {}

    # ------------------------------------------------------------------ bus side
    def _inst(self, addr: int) -> RegInstance:
        if not isinstance(addr, int) or addr % 4:
            raise BusError(f"unaligned register address {addr!r}")
        inst = self.map.decode(addr)
        if inst is None:
            raise BusError(f"no register at address 0x{addr:x}")
        return inst

    def read(self, addr: int) -> int:
        inst = self._inst(addr)
        g = self._getters.get(addr)
        v = g() if g is not None else self._mem[addr]
        return v & inst.reg.readable_mask & _U32

    def write(self, addr: int, value: int) -> None:
        inst = self._inst(addr)
        if not isinstance(value, int) or not 0 <= value <= _U32:
            raise BusError(f"write of {value!r} to {inst.name}: not a 32-bit value")
        reg = inst.reg
        old = self._mem[addr]
        new = (old & ~reg.rw_mask) | (value & reg.rw_mask)
        new &= ~(value & reg.w1c_mask)
        self._mem[addr] = new
        for hook in self._hooks.get(addr, ()):
            hook(inst, value, old)

    # ------------------------------------------------------------------ hardware side
    def peek(self, addr: int) -> int:
        """The stored value (RW/W1C/RO bits as held), ignoring any getter."""
        return self._mem[addr]

    def poke(self, addr: int, value: int) -> None:
        """Set the stored value as hardware would (no access rules, no hooks)."""
        self._mem[addr] = value & _U32

    def set_bits(self, addr: int, mask: int) -> None:
        self._mem[addr] |= mask

    def bind(self, addr: int, getter: Callable[[], int]) -> None:
        self._inst(addr)
        self._getters[addr] = getter

    def on_write(self, addr: int, hook: Callable[[RegInstance, int, int], None]) -> None:
        """Call ``hook(instance, value_written, old_value)`` after each bus write to ``addr``."""
        self._inst(addr)
        self._hooks.setdefault(addr, []).append(hook)

    # ------------------------------------------------------------------ conveniences
    def read_path(self, path: str, index: int = 0) -> int:
        return self.read(self.map.addr(path, index))

    def write_path(self, path: str, value: int, index: int = 0) -> None:
        self.write(self.map.addr(path, index), value)
