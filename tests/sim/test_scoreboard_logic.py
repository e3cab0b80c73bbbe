"""The whole-engine scoreboard itself (sim/scoreboard.py, sim/scenarios.py), model against model:
it passes when the engine is the model, and it catches (with a readable report) every kind of
difference an RTL engine could show: reordering within a flow, a flipped payload bit, a changed
header field, a missing or extra frame, a counter or state register off by one. Reordering across
flows (which the contract leaves open) must pass.

Traffic: recorded closed-loop runs of the scenario library (RC endpoint models, seeded network
model with loss/dup/reorder, several jobs, CE marks, PSN wrap, junk and spoofed frames)."""

from __future__ import annotations

import pytest
from netreduce.sim.verif.scenarios import (
    ENGINE_PARAMS,
    SCENARIOS,
    EngineAdapter,
    ModelBackend,
    random_scenario,
    record,
    run_log,
    score_backend,
    unit_logs,
)
from netreduce.sim.verif.scoreboard import (
    EventLog,
    Out,
    ScoreboardMismatch,
    check,
    compare,
    end_state_problems,
    flow_of,
    frame_diff,
    replay,
    set_cnp_interval,
    snapshot,
)

from netreduce.regmap import build_regmap
from netreduce.wire import parse

_CACHE: dict = {}


def rec(name: str):
    """Recorded library scenario (cached: recording is the slow part)."""
    if name not in _CACHE:
        sc, junk = SCENARIOS[name]
        _CACHE[name] = record(sc, junk_every_ns=junk)
    return _CACHE[name]


def _payload_result_index(outs, min_payload=8):
    """Index of an output that is a result (a data frame with payload)."""
    for i, o in enumerate(outs):
        f = parse(o.frame)
        if f.info.has_payload and len(f.payload) >= min_payload:
            return i
    raise AssertionError("no result frame")


# ------------------------------------------------------------------------ model vs model
@pytest.mark.parametrize("name", ["psn_wrap_faults", "n16_ce_marks", "junk_and_spoofs",
                                  "four_jobs_per_direction"])
def test_recorded_closed_loop_run_matches_its_replay(name):
    r = rec(name)
    assert r.report.ok, r.report.violations
    rep = check(r.log, r.outs, end_state=True)
    assert rep.ok, rep.summary()
    assert rep.expected == len(r.outs) > 0 and rep.inputs == len(r.log.frames)
    assert "OK" in rep.summary()


@pytest.mark.parametrize("name", ["n32_pmtu256", "junk_and_spoofs", "float32_max_sat"])
def test_model_backend_open_loop_passes_with_full_register_state(name):
    """run_log feeds the log into a backend (new cycles), the scoreboard replays the log as fed
    and compares outputs and every counter/state register."""
    rep = score_backend(ModelBackend(ENGINE_PARAMS), rec(name).log)
    assert rep.ok, rep.summary()
    assert rep.got == rep.expected > 0


def test_closed_loop_through_the_backend_adapter():
    """The backend protocol also runs closed loop (the RTL in the middle of the network)."""
    sc, junk = random_scenario(1)
    r = record(sc, junk_every_ns=junk, engine=EngineAdapter(ModelBackend(ENGINE_PARAMS)))
    assert r.report.ok, r.report.violations
    assert check(r.log, r.outs, end_state=True).ok


def test_scenario_library_covers_the_issue():
    """N 2..32, PMTU 256/1024/4096, 2-4 jobs, wrap, CE, faults in both directions, junk; and the
    traffic really exercises the contract's paths."""
    worlds = {j.world for sc, _ in SCENARIOS.values() for j in sc.jobs}
    pmtus = {j.pmtu for sc, _ in SCENARIOS.values() for j in sc.jobs}
    assert min(worlds) == 2 and max(worlds) == 32 and {256, 1024, 4096} <= pmtus
    assert {len(sc.jobs) for sc, _ in SCENARIOS.values()} >= {2, 4}
    assert any(j.wrap for sc, _ in SCENARIOS.values() for j in sc.jobs)
    assert any(j.elems * 4 % j.pmtu for sc, _ in SCENARIOS.values() for j in sc.jobs)
    c = replay(rec("junk_and_spoofs").log).engine.counters()
    for k in ("fwd_not_roce", "fwd_unregistered", "drop_icrc", "duplicates", "reemits",
              "fwd_nak"):
        assert c[k] > 0, k
    c = replay(rec("n16_ce_marks").log).engine.counters()
    assert c["cnp_sent"] > 0 and c["cnp_suppressed"] > 0 and c["behind_window"] > 0
    st = replay(rec("psn_wrap_faults").log).engine
    assert rec("psn_wrap_faults").report.ok and st.counters()["released"] > 0


# ------------------------------------------------------------------------ mismatches
def _flows(outs):
    by = {}
    for i, o in enumerate(outs):
        by.setdefault(flow_of(o.port, o.frame), []).append(i)
    return by


def test_swap_within_a_flow_fails():
    r = rec("four_jobs_per_direction")
    outs = list(r.outs)
    i, j = next((v[0], v[1]) for v in _flows(outs).values()
                if len(v) > 1 and outs[v[0]].frame != outs[v[1]].frame)
    outs[i], outs[j] = outs[j], outs[i]
    rep = check(r.log, outs)
    assert not rep.ok and len(rep.mismatches) == 1
    m = rep.mismatches[0]
    assert m.missing == m.extra == 0 and m.index == 0
    assert "different order" in rep.summary()
    with pytest.raises(ScoreboardMismatch, match="different order"):
        rep.assert_ok()


def test_swap_across_flows_passes():
    r = rec("four_jobs_per_direction")
    outs = list(r.outs)
    swaps = 0
    for i in range(len(outs) - 1):
        if flow_of(outs[i].port, outs[i].frame) != flow_of(outs[i + 1].port, outs[i + 1].frame):
            outs[i], outs[i + 1] = outs[i + 1], outs[i]
            swaps += 1
            if swaps == 10:
                break
    assert swaps == 10 and outs != r.outs
    rep = check(r.log, outs)
    assert rep.ok, rep.summary()


def test_flipped_payload_bit_names_flow_lane_and_values():
    r = rec("psn_wrap_faults")
    outs = list(r.outs)
    k = _payload_result_index(outs, 64)
    f = parse(outs[k].frame)
    off = f.payload_offset + 37  # int32 lane 9, byte 1
    b = bytearray(outs[k].frame)
    b[off] ^= 0x10
    outs[k] = Out(outs[k].port, bytes(b), outs[k].cycle)
    rep = check(r.log, outs)
    assert not rep.ok and rep.missing == 1 and rep.extra == 1
    s = rep.summary()
    want = int.from_bytes(f.payload[36:40], "little", signed=True)
    assert "lane 9" in s and str(want) in s and "payload byte 36" in s
    assert f"QP 0x{f.dqpn:06x}" in s
    assert "icrc" in s.lower()  # the corrupted frame no longer passes the wire checks


def test_header_field_difference_is_named():
    r = rec("n2_pmtu256_clean")
    outs = list(r.outs)
    k = _payload_result_index(outs)
    f = parse(outs[k].frame)
    outs[k] = Out(outs[k].port, f.copy(ttl=f.ttl - 1).pack(), outs[k].cycle)
    rep = check(r.log, outs)
    assert not rep.ok
    assert f"ttl: expected {hex(f.ttl)}, got {hex(f.ttl - 1)}" in rep.summary()


def test_missing_and_extra_frames_are_counted():
    r = rec("n4_pmtu1024_loss")
    outs = list(r.outs)
    gone = outs.pop(len(outs) // 2)
    rep = check(r.log, outs)
    assert not rep.ok and rep.missing == 1 and rep.extra == 0
    assert "nothing (frame missing)" in rep.summary() or "missing" in rep.summary()
    assert rep.got == rep.expected - 1
    rep2 = check(r.log, r.outs + [gone])
    assert not rep2.ok and rep2.extra == 1 and rep2.missing == 0


def test_counter_and_state_mismatches_fail():
    r = rec("ack_loss")
    state = snapshot(replay(r.log).engine.bus, r.log.params)
    assert check(r.log, r.outs, state, end_state=True).ok
    bad = dict(state, **{"CNT.DUPLICATES": state["CNT.DUPLICATES"] + 1})
    rep = check(r.log, r.outs, bad)
    assert not rep.ok and list(rep.register_diffs) == ["CNT.DUPLICATES"]
    assert "duplicates" in rep.summary()
    rep = check(r.log, r.outs, counters={"reemits": 0}, job_counters={1: {"freed": 1}})
    assert set(rep.register_diffs) == {"CNT.REEMITS", "JOB_CNT[1].FREED"}
    busy = dict(state, **{"JOB[0].SLOTS_BUSY": 3})
    rep = check(r.log, r.outs, busy, end_state=True)
    assert not rep.ok and any("slots still busy" in p for p in rep.end_state)
    with pytest.raises(ValueError, match="not in the compared state"):
        check(r.log, r.outs, {"NOPE": 1})


def test_end_state_identities_catch_inconsistent_counters():
    r = rec("n2_pmtu256_clean")
    state = snapshot(replay(r.log).engine.bus, r.log.params)
    assert end_state_problems(state, r.log.params) == []
    s = dict(state, **{"CNT.TX_FRAMES": state["CNT.TX_FRAMES"] + 1})
    assert any("tx_frames" in p for p in end_state_problems(s, r.log.params))
    s = dict(state, **{"CNT.FWD_NOT_ROCE": state["CNT.FWD_NOT_ROCE"] + 1})
    assert any("rx_frames" in p for p in end_state_problems(s, r.log.params))


def test_non_roce_difference_locates_bytes():
    a = bytes(range(60))
    b = bytearray(a)
    b[13] ^= 1
    d = frame_diff(a, bytes(b))
    assert "byte 13 (ETH.ethertype)" in d


def test_spoofed_frame_to_a_result_flow_is_its_own_flow():
    """A forged/unregistered frame to a worker's QP travels on the bypass and may overtake the
    results: the source IPv4 keeps it in its own flow."""
    r = rec("n2_pmtu256_clean")
    k = _payload_result_index(r.outs)
    f = parse(r.outs[k].frame)
    spoof = f.copy(src_ip=f.src_ip ^ 0x100).pack()
    assert flow_of(0, spoof) != flow_of(0, r.outs[k].frame)
    assert flow_of(0, spoof)[2:] == flow_of(0, r.outs[k].frame)[2:]
    assert flow_of(1, b"\x00" * 20) == (1, "other")


def test_compare_orders_mismatches_by_first_expected_frame():
    r = rec("n4_pmtu1024_loss")
    outs = list(r.outs)
    flows = _flows(outs)
    late, early = sorted(flows.values(), key=lambda v: v[0])[-1], min(flows.values())
    del outs[late[-1]]
    del outs[early[0]]
    m = compare(r.outs, outs)
    assert len(m) == 2 and m[0].expected.frame == r.outs[early[0]].frame


def test_log_roundtrip_and_cnp_interval_rewrite(tmp_path):
    r = rec("n16_ce_marks")
    p = tmp_path / "log.jsonl"
    r.log.save(p)
    back = EventLog.load(p)
    assert back.events == r.log.events and back.params == r.log.params
    rm = build_regmap(**r.log.params)
    cnp = {rm.addr("JOB.CNP_INTERVAL", j) for j in range(rm.params["jobs"])}
    zero = set_cnp_interval(r.log, 0)
    assert all(e.b == 0 for e in zero.events if e.kind == "write" and e.a in cnp)
    c0 = replay(zero).engine.counters()
    c1 = replay(r.log).engine.counters()
    assert c0["cnp_suppressed"] == 0 and c0["cnp_sent"] == c1["cnp_sent"] + c1["cnp_suppressed"]


def test_open_loop_timing_changes_cnp_decisions_and_the_scoreboard_follows():
    """Fed back to back, the frames are closer in time than in the closed-loop run: the CNP
    limiter decides differently, and the scoreboard (replaying the log as fed) agrees with the
    backend, while the recorded outputs no longer match the fed log."""
    r = rec("n16_ce_marks")
    fed, outs, state = run_log(ModelBackend(ENGINE_PARAMS, gap=0), r.log, reads=False)
    assert check(fed, outs, state).ok
    assert replay(fed).engine.counters()["cnp_sent"] != replay(r.log).engine.counters()[
        "cnp_sent"]
    assert not check(fed, r.outs).ok


def test_bad_logs_raise_clear_errors():
    log = EventLog(dict(ENGINE_PARAMS))
    log.frame(5, b"\x00" * 60, 1)
    with pytest.raises(ValueError, match="port 5"):
        replay(log)
    log = EventLog(dict(ENGINE_PARAMS))
    log.events.append(("poke", 0, 0, 0))
    with pytest.raises(ValueError, match="unknown kind 'poke'"):
        replay(log)


@pytest.mark.parametrize("name", list(unit_logs()))
def test_unit_logs_exercise_their_rule_and_pass_on_the_model_backend(name):
    u = unit_logs()[name]
    c = replay(u.log).engine.counters()
    assert {k: c[k] for k in u.expect} == u.expect
    fed, outs, state = run_log(ModelBackend(ENGINE_PARAMS), u.log)
    rep = check(fed, outs, state, end_state=u.end_state)
    assert rep.ok, rep.summary()
    assert all(v == 0 for k, v in state.items() if k.endswith("SLOTS_BUSY"))


def test_unit_log_results_are_the_true_aggregates():
    """The rule logs' results are right on the model (so matching the model means right):
    saturation clips at every addition, MAX is signed, malformed frames change nothing."""
    import numpy as np

    outs = replay(unit_logs()["saturation_max"].log).outs
    res = [parse(o.frame) for o in outs if parse(o.frame).info.has_payload]
    lanes = {np.frombuffer(f.payload, "<i4")[:4].tolist().__repr__() for f in res}
    assert repr([2**31 - 1, -2**31, 2**31 - 1, -2**31]) in lanes  # SUM_SAT index 0
    assert repr([-5, -2, -2**31 + 1, 2**31 - 1]) in lanes  # MAX
    u = unit_logs()["malformed"]
    good = [parse(o.frame) for o in replay(u.log).outs
            if flow_of(o.port, o.frame)[-1] == "data" and o.frame[12:14] == b"\x08\x00"]
    # the two results of job 0 (ranks 10.0.0.1 and .2): one aggregate; the forwarded
    # unregistered copy (another source) keeps its own payload
    payloads = {f.payload for f in good if f.info.has_payload and len(f.payload) == 128
                and f.src_ip in (0x0A000001, 0x0A000002)}
    assert len(payloads) == 1 and len(good) >= 2
