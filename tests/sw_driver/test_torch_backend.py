"""NetReduce as a torch.distributed backend: ``init_process_group("netreduce")``.

CPU ranks run under ``torch.multiprocessing`` (spawn) against a switch service in this process:
3 ranks on the reference model (every dtype and op, contiguity, async Work, gloo delegation, DDP
without a hook, the error cases), 4 ranks as 2 emulated hosts of 2 (the hierarchical path, and
the ``"cpu:netreduce"`` form), and 2 ranks briefly on the engine RTL (Verilator). One launch per
scenario serves its tests (tests/sw_driver/torch_backend_worker.py runs the ranks). Skipped
without torch.
"""

from __future__ import annotations

import functools
import pickle
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: pip install '.[torch]'")

from netreduce.sim.emu.switch import SwitchThread  # noqa: E402
from netreduce.sw_driver import quant  # noqa: E402
from netreduce.sw_driver.control import EngineControl  # noqa: E402

HERE = Path(__file__).parent
pytestmark = pytest.mark.xdist_group("torch_backend")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # spawn children get the parent's sys.path
    import torch_backend_worker

    return torch_backend_worker


def _launch(out: Path, scenario: str, world: int, engine=None, limit_s: float = 240,
            **cfg) -> tuple[list[dict], list[int | None], dict]:
    """Run ``world`` ranks of ``scenario``; (each rank's results, exit codes, switch counters)."""
    w = _worker()
    out.mkdir(parents=True, exist_ok=True)
    with SwitchThread(engine) as sw:
        cfg = dict(scenario=scenario, switch=sw.url, store_port=_free_port(),
                   closed_port=_free_port(), out=str(out), **cfg)
        cfg.setdefault("backend", "netreduce")
        ctx = torch.multiprocessing.start_processes(w.main, args=(world, cfg), nprocs=world,
                                                    join=False, start_method="spawn")
        end = time.monotonic() + limit_s
        for p in ctx.processes:
            p.join(max(0.1, end - time.monotonic()))
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
        counters = sw.counters()
        counters["jobs_left"] = sw.call(lambda: EngineControl(sw.service.engine.bus)
                                        .enabled_jobs())
    res = []
    for r in range(world):
        f = out / f"rank{r}.pkl"
        res.append(pickle.loads(f.read_bytes()) if f.exists() else {"crash": "no result"})
    for r, x in enumerate(res):
        assert "crash" not in x, f"rank {r}:\n{x['crash']}"
    return res, [p.exitcode for p in ctx.processes], counters


# ============================================================================ flat, 3 ranks
W3 = 3


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("flat"), "flat", W3)


def _all(key):
    w = _worker()
    return [w.inputs(r)[key] for r in range(W3)]


def _float_bound(xs: list[np.ndarray], y: np.ndarray, world: int) -> np.ndarray:
    """quant.error_bound of the flat path: segments of SEG bytes, one exponent per chunk."""
    seg, chunk = _worker().SEG // 4, _worker().CHUNK
    out = []
    for s in range(0, y.size, seg):
        e = np.max([quant.chunk_exponents(x[s:s + seg], chunk) for x in xs], axis=0)
        out.append(quant.error_bound(y[s:s + seg], quant.scales(e, world), chunk, world))
    return np.concatenate(out)


def test_float32_sum_within_the_quantised_bound_across_segments(flat):
    res, codes, counters = flat
    xs = _all("big")
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    y = res[0]["big"]
    bound = _float_bound(xs, y, W3)
    err = np.abs(y - exact)
    assert (err <= bound).all(), f"max err/bound {np.max(err / bound):.3g}"
    assert err.max() > 0  # really quantised (and so really through the engine)
    for r in range(1, W3):
        assert np.array_equal(res[r]["big"], y)
    assert counters["engine.saturations"] == 0 and counters["engine.results_sent"] > 0


def test_half_precision_sum_and_avg_within_the_bound_plus_one_rounding(flat):
    res, _, _ = flat
    for key, name, dt, ulp in (("bf16", "bf16_sum", torch.bfloat16, 2.0**-8),
                               ("f16", "f16_avg", torch.float16, 2.0**-10)):
        xs = [torch.from_numpy(x).to(dt).float().numpy() for x in _all(key)]
        exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
        if name.endswith("avg"):
            exact /= W3
        y = res[0][name].astype(np.float64)
        # quantised float32 sum (<= 2^-29 max|x| here) + the final rounding to 16 bits
        tol = 2.0**-26 * np.max(np.abs(xs)) * W3 + ulp * np.abs(exact)
        assert (np.abs(y - exact) <= tol).all(), name
        for r in range(1, W3):
            assert np.array_equal(res[r][name], res[0][name])


def test_integer_sums_are_exact_and_wrap_like_torch(flat):
    res, _, _ = flat
    i64 = np.sum(_all("i64"), axis=0)  # numpy int64 wraps as torch does
    n = W3
    for r in range(W3):
        x = res[r]
        assert x["i32"].tolist() == torch.tensor(
            [(2**31 - 1) * n, -(2**31) * n, 7 * sum(range(n)), -3 * n],
            dtype=torch.int64).to(torch.int32).tolist()
        assert np.array_equal(x["i64"], i64)
        want = torch.tensor([2**63 - 1, -(2**63), 0], dtype=torch.int64)
        want = want * n + torch.tensor([0, 0, sum(range(n))])
        assert x["i64w"].tolist() == want.tolist()
        assert x["i8"].tolist() == torch.tensor([100 * n, -100 * n, sum(range(n))]).to(
            torch.int8).tolist()
        s = 7 * sum(range(1, n + 1))
        assert x["avg_i"].tolist() == [s // n, -(s // n), 1]  # truncation towards zero


def test_max_min_are_exact_with_nan_inf_and_64_bit_values(flat):
    res, _, _ = flat
    mx = [torch.from_numpy(x.copy()) for x in _all("mx")]
    for r, t in enumerate(mx):
        if r == 1:
            t[7], t[8] = float("nan"), float("inf")
        t[9] = -0.0 if r else -1e-30
    want_max = functools.reduce(torch.maximum, mx).numpy()
    want_min = functools.reduce(torch.minimum, mx).numpy()
    m64 = [torch.from_numpy(x) for x in _all("mx64")]
    for r in range(W3):
        x = res[r]
        np.testing.assert_array_equal(x["max"], want_max)  # NaN == NaN here
        np.testing.assert_array_equal(x["min"], want_min)
        assert np.isnan(x["max"][7]) and np.isnan(x["min"][7])
        assert x["max"][8] == np.inf
        assert np.array_equal(x["max64"], functools.reduce(torch.maximum, m64).numpy())
        assert np.array_equal(x["min64"], functools.reduce(torch.minimum, m64).numpy())
        assert x["imax64"].tolist() == [2**63 - 1, -(2**63) + W3 - 1, ((W3 - 1) << 32) - 1]
        assert x["imin64"].tolist() == [2**63 - W3, -(2**63), -1]
        assert x["bf16_max"].tolist() == [0.5, -2.0, float(W3 - 1)]


def test_views_are_reduced_in_place(flat):
    res, _, _ = flat
    n = sum(range(1, W3 + 1))
    for r in range(W3):
        assert np.array_equal(res[r]["view_base"], np.arange(24, dtype=np.float32)
                              .reshape(4, 6) * n)
        want = np.arange(10, dtype=np.int32) * (r + 1)
        want[::3] = np.arange(10, dtype=np.int32)[::3] * n
        assert np.array_equal(res[r]["strided"], want)
        assert res[r]["empty"] is None  # an empty tensor is a no-op, not an error


def test_async_work_completes_in_order_and_futures_hold_the_tensor(flat):
    res, _, _ = flat
    want = [float(sum(k + r for r in range(W3))) for k in range(4)]
    for r in range(W3):
        assert res[r]["async"] == want
        assert res[r]["future"] == want[0]
        assert res[r]["backend_name"] == "netreduce"


def test_other_collectives_go_to_gloo(flat):
    res, _, _ = flat
    for r in range(W3):
        x = res[r]
        assert x["bcast"] == W3 - 1
        assert x["ag"].tolist() == [10.0 * k for k in range(W3)]
        assert x["rs"] == float(sum(r + k for k in range(W3)))
        assert x["a2a"].tolist() == [100.0 * k + r for k in range(W3)]
        assert x["obj"] == {"k": 1}
    assert res[0]["reduce"] == float(np.prod(range(1, W3 + 1)))  # PRODUCT: gloo's reduce


def _engine_sum(xs: list[np.ndarray]) -> np.ndarray:
    """What the flat float path computes (one segment): shared exponents, exact integer sum."""
    chunk = _worker().CHUNK
    e = quant.scales(np.max([quant.chunk_exponents(x, chunk) for x in xs], axis=0), len(xs))
    q = np.sum([quant.quantize(x, e, chunk).astype(np.int64) for x in xs], axis=0)
    return quant.dequantize(q.astype(np.int32), e, chunk)


def test_ddp_without_a_hook_averages_through_the_engine(flat):
    res, _, _ = flat
    local = res[0]["ddp_local"]  # [step, rank, element]
    for step in range(local.shape[0]):
        g = local[step]
        mean = g.astype(np.float64).mean(axis=0)
        # DDP scales each bucket by float32(1/N), then SUMs it: bit for bit the engine's sum
        pre = [x * np.float32(1 / W3) for x in g]
        for r in range(W3):
            y = res[r]["ddp_avg"][step]
            assert np.array_equal(y, _engine_sum(pre)), f"step {step} rank {r}"
        # and within quant's bound (plus the scaling's roundings) of the float64 mean
        e = quant.scales(np.max([quant.chunk_exponents(x, x.size) for x in pre], axis=0), W3)
        y = y.astype(np.float64)
        bound = (W3 * 2.0 ** (-int(e[0]) - 1) + 2.0**-24 * np.abs(y) * (1 + 2.0**-20)
                 + 2.0**-23 * np.abs(g.astype(np.float64)).sum(axis=0) / W3)
        assert (np.abs(y - mean) <= bound).all()
        assert not np.allclose(g[0], g[1])  # the ranks' gradients differ
    for r in range(1, W3):
        assert np.array_equal(res[r]["ddp_params"], res[0]["ddp_params"])
    assert res[0]["qp"]["messages_received"] > 0


def test_unsupported_ops_and_inexact_dtypes_name_rank_op_and_qp(flat):
    res, _, _ = flat
    for r in range(W3):
        x = res[r]
        for key, needle in (("err_product", "op PRODUCT is not supported"),
                            ("err_bxor", "op BXOR is not supported"),
                            ("err_f64", "torch.float64 cannot be summed exactly")):
            msg = x[key]
            assert msg is not None and msg.startswith(f"rank {r}: all_reduce("), key
            assert needle in msg and "QP 0x" in msg, msg


def test_no_switch_is_a_clear_error_within_the_connect_timeout(flat):
    res, _, _ = flat
    for r in range(W3):
        msg = res[r]["err_no_switch"]
        assert msg is not None and f"rank {r}: init_process_group" in msg, msg
        assert "no QP created" in msg and "switch is not there" in msg or \
            "failed: rank" in msg, msg
        assert res[r]["no_switch_s"] < 15


def test_dead_rank_is_a_clear_error_not_a_hang(flat):
    res, codes, _ = flat
    assert codes[-1] == 3 and codes[:-1] == [0] * (W3 - 1)
    for r in range(W3 - 1):
        msg = res[r]["err_dead"]
        assert msg is not None and msg.startswith(f"rank {r}: all_reduce(SUM"), msg
        assert "QP 0x" in msg and "retry limit exceeded" in msg, msg
        assert res[r]["dead_s"] < 30
        assert res[r]["err_after"] is not None  # the communicator stays failed


# ============================================================================ hierarchy
W4 = 4


@pytest.fixture(scope="module")
def hier(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("hier"), "hierarchical", W4,
                   backend="cpu:netreduce", env={"NETREDUCE_LOCAL_SIZE": "2"})


def test_hierarchy_groups_hosts_and_uses_one_job_set_per_shard(hier):
    res, codes, counters = hier
    assert codes == [0] * W4
    assert res[0]["hosts"] == [[0, 1], [2, 3]]
    assert all(x["local_size"] == 2 and x["comm_world"] == 2 for x in res)
    assert res[0]["jobs"] == res[2]["jobs"] and res[1]["jobs"] == res[3]["jobs"]
    assert not set(res[0]["jobs"]) & set(res[1]["jobs"])  # two shards, two job sets
    assert counters["engine.results_sent"] > 0
    assert list(counters["jobs_left"]) == []  # destroy_process_group removed both job sets


def test_hierarchy_results(hier):
    res, _, _ = hier
    w = _worker()
    ins = [w.inputs(r) for r in range(W4)]
    exact = np.sum([x["bf16"].astype(np.float64) for x in ins], axis=0)
    i64 = np.sum([x["i64"] for x in ins], axis=0)
    mx = np.max([x["mx"] for x in ins], axis=0)
    absum = np.sum([np.abs(x["bf16"].astype(np.float64)) for x in ins], axis=0)
    scale = np.max(absum)
    for x in res:
        # gloo's float32 local sums (2 ranks: one rounding each), the engine's quantised sum of
        # the 2 hosts' shards (step 2^-29 of their maximum at most), the final rounding
        tol = 2.0**-24 * absum + 2.0**-28 * scale + 2.0**-24 * np.abs(exact)
        assert (np.abs(x["sum"] - exact) <= tol).all()
        assert np.array_equal(x["sum"], res[0]["sum"])
        assert np.array_equal(x["i64"], i64)
        assert np.array_equal(x["max"], mx)
        assert x["avg"].tolist() == [2.5] * 7
        assert x["backend_name"] == "cpu:netreduce"  # as given to init_process_group


# ============================================================================ RTL, briefly
@functools.cache
def _rtl_unavailable() -> str | None:
    from netreduce.sim.net.simrun import BackendUnavailable
    from netreduce.sim.rtl.fabric import probe_rtl

    try:
        probe_rtl("verilator")
    except BackendUnavailable as e:
        return str(e)
    return None


@pytest.mark.xdist_group("fastsim_engine")
def test_rtl_switch_backend(tmp_path):
    if _rtl_unavailable():
        pytest.skip(_rtl_unavailable())
    from netreduce.sim.net.simrun import SimConfig
    from netreduce.sim.rtl.fabric import rtl_params
    from netreduce.sim.rtl.switch_engine import RtlSwitchEngine

    # the small build of tests/sim/test_switch_rtl.py (2 jobs: no integer job)
    small = {**rtl_params(SimConfig(workers=4)), "data_width": 64, "pmtu_max": 1024}
    res, codes, counters = _launch(tmp_path, "rtl", 2, RtlSwitchEngine(**small), ints=False,
                                   rc_timeout=18, op_timeout_s=120, limit_s=300)
    assert codes == [0, 0]
    want = np.arange(300, dtype=np.float32) * 3 - 201.0
    for r, x in enumerate(res):
        assert np.array_equal(x["sum"], want)  # multiples of 0.5: exact through the engine
        assert x["max"].tolist() == [1.5, -3.0, 1.0, 0.0]
        assert x["err_int"] is not None and "NETREDUCE_INT=0" in x["err_int"]
        assert x["err_int"].startswith(f"rank {r}: all_reduce(SUM")
    assert counters["engine.results_sent"] > 0
