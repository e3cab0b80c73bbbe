"""Bounded CI version of the soak (issue 9): seeded scenarios through the reference model.

Each scenario (netreduce.sim.verif.soak.random_scenario) runs 2-4 concurrent jobs of different N,
PMTU and window, 1-2 all-reduces each, with one fault style (uniform, per direction/kind, ACK-only
loss, link outages, CE marking), PSN wrap in some jobs and, for odd seeds, an adversary injecting
spoofed frames. After each: results bit-exact, every slot freed, the counters balance (see
run_scenario). The long version is bench/soak.py.
"""

from __future__ import annotations

import pytest
from netreduce.sim.model import Emit, Engine
from netreduce.sim.net.model_fabric import ModelFabric
from netreduce.sim.net.network import LinkConfig, NetConfig
from netreduce.sim.verif.soak import (
    JobSpec,
    Outage,
    Scenario,
    balance,
    model_backend,
    random_scenario,
    run_scenario,
)

from netreduce.wire import parse

SEEDS = range(12)  # >= 2 of each fault style, odd seeds with the adversary


@pytest.mark.parametrize("seed", SEEDS)
def test_soak_scenario(seed):
    sc = random_scenario(seed, "ci")
    rep = run_scenario(sc)
    assert rep.violations == [], (sc.name, rep.violations)
    assert rep.ok and rep.allreduces == sum(j.rounds for j in sc.jobs)
    # the faults the scenario asks for really happened
    style = sc.name.split("-")[-1]
    links, c = rep.links, rep.counters
    if style == "burst":
        assert sum(links["outage_drops"].values()) > 0
    if style == "ack_only":
        assert links["up"].get("ack_lost", 0) + links["down"].get("ack_lost", 0) > 0
        assert links["up"].get("data_lost", 0) + links["down"].get("data_lost", 0) == 0
    if style == "ce":
        assert c["cnp_sent"] > 0
    if style in ("uniform", "per_kind"):
        assert rep.endpoint["retransmitted"] > 0 or links["up"].get("lost", 0) == 0
    if sc.adversary_every_ns:
        assert sum(rep.adversary.values()) == links["injected"] > 0
        assert c["fwd_unregistered"] > 0


def test_psn_wrap_and_many_rounds_on_one_engine():
    """Several rounds per job on one engine, every job wrapping its PSNs, faults everywhere."""
    jobs = (JobSpec(world=3, elems=3000, pmtu=256, window=32, msg_packets=4, rounds=3, wrap=True),
            JobSpec(world=5, elems=1500, pmtu=512, window=64, msg_packets=8, rounds=2, wrap=True))
    sc = Scenario("wrap", 7, NetConfig.faulty(loss=0.03, dup=0.03, reorder=0.03), jobs,
                  (Outage(1, "down", 5_000, 80_000),))
    rep = run_scenario(sc)
    assert rep.violations == [] and rep.allreduces == 5
    assert rep.counters["freed"] == rep.counters["released"] > 0


class _CorruptingEngine(Engine):
    """Flips one bit of the 7th result frame's payload (ICRC recomputed: a wrong aggregate)."""

    n = 0

    def receive(self, port, frame, time):
        out = super().receive(port, frame, time)
        res = []
        for e in out:
            try:
                f = parse(e.frame)
            except Exception:
                res.append(e)
                continue
            if f.payload and e.frame != frame:
                self.n += 1
                if self.n == 7:
                    p = bytearray(f.payload)
                    p[0] ^= 1
                    e = Emit(e.port, f.copy(payload=bytes(p)).pack(), e.time)
            res.append(e)
        return res


def test_the_checker_catches_a_wrong_result():
    sc = Scenario("broken", 1, NetConfig(LinkConfig()),
                  (JobSpec(world=2, elems=2000, pmtu=256, window=32, msg_packets=2),))
    assert run_scenario(sc).violations == []

    def backend(sc, net):
        return ModelFabric(_CorruptingEngine(**sc.engine), net=net, seed=sc.seed)

    rep = run_scenario(sc, backend)
    assert not rep.ok and any("differs from numpy" in v for v in rep.violations), rep.violations


def test_balance_names_each_broken_identity():
    rep = run_scenario(Scenario("b", 2, NetConfig(LinkConfig()),
                                (JobSpec(world=2, elems=500, pmtu=256, window=32),)))
    c = dict(rep.counters)
    assert balance(c) == []
    for key, what in (("drop_icrc", "rx_frames"), ("cnp_sent", "tx_frames"),
                      ("results_sent", "contributions"), ("freed", "released")):
        bad = dict(c)
        bad[key] += 1
        assert any(m.startswith(what) for m in balance(bad)), key


def test_model_backend_and_profiles_are_deterministic():
    a, b = random_scenario(7, "ci"), random_scenario(7, "ci")  # a small one, with the adversary
    assert a == b and a != random_scenario(7, "soak") and a.adversary_every_ns
    with pytest.raises(ValueError, match="profile"):
        random_scenario(0, "forever")
    ra, rb = run_scenario(a), run_scenario(b)
    assert ra.counters == rb.counters and ra.sim_time_ns == rb.sim_time_ns
    assert callable(model_backend)
