"""Reset domains (issue 22): engine port 0 flaps in the middle of an all-reduce; the engine keeps
its jobs, flows and slots (its core is not reset with a MAC), and the job completes bit-exact by
RC retransmission."""

from __future__ import annotations

import numpy as np
from netreduce.sim.model import Engine
from netreduce.sim.net.collective import CollectiveConfig, allreduce
from netreduce.sim.net.linkflap import PortFlap
from netreduce.sim.net.model_fabric import ModelFabric


def test_port0_flap_mid_allreduce_completes_by_retransmission():
    eng = Engine(ports=2)
    fab = ModelFabric(eng, seed=11, port_of=lambda mac: mac[-1] % 2)
    flap = PortFlap(fab, 0, 5_000, 15_000)      # down from 5 us to 15 us (lossless: 24 us)
    rng = np.random.default_rng(11)
    xs = [rng.integers(-2**31, 2**31, 60_000, dtype=np.int64).astype(np.int32)
          for _ in range(4)]
    res = allreduce(fab, xs, CollectiveConfig(pmtu=1024, timeout=6))
    ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    for r, y in enumerate(res.results):
        assert np.array_equal(y, ref), f"rank {r}"
    assert flap.stats["rx_lost"] > 100                               # the flap hit the job
    st = res.stats
    assert st["retransmitted"] > 0 and st["timeouts"] > 0            # recovered by RC
    assert st["slots_left"] == 0
    assert st["engine"]["freed"] == st["engine"]["released"]
