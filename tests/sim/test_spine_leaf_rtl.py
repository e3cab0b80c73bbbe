"""Spine-leaf on the engine RTL (issue 19, model D17): a leaf engine and a spine engine, each
the 64-bit engine built with flow roles under Verilator, frame by frame against its own model
instance; then the whole R-rack all-reduce with one Verilator engine per switch
(``netreduce sim --racks R --backend verilator``) with faults on every link.

One build (:func:`netreduce.sim.rtl.rack_engine.rack_build_params` of 2 racks x 2 workers)
serves every test here."""

from __future__ import annotations

import functools
import random
from collections import Counter

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.model.marks import remark
from netreduce.sim.net.simrun import BackendUnavailable, SimConfig
from netreduce.sim.net.spine_leaf import run_rack_sim
from netreduce.sim.rtl.fabric import probe_rtl
from netreduce.sim.rtl.rack_engine import RtlRackEngine, rack_build_params
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import JOB_COUNTERS, Role
from netreduce.wire import ECN_CE, Opcode
from netreduce.wire.marks import MARK_PARTIAL, MARK_TOTAL

PARAMS = rack_build_params(4, 2, 1024)  # ports 3: a leaf's 2 ranks + uplink; the spine's 2
L2 = 14
rtl = pytest.mark.xdist_group("fastsim_engine_roles")


@functools.cache
def _unavailable() -> str | None:
    try:
        probe_rtl("verilator")
    except BackendUnavailable as e:
        return str(e)
    return None


def _pair(job: RingJob, roles: list[Role]):
    """The model and the RTL engine, the same job (with ``roles``) programmed into both."""
    if _unavailable():
        pytest.skip(_unavailable())
    model = Engine(**PARAMS)
    dut = RtlRackEngine(PARAMS)
    cfg = job.config()
    for f, role in zip(cfg.flows, roles, strict=True):
        f.role = role
    for bus in (model.bus, dut.bus):
        EngineControl(bus).add_job(cfg)
    return model, dut


def _score(job: RingJob, roles: list[Role], frames, end_state: bool = True) -> Engine:
    """The existing RTL-vs-model harness (netreduce.sim.verif: the log recorded on the model,
    played into the roles build under Verilator back to back per port, replayed on a fresh
    model): every output frame byte for byte per output port and flow in order (forwarded
    frames and engine-made ones apart), every counter and job / flow register
    (``JOB.PARTIAL_PTR`` included), and the end-state identities. Returns the recording model."""
    if _unavailable():
        pytest.skip(_unavailable())
    from netreduce.sim.backend import open_engine
    from netreduce.sim.verif.scenarios import FastSimBackend, run_log
    from netreduce.sim.verif.scoreboard import RecordingEngine, check, flow_of

    rec = RecordingEngine(Engine(**PARAMS), PARAMS, "spine-leaf-rtl")
    cfg = job.config()
    for f, role in zip(cfg.flows, roles, strict=True):
        f.role = role
    EngineControl(rec.bus).add_job(cfg)
    for i, (port, buf) in enumerate(frames):
        rec.receive(port, buf, i)
    inputs = {e.b for e in rec.log.frames}
    with open_engine("verilator", {**PARAMS, "roles": True}) as sim:
        fed, outs, state = run_log(FastSimBackend(sim, PARAMS, limit=100_000), rec.log,
                                   reads=False)
        assert sim.protocol_errors == 0

    def key(port: int, frame: bytes) -> tuple:
        return (*flow_of(port, frame), frame in inputs)

    rep = check(fed, outs, state, end_state=end_state, key=key)
    assert rep.ok, rep.summary()
    assert rep.expected > len(frames) // 2
    return rec.engine


def _compare(model, dut, frames, jobs=(0,)):
    """Every frame through both: per frame, the frames out per port (as multisets: the RTL's
    forward and result paths interleave flows differently); at the end every job counter and
    the slots in use."""
    for i, (port, buf) in enumerate(frames):
        want = Counter((e.port, bytes(e.frame)) for e in model.receive(port, buf, i))
        got = Counter((e.port, e.frame) for e in dut.receive(port, buf, i))
        assert got == want, f"frame {i} (port {port}): RTL {sorted(got)} model {sorted(want)}"
    ctl = EngineControl(dut.bus)
    for j in jobs:
        g, w = ctl.counters(j), model.counters(j)
        diff = {c.name: (g[c.name], w[c.name]) for c in JOB_COUNTERS
                if g[c.name] != w[c.name]}
        assert not diff, f"job {j} counters (RTL, model): {diff}"
        assert dut.slots_in_use(j) == model.slots_in_use(j)
    dut.close()


def _vec(rng, n=16):
    return np.array([rng.randrange(-1 << 20, 1 << 20) for _ in range(n)], np.int32)


LEAF = [Role.MEMBER, Role.MEMBER, Role.UP, Role.DOWN]
LEAF_PORT = [0, 1, 1, 2]  # ranks 0, 1 (and 1's cross-rack flow UP) local; DOWN from the spine


@rtl
@pytest.mark.parametrize("vlan", [False, True])
def test_leaf_engine_rtl_matches_its_model(vlan):
    """A leaf: partials up (MARK_PARTIAL) in index order, totals from DOWN forwarded without
    the mark and released to the MEMBER ranks, UP's resends answered with the partial, wrong
    stage frames dropped, probes on DOWN passed, ACKs freeing, CE answered with CNPs; untagged
    and 802.1Q-tagged (the mark 4 bytes further)."""
    rng = random.Random(11)
    job = RingJob(job=0, world=4, window=4, slot_base=0, vlan_tci=0x2005 if vlan else None)
    l2 = 18 if vlan else L2
    model, dut = _pair(job, LEAF)
    frames = []

    def data(r, k, **kw):
        frames.append((LEAF_PORT[r], job.data_bytes(r, k, _vec(rng), **kw)))

    def total(k, mark=MARK_TOTAL, n=16, **kw):
        frames.append((2, remark(job.data_bytes(3, k, _vec(rng, n), **kw), l2, mark)))

    def ack(r, k):
        frames.append((LEAF_PORT[(r + 1) % 4], job.ack(r, k)))

    for k in (1, 0, 2):  # out of order: a chain of partials
        for r in (2, 0, 1):
            data(r, k, ecn=ECN_CE if k == 2 and r == 0 else 0)
    data(2, 1)  # UP resends: the partial again
    data(0, 0)  # a MEMBER's duplicate
    total(3)  # its partial has not gone up: drop_role
    total(1, mark=0)  # a worker's frame on DOWN
    total(1, mark=MARK_PARTIAL)  # another leaf's partial
    total(1, n=8)  # another length
    for k in (1, 0, 2):  # totals out of order: a chain of releases
        total(k, ecn=ECN_CE if k == 0 else 0)
    total(1)  # the total again: re-emitted
    data(1, 0)  # a MEMBER's resend after the release: its result again
    data(2, 0)  # UP's resend: the partial
    for k in range(3):
        for r in range(4):
            ack(r, k)
    frames.append((2, remark(job.data_bytes(3, 1, b"", opcode=Opcode.WRITE_MIDDLE), l2,
                             MARK_TOTAL)))  # the spine's probe of a freed index
    data(2, 1)  # behind the window: probe
    for k in range(3, 9):  # in order, with an interleaved total
        for r in (0, 1, 2):
            data(r, k)
        total(k)
        for r in range(4):
            ack(r, k)
    _compare(model, dut, frames)
    c = model.counters(0)
    assert (c["partials_up"], c["totals"], c["drop_role"], c["freed"]) == (9, 9, 4, 9), c
    _score(job, LEAF, frames)
    assert min(c["reemits"], c["behind_window"], c["cnp_sent"], c["duplicates"]) > 0, c


@rtl
def test_leaf_engine_rtl_back_to_back_random():
    """Random leaf traffic (contributions, totals, wrong stages, probes, ACKs/NAKs around the
    pointers, CE) sent to the RTL in one batch on one port, back to back: the same frames out
    as the model's (as a multiset: the RTL's paths interleave), every counter, the slots."""
    import importlib

    gen_mod = importlib.import_module("tests.hw.test_agg_roles")
    rng = random.Random(21)
    job = RingJob(job=0, world=4, window=4, slot_base=4, cnp_interval=0)  # CNPs timing-free
    gen = _model_only(job, LEAF)
    st = gen._jobs[0]
    kinds = ["contrib"] * 10 + ["total"] * 4 + ["ack"] * 8 + [
        "raw_down", "partial_down", "short_total", "probe", "marked_member"]
    frames = []
    for i in range(300):
        kind = rng.choice(kinds)
        if kind == "ack":
            r = rng.randrange(4)
            if rng.random() < 0.5:
                r = min(range(4), key=lambda f: (st.flows[f].acked - st.free) % (1 << 24))
            lim = st.leaf.upptr if r == 2 else st.rel
            ahead = (lim - st.flows[r].acked) % (1 << 24)
            k = (st.flows[r].acked + rng.randrange(-1, ahead + 1) - 1) % (1 << 24)
            buf = job.ack(r, k, nak=rng.random() < 0.2)
        else:
            base = st.rel if kind in ("total", "short_total", "probe") else st.leaf.upptr
            k = (base + rng.choice([-2, -1, 0, 0, 0, 1, 2, 3])) % (1 << 24)
            buf = gen_mod.leaf_frames(job, rng, k, kind, ce=rng.random() < 0.1)
        gen.receive(0, buf, i)
        frames.append(buf)
    model, dut = _pair(job, LEAF)
    want = Counter()
    for i, buf in enumerate(frames):
        want.update((e.port, bytes(e.frame)) for e in model.receive(0, buf, i))
    for buf in frames:
        dut.rtl.send(0, buf)
    got = Counter((f.port, bytes(f.frame)) for f in dut.rtl.run())
    assert got == want, (sorted(got - want)[:3], sorted(want - got)[:3])
    c = model.counters(0)
    assert min(c["partials_up"], c["totals"], c["drop_role"], c["reemits"], c["freed"],
               c["cnp_sent"]) > 0, c
    ctl = EngineControl(dut.bus)
    g = ctl.counters(0)
    assert {k: g[k] for k in c} == c
    assert dut.slots_in_use(0) == model.slots_in_use(0)
    dut.close()
    _score(job, LEAF, [(0, b) for b in frames], end_state=False)


def _model_only(job: RingJob, roles: list[Role]) -> Engine:
    """A model with the job (the random generator's view of the pointers)."""
    model = Engine(**PARAMS)
    cfg = job.config()
    for f, role in zip(cfg.flows, roles, strict=True):
        f.role = role
    EngineControl(model.bus).add_job(cfg)
    return model


@rtl
def test_spine_engine_rtl_matches_its_model():
    """A spine: RACK partials summed, totals out with MARK_TOTAL, re-emits, unmarked and
    total-marked frames dropped, another engine's probe passed unchanged."""
    rng = random.Random(12)
    job = RingJob(job=1, world=3, window=4, slot_base=8)
    model, dut = _pair(job, [Role.RACK] * 3)
    frames = []

    def part(r, k, mark=MARK_PARTIAL):
        frames.append((r, remark(job.data_bytes(r, k, _vec(rng)), L2, mark)))

    for k in range(4):
        for r in rng.sample(range(3), 3):
            part(r, k)
        part(1, k)  # a leaf re-sends its partial: the total re-emitted
    part(0, 4, mark=0)  # a worker's frame that bypassed its leaf
    part(1, 4, mark=MARK_TOTAL)  # a total sent up again
    frames.append((0, job.data_bytes(0, 4, b"", opcode=Opcode.WRITE_MIDDLE)))  # a leaf's probe
    for k in range(2):
        for r in range(3):
            frames.append((r, job.ack(r, k)))
    part(2, 0)  # behind: the probe carries MARK_TOTAL
    _compare(model, dut, frames, jobs=(1,))
    c = model.counters(1)
    assert (c["released"], c["reemits"], c["drop_role"], c["freed"]) == (4, 4, 2, 2), c
    _score(job, [Role.RACK] * 3, frames, end_state=False)  # slots of indices 2-3 still held


@rtl
@pytest.mark.parametrize("loss", [0.0, 0.03])
def test_rack_allreduce_on_rtl_engines(loss, tmp_path):
    """2 racks x 2 workers, three Verilator engines (two leaves, the spine): bit-exact, every
    engine ends with no slot held; with loss, duplication and reordering on every link (the
    inter-switch links included); one pcap pair per engine."""
    if _unavailable():
        pytest.skip(_unavailable())
    cfg = SimConfig(workers=4, size=16384 if loss else 2048, backend="verilator", loss=loss,
                    dup=loss, reorder=loss, seed=5, qp_timeout=4,
                    dtype="int32" if loss else "float32")
    run = run_rack_sim(cfg, 2, pcap=tmp_path / "r")
    assert run.ok, (run.error, run.checks, run.slots_left)
    assert set(run.slots_left) == {"leaf0", "leaf1", "spine"}
    assert not any(run.slots_left.values())
    for leaf in ("leaf0", "leaf1"):
        c = run.engines[leaf]
        assert c["partials_up"] > 0 and c["totals"] > 0, c
    assert run.engines["spine"]["contributions"] > 0
    if loss:
        isl = run.link_stats["isl_up"], run.link_stats["isl_down"]
        assert sum(s.get("lost", 0) + s.get("duplicated", 0) for s in isl) > 0, isl
    assert len(run.pcaps) == 6 and all((tmp_path / p).exists() for p in run.pcaps)


@rtl
def test_cli_racks_on_verilator(tmp_path):
    if _unavailable():
        pytest.skip(_unavailable())
    from click.testing import CliRunner

    from netreduce.cli import main

    r = CliRunner().invoke(main, ["sim", "--racks", "2", "-n", "4", "-s", "8KiB", "--dtype",
                                  "int32", "--backend", "verilator", "--loss", "0.02",
                                  "--pcap", str(tmp_path / "c"), "--json",
                                  str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    assert "verilator RTL engines" in " ".join(r.output.split()) and "PASS" in r.output
    import json

    rep = json.loads((tmp_path / "c.json").read_text())
    assert rep["ok"] and rep["slots_left"] == {"leaf0": 0, "leaf1": 0, "spine": 0}
    assert sorted(p.rsplit("/", 1)[1] for p in rep["pcaps"]) == sorted(
        f"c.{n}.{d}.pcap" for n in ("leaf0", "leaf1", "spine") for d in ("in", "out"))
