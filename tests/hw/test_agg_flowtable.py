"""FlowTable (netreduce.hw.agg.flowtable): bind / commit / drop and the pipelined key lookup.

A random sequence of table operations and one lookup per cycle (with random pipeline stalls) is
checked against a dictionary model: every lookup result appears exactly ``lk_latency`` enabled
cycles after its key, and reflects the live entries at the time the key was presented; a key check
every cycle answers ``chk_latency`` cycles later for the entries used when its keys were presented.
"""

import random

import pytest
from amaranth.hdl import Value
from amaranth.sim import Simulator
from netreduce.hw.agg.flowtable import FlowTable, make_key


class Model:
    def __init__(self):
        self.entries = {}  # entry -> dict(job, fwd, rev, data, state)

    def live(self, e):
        return e in self.entries and self.entries[e]["state"] == "live"

    def used_keys(self, kind):
        return {v[kind] for v in self.entries.values()}

    def lookup(self, key, rev):
        kind = "rev" if rev else "fwd"
        hits = [e for e, v in self.entries.items() if v["state"] == "live" and v[kind] == key]
        assert len(hits) <= 1
        return hits[0] if hits else None


def run(flows, n_ops, seed, stall):
    ft = FlowTable(flows, jobs=4, max_world=8)
    rng = random.Random(seed)
    model = Model()
    keys = [make_key(0x0A000000 + rng.randrange(8), 0x100 + rng.randrange(8)) for _ in range(12)]
    dlay = ft.data_layout
    log = {"lookups": 0, "hits": 0, "checks": 0}

    async def bench(ctx):
        pipe = []  # keys compared in enabled cycles, oldest first: (expected entry, data)
        chks = []  # key checks, one per cycle, oldest first: (expected fwd hit, rev hit)
        dropped = {}  # entry -> lookups presented before its last drop
        for _ in range(n_ops):
            # a key check of this cycle sees the entries used now (before this cycle's op)
            cf, cr = rng.choice(keys), rng.choice(keys)
            ctx.set(ft.chk_fwd, cf)
            ctx.set(ft.chk_rev, cr)
            if len(chks) >= ft.chk_latency:
                want = chks[-ft.chk_latency]
                assert (ctx.get(ft.chk_fwd_hit), ctx.get(ft.chk_rev_hit)) == want
                log["checks"] += want[0] + want[1]
            chks.append((int(cf in model.used_keys("fwd")), int(cr in model.used_keys("rev"))))
            # the key of this cycle is compared against the entries as they are now
            key, use_rev = rng.choice(keys), rng.random() < 0.5
            e = model.lookup(key, use_rev)
            packed = 0 if e is None else dlay.const(model.entries[e]["data"]).as_value().value
            op = rng.random()
            ctx.set(ft.bind_en, 0)
            ctx.set(ft.commit_en, 0)
            ctx.set(ft.drop_en, 0)
            if op < 0.35:
                be, job = rng.randrange(flows), rng.randrange(4)
                # (the entry data RAM is read by the last lookup stage: a lookup still in flight
                # over a drop would see a re-bind's data; the control path quiesces around drops)
                if not model.live(be) and len(pipe) - dropped.get(be, -99) > ft.lk_latency + 1:
                    fwd, rev = rng.choice(keys), rng.choice(keys)
                    d = {"job": job, "rank": rng.randrange(8), "start": rng.randrange(1 << 24),
                         "rev_qpn": rng.randrange(1 << 24)}
                    if (fwd not in model.used_keys("fwd") and rev not in model.used_keys("rev")):
                        ctx.set(ft.bind_en, 1)
                        ctx.set(ft.bind_entry, be)
                        ctx.set(ft.bind_job, job)
                        ctx.set(ft.bind_fwd, fwd)
                        ctx.set(ft.bind_rev, rev)
                        ctx.set(ft.bind_data, d)
                        model.entries[be] = dict(job=job, fwd=fwd, rev=rev, data=d,
                                                state="pending")
            elif op < 0.5:
                job = rng.randrange(4)
                ctx.set(ft.commit_en, 1)
                ctx.set(ft.commit_job, job)
                for v in model.entries.values():
                    if v["job"] == job and v["state"] == "pending":
                        v["state"] = "live"
            elif op < 0.55:
                job = rng.randrange(4)
                ctx.set(ft.drop_en, 1)
                ctx.set(ft.drop_job, job)
                for de in [x for x, v in model.entries.items() if v["job"] == job]:
                    del model.entries[de]
                    dropped[de] = len(pipe)
            en = rng.random() >= stall
            ctx.set(ft.lk_en, en)
            ctx.set(ft.lk_ip, key >> 24)
            ctx.set(ft.lk_qpn, key & 0xFFFFFF)
            ctx.set(ft.lk_rev, use_rev)
            if en:
                # the result of the key compared lk_latency enabled cycles ago is on the outputs
                if len(pipe) >= ft.lk_latency:
                    want = pipe[-ft.lk_latency]
                    hit = ctx.get(ft.lk_hit)
                    assert hit == (want[0] is not None)
                    if hit:
                        assert ctx.get(ft.lk_entry) == want[0]
                        assert ctx.get(Value.cast(ft.lk_data)) == want[1]
                        log["hits"] += 1
                    log["lookups"] += 1
                pipe.append((e, packed))
            await ctx.tick()
            assert ctx.get(ft.live) == sum(1 << e for e in range(flows) if model.live(e))

    sim = Simulator(ft)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return log


@pytest.mark.parametrize("flows,stall", [(16, 0.0), (16, 0.3), (5, 0.2), (40, 0.2)])
def test_flowtable_random(flows, stall):
    """(40 entries: two encoder / OR stages.)"""
    log = run(flows, 1500, seed=flows + int(stall * 10), stall=stall)
    assert log["hits"] > 50 and log["lookups"] > 500 and log["checks"] > 100


def test_flowtable_live_flags():
    """``live`` shows committed entries only; drop frees a job's pending and live entries."""
    ft = FlowTable(8, jobs=2, max_world=4)

    async def bench(ctx):
        for e, job in ((1, 0), (2, 1), (5, 0)):
            ctx.set(ft.bind_en, 1)
            ctx.set(ft.bind_entry, e)
            ctx.set(ft.bind_job, job)
            ctx.set(ft.bind_fwd, make_key(1, e))
            ctx.set(ft.bind_rev, make_key(2, e))
            await ctx.tick()
        ctx.set(ft.bind_en, 0)
        assert ctx.get(ft.live) == 0
        ctx.set(ft.commit_en, 1)
        ctx.set(ft.commit_job, 0)
        await ctx.tick()
        ctx.set(ft.commit_en, 0)
        assert ctx.get(ft.live) == (1 << 1) | (1 << 5)
        ctx.set(ft.chk_fwd, make_key(1, 2))  # pending entry 2 still holds its key
        await ctx.tick().repeat(ft.chk_latency)
        assert ctx.get(ft.chk_fwd_hit) == 1
        ctx.set(ft.drop_en, 1)
        ctx.set(ft.drop_job, 1)
        await ctx.tick()
        ctx.set(ft.drop_en, 0)
        await ctx.tick().repeat(ft.chk_latency)
        assert ctx.get(ft.chk_fwd_hit) == 0
        ctx.set(ft.drop_job, 0)
        ctx.set(ft.drop_en, 1)
        await ctx.tick()
        assert ctx.get(ft.live) == 0

    sim = Simulator(ft)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_flowtable_rejects_bad_parameters():
    with pytest.raises(ValueError, match="flows"):
        FlowTable(0)
