"""The engine's register bank: an AXI4-Lite slave generated from :mod:`netreduce.regmap`.

Nothing here restates an address, a field position or a reset value: every register, field,
access type, reset value and table length comes from the :class:`~netreduce.regmap.RegMap` the
bank is built with (default: ``build_regmap()``). The bank implements exactly the access semantics
of :class:`netreduce.regmap.RegisterFile` (the model's implementation of the same map), which the
tests check by running the same random access sequence on both.

Bus (``s_axil``, :class:`~.axil.AXI4LiteSignature`, 32-bit data, byte addresses):

* One transaction at a time. In the idle state the bank accepts a read (``arvalid``) or a write
  (``awvalid`` *and* ``wvalid`` together: AW and W are accepted in the same cycle, which AXI
  allows); when both are pending it alternates, so neither side starves. ``*ready`` depend
  combinationally on the ``*valid`` inputs (allowed by AXI), never the other way round.
* Latency, counting the cycle whose closing clock edge completes the AR (or AW and W) handshake
  as cycle 0: a read samples the registers (and status inputs and counters) in cycle 1 and goes
  up a registered select tree of 16 words per level, one level per cycle, so ``rvalid`` is high
  from cycle ``read_latency`` (1 + the deepest table's levels: 2 for a map of at most 16 words
  per table, 4 for the default map); a write is applied at the end of cycle 1, so from cycle 2
  the core sees the new value, a WO pulse is high during cycle 2 only, and ``bvalid`` is high
  from cycle 2. ``rvalid`` / ``bvalid`` then hold (data and response stable) until ``rready`` /
  ``bready``: that is the only backpressure. A read issued after a write's B handshake sees the
  write. Peak rate with ``*ready`` held high: one read per ``read_latency + 1`` cycles, one
  write per 3. The select tree keeps every register-to-register path of the read within the
  clock plan's logic depth (docs/engine.md) at any map size. RAM tables (below) are read at the
  AR handshake itself (address straight from ``araddr``; their word is kept in cycle 1) and
  written at the end of cycle 1.
* Errors: an address that decodes to no register of the map (holes inside a table entry, gaps
  between tables, beyond the last entry, beyond the map) or that is not 4-byte aligned answers
  ``DECERR`` (the map's :class:`~netreduce.regmap.BusError`); a write then has no effect, a read
  returns 0. ``SLVERR`` is never used. Writes to read-only registers answer ``OKAY`` and change
  nothing (as the map says). ``awprot`` / ``arprot`` are ignored.
* Byte strobes are honoured: ``wstrb`` bit *k* enables byte *k* (bits 8k..8k+7). RW bits of a
  disabled byte keep their value, W1C bits of a disabled byte are not cleared and WO bits of a
  disabled byte do not pulse. The address of a partial write must still be word aligned.

Core side (members generated per table; ``t`` = the table name in lower case; a table with more
than one entry gives a ``data.ArrayLayout`` of per-entry structs, field path ``<reg>.<field>`` in
lower case, e.g. ``bank.job_cfg[j].window.w`` or ``bank.flow_rd.data.fwd_ip.ip``):

* ``<t>_cfg`` (Out): every RW field, straight from its flip-flop (reset value from the map), for
  tables that are not RAM tables: the job table is read by several blocks at once, so every
  entry is visible at all times at no latency. The outputs are the live register values; the
  map's "configuration is latched on enable" is the core's job (it sees
  ``job_cfg[j].ctrl.enable`` and snapshots what it needs on the 0 -> 1 edge).
* ``<t>_rd`` (In, :func:`cfg_read_signature`) instead of ``<t>_cfg`` for a *RAM table*
  (``ram_tables``, default :data:`RAM_TABLES` = the flow table): its RW fields are held in a
  ``lib.memory.Memory`` (one 32-bit lane per register with an RW field, the bus's byte strobes
  are its byte write enables; inferable as BRAM/LUTRAM), not in flops, and the core reads one
  entry per cycle: ``data`` (the ``<t>_cfg`` entry layout) is the entry whose index was on
  ``addr`` in the previous cycle (a synchronous read port, not transparent: a read in the cycle a
  write is applied returns the old value, so a bus write is seen by a core read addressed from
  cycle 2 on, i.e. ``data`` from cycle 3). The flow table's RW copy is only scanned by the
  enable sequencer (the classifier compares frames against the flow table's own latched CAM),
  so it needs no parallel access. The other access types of a RAM table (RO status inputs, W1C
  flags, WO pulses) are as for any table.
* ``<t>_pulse`` (Out): WO fields; the written 1 bits are high for exactly one cycle (cycle 2
  above). ``GLOBAL.CONTROL.clear_counters`` also clears the bank's counters (at the end of that
  cycle).
* ``<t>_status`` (In): RO fields the core owns (job state, pointers, acked index, bound flag);
  sampled when a read is decoded.
* ``<t>_set`` (In): W1C sticky flags. Each cycle, ``flag <= flag & ~cleared | set``: a set in the
  same cycle as a clearing write wins, so no event is lost. Reset value from the map.
* Counters are held here and the core drives increment inputs: ``job_cnt_inc[j].<name>``
  (``inc_width`` bits, default 1: a strobe) per job counter, ``cnt_inc.<name>`` for the
  engine-wide counters that belong to no job. The engine-wide copies of the job counters (``CNT``
  registers named like a ``JOB_CNT`` register) are the sum over all jobs, kept by the bank: so the
  per-job and global values cannot disagree, and the core increments one place per event. The
  sum is pipelined: the ``CNT`` copy lags the ``JOB_CNT`` one by one cycle (also through a clear,
  so after any quiet cycle ``CNT.x == sum_j JOB_CNT[j].x`` holds exactly, modulo 2^32). Counters
  are 32 bits and wrap; bus writes to them are ignored (RO); ``clear_counters`` zeroes them all,
  and the increment of the clearing cycle still counts (``count <= 0 + inc``).
* Identity, version and build-parameter registers (the RO fields of ``GLOBAL``) are constants.

Reset: synchronous (Amaranth ``sync`` domain); every flop register takes its map reset value, no
response is pending. A RAM cannot be reset at once, so the FSM then sweeps the RAM tables: in
each of the ``reset_cycles`` cycles that follow reset (the entry count of the largest RAM table,
e.g. 256 for the default flow table; 0 without RAM tables) it writes the map's reset values into
one entry of every RAM table, with ``arready`` / ``awready`` / ``wready`` low; the first
handshake can complete in cycle ``reset_cycles`` (the first cycle after reset being cycle 0),
after which every register reads its reset value exactly as with flops. The core read port
returns reset values for an entry from the cycle after the sweep wrote it. The RAM's
initial contents (configuration) are the reset values as well.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from netreduce.regmap import REG_BITS, REG_BYTES, Access, Field, Register, RegMap, Table
from netreduce.regmap import build_regmap as _build_regmap

from .axil import AXI4LiteSignature, Resp

__all__ = ["RegisterBank", "BankBus", "ReadSelect", "CONST_TABLES", "COUNTER_TABLES",
           "SUM_TABLE", "JOB_COUNTER_TABLE", "CLEAR_COUNTERS", "RAM_TABLES", "member_name",
           "min_addr_width", "port_bits", "cfg_read_signature"]

# The roles of the map's tables (names, not addresses). RO fields elsewhere are core inputs.
CONST_TABLES = ("GLOBAL",)  # RO fields are constants: identity, version, build parameters
JOB_COUNTER_TABLE = "JOB_CNT"  # per-job counters, incremented by the core
SUM_TABLE = "CNT"  # engine-wide counters; registers named like JOB_CNT's are sums over jobs
COUNTER_TABLES = (SUM_TABLE, JOB_COUNTER_TABLE)
CLEAR_COUNTERS = "GLOBAL.CONTROL.clear_counters"
# Default tables whose RW fields live in a RAM (one read port for the core) instead of flops: the
# flow table's RW copy is only scanned by the enable sequencer (the per-frame lookup uses the
# flow table's own latched CAM), so flops would buy nothing but area.
RAM_TABLES = ("FLOW",)
# Read select tree: words per registered level (one LUT6 + MUXF7 + MUXF8 at 16)
READ_FANIN_BITS = 4
READ_FANIN_MASK = (1 << READ_FANIN_BITS) - 1


def member_name(table: str, role: str) -> str:
    """The signature member of ``table``'s ``role`` (cfg, pulse, status, set, inc)."""
    return f"{table.lower()}_{role}"


def cfg_read_signature(idx_bits: int, layout: data.Layout) -> wiring.Signature:
    """A RAM table's core read port, from the reader's side: ``addr`` (entry index, Out) and
    ``data`` (In, the entry's RW fields in ``layout``), valid in the cycle after ``addr``."""
    return wiring.Signature({"addr": Out(unsigned(idx_bits)), "data": In(layout)})


def port_bits(shape, *path) -> tuple[int, int]:
    """``(lsb, width)`` of ``path`` (entry index, register key, field key, as far as given) inside
    a packed port of layout ``shape``: where a Verilog or cocotb user finds ``job_cfg[1].world.n``
    in the flat ``job_cfg`` vector (``port_bits(shape, 1, "world", "n")``)."""
    lsb = 0
    for p in path:
        if isinstance(shape, data.ArrayLayout):
            if not 0 <= p < shape.length:
                raise IndexError(f"entry {p} outside 0..{shape.length - 1}")
            lsb += p * shape.elem_shape.size
            shape = shape.elem_shape
        else:
            f = shape[p]
            lsb += f.offset
            shape = f.shape
    width = shape.size if isinstance(shape, data.Layout) else Shape.cast(shape).width
    return lsb, width


def min_addr_width(rm: RegMap) -> int:
    """Address bits needed to reach every register of ``rm``."""
    return max(1, (rm.size - 1).bit_length())


def _key(name: str) -> str:
    return name.lower()


@dataclass
class _TablePlan:
    table: Table
    shift: int  # log2(stride) for multi-entry tables
    idx_bits: int
    layouts: dict[str, data.Layout] = field(default_factory=dict)  # role -> per-entry layout
    counters: bool = False
    sum_regs: tuple[str, ...] = ()  # CNT registers that are sums of JOB_CNT registers
    lanes: tuple[Register, ...] = ()  # RAM table: registers with RW fields, one 32-bit lane each


def _fields_layout(regs, keep) -> data.StructLayout | None:
    out = {}
    for r in regs:
        fs = {_key(f.name): unsigned(f.width) for f in r.fields if keep(r, f)}
        if fs:
            out[_key(r.name)] = data.StructLayout(fs)
    return data.StructLayout(out) if out else None


def _pack(shape, leaf, path=()):
    """The value of a port of layout ``shape`` (array / struct / leaf) built from ``leaf(path)``,
    where ``path`` is (entry index if an array, register key, field key)."""
    if isinstance(shape, data.ArrayLayout):
        return Cat(*(_pack(shape.elem_shape, leaf, path + (i,)) for i in range(shape.length)))
    if isinstance(shape, data.StructLayout):
        parts, pos = [], 0
        for name, f in sorted(shape, key=lambda nf: nf[1].offset):
            if f.offset > pos:
                parts.append(Const(0, f.offset - pos))
            parts.append(_pack(f.shape, leaf, path + (name,)))
            pos = f.offset + f.width
        if pos < shape.size:
            parts.append(Const(0, shape.size - pos))
        return Cat(*parts)
    return leaf(path)


def _in_range(addr, lo: int, hi: int):
    """``lo <= addr < hi`` for constants: the address bits above the smallest aligned
    power-of-two block holding ``[lo, hi)`` equal a constant, and compares on the bits inside
    the block only where the range does not start or end at its edges."""
    n = len(addr)
    hi = min(hi, 1 << n)
    if lo >= hi:
        return Const(0, 1)
    k = (lo ^ (hi - 1)).bit_length()
    hit = addr[k:] == (lo >> k) if k < n else Const(1, 1)
    low, lo_k, hi_k = addr[:k], lo & ((1 << k) - 1), (hi - 1) & ((1 << k) - 1)
    if lo_k:
        hit = hit & (low >= lo_k)
    if hi_k != (1 << k) - 1:
        hit = hit & (low <= hi_k)
    return hit


class BankBus(wiring.Component):
    """The register bank's AXI4-Lite handshakes (see the module docstring's "Bus" contract).

    * ``bus`` (In, :class:`~.axil.AXI4LiteSignature`): the slave port. This block drives its
      ``*ready``, ``rvalid``, ``bvalid`` and ``bresp``; ``rdata`` / ``rresp`` (In) are passed
      to it.
    * The transaction, held from the handshake to the response: ``raddr`` (Out) of a read,
      ``waddr``, ``wdata``, ``wstrb`` (Out) of a write.
    * ``decoding`` (Out): the cycle after an AR handshake (the read's level-0 sample);
      ``applying`` (Out): the cycle after an AW/W handshake (the write takes effect at its end);
      ``wr_ok`` (In) from the cycle after: the address was a register, else ``bresp`` = DECERR.
    * ``sweeping`` / ``sweep_i`` (Out): the ``reset_cycles`` cycles after reset (the RAM tables'
      reset sweep), with the entry index; the bus is not served then.

    Latency: ``rvalid`` from cycle ``read_latency`` after the AR handshake (cycle 0), ``bvalid``
    from cycle 2 after the AW/W handshake, each held until ``rready`` / ``bready`` (the only
    backpressure). One transaction at a time; reads and writes alternate when both wait.
    Errors: none of its own (``wr_ok``, ``rresp`` come from the decoders). Reset: synchronous,
    to SWEEP (IDLE without RAM tables).
    """

    def __init__(self, addr_width: int, read_latency: int, reset_cycles: int):
        self.read_latency, self.reset_cycles = read_latency, reset_cycles
        super().__init__({
            "bus": In(AXI4LiteSignature(addr_width)),
            "rdata": In(REG_BITS), "rresp": In(2), "wr_ok": In(1),
            "raddr": Out(addr_width), "waddr": Out(addr_width), "wdata": Out(REG_BITS),
            "wstrb": Out(REG_BYTES), "decoding": Out(1), "applying": Out(1),
            "sweeping": Out(1), "sweep_i": Out(range(max(reset_cycles, 2))),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        prefer_read = Signal()  # alternate when reads and writes are both pending
        tree_i = Signal(range(max(self.read_latency, 2)))
        m.d.comb += [bus.rdata.eq(self.rdata), bus.rresp.eq(self.rresp)]
        wr_pending = bus.awvalid & bus.wvalid
        with m.FSM(name="axil", init="SWEEP" if self.reset_cycles else "IDLE"):
            if self.reset_cycles:
                with m.State("SWEEP"):
                    m.d.comb += self.sweeping.eq(1)
                    m.d.sync += self.sweep_i.eq(self.sweep_i + 1)
                    with m.If(self.sweep_i == self.reset_cycles - 1):
                        m.next = "IDLE"
            with m.State("IDLE"):
                take_read = bus.arvalid & (~wr_pending | prefer_read)
                take_write = wr_pending & ~take_read
                m.d.comb += [bus.arready.eq(take_read), bus.awready.eq(take_write),
                             bus.wready.eq(take_write)]
                with m.If(take_read):
                    m.d.sync += [self.raddr.eq(bus.araddr), prefer_read.eq(0)]
                    m.next = "READ"
                with m.Elif(take_write):
                    m.d.sync += [self.waddr.eq(bus.awaddr), self.wdata.eq(bus.wdata),
                                 self.wstrb.eq(bus.wstrb), prefer_read.eq(1)]
                    m.next = "WRITE"
            with m.State("READ"):
                m.d.comb += self.decoding.eq(1)
                m.next = "READ_TREE" if self.read_latency > 2 else "READ_RESP"
            if self.read_latency > 2:
                with m.State("READ_TREE"):  # the select tree's upper levels
                    m.d.sync += tree_i.eq(tree_i + 1)
                    with m.If(tree_i == self.read_latency - 3):
                        m.d.sync += tree_i.eq(0)
                        m.next = "READ_RESP"
            with m.State("READ_RESP"):
                m.d.comb += bus.rvalid.eq(1)
                with m.If(bus.rready):
                    m.next = "IDLE"
            with m.State("WRITE"):
                m.d.comb += self.applying.eq(1)
                m.next = "WRITE_RESP"
            with m.State("WRITE_RESP"):
                m.d.comb += [bus.bvalid.eq(1),
                             bus.bresp.eq(Mux(self.wr_ok, Resp.OKAY, Resp.DECERR))]
                with m.If(bus.bready):
                    m.next = "IDLE"
        return m


class ReadSelect(wiring.Component):
    """One table's registered read select tree (the register bank's read path).

    * ``words`` (In, ``len(index)`` x 32): the table's register values; ``words[j]`` is word
      ``index[j]`` of the table (word = byte offset / 4 from the table's base; words not in
      ``index`` are holes).
    * ``sel`` (In, ``sel_bits``): the word index of the read; ``hit`` (In): the address lies in
      the table and is 4-aligned; ``sample`` (In, strobe): the read's decode cycle.
    * ``value`` / ``ok`` (Out): the addressed word and 1, or 0 / 0 for a hole or a miss.

    Level 0 samples the words (16 per group, chosen by ``sel``'s low 4 bits) in the ``sample``
    cycle and holds them; each level above chooses among 16 groups of the level below on every
    cycle, from ``sel`` and the held values, the top one gated by ``hit``: one LUT6 + MUXF7 +
    MUXF8 per register stage at any table size. Latency: ``value`` / ``ok`` are valid from the
    ``levels``-th cycle after the ``sample`` cycle's edge while ``sel`` and ``hit`` hold;
    ``levels`` = ceil(``sel_bits`` / 4), at least ``min_levels``. No backpressure, no errors.
    """

    def __init__(self, index, sel_bits: int, min_levels: int = 1):
        self.index = tuple(index)
        self.sel_bits = sel_bits
        self.levels = max(-(-sel_bits // READ_FANIN_BITS), min_levels, 1)
        super().__init__({"words": In(data.ArrayLayout(REG_BITS, len(self.index))),
                          "sel": In(max(sel_bits, 1)), "hit": In(1), "sample": In(1),
                          "value": Out(REG_BITS), "ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        items = {w: (self.words[j], Const(1, 1)) for j, w in enumerate(self.index)}
        sel = self.sel if self.sel_bits else Const(0, 1)
        for lv in range(self.levels):
            top = lv == self.levels - 1
            groups: dict[int, dict[int, tuple]] = {}
            for w, item in items.items():
                groups.setdefault(w >> READ_FANIN_BITS, {})[w & READ_FANIN_MASK] = item
            s = sel[READ_FANIN_BITS * lv:READ_FANIN_BITS * (lv + 1)]
            nxt = {}
            for g, members in groups.items():
                v = Signal(REG_BITS, name=f"l{lv}_{g}")
                k = Signal(name=f"l{lv}_{g}_ok")
                with m.If(self.sample if lv == 0 else 1):
                    m.d.sync += [v.eq(0), k.eq(0)]
                    with m.If(self.hit if top else 1):
                        if len(s) == 0:
                            iv, ik = members[0]
                            m.d.sync += [v.eq(iv), k.eq(ik)]
                        else:
                            with m.Switch(s):
                                for j, (iv, ik) in members.items():
                                    with m.Case(j):
                                        m.d.sync += [v.eq(iv), k.eq(ik)]
                nxt[g] = (v, k)
            items = nxt
        (val, ok), = items.values()
        m.d.comb += [self.value.eq(val), self.ok.eq(ok)]
        return m


class RegisterBank(wiring.Component):
    """AXI4-Lite register bank for ``regmap`` (see the module docstring for the contract).

    Parameters: ``regmap`` (default ``build_regmap()``), ``addr_width`` (default: the fewest bits
    that reach every register; more bits make the extra space DECERR), ``inc_width`` (width of the
    counter increment inputs), ``ram_tables`` (names of the tables whose RW fields are held in a
    RAM, default :data:`RAM_TABLES`; a name the map lacks is ignored only if ``ram_tables`` is the
    default). Raises ``ValueError`` for a map it cannot implement (a multi-entry table whose
    stride is not a power of two, a table layout that is not as the roles above need, a RAM table
    that is a counter or constant table or has no RW field).

    ``reset_cycles``: cycles after reset during which the bus is not served (the RAM sweep).
    ``read_latency``: cycles from the AR handshake to ``rvalid`` (see the module docstring).
    """

    def __init__(self, regmap: RegMap | None = None, *, addr_width: int | None = None,
                 inc_width: int = 1, ram_tables: Iterable[str] | None = None):
        try:
            self._build(regmap, addr_width, inc_width, ram_tables)
        except Exception:
            self._MustUse__silence = True  # a refused map is not an unused elaboratable
            raise

    def _build(self, regmap, addr_width, inc_width, ram_tables):
        rm = regmap if regmap is not None else _build_regmap()
        need = min_addr_width(rm)
        addr_width = need if addr_width is None else addr_width
        if addr_width < need:
            raise ValueError(f"addr_width {addr_width} cannot reach the map's last register at "
                             f"0x{rm.size - REG_BYTES:x} (needs {need} bits)")
        if inc_width < 1:
            raise ValueError(f"inc_width {inc_width} must be >= 1")
        self.map = rm
        self.addr_width = addr_width
        self.inc_width = inc_width
        self.clear_field = rm.field(CLEAR_COUNTERS)
        if self.clear_field.access != Access.WO:
            raise ValueError(f"{CLEAR_COUNTERS} must be WO, is {self.clear_field.access}")
        job_cnt_names = {r.name for r in rm.table(JOB_COUNTER_TABLE).registers}
        names = {t.name for t in rm.tables}
        if ram_tables is None:
            ram = {n for n in RAM_TABLES if n in names}
        else:
            ram = set(ram_tables)
            if ram - names:
                raise ValueError(f"RAM tables {sorted(ram - names)} are not in the map")
        bad = ram & (set(COUNTER_TABLES) | set(CONST_TABLES))
        if bad:
            raise ValueError(f"tables {sorted(bad)}: counter and constant tables cannot be RAM "
                             f"tables")
        self.ram_tables = tuple(sorted(ram))

        self._plans: list[_TablePlan] = []
        members: dict[str, wiring.Member] = {"s_axil": In(AXI4LiteSignature(addr_width))}
        for t in rm.tables:
            if t.count == 0:
                continue
            if t.count > 1 and t.stride & (t.stride - 1):
                raise ValueError(f"table {t.name}: stride 0x{t.stride:x} is not a power of two")
            plan = _TablePlan(t, max(t.stride.bit_length() - 1, 0),
                              max((t.count - 1).bit_length(), 1))
            if t.name in COUNTER_TABLES:
                for r in t.registers:
                    if [(f.access, f.width) for f in r.fields] != [(Access.RO, REG_BITS)]:
                        raise ValueError(f"counter {t.name}.{r.name} must be one 32-bit RO field")
                if t.name == SUM_TABLE:
                    if t.count != 1:
                        raise ValueError(f"table {SUM_TABLE} must have one entry")
                    plan.sum_regs = tuple(r.name for r in t.registers if r.name in job_cnt_names)
                plan.counters = True
                incs = {_key(r.name): unsigned(inc_width) for r in t.registers
                        if r.name not in plan.sum_regs}
                if incs:
                    plan.layouts["inc"] = data.StructLayout(incs)
            else:
                const = t.name in CONST_TABLES
                roles = {
                    "cfg": (lambda r, f: f.access == Access.RW, Out),
                    "pulse": (lambda r, f: f.access == Access.WO, Out),
                    "status": (lambda r, f, c=const: f.access == Access.RO and not c, In),
                    "set": (lambda r, f: f.access == Access.W1C, In),
                }
                for role, (keep, _) in roles.items():
                    lay = _fields_layout(t.registers, keep)
                    if lay is not None:
                        plan.layouts[role] = lay
                if t.name in ram:
                    if "cfg" not in plan.layouts:
                        raise ValueError(f"RAM table {t.name} has no RW field")
                    plan.lanes = tuple(r for r in t.registers if r.rw_mask)
            for role, lay in plan.layouts.items():
                if plan.lanes and role == "cfg":
                    members[member_name(t.name, "rd")] = In(cfg_read_signature(plan.idx_bits,
                                                                               lay))
                    continue
                flow = Out if role in ("cfg", "pulse") else In
                shape = lay if t.count == 1 else data.ArrayLayout(lay, t.count)
                members[member_name(t.name, role)] = flow(shape)
            self._plans.append(plan)
        self.reset_cycles = max((p.table.count for p in self._plans if p.lanes), default=0)
        # cycles from the AR handshake to rvalid: the decode cycle is the select tree's level 0
        self.read_latency = 1 + max(self._read_levels(p) for p in self._plans)
        super().__init__(members)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _word_bits(plan: _TablePlan) -> int:
        """Bits of the word index inside ``plan``'s table (its span in 32-bit words)."""
        t = plan.table
        span = t.count * t.stride if t.count > 1 else t.size
        return max(span // REG_BYTES - 1, 0).bit_length()

    def _read_levels(self, plan: _TablePlan) -> int:
        """Registered levels of the table's read select tree (a RAM table keeps its word in a
        level-0 register, so it has at least 2)."""
        n = max(-(-self._word_bits(plan) // READ_FANIN_BITS), 1)
        return max(n, 2) if plan.lanes else n

    def _port(self, plan: _TablePlan, role: str, i: int):
        v = getattr(self, member_name(plan.table.name, role))
        return v if plan.table.count == 1 else v[i]

    @staticmethod
    def _decode(m: Module, plan: _TablePlan, addr: Signal, name: str):
        """(hit, index, offset) of ``addr`` in ``plan``'s table: hit = inside the table's span
        and 4-byte aligned (the register offset is checked by the caller); index and offset are
        meaningful only with hit. No subtraction where the table is aligned (the offset and
        index are then bits of the address), and the span check compares the bits above the
        table's aligned block with a constant (:func:`_in_range`): a few LUTs, no carry chain
        over the address."""
        t = plan.table
        span = t.count * t.stride if t.count > 1 else t.size
        hit = Signal(name=f"{name}_hit")
        m.d.comb += hit.eq(_in_range(addr, t.base, t.base + span) & (addr[:2] == 0))
        if t.count > 1 and t.base % t.stride == 0:
            b = (t.base >> plan.shift) % (1 << plan.idx_bits)
            raw = addr[plan.shift:plan.shift + plan.idx_bits]
            return hit, (raw if b == 0 else (raw - b)[:plan.idx_bits]), addr[:plan.shift]
        wb = (span - 1).bit_length()
        if t.count == 1 and t.base % (1 << wb) == 0:
            return hit, Const(0, 1), addr[:wb]
        rel = Signal(len(addr), name=f"{name}_rel")
        m.d.comb += rel.eq(addr - t.base)
        if t.count > 1:
            return hit, rel[plan.shift:plan.shift + plan.idx_bits], rel[:plan.shift]
        return hit, Const(0, 1), rel

    @staticmethod
    def _index(plan: _TablePlan, addr):
        """The entry index bits of ``addr`` in ``plan``'s table (no range check)."""
        if plan.table.count == 1:
            return Const(0, plan.idx_bits)
        rel = addr - plan.table.base
        return rel[plan.shift:plan.shift + plan.idx_bits]

    # ------------------------------------------------------------------ elaborate
    def elaborate(self, platform):
        m = Module()
        st = self._storage()
        rams = self._ram_tables(m, st)
        # outputs to the core: one assignment per port (per-field slices of a wide port make
        # elaboration quadratic in the table size)
        for plan in self._plans:
            t = plan.table
            for role, src in (("cfg", st.store), ("pulse", st.pulses)):
                if role not in plan.layouts or (role == "cfg" and plan.lanes):
                    continue
                port = getattr(self, member_name(t.name, role))
                m.d.comb += port.as_value().eq(_pack(
                    port.shape(), lambda p, t=t, src=src: src[(t.name, *p)]
                    if t.count > 1 else src[(t.name, 0, *p)]))
        m.submodules.axil = fsm = BankBus(self.addr_width, self.read_latency,
                                          self.reset_cycles)
        wiring.connect(m, wiring.flipped(self.s_axil), fsm.bus)
        rdata, any_ok = self._read_path(m, st, rams, fsm)
        m.d.comb += [fsm.rdata.eq(rdata), fsm.rresp.eq(Mux(any_ok, Resp.OKAY, Resp.DECERR))]
        # the per-table results of the write's decode, registered (bresp is their OR)
        wr_oks = self._write_path(m, st, rams, fsm)
        wr_ok_q = Signal(len(wr_oks))
        with m.If(fsm.applying):
            m.d.sync += wr_ok_q.eq(wr_oks)
        m.d.comb += fsm.wr_ok.eq(wr_ok_q.any())
        # W1C sticky flags: set by the core, cleared by the bus; set wins
        for plan in self._plans:
            t = plan.table
            for i in range(t.count):
                for r in t.registers:
                    for f in r.fields:
                        if f.access != Access.W1C:
                            continue
                        k = (t.name, i, _key(r.name), _key(f.name))
                        s = self._port(plan, "set", i)[_key(r.name)][_key(f.name)]
                        m.d.sync += st.store[k].eq((st.store[k] & ~st.w1c_clear[k]) | s)
        self._counters(m, st)
        return m

    def _storage(self):
        """The bank's flip-flops: RW and W1C fields (``store``), WO pulses (``pulses``),
        counters (``counters``), keyed by (table, entry, register key, field key) / (table,
        entry, register name)."""
        st = SimpleNamespace(store={}, pulses={}, counters={}, w1c_clear={})
        for plan in self._plans:
            t = plan.table
            for i in range(t.count):
                for r in t.registers:
                    if plan.counters:
                        st.counters[(t.name, i, r.name)] = Signal(
                            REG_BITS, name=f"cnt_{t.name}_{i}_{r.name}".lower())
                        continue
                    for f in r.fields:
                        nm = f"{t.name}_{i}_{r.name}_{f.name}".lower()
                        k = (t.name, i, _key(r.name), _key(f.name))
                        if f.access == Access.W1C or (f.access == Access.RW and not plan.lanes):
                            st.store[k] = Signal(f.width, init=f.reset, name=nm)
                        elif f.access == Access.WO:
                            st.pulses[k] = Signal(f.width, name=nm)
        return st

    def _reg_value(self, st, plan: _TablePlan, i: int, r: Register):
        """What the bus reads for register ``r`` of entry ``i`` (a RAM table's RW fields read 0
        here: they come from the RAM's bus read port, OR-ed in after the select tree)."""
        t = plan.table

        def source(f: Field):
            if plan.counters:
                return st.counters[(t.name, i, r.name)]
            if f.access == Access.RW and plan.lanes:
                return Const(0, f.width)
            if f.access in (Access.RW, Access.W1C):
                return st.store[(t.name, i, _key(r.name), _key(f.name))]
            if f.access == Access.WO:
                return Const(0, f.width)
            if t.name in CONST_TABLES:
                return Const(f.reset, f.width)
            return self._port(plan, "status", i)[_key(r.name)][_key(f.name)]

        parts, pos = [], 0
        for f in sorted(r.fields, key=lambda f: f.lsb):
            if f.lsb > pos:
                parts.append(Const(0, f.lsb - pos))
            parts.append(source(f))
            pos = f.msb + 1
        if pos < REG_BITS:
            parts.append(Const(0, REG_BITS - pos))
        return Cat(*parts)

    def _ram_tables(self, m, st) -> dict:
        """RAM tables: every register with an RW field is one 32-bit lane of the entry's word
        (bits outside RW fields stay 0), so the bus's byte strobes are the write port's byte
        enables. Ports: a bus read port and the write port share one address (an inferred
        BRAM's read-write port), the core read port is the other side."""
        rams: dict[str, tuple] = {}
        for plan in self._plans:
            if not plan.lanes:
                continue
            t = plan.table
            reset_word = sum((r.reset & r.rw_mask) << (REG_BITS * k)
                             for k, r in enumerate(plan.lanes))
            mem = Memory(shape=unsigned(REG_BITS * len(plan.lanes)), depth=t.count,
                         init=[reset_word] * t.count)
            m.submodules[f"ram_{t.name.lower()}"] = mem
            wp = mem.write_port(granularity=8)
            bp = mem.read_port()
            cp = mem.read_port()
            addr = Signal(plan.idx_bits, name=f"ram_{t.name.lower()}_addr")
            m.d.comb += [wp.addr.eq(addr), bp.addr.eq(addr)]
            rams[t.name] = (wp, bp, addr, reset_word)
            rd = getattr(self, member_name(t.name, "rd"))
            regs = {_key(r.name): (k, r) for k, r in enumerate(plan.lanes)}

            def lane_bits(p, cp=cp, regs=regs):
                k, r = regs[p[0]]
                f = r.field(next(f.name for f in r.fields if _key(f.name) == p[1]))
                return cp.data[REG_BITS * k + f.lsb:REG_BITS * k + f.msb + 1]

            m.d.comb += [cp.addr.eq(rd.addr),
                         rd.data.as_value().eq(_pack(plan.layouts["cfg"], lane_bits))]
        return rams

    def _read_path(self, m, st, rams, fsm):
        """A registered select tree per table (:class:`ReadSelect`); ``rdata`` is the OR of the
        tables' top registers (only the addressed table's is non-zero). Returns ``(rdata,
        any_ok)``."""
        raddr = fsm.raddr
        rd_vals, rd_oks = [], []
        for plan in self._plans:
            t = plan.table
            nm = f"rd_{t.name.lower()}"
            hit, _, _ = self._decode(m, plan, raddr, nm)
            wbits = self._word_bits(plan)
            # a table aligned to its span needs no subtraction for its word index
            rel = raddr if t.base % (REG_BYTES << wbits) == 0 else raddr - t.base
            sel = rel[2:2 + wbits] if wbits else Const(0, 1)
            stride = t.stride // REG_BYTES if t.count > 1 else 0
            index = [i * stride + r.offset // REG_BYTES for i in range(t.count)
                     for r in t.registers]
            tree = ReadSelect(index, wbits, min_levels=2 if plan.lanes else 1)
            assert tree.levels == self._read_levels(plan)
            m.submodules[nm] = tree
            m.d.comb += [tree.words.as_value().eq(Cat(*(self._reg_value(st, plan, i, r)
                                                        for i in range(t.count)
                                                        for r in t.registers))),
                         tree.sel.eq(sel), tree.hit.eq(hit), tree.sample.eq(fsm.decoding)]
            val = tree.value
            if plan.lanes:
                # the RAM was read at the AR handshake (address from araddr): its word is there
                # in the decode cycle only, so level 0 keeps the addressed register's lane
                bp = rams[t.name][1]
                lane_of = {r.name: k for k, r in enumerate(plan.lanes)}
                ram_reg = Signal(REG_BITS, name=f"{nm}_ram")
                off = rel[2:plan.shift] if t.count > 1 else sel
                with m.If(fsm.decoding):
                    m.d.sync += ram_reg.eq(0)
                    with m.If(hit), m.Switch(off):
                        for r in plan.lanes:
                            with m.Case(r.offset // REG_BYTES):
                                m.d.sync += ram_reg.eq(
                                    bp.data.word_select(lane_of[r.name], REG_BITS) & r.rw_mask)
                val = val | ram_reg
            rd_vals.append(val)
            rd_oks.append(tree.ok)
        rdata = rd_vals[0]
        for v in rd_vals[1:]:
            rdata = rdata | v
        return rdata, Cat(*rd_oks).any()

    def _write_path(self, m, st, rams, fsm):
        """Decode the latched AW/W while ``applying``: RW fields, RAM lanes, W1C clears (into
        ``st.w1c_clear``), WO pulses. Returns per table whether the address is one of its
        registers."""
        waddr, wdata, wstrb, applying = fsm.waddr, fsm.wdata, fsm.wstrb, fsm.applying
        bytemask = Cat(*(wstrb[k].replicate(8) for k in range(REG_BYTES)))
        wr_oks = []
        for plan in self._plans:
            t = plan.table
            hit, idx, off = self._decode(m, plan, waddr, f"wr_{t.name.lower()}")
            offs = Signal(name=f"wr_{t.name.lower()}_known")
            m.d.comb += offs.eq(Cat(*(off == r.offset for r in t.registers)).any())
            wr_oks.append(hit & offs)
            if plan.counters:
                continue  # counters are RO: bus writes ignored
            if plan.lanes:
                wp, _, ram_addr, reset_word = rams[t.name]
                with m.If(fsm.sweeping):
                    m.d.comb += [ram_addr.eq(fsm.sweep_i), wp.data.eq(reset_word),
                                 wp.en.eq(Mux(fsm.sweep_i < t.count, (1 << len(wp.en)) - 1, 0))]
                with m.Elif(applying):
                    m.d.comb += [
                        ram_addr.eq(idx),
                        wp.data.eq(Cat(*(wdata & r.rw_mask for r in plan.lanes))),
                        wp.en.eq(Cat(*(Mux(hit & (off == r.offset), wstrb, 0)
                                       for r in plan.lanes))),
                    ]
                with m.Else():
                    m.d.comb += ram_addr.eq(self._index(plan, self.s_axil.araddr))
            entry_sel = [idx == i for i in range(t.count)] if t.count > 1 else [Const(1, 1)]
            for r in t.registers:
                reg_sel = Signal(name=f"wr_{t.name}_{r.name}".lower())
                m.d.comb += reg_sel.eq(applying & hit & (off == r.offset))
                for i in range(t.count):
                    we = reg_sel & entry_sel[i]
                    for f in r.fields:
                        k = (t.name, i, _key(r.name), _key(f.name))
                        bits = slice(f.lsb, f.msb + 1)
                        en = bytemask[bits]
                        if f.access == Access.RW and plan.lanes:
                            continue  # the RAM's write port, above
                        if f.access == Access.RW:
                            with m.If(we):
                                m.d.sync += st.store[k].eq((st.store[k] & ~en)
                                                           | (wdata[bits] & en))
                        elif f.access == Access.W1C:
                            st.w1c_clear[k] = Mux(we, wdata[bits] & en, 0)
                        elif f.access == Access.WO:
                            m.d.sync += st.pulses[k].eq(Mux(we, wdata[bits] & en, 0))
        return Cat(*wr_oks)

    def _counters(self, m, st):
        """Counters: ``count <= (clear ? 0 : count) + inc``; the CNT sums of the per-job
        counters through a registered balanced adder tree (one cycle later, their clear too)."""
        tname, rname, fname = CLEAR_COUNTERS.split(".")
        clear = st.pulses[(tname, 0, _key(rname), _key(fname))].any()
        clear_d = Signal()  # the sums lag one cycle: so does their clear
        m.d.sync += clear_d.eq(clear)
        jplan = next(p for p in self._plans if p.table.name == JOB_COUNTER_TABLE)
        for plan in self._plans:
            if not plan.counters:
                continue
            t = plan.table
            for i in range(t.count):
                for r in t.registers:
                    c = st.counters[(t.name, i, r.name)]
                    if r.name in plan.sum_regs:
                        n = jplan.table.count
                        total = Signal(range(n * ((1 << self.inc_width) - 1) + 1),
                                       name=f"sum_{r.name}".lower())
                        # a balanced adder tree: a chain would widen every adder by one more
                        # bit per term (and be n - 1 adders deep)
                        acc = [self._port(jplan, "inc", j)[_key(r.name)] for j in range(n)]
                        while len(acc) > 1:
                            acc = [acc[k] + acc[k + 1] if k + 1 < len(acc) else acc[k]
                                   for k in range(0, len(acc), 2)]
                        acc = acc[0]
                        m.d.sync += [total.eq(acc),
                                     c.eq((Mux(clear_d, 0, c) + total)[:REG_BITS])]
                    else:
                        inc = self._port(plan, "inc", i)[_key(r.name)]
                        m.d.sync += c.eq((Mux(clear, 0, c) + inc)[:REG_BITS])
