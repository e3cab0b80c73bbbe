"""Register bank (netreduce.hw.csr) in the Amaranth simulator, against the map and RegisterFile.

Every expectation comes from netreduce.regmap: addresses, resets and access types from the map,
bus behaviour from RegisterFile (the model's implementation of the same map), which is run through
the same access sequence. The small map uses table lengths that are not powers of two, so the
address space past the last entry of a table decodes to nothing.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.lib.wiring import In
from amaranth.sim import Simulator
from netreduce.hw.csr import (
    CLEAR_COUNTERS,
    JOB_COUNTER_TABLE,
    SUM_TABLE,
    AxiLiteSimMaster,
    BankModel,
    RegisterBank,
    Resp,
    member_name,
    min_addr_width,
)

from netreduce.regmap import MAGIC, VERSION, Access, BusError, RegMap, build_regmap

SMALL = dict(jobs=3, flows=5, slots=64, max_world=8)
U32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------- harness
class Mirror(BankModel):
    """The bank's reference; unmapped writes also checked against RegisterFile's BusError."""

    def write(self, addr: int, value: int, strb: int = 0xF) -> Resp:
        resp = super().write(addr, value, strb)
        if resp == Resp.DECERR:
            with pytest.raises(BusError):
                self.rf.write(addr, value)
        return resp


def simulate(dut: RegisterBank, *benches, cycles_limit: int | None = None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for b in benches:
        sim.add_testbench(b)
    if cycles_limit is None:
        sim.run()
    else:
        sim.run_until(cycles_limit * 1e-8)


def port_entry(dut, table, role, i):
    p = getattr(dut, member_name(table.name, role))
    return p if table.count == 1 else p[i]


async def check_outputs(ctx, dut, mirror):
    """The RW fields the core sees equal the model's register contents: live flops for most
    tables, one entry per cycle through the core read port of a RAM table."""
    ram = {}
    for t in mirror.map.tables:
        if t.name in dut.ram_tables:
            port = getattr(dut, member_name(t.name, "rd"))
            ram[t.name] = []
            for e in range(t.count):
                ctx.set(port.addr, e)
                await ctx.tick()
                ram[t.name].append(ctx.get(port.data))
    for inst in mirror.map.instances():
        for f in inst.reg.fields:
            if f.access != Access.RW:
                continue
            if inst.table.name in ram:
                got = ram[inst.table.name][inst.index][inst.reg.name.lower()][f.name]
            else:
                got = ctx.get(port_entry(dut, inst.table, "cfg", inst.index)
                              [inst.reg.name.lower()][f.name])
            want = f.get(mirror.rf.peek(inst.addr))
            assert got == want, f"{inst.name}.{f.name}: core sees 0x{got:x}, model 0x{want:x}"


def set_status(ctx, dut, mirror, rng):
    """Random values on every core-owned RO field, mirrored into the model."""
    for inst in mirror.map.instances():
        t = inst.table
        if member_name(t.name, "status") not in dut.signature.members:
            continue
        v = mirror.rf.peek(inst.addr)
        for f in inst.reg.fields:
            if f.access == Access.RO:
                x = rng.getrandbits(f.width)
                ctx.set(port_entry(dut, t, "status", inst.index)[inst.reg.name.lower()][f.name], x)
                v = f.put(v, x)
        mirror.rf.poke(inst.addr, v)


def unmapped(rm: RegMap, aw: int, rng: random.Random, n_random: int = 40) -> list[int]:
    """Aligned addresses that decode to nothing: holes in entries, past tables, past the map."""
    out = {rm.size, (1 << aw) - 4}
    for t in rm.tables:
        offs = {r.offset for r in t.registers}
        for i in sorted({0, t.count - 1}):
            out.update(t.base + i * t.stride + o for o in range(0, t.stride, 4) if o not in offs)
        out.add(t.base + t.size)
        out.add(t.base + (t.count * t.stride if t.count > 1 else t.size))
        out.add(t.base - 4)
    while n_random:
        a = rng.randrange(0, 1 << aw, 4)
        if rm.decode(a) is None:
            out.add(a)
            n_random -= 1
    return sorted(a for a in out if 0 <= a < 1 << aw and rm.decode(a) is None)


@pytest.fixture(scope="module")
def small():
    return build_regmap(**SMALL)


# ---------------------------------------------------------------------------- tests
def test_identity_and_build_parameters(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    seen = {}

    async def bench(ctx):
        for inst in small.instances():
            if inst.table.name != "GLOBAL":
                continue
            seen[inst.reg.name] = await bus.read(ctx, inst.addr)
            assert seen[inst.reg.name] == mirror.read(inst.addr), inst.name

    simulate(dut, bench)
    assert seen["MAGIC"] == (MAGIC, Resp.OKAY)
    assert seen["VERSION"][0] == VERSION[0] << 16 | VERSION[1]
    for k in ("jobs", "flows", "slots", "max_world", "pmtu_max", "clock_hz"):
        assert seen[k.upper()] == (small.params[k], Resp.OKAY), k


def test_every_rw_register_resets_and_holds_its_value(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    rng = random.Random(1)
    rw = [i for i in small.instances() if i.reg.rw_mask]
    assert len(rw) > 40  # the job and flow tables are in

    async def bench(ctx):
        for inst in rw:  # reset values from the map
            assert await bus.read(ctx, inst.addr) == (inst.reg.reset, Resp.OKAY), inst.name
        await check_outputs(ctx, dut, mirror)
        for inst in rw:
            v = rng.getrandbits(32)
            assert await bus.write(ctx, inst.addr, v) == mirror.write(inst.addr, v) == Resp.OKAY
            got = await bus.read(ctx, inst.addr)
            assert got == mirror.read(inst.addr), f"{inst.name}: 0x{got[0]:x} after 0x{v:x}"
            assert got[0] == v & inst.reg.rw_mask  # masks honoured: unused bits read 0
        for inst in rw:  # nothing aliased: every register still holds its own value
            assert await bus.read(ctx, inst.addr) == mirror.read(inst.addr), inst.name
        await check_outputs(ctx, dut, mirror)

    simulate(dut, bench)


def test_unmapped_and_unaligned_answer_decerr(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    rng = random.Random(2)
    holes = unmapped(small, dut.addr_width, rng)
    mapped = [i.addr for i in small.instances()]
    odd = [a + rng.randrange(1, 4) for a in rng.sample(mapped, 20)]
    assert len(holes) > 60

    async def bench(ctx):
        for inst in small.instances():  # fill every RW register so a stray write would show
            if inst.reg.rw_mask:
                await bus.write(ctx, inst.addr, U32)
                mirror.write(inst.addr, U32)
        for a in holes + odd:
            assert await bus.read(ctx, a) == (0, Resp.DECERR) == mirror.read(a), hex(a)
            assert await bus.write(ctx, a, 0) == Resp.DECERR == mirror.write(a, 0), hex(a)
        await check_outputs(ctx, dut, mirror)
        for a in mapped:
            assert await bus.read(ctx, a) == mirror.read(a), hex(a)

    simulate(dut, bench)


def test_wider_address_bus_decodes_the_extra_space_as_unmapped(small):
    dut = RegisterBank(small, addr_width=min_addr_width(small) + 2)
    bus = AxiLiteSimMaster(dut.s_axil)
    top = 1 << dut.addr_width
    magic = small.addr("GLOBAL.MAGIC")

    async def bench(ctx):
        # an alias of MAGIC in the upper space must not decode
        assert await bus.read(ctx, magic + (top >> 1)) == (0, Resp.DECERR)
        assert await bus.read(ctx, top - 4) == (0, Resp.DECERR)
        assert await bus.read(ctx, magic) == (MAGIC, Resp.OKAY)

    simulate(dut, bench)
    with pytest.raises(ValueError, match="addr_width 8 cannot reach"):
        RegisterBank(small, addr_width=8)


def test_byte_strobes(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    rng = random.Random(3)
    ip = small.addr("FLOW.FWD_IP", 2)
    cfg = small.addr("FLOW.CFG", 4)
    status = small.addr("JOB.STATUS", 1)
    control = small.addr("GLOBAL.CONTROL")
    cnt = small.addr("JOB_CNT.RX_DATA", 0)
    mism = small.field("JOB.STATUS.mismatch")

    async def bench(ctx):
        for strb in range(16):
            for a in (ip, cfg):
                v = rng.getrandbits(32)
                assert await bus.write(ctx, a, v, strb) == mirror.write(a, v, strb)
                got = await bus.read(ctx, a)
                assert got == mirror.read(a), f"0x{a:x} strb {strb:04b}: 0x{got[0]:x}"
        # W1C: a clearing 1 in a disabled byte does not clear
        ctx.set(dut.job_set[1].status.mismatch, 1)
        await ctx.tick()
        ctx.set(dut.job_set[1].status.mismatch, 0)
        mirror.rf.set_bits(status, mism.mask)
        assert await bus.write(ctx, status, U32, 0b1110) == mirror.write(status, U32, 0b1110)
        assert (await bus.read(ctx, status))[0] & mism.mask
        assert await bus.write(ctx, status, U32, 0b0001) == mirror.write(status, U32, 0b0001)
        assert (await bus.read(ctx, status))[0] & mism.mask == 0
        # WO: clear_counters only pulses when its byte is enabled
        ctx.set(dut.job_cnt_inc[0].rx_data, 1)
        await ctx.tick().repeat(5)
        ctx.set(dut.job_cnt_inc[0].rx_data, 0)
        await ctx.tick()
        await bus.write(ctx, control, U32, 0b1110)
        assert await bus.read(ctx, cnt) == (5, Resp.OKAY)
        await bus.write(ctx, control, U32, 0b0001)
        assert await bus.read(ctx, cnt) == (0, Resp.OKAY)

    simulate(dut, bench)


def _counter_regs(rm):
    job = [r.name for r in rm.table(JOB_COUNTER_TABLE).registers]
    glob = [r.name for r in rm.table(SUM_TABLE).registers if r.name not in job]
    return job, glob


def test_counters_increment_sum_and_clear(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    rng = random.Random(4)
    job, glob = _counter_regs(small)
    jobs = small.params["jobs"]
    want_job = {(j, n): 0 for j in range(jobs) for n in job}
    want_glob = dict.fromkeys(glob, 0)

    async def bench(ctx):
        for _ in range(40):  # random strobes, several counters and jobs per cycle
            for j in range(jobs):
                for n in rng.sample(job, 5):
                    ctx.set(dut.job_cnt_inc[j][n.lower()], 1)
                    want_job[(j, n)] += 1
            for n in rng.sample(glob, 2):
                ctx.set(dut.cnt_inc[n.lower()], 1)
                want_glob[n] += 1
            await ctx.tick()
            for j in range(jobs):
                for n in job:
                    ctx.set(dut.job_cnt_inc[j][n.lower()], 0)
            for n in glob:
                ctx.set(dut.cnt_inc[n.lower()], 0)
        await ctx.tick().repeat(2)
        for (j, n), v in want_job.items():
            assert await bus.read(ctx, small.addr(f"JOB_CNT.{n}", j)) == (v, Resp.OKAY), (j, n)
        for n in job:
            total = sum(want_job[(j, n)] for j in range(jobs))
            assert await bus.read(ctx, small.addr(f"CNT.{n}")) == (total, Resp.OKAY), n
        for n, v in want_glob.items():
            assert await bus.read(ctx, small.addr(f"CNT.{n}")) == (v, Resp.OKAY), n
        assert sum(want_glob.values()) and sum(want_job.values())
        # RO: a bus write is accepted and ignored
        a = small.addr(f"JOB_CNT.{job[0]}", 1)
        before = await bus.read(ctx, a)
        assert await bus.write(ctx, a, 0) == Resp.OKAY
        assert await bus.read(ctx, a) == before
        # clear
        field = small.field(CLEAR_COUNTERS)
        t, r, _ = CLEAR_COUNTERS.split(".")
        assert await bus.write(ctx, small.addr(f"{t}.{r}"), field.mask) == Resp.OKAY
        for inst in small.instances():
            if inst.table.name in (SUM_TABLE, JOB_COUNTER_TABLE):
                assert await bus.read(ctx, inst.addr) == (0, Resp.OKAY), inst.name

    simulate(dut, bench)


def test_clear_while_counting_keeps_sums_exact(small):
    """Increments every cycle while the host clears: the per-job counters and their engine-wide
    sum stay consistent (the clearing cycle's increment counts in both)."""
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    job, _ = _counter_regs(small)
    name = job[3]
    stop = []
    t, r, _ = CLEAR_COUNTERS.split(".")
    control = small.addr(f"{t}.{r}")

    async def counting(ctx):
        rng = random.Random(5)
        while not stop:
            for j in range(small.params["jobs"]):
                ctx.set(dut.job_cnt_inc[j][name.lower()], rng.getrandbits(1))
            await ctx.tick()
        for j in range(small.params["jobs"]):
            ctx.set(dut.job_cnt_inc[j][name.lower()], 0)
        stop.append("done")

    async def host(ctx):
        for k in range(6):
            await ctx.tick().repeat(7 + k)
            await bus.write(ctx, control, small.field(CLEAR_COUNTERS).mask)
        stop.append(1)
        while len(stop) < 2:
            await ctx.tick()
        await ctx.tick().repeat(2)
        per_job = [(await bus.read(ctx, small.addr(f"JOB_CNT.{name}", j)))[0]
                   for j in range(small.params["jobs"])]
        total = (await bus.read(ctx, small.addr(f"CNT.{name}")))[0]
        assert total == sum(per_job), (total, per_job)
        assert 0 < total < 3 * 40  # cleared recently, not from the start

    simulate(dut, counting, host)


def test_counters_wrap_at_32_bits(small):
    dut = RegisterBank(small, inc_width=32)
    bus = AxiLiteSimMaster(dut.s_axil)
    job, glob = _counter_regs(small)

    async def bench(ctx):
        ctx.set(dut.job_cnt_inc[2][job[0].lower()], U32)
        ctx.set(dut.cnt_inc[glob[0].lower()], U32)
        await ctx.tick()
        ctx.set(dut.job_cnt_inc[2][job[0].lower()], 3)
        ctx.set(dut.cnt_inc[glob[0].lower()], 3)
        await ctx.tick()
        ctx.set(dut.job_cnt_inc[2][job[0].lower()], 0)
        ctx.set(dut.cnt_inc[glob[0].lower()], 0)
        await ctx.tick().repeat(2)
        assert await bus.read(ctx, small.addr(f"JOB_CNT.{job[0]}", 2)) == (2, Resp.OKAY)
        assert await bus.read(ctx, small.addr(f"CNT.{job[0]}")) == (2, Resp.OKAY)
        assert await bus.read(ctx, small.addr(f"CNT.{glob[0]}")) == (2, Resp.OKAY)

    simulate(dut, bench)


def test_w1c_flags_and_status_inputs(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    rng = random.Random(6)
    status = small.reg("JOB.STATUS")
    w1c = [f for f in status.fields if f.access == Access.W1C]
    assert w1c

    go = []

    async def set_in_apply_cycle(ctx):
        # once armed: a one-cycle set of job 0's saturated flag in exactly the cycle a write
        # takes effect (the cycle after the AW/W handshake): the set must win over the clear
        while True:
            _, _, hs = await ctx.tick().sample(dut.s_axil.awvalid & dut.s_axil.awready)
            if hs and go:
                break
        ctx.set(dut.job_set[0].status.saturated, 1)
        await ctx.tick()
        ctx.set(dut.job_set[0].status.saturated, 0)

    async def bench(ctx):
        set_status(ctx, dut, mirror, rng)
        for inst in small.instances():
            assert await bus.read(ctx, inst.addr) == mirror.read(inst.addr), inst.name
        for f in w1c:
            ctx.set(dut.job_set[2].status[f.name], 1)
            await ctx.tick()
            ctx.set(dut.job_set[2].status[f.name], 0)
            mirror.rf.set_bits(small.addr("JOB.STATUS", 2), f.mask)
        a = small.addr("JOB.STATUS", 2)
        got = await bus.read(ctx, a)
        assert got == mirror.read(a) and got[0] & status.w1c_mask == status.w1c_mask
        await bus.write(ctx, a, 0)  # writing 0 leaves the flags
        mirror.write(a, 0)
        assert await bus.read(ctx, a) == mirror.read(a)
        await bus.write(ctx, a, w1c[0].mask)  # writing 1 clears exactly that flag
        mirror.write(a, w1c[0].mask)
        got = await bus.read(ctx, a)
        assert got == mirror.read(a) and not got[0] & w1c[0].mask
        a0 = small.addr("JOB.STATUS", 0)
        sat = status.field("saturated").mask
        ctx.set(dut.job_set[0].status.saturated, 1)
        await ctx.tick()
        ctx.set(dut.job_set[0].status.saturated, 0)
        assert (await bus.read(ctx, a0))[0] & sat
        go.append(1)
        await bus.write(ctx, a0, status.w1c_mask)  # clears, but the coinciding set wins
        assert (await bus.read(ctx, a0))[0] & sat
        await bus.write(ctx, a0, status.w1c_mask)  # no set this time: cleared
        assert not (await bus.read(ctx, a0))[0] & sat

    simulate(dut, bench, set_in_apply_cycle)


# RAM-table choices: the default (FLOW), none (every table in flops) and every table that can
# be one (JOB mixes RW with RO and W1C registers, MGMT has one entry and a non-zero reset value)
RAM_CHOICES = {"default": None, "flops": (), "all": ("FLOW", "JOB", "MGMT", "MGMT_SRC")}


@pytest.mark.parametrize("seed,ram", [(11, "default"), (12, "default"), (13, "flops"),
                                      (14, "all")])
def test_random_sequence_matches_register_file(small, seed, ram):
    """Random reads, writes (random strobes, AW/W skew, slow bready/rready), core-side status
    changes, W1C events and counter bursts on the bank and on RegisterFile: identical answers
    (RAM tables included: the bus master waits out the sweep after reset)."""
    dut = RegisterBank(small, ram_tables=RAM_CHOICES[ram])
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    rng = random.Random(seed)
    insts = list(small.instances())
    holes = unmapped(small, dut.addr_width, rng, 10)
    job, glob = _counter_regs(small)
    stats = {"reads": 0, "writes": 0, "errors": 0, "nonzero": 0}

    def addr():
        x = rng.random()
        if x < 0.08:
            return rng.choice(holes)
        if x < 0.12:
            return rng.choice(insts).addr + rng.randrange(1, 4)
        return rng.choice(insts).addr

    async def bench(ctx):
        for _ in range(500):
            op = rng.random()
            if op < 0.45:
                a = addr()
                got = await bus.read(ctx, a, ready_delay=rng.choice([0, 0, 1, 3]))
                want = mirror.read(a)
                assert got == want, f"read 0x{a:x}: bank {got}, model {want}"
                stats["reads"] += 1
                stats["errors"] += got[1] != Resp.OKAY
                stats["nonzero"] += got[0] != 0
            elif op < 0.85:
                a, v = addr(), rng.getrandbits(32)
                strb = 0xF if rng.random() < 0.7 else rng.getrandbits(4)
                got = await bus.write(ctx, a, v, strb, w_delay=rng.choice([0, 0, 2, -2]),
                                      ready_delay=rng.choice([0, 0, 2]))
                assert got == mirror.write(a, v, strb), f"write 0x{a:x}"
                stats["writes"] += 1
            elif op < 0.9:
                set_status(ctx, dut, mirror, rng)
            elif op < 0.95:
                j = rng.randrange(small.params["jobs"])
                f = rng.choice([f for f in small.reg("JOB.STATUS").fields
                                if f.access == Access.W1C])
                ctx.set(dut.job_set[j].status[f.name], 1)
                await ctx.tick()
                ctx.set(dut.job_set[j].status[f.name], 0)
                mirror.rf.set_bits(small.addr("JOB.STATUS", j), f.mask)
            else:
                j, n, k = rng.randrange(small.params["jobs"]), rng.choice(job), rng.randint(1, 4)
                g = rng.choice(glob)
                ctx.set(dut.job_cnt_inc[j][n.lower()], 1)
                ctx.set(dut.cnt_inc[g.lower()], 1)
                await ctx.tick().repeat(k)
                ctx.set(dut.job_cnt_inc[j][n.lower()], 0)
                ctx.set(dut.cnt_inc[g.lower()], 0)
                await ctx.tick().repeat(2)
                for path, idx in ((f"JOB_CNT.{n}", j), (f"CNT.{n}", 0), (f"CNT.{g}", 0)):
                    a = small.addr(path, idx)
                    mirror.rf.poke(a, mirror.rf.peek(a) + k)
        await check_outputs(ctx, dut, mirror)
        for inst in insts:
            assert await bus.read(ctx, inst.addr) == mirror.read(inst.addr), inst.name

    simulate(dut, bench)
    assert stats["reads"] > 150 and stats["writes"] > 150
    assert 10 < stats["errors"] < stats["reads"] and stats["nonzero"] > 50


def test_reads_and_writes_both_progress_under_contention(small):
    """A master that never stops reading does not starve one that writes, and a read issued after
    a write's response sees that write."""
    dut = RegisterBank(small)
    rd = AxiLiteSimMaster(dut.s_axil)
    wr = AxiLiteSimMaster(dut.s_axil)
    scratch = small.addr("GLOBAL.SCRATCH")
    done = {"reads": 0, "writes": 0}
    finished = []

    async def reader(ctx):
        last = 0
        while not finished:
            v, resp = await rd.read(ctx, scratch)
            assert resp == Resp.OKAY and v >= last  # writes count up: never read backwards
            last = v
            done["reads"] += 1

    async def writer(ctx):
        for k in range(1, 31):
            assert await wr.write(ctx, scratch, k) == Resp.OKAY
            done["writes"] += 1
        finished.append(1)

    simulate(dut, reader, writer)
    assert done["writes"] == 30
    assert abs(done["reads"] - done["writes"]) <= 2, done  # alternation, one each


def test_signature_from_the_map():
    rm = build_regmap()
    dut = RegisterBank(rm)
    dut._MustUse__silence = True  # only the interface is checked: elaborating takes ~40 s
    mem = dut.signature.members
    assert dut.ram_tables == ("FLOW",)
    assert "flow_cfg" not in mem  # the flow table's RW fields are in a RAM: a read port instead
    rd = mem["flow_rd"].signature.members
    assert rd["addr"].flow == In  # an input of the bank: the core drives the entry index
    assert rd["addr"].shape.width == (rm.params["flows"] - 1).bit_length()
    assert mem["job_cfg"].shape.length == rm.params["jobs"]
    assert mem["job_cnt_inc"].shape.length == rm.params["jobs"]
    # job counters have no engine-wide input: CNT holds their sums
    job, glob = _counter_regs(rm)
    assert {n for n, _ in mem["cnt_inc"].shape} == {g.lower() for g in glob}
    assert {n for n, _ in mem["job_cnt_inc"].shape.elem_shape} == {j.lower() for j in job}
    assert dut.addr_width == min_addr_width(rm) == (rm.size - 1).bit_length()
    flow_entry = rd["data"].shape
    rw_bits = sum(f.width for r in rm.table("FLOW").registers for f in r.fields
                  if f.access == Access.RW)
    assert flow_entry.size == rw_bits  # every RW bit of a flow entry, packed
    assert dut.reset_cycles == rm.params["flows"]
    assert "flow_status" in mem  # RO fields stay core inputs
    assert "global_status" not in mem  # identity registers are constants


def test_maps_it_cannot_implement_are_refused():
    rm = build_regmap(**SMALL)
    flow = rm.table("FLOW")
    bad = RegMap(rm.name, rm.version, rm.params,
                 tuple(dataclasses.replace(t, stride=0x30) if t is flow else t
                       for t in rm.tables), rm.enums)
    with pytest.raises(ValueError, match="FLOW: stride 0x30 is not a power of two"):
        RegisterBank(bad)
    with pytest.raises(ValueError, match="inc_width 0"):
        RegisterBank(rm, inc_width=0)


def test_latency_and_rate_as_documented(small):
    """rvalid in cycle ``read_latency`` after the AR handshake (the select tree's levels + 1),
    bvalid in the 2nd after the AW+W handshake; the core sees a write and a WO pulse (exactly one
    cycle) in the cycle after the handshake; with valid and ready held high, one read per
    ``read_latency + 1`` cycles."""
    dut = RegisterBank(small)
    b = dut.s_axil
    scratch = small.addr("GLOBAL.SCRATCH")
    control = small.addr("GLOBAL.CONTROL")
    mask = small.field(CLEAR_COUNTERS).mask
    log = []

    async def watch(ctx):
        for cyc in range(200):
            _, _, *v = await ctx.tick().sample(
                b.arvalid & b.arready, b.rvalid & b.rready, b.awvalid & b.awready,
                b.wvalid & b.wready, b.bvalid & b.bready, dut.global_cfg.scratch.value,
                dut.global_pulse.control.clear_counters)
            log.append((cyc, *v))

    async def bench(ctx):
        await ctx.tick().repeat(dut.reset_cycles)  # the RAM sweep after reset
        ctx.set(b.rready, 1)
        ctx.set(b.bready, 1)
        ctx.set(b.araddr, scratch)
        ctx.set(b.arvalid, 1)
        await ctx.tick().repeat(30)  # back-to-back reads
        ctx.set(b.arvalid, 0)
        await ctx.tick().repeat(5)
        for addr, data in ((scratch, 0x1234), (control, mask)):
            ctx.set(b.awaddr, addr)
            ctx.set(b.wdata, data)
            ctx.set(b.wstrb, 0xF)
            ctx.set(b.awvalid, 1)
            ctx.set(b.wvalid, 1)
            await ctx.tick().until(b.awready)
            ctx.set(b.awvalid, 0)
            ctx.set(b.wvalid, 0)
            await ctx.tick().repeat(6)

    simulate(dut, bench, watch, cycles_limit=220)
    ar = [c for c, a, *_ in log if a]
    r = [c for c, _, x, *_ in log if x]
    lat = dut.read_latency
    assert lat >= 2
    assert len(ar) == len(r) >= 30 // (lat + 1)
    assert all(y - x == lat for x, y in zip(ar, r, strict=True))
    assert all(y - x == lat + 1 for x, y in zip(ar, ar[1:], strict=False))
    aw = [c for c, _, _, a, w, *_ in log if a and w]
    bv = [c for c, *v in log if v[4]]
    assert len(aw) == len(bv) == 2 and all(y - x == 2 for x, y in zip(aw, bv, strict=True))
    first_new = min(c for c, *v in log if v[5] == 0x1234)
    assert first_new == aw[0] + 2  # visible to the core from the cycle after the handshake
    pulses = [c for c, *v in log if v[6]]
    assert pulses == [aw[1] + 2]


def test_reset_mid_transaction_restores_map_resets(small):
    dut = RegisterBank(small)
    bus = AxiLiteSimMaster(dut.s_axil)
    b = dut.s_axil
    cnp = small.addr("JOB.CNP_INTERVAL", 1)
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.bank = dut
    rst = cd.rst

    async def bench(ctx):
        await bus.write(ctx, cnp, 7)
        await bus.write(ctx, small.addr("FLOW.CFG", 0), U32)
        ctx.set(b.arvalid, 1)  # a read left hanging: response pending, never taken
        ctx.set(b.araddr, cnp)
        await ctx.tick().until(b.rvalid)
        ctx.set(b.arvalid, 0)
        ctx.set(rst, 1)
        for _ in range(2):
            await ctx.tick()  # a plain tick: .repeat()/.until() raise DomainReset
        ctx.set(rst, 0)
        assert not ctx.get(b.rvalid) and not ctx.get(b.bvalid)
        assert await bus.read(ctx, cnp) == (small.reg("JOB.CNP_INTERVAL").reset, Resp.OKAY)
        assert await bus.read(ctx, small.addr("FLOW.CFG", 0)) == (0, Resp.OKAY)  # swept
        ctx.set(dut.flow_rd.addr, 0)
        await ctx.tick()
        assert ctx.get(dut.flow_rd.data.cfg.valid) == small.field("FLOW.CFG.valid").reset

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def _handshake_log(dut, cycles):
    """A testbench logging, per cycle: AR handshake, R handshake, AW+W handshake, B handshake."""
    b = dut.s_axil
    log = []

    async def watch(ctx):
        for cyc in range(cycles):
            _, _, *v = await ctx.tick().sample(
                b.arvalid & b.arready, b.rvalid & b.rready,
                b.awvalid & b.awready & b.wvalid & b.wready, b.bvalid & b.bready)
            log.append((cyc, *v))

    return log, watch


def test_sweep_after_reset_restores_ram_tables(small):
    """Every RW register of the RAM tables is dirtied, then reset: for exactly ``reset_cycles``
    cycles no handshake is accepted (valids held high), the first one completes in cycle
    ``reset_cycles``, and every register reads its map reset value again (non-zero ones
    included: JOB.CNP_INTERVAL, MGMT.PORT), on the bus and on the core read ports."""
    ram = RAM_CHOICES["all"]
    dut = RegisterBank(small, ram_tables=ram)
    assert dut.reset_cycles == max(small.table(n).count for n in ram)
    bus = AxiLiteSimMaster(dut.s_axil)
    mirror = Mirror(small)
    b = dut.s_axil
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.bank = dut
    rw = [i for i in small.instances() if i.reg.rw_mask]
    assert any(i.reg.reset for i in rw if i.table.name in ram)
    log, watch = _handshake_log(dut, 400)

    async def bench(ctx):
        for inst in rw:
            await bus.write(ctx, inst.addr, U32)
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        start = len(log)  # the first cycle after reset
        ctx.set(b.araddr, small.addr("FLOW.CFG", 1))
        ctx.set(b.arvalid, 1)
        ctx.set(b.awaddr, small.addr("GLOBAL.SCRATCH"))
        ctx.set(b.wdata, 0)
        ctx.set(b.wstrb, 0xF)
        ctx.set(b.awvalid, 1)
        ctx.set(b.wvalid, 1)
        while not (ctx.get(b.arready) or ctx.get(b.awready)):
            await ctx.tick()
        assert len(log) - start == dut.reset_cycles  # handshake in cycle reset_cycles
        for s in ("arvalid", "awvalid", "wvalid"):
            ctx.set(getattr(b, s), 0)
        await ctx.tick()
        ctx.set(b.rready, 1)
        ctx.set(b.bready, 1)
        await ctx.tick().repeat(3)
        ctx.set(b.rready, 0)
        ctx.set(b.bready, 0)
        assert not any(v for c, *v in log[start:start + dut.reset_cycles] if any(v))
        for inst in small.instances():
            assert await bus.read(ctx, inst.addr) == mirror.read(inst.addr), inst.name
        await check_outputs(ctx, dut, mirror)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_testbench(watch, background=True)
    sim.run()


def test_ram_table_latency_strobes_and_core_port(small):
    """A RAM table keeps the flops' bus latency (rvalid ``read_latency`` cycles after AR, bvalid 2
    after AW/W, a read after B sees the write, one read per ``read_latency + 1`` cycles); byte
    strobes only write their
    bytes; the core read port shows a write from cycle 3 after the handshake (address held)."""
    dut = RegisterBank(small)
    b, rd = dut.s_axil, dut.flow_rd
    mirror = Mirror(small)
    rng = random.Random(21)
    e = 3
    fwd_ip, cfg = small.addr("FLOW.FWD_IP", e), small.addr("FLOW.CFG", e)
    seen = []  # (cycle, flow_rd.data.fwd_ip.ip) with flow_rd.addr = e throughout
    log, watch = _handshake_log(dut, 300)

    async def core(ctx):
        ctx.set(rd.addr, e)
        for cyc in range(300):
            _, _, ip = await ctx.tick().sample(rd.data.fwd_ip.ip)
            seen.append((cyc, ip))

    async def bench(ctx):
        await ctx.tick().repeat(dut.reset_cycles)
        # back-to-back reads of a RAM register
        ctx.set(b.rready, 1)
        ctx.set(b.araddr, fwd_ip)
        ctx.set(b.arvalid, 1)
        await ctx.tick().repeat(5 * (dut.read_latency + 1))  # five whole reads
        ctx.set(b.arvalid, 0)
        ctx.set(b.rready, 0)
        await ctx.tick().repeat(3)
        # a full write, timed
        ctx.set(b.bready, 1)
        ctx.set(b.awaddr, fwd_ip)
        ctx.set(b.wdata, 0xA1B2C3D4)
        ctx.set(b.wstrb, 0xF)
        ctx.set(b.awvalid, 1)
        ctx.set(b.wvalid, 1)
        await ctx.tick().until(b.awready)
        ctx.set(b.awvalid, 0)
        ctx.set(b.wvalid, 0)
        await ctx.tick().repeat(3)
        ctx.set(b.bready, 0)
        mirror.write(fwd_ip, 0xA1B2C3D4)
        bus = AxiLiteSimMaster(b)
        assert await bus.read(ctx, fwd_ip) == (0xA1B2C3D4, Resp.OKAY)
        for strb in range(16):  # partial writes, each checked on the bus and the core port
            for a in (fwd_ip, cfg):
                v = rng.getrandbits(32)
                assert await bus.write(ctx, a, v, strb) == mirror.write(a, v, strb)
                got = await bus.read(ctx, a)
                assert got == mirror.read(a), f"0x{a:x} strb {strb:04b}: 0x{got[0]:x}"
            want = small.field("FLOW.FWD_IP.ip").get(mirror.rf.peek(fwd_ip))
            assert ctx.get(rd.data.fwd_ip.ip) == want
            c = mirror.rf.peek(cfg)
            assert ctx.get(rd.data.cfg.rank) == small.field("FLOW.CFG.rank").get(c)
            assert ctx.get(rd.data.cfg.job) == small.field("FLOW.CFG.job").get(c)
            assert ctx.get(rd.data.cfg.valid) == small.field("FLOW.CFG.valid").get(c)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_testbench(core, background=True)
    sim.add_testbench(watch, background=True)
    sim.run()
    ar = [c for c, a, *_ in log if a]
    r = [c for c, _, x, *_ in log if x]
    lat = dut.read_latency
    assert len(ar) >= 5 and all(y - x == lat for x, y in zip(ar[:5], r[:5], strict=True))
    assert all(y - x == lat + 1 for x, y in zip(ar[:5], ar[1:5], strict=False))
    aw = next(c for c, _, _, w, _ in log if w)
    bv = next(c for c, _, _, _, x in log if x)
    assert bv == aw + 2
    first = next(c for c, ip in seen if ip == 0xA1B2C3D4)
    assert first == aw + 3  # applied at the end of cycle 1, read addressed in cycle 2
