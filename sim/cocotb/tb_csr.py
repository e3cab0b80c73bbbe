"""cocotb: the register bank's Verilog top driven by cocotbext-axi's AxiLiteMaster.

The DUT is ``generate(RegisterBank(build_regmap(**params)), ...)``; the pytest wrapper passes the
same ``params`` (and ``seed``, ``ops``). Every answer is compared with
:class:`netreduce.hw.csr.BankModel` (RegisterFile plus strobes, counters and core inputs) run
through the same sequence. cocotbext-axi is the independent AXI4-Lite implementation; its channel
pause generators stall AW, W, B, AR and R independently, so AW/W arrive skewed and the bank's
responses wait for ``bready``/``rready``.

Sub-word writes: cocotbext-axi puts the byte address on ``awaddr``; the map (and the bank) answer
DECERR for an address that is not 4-byte aligned, so sub-word writes are issued at the aligned
address with 1..4 bytes (``wstrb`` low lanes), and unaligned ones are checked to be refused.
"""

from __future__ import annotations

import itertools
import random

import cocotb
from amaranth.lib.wiring import In
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster
from netreduce.hw.csr import (
    JOB_COUNTER_TABLE,
    SUM_TABLE,
    BankModel,
    RegisterBank,
    Resp,
    member_name,
    port_bits,
)

from netreduce.regmap import MAGIC, Access, build_regmap

from .axis import quiet, report, reset, start_clock, tb_args


class Env:
    """DUT, bus master, model and the packed core-side inputs."""

    def __init__(self, dut):
        a = tb_args()
        self.dut = dut
        self.rm = build_regmap(**a.get("params", {}))
        bank = RegisterBank(self.rm)  # for the port layouts only
        bank._MustUse__silence = True
        self.shapes = {n: m.shape for n, m in bank.signature.members.items() if not m.is_signature}
        self.model = BankModel(self.rm)
        self.rng = random.Random(a.get("seed", 1))
        self.ops = a.get("ops", 300)
        quiet(dut, "s_axil")
        self.axi = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        self.inputs = {n: 0 for n, m in bank.signature.members.items()
                       if not m.is_signature and m.flow == In}
        for n in self.inputs:
            getattr(dut, n).value = 0

    def bits(self, table, role, index, reg, field=None):
        name = member_name(table.name, role)
        shape = self.shapes[name]
        path = ([index] if table.count > 1 else []) + [reg.lower()] + ([field] if field else [])
        return name, *port_bits(shape, *path)

    def drive(self, name, lsb, width, value):
        v = self.inputs[name]
        v = (v & ~(((1 << width) - 1) << lsb)) | (value << lsb)
        self.inputs[name] = v
        getattr(self.dut, name).value = v

    async def read(self, addr):
        r = await self.axi.read(addr, 4 - addr % 4)
        return int.from_bytes(r.data, "little"), Resp(int(r.resp))

    async def write(self, addr, data: bytes):
        r = await self.axi.write(addr, data)
        return Resp(int(r.resp))


@cocotb.test()
async def test_identity(dut):
    start_clock(dut)
    env = Env(dut)
    await reset(dut)
    n = 0
    for inst in env.rm.instances():
        if inst.table.name == "GLOBAL":
            got = await env.read(inst.addr)
            assert got == env.model.read(inst.addr), f"{inst.name}: {got}"
            n += 1
    assert (await env.read(env.rm.addr("GLOBAL.MAGIC"))) == (MAGIC, Resp.OKAY)
    assert (await env.read(env.rm.addr("GLOBAL.FLOWS")))[0] == env.rm.params["flows"]
    report(identity_registers=n)


@cocotb.test()
async def test_random_sequence(dut):
    """Random reads/writes (with sub-word, unaligned and unmapped addresses), core status changes,
    W1C events and counter bursts; the bank and BankModel answer the same."""
    start_clock(dut)
    env = Env(dut)
    rng, rm, model = env.rng, env.rm, env.model
    await reset(dut)
    w = env.axi.write_if
    r = env.axi.read_if
    w.aw_channel.set_pause_generator(itertools.cycle([0, 0, 1]))
    w.w_channel.set_pause_generator(itertools.cycle([1, 0, 0, 1, 0]))
    w.b_channel.set_pause_generator(itertools.cycle([0, 1, 1]))
    r.ar_channel.set_pause_generator(itertools.cycle([0, 1]))
    r.r_channel.set_pause_generator(itertools.cycle([1, 1, 0]))
    insts = list(rm.instances())
    ro = [(i, f) for i in insts for f in i.reg.fields
          if f.access == Access.RO and member_name(i.table.name, "status") in env.inputs]
    w1c = [(i, f) for i in insts for f in i.reg.fields if f.access == Access.W1C]
    job_cnt = [x.name for x in rm.table(JOB_COUNTER_TABLE).registers]
    glob_cnt = [x.name for x in rm.table(SUM_TABLE).registers if x.name not in job_cnt]
    top = 1 << len(dut.s_axil_araddr)
    st = dict.fromkeys(("reads", "writes", "decerr", "partial", "counts", "nonzero"), 0)

    def address():
        x = rng.random()
        if x < 0.1:
            while True:
                a = rng.randrange(0, top, 4)
                if rm.decode(a) is None:
                    return a
        return rng.choice(insts).addr

    for _ in range(env.ops):
        op = rng.random()
        if op < 0.4:
            a = address() + (rng.randrange(1, 4) if rng.random() < 0.05 else 0)
            got = await env.read(a)
            want = model.read(a)
            assert got == want, f"read 0x{a:x}: bank {got}, model {want}"
            st["reads"] += 1
            st["decerr"] += got[1] == Resp.DECERR
            st["nonzero"] += got[0] != 0
        elif op < 0.8:
            a, v = address(), rng.getrandbits(32)
            n = 4 if rng.random() < 0.7 else rng.randint(1, 3)
            off = 0
            if n < 4 and rng.random() < 0.3:
                off = rng.randrange(1, 5 - n)  # unaligned, still inside the word: refused
            data = v.to_bytes(4, "little")[:n]
            got = await env.write(a + off, data)
            want = Resp.DECERR if off else model.write(a, v, (1 << n) - 1)
            assert got == want, f"write 0x{a + off:x} {data.hex()}: bank {got}, model {want}"
            st["writes"] += 1
            st["partial"] += n < 4
        elif op < 0.88:
            inst, f = rng.choice(ro)
            x = rng.getrandbits(f.width)
            env.drive(*env.bits(inst.table, "status", inst.index, inst.reg.name, f.name), x)
            model.set_ro(f"{inst.table.name}.{inst.reg.name}", inst.index, f.name, x)
        elif op < 0.94:
            inst, f = rng.choice(w1c)
            name, lsb, width = env.bits(inst.table, "set", inst.index, inst.reg.name, f.name)
            await RisingEdge(dut.clk)
            env.drive(name, lsb, width, (1 << width) - 1)
            await RisingEdge(dut.clk)
            env.drive(name, lsb, width, 0)
            model.set_flag(f"{inst.table.name}.{inst.reg.name}", inst.index, f.name)
        else:
            j, c, g = rng.randrange(rm.params["jobs"]), rng.choice(job_cnt), rng.choice(glob_cnt)
            k = rng.randint(1, 5)
            jb = env.bits(rm.table(JOB_COUNTER_TABLE), "inc", j, c)
            gb = env.bits(rm.table(SUM_TABLE), "inc", 0, g)
            await RisingEdge(dut.clk)
            env.drive(*jb, 1)
            env.drive(*gb, 1)
            for _ in range(k):
                await RisingEdge(dut.clk)
            env.drive(*jb, 0)
            env.drive(*gb, 0)
            for _ in range(3):
                await RisingEdge(dut.clk)
            model.count(c, j, k)
            model.count_global(g, k)
            st["counts"] += k
    for inst in insts:  # final sweep: every register agrees
        got = await env.read(inst.addr)
        assert got == model.read(inst.addr), f"{inst.name}: bank {got}"
    assert st["reads"] and st["writes"] and st["decerr"] and st["partial"], st
    report(**st)
