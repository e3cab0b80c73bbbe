"""Generic register-map description: fields, registers, tables, the map, the bus protocol.

Everything here is plain data (frozen dataclasses) so that gateware (an AXI4-Lite register bank),
driver constants and Markdown docs can all be generated from one :class:`RegMap`. Registers are
32 bits wide at 4-byte aligned byte addresses. A :class:`Table` is an array of ``count`` entries of
the same registers, ``stride`` bytes apart; a block of singleton registers is a table of one entry.

Access types (per field; a register may mix them):

* ``RO``  read-only: written by hardware; bus writes are ignored (AXI OKAY, no effect).
* ``RW``  read-write: holds what the bus wrote (masked to the field); hardware only reads it.
* ``W1C`` sticky flag set by hardware; writing 1 to a bit clears it, writing 0 leaves it.
* ``WO``  write-only pulse: a write of 1 triggers an action for one cycle; always reads 0.

Bits covered by no field are reserved: they read 0 and ignore writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol, runtime_checkable

__all__ = ["Access", "Field", "Register", "Table", "RegMap", "RegInstance", "RegisterBus",
           "BusError", "REG_BYTES", "REG_BITS"]

REG_BITS = 32
REG_BYTES = 4


class Access(StrEnum):
    RO = "RO"
    RW = "RW"
    W1C = "W1C"
    WO = "WO"


class BusError(Exception):
    """An AXI4-Lite access the register bank answers with DECERR (unmapped or unaligned address)
    or SLVERR; also raised for values that do not fit 32 bits."""


@runtime_checkable
class RegisterBus(Protocol):
    """The AXI4-Lite view of an engine: 32-bit reads and writes at byte addresses."""

    def read(self, addr: int) -> int: ...

    def write(self, addr: int, value: int) -> None: ...


@dataclass(frozen=True)
class Field:
    """Bits ``lsb .. lsb+width-1`` of a register."""

    name: str
    lsb: int
    width: int
    access: Access
    reset: int = 0
    desc: str = ""
    enum: type[IntEnum] | None = None

    def __post_init__(self):
        if self.width < 1 or self.lsb < 0 or self.lsb + self.width > REG_BITS:
            raise ValueError(f"field {self.name}: bits [{self.msb}:{self.lsb}] outside 0..31")
        if not 0 <= self.reset <= self.max:
            raise ValueError(f"field {self.name}: reset {self.reset} does not fit {self.width} b")

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    @property
    def max(self) -> int:
        return (1 << self.width) - 1

    @property
    def mask(self) -> int:
        """The field's bits in register position."""
        return self.max << self.lsb

    @property
    def bits(self) -> str:
        return f"[{self.msb}:{self.lsb}]" if self.width > 1 else f"[{self.lsb}]"

    def get(self, reg_value: int) -> int:
        return (reg_value >> self.lsb) & self.max

    def put(self, reg_value: int, value: int) -> int:
        if not 0 <= value <= self.max:
            raise ValueError(f"{self.name} = {value} does not fit in {self.width} bits")
        return (reg_value & ~self.mask) | (value << self.lsb)


@dataclass(frozen=True)
class Register:
    """One 32-bit register at byte ``offset`` inside its table entry."""

    name: str
    offset: int
    desc: str
    fields: tuple[Field, ...]

    def __post_init__(self):
        if self.offset % REG_BYTES:
            raise ValueError(f"register {self.name}: offset 0x{self.offset:x} not 4-aligned")
        used = 0
        for f in self.fields:
            if used & f.mask:
                raise ValueError(f"register {self.name}: field {f.name} overlaps another field")
            used |= f.mask

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name} has no field {name!r}")

    def _mask(self, *access: Access) -> int:
        m = 0
        for f in self.fields:
            if f.access in access:
                m |= f.mask
        return m

    @property
    def access(self) -> str:
        """The access type, or ``"mixed"`` when fields differ."""
        kinds = {f.access for f in self.fields}
        return next(iter(kinds)).value if len(kinds) == 1 else "mixed"

    @property
    def reset(self) -> int:
        v = 0
        for f in self.fields:
            v |= f.reset << f.lsb
        return v

    @property
    def rw_mask(self) -> int:
        return self._mask(Access.RW)

    @property
    def w1c_mask(self) -> int:
        return self._mask(Access.W1C)

    @property
    def wo_mask(self) -> int:
        return self._mask(Access.WO)

    @property
    def readable_mask(self) -> int:
        return self._mask(Access.RO, Access.RW, Access.W1C)


@dataclass(frozen=True)
class Table:
    """``count`` entries of ``registers`` at ``base + i * stride``."""

    name: str
    base: int
    stride: int
    count: int
    registers: tuple[Register, ...]
    desc: str = ""

    def __post_init__(self):
        if self.base % REG_BYTES or self.stride % REG_BYTES:
            raise ValueError(f"table {self.name}: base/stride must be 4-aligned")
        end = max((r.offset + REG_BYTES for r in self.registers), default=0)
        if self.count > 1 and end > self.stride:
            raise ValueError(f"table {self.name}: registers span {end} B > stride {self.stride}")
        offs = [r.offset for r in self.registers]
        if len(set(offs)) != len(offs):
            raise ValueError(f"table {self.name}: two registers share an offset")

    @property
    def size(self) -> int:
        """Bytes spanned by the table (the last entry's registers included)."""
        end = max((r.offset + REG_BYTES for r in self.registers), default=0)
        return (self.count - 1) * self.stride + end if self.count else 0

    def reg(self, name: str) -> Register:
        for r in self.registers:
            if r.name == name:
                return r
        raise KeyError(f"table {self.name} has no register {name!r}")

    def addr(self, index: int, reg: str) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"{self.name} index {index} outside 0..{self.count - 1}")
        return self.base + index * self.stride + self.reg(reg).offset


@dataclass(frozen=True)
class RegInstance:
    """One register of one table entry, at its absolute byte address."""

    table: Table
    index: int
    reg: Register
    addr: int

    @property
    def name(self) -> str:
        if self.table.count == 1:
            return f"{self.table.name}.{self.reg.name}"
        return f"{self.table.name}[{self.index}].{self.reg.name}"


@dataclass(frozen=True)
class RegMap:
    """A whole register map: named tables at non-overlapping byte ranges, plus the build
    parameters and enums it was generated with."""

    name: str
    version: tuple[int, int]
    params: dict[str, int]
    tables: tuple[Table, ...]
    enums: tuple[type[IntEnum], ...] = ()
    desc: str = ""
    _decode: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        spans = sorted((t.base, t.base + t.size, t.name) for t in self.tables if t.count)
        for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:], strict=False):
            if b1 < e0:
                raise ValueError(f"tables {n0} and {n1} overlap at 0x{b1:x}")
        for inst in self.instances():
            self._decode[inst.addr] = inst

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"register map has no table {name!r}")

    def addr(self, path: str, index: int = 0) -> int:
        """Byte address of ``"TABLE.REG"`` in entry ``index``."""
        t, r = path.split(".")
        return self.table(t).addr(index, r)

    def reg(self, path: str) -> Register:
        t, r = path.split(".")
        return self.table(t).reg(r)

    def field(self, path: str) -> Field:
        """The field ``"TABLE.REG.FIELD"``."""
        t, r, f = path.split(".")
        return self.table(t).reg(r).field(f)

    def decode(self, addr: int) -> RegInstance | None:
        return self._decode.get(addr)

    def instances(self) -> Iterator[RegInstance]:
        for t in self.tables:
            for i in range(t.count):
                for r in t.registers:
                    yield RegInstance(t, i, r, t.base + i * t.stride + r.offset)

    @property
    def size(self) -> int:
        """Bytes of address space the map needs (one past the highest register)."""
        return max(t.base + t.size for t in self.tables if t.count)
