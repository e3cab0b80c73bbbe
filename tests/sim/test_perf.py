"""The analytic all-reduce model (netreduce.sim.net.perf) against the simulation at cheap points,
hierarchical NetReduce bit-exact, and bench/training.py's model shapes and DDP buckets."""

import importlib.util
from pathlib import Path

import pytest
from netreduce.sim.net import perf

MIB = 1 << 20


def _training():
    p = Path(__file__).resolve().parents[2] / "bench" / "training.py"
    spec = importlib.util.spec_from_file_location("nr_bench_training", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_model_matches_simulation_where_capacity_binds():
    a = perf.fit_alphas(100.0)
    assert a.nr > 0 and a.ring > 0
    # 8 ranks through one 100G engine port: port-bound; 8 ranks on the ring
    sim = perf.sim_netreduce(8, 256 << 10, 100, 1, 100)
    assert perf.t_netreduce(8, 256 << 10, 100, 1, 100, a=a) == pytest.approx(sim, rel=0.06)
    ring = perf.sim_ring(8, 256 << 10, 100)
    assert perf.t_ring(8, 256 << 10, 100, a=a) == pytest.approx(ring, rel=0.06)
    # the capacity argument: one 100G port is slower than the ring at N=8, 100G workers
    assert sim > ring


def test_hierarchical_netreduce_is_bit_exact_and_timed():
    r = perf.sim_hier_nr(2, 4, 64 << 10, 100, 2, 100, 400)
    assert r["ok"]
    assert r["intra_rs_ns"] == pytest.approx(3 * (16 << 10) * 8 / 400 + 3 * 1000)
    assert r["total_ns"] > r["inter_ns"] >= 2 * (64 << 10) * 8 / (2 * 100)
    with pytest.raises(ValueError, match="size 100 must split into 4"):
        perf.sim_hier_nr(2, 4, 100, 100, 2, 100, 400)


def test_training_models_and_buckets():
    t = _training()
    for name in t.MODELS:
        ls = t.layers_of(name)  # asserts the reference parameter count
        assert all(p >= 0 and f >= 0 for _, p, f in ls)
    bks = t.buckets(t.layers_of("resnet50"))
    assert bks[0][0] >= 1 * MIB and all(b >= 25 * MIB for b, _ in bks[1:-1])
    assert sum(b for b, _ in bks) == 4 * 25_557_032
    assert [f for _, f in bks] == sorted(f for _, f in bks) and bks[-1][1] == 1.0
    # overlap: a free network leaves only the compute; a slow one is exposed
    assert t.iteration_ms(bks, 100.0, lambda nb: 0.0) == (100.0, 0.0)
    it, exposed = t.iteration_ms(bks, 100.0, lambda nb: nb)  # 1 ns per byte
    assert exposed > 0 and it == pytest.approx(100.0 + exposed)


def test_training_bad_options_name_the_value(capsys):
    t = _training()
    with pytest.raises(SystemExit):
        t.main(["--links", "33"])
    assert "'33'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        t.main(["--compute-ms", "lenet=5"])
    assert "'lenet'" in capsys.readouterr().err


def test_hierarchical_driver_float_and_bad_input():
    import numpy as np
    from netreduce.sim.net.collective import CollectiveConfig, Communicator
    from netreduce.sim.net.hier import hierarchical_allreduce
    from netreduce.sim.net.simrun import SimConfig, get_backend, net_config

    cfg = SimConfig(workers=2, size=4096, pmtu=1024, ports=1, port_gbps=100, stripes=2)
    fab = get_backend("model").make(cfg, net_config(cfg), None)
    comm = Communicator(fab, 2, CollectiveConfig(pmtu=1024))
    rng = np.random.default_rng(1)
    xs = [[rng.standard_normal(1024).astype(np.float32) for _ in range(2)] for _ in range(2)]
    r = hierarchical_allreduce(comm, xs, 400.0)
    host = [d[0] + d[1] for d in xs]  # the intra-host float32 sums
    ref = host[0].astype(np.float64) + host[1]
    err = np.abs(r.results[1][0].astype(np.float64) - ref)
    assert np.all(err <= r.inter.error_bound())
    assert all(np.array_equal(y, r.results[0][0]) for d in r.results for y in d)
    with pytest.raises(ValueError, match=r"same number .* \[2, 1\]"):
        hierarchical_allreduce(comm, [xs[0], xs[1][:1]], 400.0)
    with pytest.raises(ValueError, match="intra_gbps must be > 0, got 0"):
        hierarchical_allreduce(comm, xs, 0)
