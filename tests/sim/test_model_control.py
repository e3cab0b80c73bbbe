"""EngineControl over the model's register bus, and the engine's own enable-time checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.kit import RingJob, engine_with
from netreduce.sw_driver.control import ConfigError, EngineControl

from netreduce.regmap import VERSION, JobError, Op, RegisterFile, build_regmap
from netreduce.wire import parse


def test_identify_reads_build_parameters_and_rejects_other_devices():
    eng = Engine(ports=2, jobs=4, flows=32, slots=512, pmtu_max=2048)
    info = EngineControl(eng.bus).identify()
    assert (info.ports, info.jobs, info.flows, info.slots, info.pmtu_max, info.version) == \
        (2, 4, 32, 512, 2048, VERSION)
    rf = RegisterFile(build_regmap())
    rf.poke(0, 0x12345678)
    with pytest.raises(ConfigError, match="0x12345678"):
        EngineControl(rf).identify()


def _bad(cfg, **kw):
    return dataclasses.replace(cfg, **kw)


@pytest.mark.parametrize("change, match", [
    (dict(world=1), "world = 1"),
    (dict(world=65), "world = 65"),
    (dict(window=12), "window = 12 is not a power of two"),
    (dict(slot_base=4090), r"slots 4090\.\.4105 outside"),
    (dict(pmtu=1500), "pmtu = 1500"),
    (dict(op=7), "op = 7"),
    (dict(job=8), "job = 8"),
    (dict(cnp_interval=-1), "cnp_interval = -1"),
])
def test_control_validation_messages(change, match):
    eng, ctl = engine_with()
    cfg = RingJob(world=4, window=16).config()
    with pytest.raises(ConfigError, match=match):
        ctl.add_job(_bad(cfg, **change))
    assert ctl.enabled_jobs() == [] and ctl.free_flow_entries() == list(range(256))


def test_control_validation_flows_keys_overlap_and_pmtu_max():
    eng, ctl = engine_with(RingJob(job=0, world=2, window=8), pmtu_max=2048)
    cfg = RingJob(job=1, world=3, window=8, slot_base=8).config()
    with pytest.raises(ConfigError, match=r"ranks \[0, 1\] are not 0..2"):
        ctl.add_job(_bad(cfg, flows=cfg.flows[:2]))
    dup = [dataclasses.replace(f) for f in cfg.flows]
    dup[2].fwd_qpn = dup[1].fwd_qpn
    dup[2].fwd_ip = dup[1].fwd_ip
    with pytest.raises(ConfigError, match="forward key"):
        ctl.add_job(_bad(cfg, flows=dup))
    taken = RingJob(job=0, world=2).config().flows[1]
    clash = [dataclasses.replace(f) for f in cfg.flows]
    clash[0].rev_ip, clash[0].rev_qpn = taken.rev_ip, taken.rev_qpn
    with pytest.raises(ConfigError, match="already registered by job 0"):
        ctl.add_job(_bad(cfg, flows=clash))
    with pytest.raises(ConfigError, match=r"overlap job 0's slots 0..7"):
        ctl.add_job(_bad(cfg, slot_base=4))
    with pytest.raises(ConfigError, match="pmtu = 4096"):
        ctl.add_job(_bad(cfg, pmtu=4096))
    bad_psn = [dataclasses.replace(f) for f in cfg.flows]
    bad_psn[1].start_psn = 1 << 24
    with pytest.raises(ConfigError, match="start_psn = 16777216"):
        ctl.add_job(_bad(cfg, flows=bad_psn))
    with pytest.raises(ConfigError, match="already enabled"):
        ctl.add_job(RingJob(job=0, world=2, window=8, slot_base=100).config())
    ctl.add_job(cfg)
    assert ctl.enabled_jobs() == [0, 1] and len(ctl.free_flow_entries()) == 256 - 5


def _raw_enable(eng, j: RingJob, **over):
    """Program a job with raw register writes (no EngineControl checks); return STATUS.error."""
    rm, bus = eng.regmap, eng.bus
    cfg = j.config()
    for e, f in enumerate(cfg.flows):
        e += over.get("entry_base", 0)
        for path, v in (("FLOW.FWD_IP", f.fwd_ip), ("FLOW.FWD_QPN", f.fwd_qpn),
                        ("FLOW.REV_IP", f.rev_ip), ("FLOW.REV_QPN", f.rev_qpn),
                        ("FLOW.START_PSN", f.start_psn)):
            bus.write(rm.addr(path, e), v)
        bus.write(rm.addr("FLOW.CFG", e), 1 | (cfg.job << 8) | (f.rank << 16))
    vals = dict(WORLD=cfg.world, WINDOW=cfg.window, SLOT_BASE=cfg.slot_base, PMTU=cfg.pmtu,
                OP=int(cfg.op))
    vals.update({k: v for k, v in over.items() if k.isupper()})
    for k, v in vals.items():
        bus.write(rm.addr(f"JOB.{k}", cfg.job), v)
    bus.write(rm.addr("JOB.CTRL", cfg.job), 1)
    st = bus.read(rm.addr("JOB.STATUS", cfg.job))
    return JobError((st >> 8) & 0xFF), st & 1, bus.read(rm.addr("JOB.CTRL", cfg.job))


@pytest.mark.parametrize("over, err", [
    (dict(WORLD=0), JobError.WORLD),
    (dict(WINDOW=6), JobError.WINDOW),
    (dict(SLOT_BASE=4095), JobError.SLOT_RANGE),
    (dict(PMTU=1000), JobError.PMTU),
    (dict(OP=3), JobError.OP),
    (dict(WORLD=5), JobError.FLOWS),
    (dict(SLOT_BASE=8, entry_base=16), JobError.SLOT_OVERLAP),
    (dict(entry_base=16), JobError.KEY_CONFLICT),
])
def test_engine_refuses_bad_enable(over, err):
    eng = Engine()
    if err in (JobError.SLOT_OVERLAP, JobError.KEY_CONFLICT):
        assert _raw_enable(eng, RingJob(job=1, world=4, window=16, slot_base=0)) == \
            (JobError.NONE, 1, 1)
        j = RingJob(job=2, world=4, window=16, slot_base=16)
        if err == JobError.KEY_CONFLICT:
            # same addresses and QPNs as job 1's flows
            j.ip = RingJob(job=1).ip  # type: ignore[method-assign]
            j.sq = RingJob(job=1).sq  # type: ignore[method-assign]
            j.rq = RingJob(job=1).rq  # type: ignore[method-assign]
    else:
        j = RingJob(job=2, world=4, window=16)
    got = _raw_enable(eng, j, **over)
    assert got == (err, 0, 0)
    x = np.ones((4, 8), dtype=np.int32)
    out = eng.receive(0, j.data_bytes(0, 0, x[0]), 0)
    assert eng.counters(2)["contributions"] == 0 and len(out) <= 1


def test_disable_discards_state_and_reenable_restarts_at_index_zero():
    j = RingJob(world=2, window=4)
    eng, ctl = engine_with(j)
    x = np.arange(16, dtype=np.int32).reshape(2, 8)
    eng.receive(0, j.data_bytes(0, 0, x[0]), 0)
    eng.receive(0, j.data_bytes(0, 1, x[0]), 0)
    assert ctl.slots_in_use(0) == 2
    ctl.remove_job(0)
    assert ctl.slots_in_use() == 0 and ctl.job_status(0).enabled is False
    assert ctl.free_flow_entries() == list(range(256))
    f = j.data_bytes(1, 0, x[1])
    assert [e.frame for e in eng.receive(0, f, 0)] == [f]  # unregistered now: bypass
    assert eng.counters()["fwd_unregistered"] == 1
    ctl.add_job(j.config())
    assert eng.receive(0, f, 0) == []  # fresh slot: rank 0's old contribution is gone
    out = eng.receive(0, j.data_bytes(0, 0, x[1]), 0)
    assert [np.frombuffer(parse(e.frame).payload, "<i4").tolist() for e in out] == \
        [(2 * x[1]).tolist()] * 2
    assert eng.counters(0)["contributions"] == 4  # counters survive disable


def test_config_latched_at_enable():
    j = RingJob(world=2, window=4)
    eng, ctl = engine_with(j)
    rm = eng.regmap
    eng.bus.write(rm.addr("JOB.WORLD", 0), 3)  # ignored until the next enable
    x = np.ones((2, 4), dtype=np.int32)
    out = eng.receive(0, j.data_bytes(0, 0, x[0]), 0) + eng.receive(0, j.data_bytes(1, 0, x[1]),
                                                                    0)
    assert len(out) == 2
    eng.bus.write(rm.addr("JOB.CTRL", 0), 0)
    eng.bus.write(rm.addr("JOB.CTRL", 0), 1)  # now N = 3 with 2 flows: refused
    assert ctl.job_status(0).error == JobError.FLOWS and not ctl.job_status(0).enabled


def test_alloc_slots_first_fit_and_exhaustion():
    eng, ctl = engine_with(RingJob(job=0, window=16, slot_base=0),
                           RingJob(job=1, window=16, slot_base=48), slots=64)
    assert ctl.alloc_slots(16) == 16
    assert ctl.alloc_slots(32) == 16
    with pytest.raises(ConfigError, match="no 33 free"):
        ctl.alloc_slots(33)
    with pytest.raises(ConfigError, match="no 64 free"):
        ctl.alloc_slots(64)
    with pytest.raises(ConfigError, match="window = 128"):
        ctl.alloc_slots(128)
    ctl.remove_job(0)
    assert ctl.alloc_slots(32) == 0


def test_counters_and_slots_over_registers_match_model():
    j = RingJob(world=3, window=8, op=Op.MAX)
    eng, ctl = engine_with(j)
    x = np.arange(3 * 16, dtype=np.int32).reshape(3, 16)
    for k in range(3):
        for r in range(3):
            eng.receive(0, j.data_bytes(r, k, x[r]), k)
    eng.receive(0, j.data_bytes(0, 0, x[0]), 9)  # re-emit
    eng.receive(0, j.ack(0, 1), 10)
    assert ctl.counters() == eng.counters() and ctl.counters(0) == eng.counters(0)
    assert ctl.slots_in_use() == eng.slots_in_use() == 3
    st = ctl.job_status(0)
    assert (st.free_ptr, st.release_ptr, st.slots_busy) == (0, 3, 3)
    acked = [eng.bus.read(eng.regmap.addr("FLOW.ACKED", e)) for e in range(3)]
    assert acked == [2, 0, 0]
    ctl.clear_counters()
    assert set(ctl.counters().values()) == {0} and set(eng.counters(0).values()) == {0}


class _SlowDisableBus:
    """The model's bus, but JOB.STATUS keeps saying enabled for ``lag`` reads after a
    JOB.CTRL=0 write (as the gateware does while a packet is in its pipeline)."""

    def __init__(self, eng, lag):
        self.eng, self.lag, self.left, self.log = eng, lag, 0, []
        rm = eng.regmap
        self.ctrl, self.status = rm.addr("JOB.CTRL", 0), rm.addr("JOB.STATUS", 0)
        self.enabled = rm.field("JOB.STATUS.enabled").mask
        self.flow_cfg = {rm.addr("FLOW.CFG", e) for e in range(256)}

    def read(self, addr):
        v = self.eng.bus.read(addr)
        if addr == self.status and self.left:
            self.left -= 1
            v |= self.enabled
        self.log.append(("r", addr, v))
        return v

    def write(self, addr, value):
        if addr == self.ctrl and value == 0:
            self.left = self.lag
        self.log.append(("w", addr, value))
        self.eng.bus.write(addr, value)


@pytest.mark.parametrize("lag", [0, 5])
def test_remove_job_frees_flow_entries_only_once_the_engine_reports_disabled(lag):
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    bus = _SlowDisableBus(eng, lag)
    ctl = EngineControl(bus)
    ctl.remove_job(0)
    assert ctl.free_flow_entries() == list(range(256))
    disabled_at = next(i for i, (op, a, v) in enumerate(bus.log)
                       if op == "r" and a == bus.status and not v & bus.enabled)
    first_free = next(i for i, (op, a, v) in enumerate(bus.log)
                      if op == "w" and a in bus.flow_cfg)
    assert first_free > disabled_at
    assert sum(op == "r" and a == bus.status for op, a, _ in bus.log[:disabled_at + 1]) == lag + 1


def test_remove_job_that_never_disables_is_a_clear_error_and_keeps_the_entries():
    j = RingJob(world=2, window=4)
    eng, _ = engine_with(j)
    bus = _SlowDisableBus(eng, 10**9)
    ctl = EngineControl(bus)
    ctl.ENABLE_POLLS = 50
    with pytest.raises(ConfigError, match="job 0: still enabled after 50 JOB.STATUS reads"):
        ctl.remove_job(0)
    assert len(ctl.free_flow_entries()) == 256 - 2
