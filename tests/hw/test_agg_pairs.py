"""AggControl with ``pairs`` (netreduce.hw.agg.sideack): a second ACK/NAK decided in the same
cycle, against the reference model frame by frame (the harness of test_agg_control.py).

The model decides the frames one at a time, in the order of the scenario; the gateware gets two
records in one cycle where the engine's header arbiter would pair them (both ACK/NAKs, different
ports, different keys) and decides the side one right after the main one. Compared as in
test_agg_control: every decision, the release commands, every counter, the status registers.
"""

from __future__ import annotations

import random

import pytest
from netreduce.hw.agg.control import AggControl
from netreduce.sim.model.kit import RingJob

from .test_agg_control import (
    NoAckedForwardAggControl,
    Scenario,
    check,
    payload,
    random_traffic,
)

PAIRS = {"pairs": True}


def params(ports=4):
    return dict(ports=ports, jobs=2, flows=16, slots=64, max_world=8)


def ack_burst_scenario(world=4, indices=12, seed=1) -> Scenario:
    """Each index: every rank's contribution, then every rank's ACK of it, each rank on its own
    port (rank r on port r % 4): the ACK bursts are what pairs."""
    sc = Scenario(params=params())
    rng = random.Random(seed)
    job = sc.add(RingJob(job=0, world=world, window=8, slot_base=0))
    for k in range(indices):
        for r in range(world):
            sc.frame(job.data_bytes(r, k, payload(rng)), r % 4)
        for r in range(world):
            sc.frame(job.ack(r, k), r % 4)
    return sc


def test_ack_bursts_pair_and_match_the_model():
    gw = check(ack_burst_scenario(), ctl_kw=PAIRS, pair=1.0)
    assert gw.pairs >= 20


@pytest.mark.parametrize("stall,gap", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.3), (0.3, 0.3)])
def test_ack_bursts_under_backpressure(stall, gap):
    gw = check(ack_burst_scenario(seed=2), ctl_kw=PAIRS, pair=1.0, stall=stall, gap=gap,
               seed=7)
    assert gw.pairs >= 20


def same_flow_scenario() -> Scenario:
    """ACKs of one flow in consecutive pairs (side, then main or side of the next pair, then the
    pair after): acked_f must be forwarded across the lanes, directly behind and two behind;
    duplicate and stale ACKs among them."""
    sc = Scenario(params=params())
    rng = random.Random(3)
    job = sc.add(RingJob(job=0, world=4, window=8, slot_base=0))
    for k in range(6):
        for r in range(4):
            sc.frame(job.data_bytes(r, k, payload(rng)), r)
    # rank 1's ACKs arrive on port 1, the others' on ports 0 / 2 / 3 around them
    seq = [(0, 0, 0), (1, 0, 1), (2, 0, 2), (1, 1, 1), (3, 0, 3), (1, 2, 1), (0, 1, 0),
           (1, 2, 1), (2, 1, 2), (1, 3, 1), (3, 1, 3), (1, 1, 1), (0, 2, 0), (1, 4, 1),
           (2, 2, 2), (1, 5, 1), (3, 2, 3), (1, 9, 1), (0, 3, 0), (1, 5, 1),
           # rank 3's duplicate as the main frame of the pair right behind its side one, then
           # two pairs behind
           (2, 3, 2), (3, 3, 3), (3, 3, 3), (0, 4, 0), (2, 4, 2), (3, 4, 3), (0, 5, 0),
           (2, 5, 2), (3, 4, 3), (1, 5, 1)]
    for r, k, port in seq:
        sc.frame(job.ack(r, k), port)
    return sc


def test_same_flow_across_pairs():
    gw = check(same_flow_scenario(), ctl_kw=PAIRS, pair=1.0)
    assert gw.pairs >= 6


def test_same_flow_across_pairs_needs_forwarding():
    with pytest.raises(AssertionError):
        check(same_flow_scenario(), NoAckedForwardAggControl, ctl_kw=PAIRS, pair=1.0)


def test_ack_of_index_released_by_the_frame_in_front():
    """The pair right behind the contribution that releases index k acknowledges k: its
    check needs rel_j + 1 (the main lane's release in front of the side lane)."""
    sc = Scenario(params=params())
    rng = random.Random(4)
    job = sc.add(RingJob(job=0, world=3, window=8, slot_base=0))
    for k in range(8):
        for r in range(3):
            sc.frame(job.data_bytes(r, k, payload(rng)), r)
        # ranks 0 and 1 ACK index k at once (rank 2's ACK of k - 1 first: a stale one)
        sc.frame(job.ack(2, (k - 1) & 0xFFFFFF), 2)
        sc.frame(job.ack(0, k), 0)
        sc.frame(job.ack(1, k), 1)
        sc.frame(job.ack(2, k), 2)
    gw = check(sc, ctl_kw=PAIRS, pair=1.0)
    assert gw.pairs >= 8


@pytest.mark.parametrize("seed", range(4))
def test_random_against_model_with_pairs(seed):
    rng = random.Random(500 + seed)
    sc = Scenario(params=params())
    a = sc.add(RingJob(job=0, world=5, window=8, slot_base=0, cnp_interval=300,
                       start_psns=[(0xFFFFF0 + 5 * r) & 0xFFFFFF for r in range(5)]))
    b = sc.add(RingJob(job=1, world=3, window=4, slot_base=32, cnp_interval=50))
    random_traffic(sc, [a, b], rng, 300, 4)
    gw = check(sc, ctl_kw=PAIRS, pair=0.8, gap=0.2 * (seed % 2), stall=0.2 * (seed // 2),
               seed=seed)
    assert gw.pairs >= 5


def test_pairs_with_roles_refused():
    from netreduce.regmap import build_regmap
    with pytest.raises(ValueError, match="pairs"):
        AggControl(build_regmap(**params()), pairs=True, roles=True)
