"""Fuzzing the reference engine with hypothesis (issue 9): mutated valid traffic never crashes it,
never breaks the accounting and never changes a job's result.

Two jobs (A: N=3, W=4, PMTU 256, SUM_WRAP; B: N=2, W=8, PMTU 512, MAX) run K indices of valid
traffic (contributions, then every receiver's ACK). Hypothesis inserts attack frames anywhere in
that schedule: copies of schedule frames mutated by bit flips, truncations, extensions, header
field rewrites (any field of ETH/IPv4/UDP/BTH/RETH/AETH) and header splices (the first bytes of one
frame, the rest of another), optionally with the IPv4 checksum and ICRC recomputed (a well-formed
forgery). Well-formed data frames on a registered forward key are not sent: they are what the
worker itself would send, and the engine trusts the switch's steering for them
(docs/guarantees.md A1). Everything else must be handled per frame as follows:

* ``receive`` returns (never raises); ``rx_frames`` and exactly one disposition counter move;
* every emitted frame is the input unchanged, its duplicate probe (D15), a CNP, or a result whose
  payload is the true aggregate of its (job, flow, index);
* at the end every flow got every index, with the true aggregate, and every slot is free.

CI runs a fixed number of derandomized examples without a database (reproducible). Any input
that ever crashed the model belongs in ``REGRESSIONS`` (replayed first, as explicit examples).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from netreduce.sim.model.congestion import mark_ce
from netreduce.sim.model.kit import RingJob, engine_with
from netreduce.sim.verif.mutate import FIELDS, fixup, impersonates, mutate

from netreduce.regmap import DISPOSITIONS, Op
from netreduce.wire import ECN_ECT0, Opcode, parse
from netreduce.wire.linklocal import COUNTERS as LL_COUNTERS
from netreduce.wire.linklocal import classify as ll_classify

PSN_MOD = 1 << 24
K = 5
A = RingJob(job=0, world=3, window=4, slot_base=0, pmtu=256, start_psns=[PSN_MOD - 2, 9, 9])
B = RingJob(job=1, world=2, window=8, slot_base=4, pmtu=512, op=Op.MAX, start_psns=[9, 9])
JOBS = (A, B)
_RNG = np.random.default_rng(2024)
X = {j.job: _RNG.integers(-2**31, 2**31, size=(K, j.world, 40), dtype=np.int64).astype(np.int32)
     for j in JOBS}
WANT = {(j.job, k): (X[j.job][k].max(axis=0) if j.op == Op.MAX else
                     X[j.job][k].sum(axis=0, dtype=np.int64).astype(np.int32)).tobytes()
        for j in JOBS for k in range(K)}
# (src IPv4, DestQP, PSN) of every result -> (job, k)
RESULT_OF = {(j.ip(r), j.rq(j.succ(r)), j.psn(r, k)): (j.job, k)
             for j in JOBS for r in range(j.world) for k in range(K)}
FWD_KEYS = {(j.ip(r), j.rq(j.succ(r))) for j in JOBS for r in range(j.world)}


def _schedule() -> list[bytes]:
    out = []
    for k in range(K):
        ops = {0: Opcode.WRITE_FIRST, K - 1: Opcode.WRITE_LAST_IMM}.get(k, Opcode.WRITE_MIDDLE)
        for r in range(3):
            for j in JOBS:
                if r < j.world:
                    out.append(j.data_bytes(r, k, X[j.job][k][r], opcode=ops, ackreq=1,
                                            ecn=ECN_ECT0))  # ECN-capable (D19 marks them)
        for j in JOBS:
            out += j.ack_all(k)
    return out


SCHEDULE = _schedule()











MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 4096), st.integers(0, 7)),
    st.tuples(st.just("trunc"), st.integers(0, 4096)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=12)),
    st.tuples(st.just("field"), st.integers(0, len(FIELDS) - 1), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("splice"), st.integers(0, len(SCHEDULE) - 1), st.integers(0, 4096)),
    st.tuples(st.just("linklocal"), st.integers(0, 3), st.integers(0, 2**32 - 1)),
)
ATTACK = st.tuples(st.integers(0, len(SCHEDULE)), st.integers(0, len(SCHEDULE) - 1),
                   st.lists(MUTATION, min_size=1, max_size=3), st.booleans())

# Inputs that once crashed or broke the model: (position, source, mutations, fixup) lists.
REGRESSIONS: list = [
    [(0, 0, [("trunc", 14)], False)],  # an Ethernet header only
    [(3, 5, [("field", 5, 0x8100)], True)],  # EtherType rewritten to a VLAN TPID
    [(1, 0, [("field", 16, 3)], True)],  # IPv4 total length far below the headers
    [(40, 6, [("trunc", 58), ("field", 28, 0x11)], True)],  # a data frame turned into an ACK
]


def run(attacks, congested=frozenset()) -> None:
    """``congested``: schedule positions at which port 0 is congested (D19: ECT frames are
    CE-marked on arrival, so a forwarded frame may come back marked)."""
    eng, ctl = engine_with(*JOBS, jobs=2, flows=8, slots=64)
    inserts: dict[int, list[bytes]] = {}
    for pos, srci, muts, fix in attacks:
        f = mutate(SCHEDULE[srci], muts, fix, SCHEDULE)
        if not (fix and impersonates(f, FWD_KEYS)):
            inserts.setdefault(pos, []).append(f)
    got: dict = {}
    t = 0
    for i in range(len(SCHEDULE) + 1):
        batch = inserts.get(i, []) + ([SCHEDULE[i]] if i < len(SCHEDULE) else [])
        eng.congested[0] = i in congested
        for frame in batch:
            t += 1
            before = eng.counters()
            out = eng.receive(0, frame, t)
            after = eng.counters()
            moved = [d for d in DISPOSITIONS if after[d] != before[d]]
            assert after["rx_frames"] == before["rx_frames"] + 1 and len(moved) == 1, moved
            assert after["tx_frames"] == before["tx_frames"] + len(out)
            ll = ll_classify(frame)[0]
            if ll:  # D18: consumed, counted under its reason, never forwarded
                assert out == [] and moved == [LL_COUNTERS[ll]], (ll, moved)
            seen = (mark_ce(frame) or frame) if i in congested else frame
            for e in out:
                if e.frame == seen:
                    continue
                g = parse(e.frame)  # anything the engine makes itself is well-formed
                if g.opcode == Opcode.CNP:
                    continue
                if g.opcode == Opcode.WRITE_MIDDLE and not g.payload:
                    assert moved == ["behind_window"] and g.psn == parse(frame).psn
                    continue
                key = RESULT_OF.get((g.src_ip, g.dqpn, g.psn))
                assert key is not None, f"result for an unknown flow/index: {g}"
                assert g.payload == WANT[key], f"job {key[0]} index {key[1]}: result changed"
                got.setdefault(key, set()).add(g.dqpn)
    for j in JOBS:
        for k in range(K):
            assert len(got.get((j.job, k), ())) == j.world, f"job {j.job} index {k} incomplete"
        assert eng.job_state(j.job)["free"] == K
    assert ctl.slots_in_use() == 0


@settings(derandomize=True, database=None, max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ATTACK, max_size=25))
@example(REGRESSIONS[0])
@example(REGRESSIONS[1])
@example(REGRESSIONS[2])
@example(REGRESSIONS[3])
def test_fuzz_mutated_traffic_never_crashes_or_changes_results(attacks):
    run(attacks)


@settings(derandomize=True, database=None, max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ATTACK, max_size=15), st.frozensets(st.integers(0, len(SCHEDULE))))
def test_fuzz_under_congestion_never_crashes_or_changes_results(attacks, congested):
    assert mark_ce(SCHEDULE[0]) is not None  # the schedule's data frames are ECT: marked
    run(attacks, congested)


def test_regressions_list_is_replayed():
    assert len(REGRESSIONS) == 4  # each entry needs its @example above
    for r in REGRESSIONS:
        run(r)


def test_the_fuzz_oracle_catches_an_accepted_forgery():
    """The filter above is what keeps the property honest: a well-formed forgery on a registered
    forward key (what a worker could send) does change a result, and run() notices."""
    forged = (0, 0, [("field", FIELDS.index(next(x for x in FIELDS if x[1].name == "va")),
                      12345)], True)  # job A rank 0 index 0 with another RETH VA: well-formed
    f = mutate(SCHEDULE[0], forged[2], True)
    assert impersonates(f, FWD_KEYS)
    payload = bytearray(f)
    payload[80] ^= 1
    fixup(payload)
    eng, _ = engine_with(*JOBS, jobs=2, flows=8, slots=64)
    eng.receive(0, bytes(payload), 0)  # accepted as rank 0's contribution of index 0
    assert eng.counters()["contributions"] == 1
