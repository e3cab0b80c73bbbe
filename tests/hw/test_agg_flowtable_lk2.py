"""FlowTable's second lookup port (``lookups=2``: ``lk2_*``, reverse keys only).

Random binds / commits / drops and both lookups every cycle (random pipeline stalls), checked
against a dictionary model: each lookup's result appears ``lk_latency`` enabled cycles after its
key and reflects the entries live when the key was presented; both ports hit and miss, and hit
the same entry in the same cycle. The second port's depth is within the clock plan's budget.
"""

import random
import shutil

import pytest
from amaranth.hdl import Value
from amaranth.sim import Simulator
from netreduce.hw.agg.flowtable import FlowTable, make_key


def run(flows, n_ops, seed, stall):
    ft = FlowTable(flows, jobs=4, max_world=8, lookups=2)
    rng = random.Random(seed)
    entries = {}  # entry -> dict(job, fwd, rev, data, state)
    keys = [make_key(0x0A000000 + rng.randrange(8), 0x100 + rng.randrange(8)) for _ in range(12)]
    dlay = ft.data_layout
    log = {"lookups": 0, "hits1": 0, "hits2": 0, "same": 0, "miss2": 0}

    def lookup(key, kind):
        hits = [e for e, v in entries.items() if v["state"] == "live" and v[kind] == key]
        assert len(hits) <= 1
        return hits[0] if hits else None

    def result(e):
        return None if e is None else (e, dlay.const(entries[e]["data"]).as_value().value)

    async def bench(ctx):
        pipe = []  # per enabled cycle: (expected port 1 result, expected port 2 result)
        dropped = {}  # entry -> lookups presented before its last drop
        for _ in range(n_ops):
            key, use_rev = rng.choice(keys), rng.random() < 0.5
            # the second key: often the reverse key of a live entry (hits), sometimes the
            # first key itself (both ports on one entry), else a random one
            live = [v for v in entries.values() if v["state"] == "live"]
            r = rng.random()
            if r < 0.25:
                key2, use_rev = key, True
            elif r < 0.7 and live:
                key2 = rng.choice(live)["rev"]
            else:
                key2 = rng.choice(keys)
            want = (result(lookup(key, "rev" if use_rev else "fwd")), result(lookup(key2, "rev")))
            for s in (ft.bind_en, ft.commit_en, ft.drop_en):
                ctx.set(s, 0)
            op = rng.random()
            if op < 0.35:
                be, job = rng.randrange(flows), rng.randrange(4)
                # a lookup in flight over a drop would see a re-bind's data (the control path
                # quiesces around drops)
                if be not in entries and len(pipe) - dropped.get(be, -99) > ft.lk_latency + 1:
                    fwd, rev = rng.choice(keys), rng.choice(keys)
                    d = {"job": job, "rank": rng.randrange(8), "start": rng.randrange(1 << 24),
                         "rev_qpn": rng.randrange(1 << 24)}
                    if all(v["fwd"] != fwd and v["rev"] != rev for v in entries.values()):
                        ctx.set(ft.bind_en, 1)
                        ctx.set(ft.bind_entry, be)
                        ctx.set(ft.bind_job, job)
                        ctx.set(ft.bind_fwd, fwd)
                        ctx.set(ft.bind_rev, rev)
                        ctx.set(ft.bind_data, d)
                        entries[be] = dict(job=job, fwd=fwd, rev=rev, data=d, state="pending")
            elif op < 0.5:
                job = rng.randrange(4)
                ctx.set(ft.commit_en, 1)
                ctx.set(ft.commit_job, job)
                for v in entries.values():
                    if v["job"] == job and v["state"] == "pending":
                        v["state"] = "live"
            elif op < 0.53:
                job = rng.randrange(4)
                ctx.set(ft.drop_en, 1)
                ctx.set(ft.drop_job, job)
                for de in [x for x, v in entries.items() if v["job"] == job]:
                    del entries[de]
                    dropped[de] = len(pipe)
            en = rng.random() >= stall
            ctx.set(ft.lk_en, en)
            ctx.set(ft.lk_ip, key >> 24)
            ctx.set(ft.lk_qpn, key & 0xFFFFFF)
            ctx.set(ft.lk_rev, use_rev)
            ctx.set(ft.lk2_ip, key2 >> 24)
            ctx.set(ft.lk2_qpn, key2 & 0xFFFFFF)
            if en:
                if len(pipe) >= ft.lk_latency:
                    w1, w2 = pipe[-ft.lk_latency]
                    for w, hit, ent, dat in ((w1, ft.lk_hit, ft.lk_entry, ft.lk_data),
                                             (w2, ft.lk2_hit, ft.lk2_entry, ft.lk2_data)):
                        assert ctx.get(hit) == (w is not None)
                        if w is not None:
                            assert (ctx.get(ent), ctx.get(Value.cast(dat))) == w
                    log["lookups"] += 1
                    log["hits1"] += w1 is not None
                    log["hits2"] += w2 is not None
                    log["miss2"] += w2 is None
                    log["same"] += w1 is not None and w1 == w2
                pipe.append(want)
            await ctx.tick()

    sim = Simulator(ft)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return log


@pytest.mark.parametrize("flows,stall", [(16, 0.0), (16, 0.3), (5, 0.2), (40, 0.2)])
def test_flowtable_second_lookup_random(flows, stall):
    """(40 entries: two encoder stages.)"""
    log = run(flows, 1500, seed=100 + flows + int(stall * 10), stall=stall)
    assert log["lookups"] > 500
    assert log["hits1"] > 50 and log["hits2"] > 100 and log["miss2"] > 50 and log["same"] > 20


def test_flowtable_lookups_parameter():
    ft = FlowTable(8, jobs=2, max_world=4)
    ft._MustUse__silence = True  # inspected, not elaborated
    assert ft.lookups == 1 and "lk2_ip" not in ft.signature.members
    with pytest.raises(ValueError, match="lookups must be 1 or 2, not 3"):
        FlowTable(8, lookups=3)


@pytest.mark.skipif(shutil.which("yosys") is None, reason="needs the native yosys")
@pytest.mark.parametrize("flows", [8, 40])
def test_flow_table_two_lookups_meet_the_depth_budget(flows):
    """docs/engine.md "Clock plan": at most 8 LUT-class cells and 8 CARRY8 per path."""
    from netreduce.hw.pathcheck import levels

    lv = levels(FlowTable(flows, jobs=2, max_world=4, lookups=2))
    assert lv["lut_levels"] <= 8, lv["lut_path"]
    assert lv["carry_max"] <= 8, lv
