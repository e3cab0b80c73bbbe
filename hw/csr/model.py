"""Bus-level reference of :class:`~.bank.RegisterBank`: :class:`netreduce.regmap.RegisterFile`
plus what the bank adds on top of the map's access rules.

* Byte strobes (:meth:`BankModel.write` ``strb``): a disabled byte keeps its RW bits and neither
  clears W1C bits nor pulses WO bits.
* ``GLOBAL.CONTROL.clear_counters`` zeroes every counter.
* Counters are kept by the bank: :meth:`count` adds to a job counter and its engine-wide sum,
  :meth:`count_global` to an engine-wide counter of no job.
* Core inputs: :meth:`set_ro` (a core-owned RO field) and :meth:`set_flag` (a W1C event).

Errors are returned as the bank answers them (``Resp.DECERR``, data 0), not raised. Testbenches
(Amaranth and cocotb) run the same sequence on this and on the gateware and compare.
"""

from __future__ import annotations

from netreduce.regmap import BusError, RegisterFile, RegMap

from .axil import Resp
from .bank import CLEAR_COUNTERS, JOB_COUNTER_TABLE, SUM_TABLE

__all__ = ["BankModel", "bytemask"]

_U32 = 0xFFFFFFFF


def bytemask(strb: int, nbytes: int = 4) -> int:
    """``wstrb`` as a bit mask: byte *k* enabled -> bits 8k..8k+7 set."""
    return sum(0xFF << (8 * k) for k in range(nbytes) if strb >> k & 1)


class BankModel:
    def __init__(self, rm: RegMap):
        self.map = rm
        self.rf = RegisterFile(rm)
        t, r, _ = CLEAR_COUNTERS.split(".")
        self.clear_mask = rm.field(CLEAR_COUNTERS).mask
        self.rf.on_write(rm.addr(f"{t}.{r}"), self._on_control)
        self.counter_addrs = [i.addr for i in rm.instances()
                              if i.table.name in (SUM_TABLE, JOB_COUNTER_TABLE)]

    def _on_control(self, inst, value, old):
        if value & self.clear_mask:
            for a in self.counter_addrs:
                self.rf.poke(a, 0)

    # ------------------------------------------------------------------ bus
    def read(self, addr: int) -> tuple[int, Resp]:
        try:
            return self.rf.read(addr), Resp.OKAY
        except BusError:
            return 0, Resp.DECERR

    def write(self, addr: int, value: int, strb: int = 0xF) -> Resp:
        inst = self.map.decode(addr) if addr % 4 == 0 else None
        if inst is None:
            return Resp.DECERR
        m = bytemask(strb)
        eff = (value & m) | (self.rf.peek(addr) & inst.reg.rw_mask & ~m)
        self.rf.write(addr, eff & _U32)
        return Resp.OKAY

    # ------------------------------------------------------------------ core side
    def set_ro(self, path: str, index: int, field: str, value: int) -> None:
        """Core input: RO field ``field`` of register ``path`` ("JOB.FREE_PTR"), entry index."""
        a = self.map.addr(path, index)
        self.rf.poke(a, self.map.reg(path).field(field).put(self.rf.peek(a), value))

    def set_flag(self, path: str, index: int, field: str) -> None:
        """Core event on W1C field ``field``: the flag becomes 1."""
        self.rf.set_bits(self.map.addr(path, index), self.map.reg(path).field(field).mask)

    def count(self, name: str, job: int, k: int = 1) -> None:
        """``k`` increments of job counter ``name`` (register name, e.g. "RX_DATA")."""
        for path, i in ((f"{JOB_COUNTER_TABLE}.{name}", job), (f"{SUM_TABLE}.{name}", 0)):
            a = self.map.addr(path, i)
            self.rf.poke(a, self.rf.peek(a) + k)

    def count_global(self, name: str, k: int = 1) -> None:
        a = self.map.addr(f"{SUM_TABLE}.{name}")
        self.rf.poke(a, self.rf.peek(a) + k)
