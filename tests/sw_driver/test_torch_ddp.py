"""The PyTorch binding: DDP's gradients through the NetReduce hook, and a dying rank.

Two ranks run torch_ddp_worker.py as torchrun would (env:// rendezvous over gloo, one process
each) against a switch service in this process. One launch serves every check below (importing
torch costs seconds per process), even across xdist workers. Skipped when torch (the ``[torch]``
extra) is not installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: pip install '.[torch]'")

from netreduce.sim.emu.switch import SwitchThread  # noqa: E402
from netreduce.sw_driver import quant  # noqa: E402

WORLD = 2
WORKER = Path(__file__).with_name("torch_ddp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path) -> dict:
    """Run the two ranks against a fresh switch; returns exit codes, logs and switch counters."""
    with SwitchThread() as sw:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                   WORLD_SIZE=str(WORLD), NETREDUCE_SWITCH=sw.url, OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, str(WORKER), str(out)],
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(WORLD)]
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=240)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                logs.append("a rank hung: no result within 240 s")
        return {"codes": [p.returncode for p in procs], "logs": logs,
                "counters": sw.counters()}


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """One launch per test session, shared by xdist workers (a file lock in the session's
    shared temporary folder): importing torch costs seconds per process."""
    from filelock import FileLock  # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by this session's workers
    out = base / "torch_ddp"
    with FileLock(str(base / "torch_ddp.lock")):
        done = out / "launch.json"
        if not done.exists():
            out.mkdir(exist_ok=True)
            done.write_text(json.dumps(_launch(out)))
        launch = json.loads(done.read_text())
    assert launch["codes"] == [0, 3], f"exit codes {launch['codes']}:\n" + "\n".join(
        launch["logs"])
    data = [dict(np.load(out / f"rank{r}.npz")) for r in range(WORLD)]
    return data, json.loads((out / "rank0.json").read_text()), launch["counters"]


def test_hook_gradients_match_the_float64_mean(run):
    data, _, _ = run
    local = data[0]["local"]  # [step, rank, element]: every rank's own float32 gradient
    assert np.array_equal(local, data[1]["local"])
    for step in range(local.shape[0]):
        mean = local[step].astype(np.float64).mean(axis=0)
        # the stated bound: 2^(-e-1) + 2^-23 |g|, e from the largest |gradient| of any rank
        e = quant.scales(quant.chunk_exponents(local[step].reshape(-1), local[step].size),
                         WORLD)[0]
        for r in range(WORLD):
            g = data[r]["hooked"][step].astype(np.float64)
            bound = 2.0 ** (-int(e) - 1) + 2.0 ** -23 * np.abs(g) * (1 + 2.0 ** -20)
            err = np.abs(g - mean)
            assert (err <= bound).all(), f"step {step} rank {r}: max err/bound " \
                                         f"{np.max(err / bound):.3g}"
        assert np.array_equal(data[0]["hooked"][step], data[1]["hooked"][step])
        # the ranks' gradients really differ, so averaging was needed and happened
        assert not np.allclose(local[step][0], local[step][1])


def test_ranks_stay_in_sync(run):
    data, _, _ = run
    assert np.array_equal(data[0]["params"], data[1]["params"])


def test_tensor_allreduce_api(run):
    data, _, _ = run
    want = np.arange(24, dtype=np.float32).reshape(4, 6) * sum(r + 1 for r in range(WORLD))
    for r in range(WORLD):
        assert np.array_equal(data[r]["f"], want)  # small integers: exact
        assert bool(data[r]["fv_is_view"])
        assert np.array_equal(data[r]["b"], np.full(5, 0.75, np.float32))  # (0.5 + 1) / 2
        # int32: bit-exact, wrapping like the engine's SUM_WRAP
        assert data[r]["i"].tolist() == [-2, -14, sum(range(WORLD))]


def test_gradients_went_through_the_engine(run):
    _, res, counters = run
    assert counters["engine.contributions"] > 0 and counters["engine.results_sent"] > 0
    assert counters["engine.saturations"] == 0
    assert res["qp_stats"]["messages_received"] >= 6  # 3 steps x (exponents + values)


def test_dead_rank_is_a_clear_error_not_a_hang(run):
    _, res, _ = run
    assert res["error"] is not None, "backward() succeeded without rank 1"
    assert "rank 0: all-reduce" in res["error"]
    assert "retry limit exceeded" in res["error"] and "peer rank died" in res["error"]
