"""netreduce vmlab guest job: one rank of the all-reduce over soft-RoCE with the verbs backend.

Run by guest/init.sh as ``python3 job.py RANK`` with the project on PYTHONPATH (copied into the
share by the host). Reads /share/config.json; writes /share/out/rank<R>.npy (the result) and
/share/out/rank<R>.json (status, timings, rxe counters, engine counters on rank 0). Never
raises: any failure is written as ``{"ok": false, "error": ...}`` for the host's report.
"""

import json
import sys
import time
import traceback
from pathlib import Path

SHARE = Path("/share")


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def stage(what: str) -> None:
    """A progress line in the init log: the host's watchdog names the last one."""
    print(f"job: {what} at {uptime():.2f} s", flush=True)


def main(rank: int) -> dict:
    import numpy as np
    from netreduce.sw_driver.verbs import FileExchange, VerbsComm, VerbsConfig, rxe_counters

    cfg = json.loads((SHARE / "config.json").read_text())
    world = cfg["workers"]
    rep = {"rank": rank, "ok": False, "t_ready": uptime()}
    stage("imports done; opening rxe0, connecting the rings, registering the jobs")
    vc = VerbsConfig(pmtu=cfg["pmtu"], msg_packets=cfg["msg_packets"], window=cfg["window"],
                     margin=cfg["margin"], timeout=cfg["qp_timeout"],
                     retry_cnt=cfg["retry_cnt"], max_bytes=4 * cfg["elems"],
                     op_timeout_s=cfg["op_timeout_s"], float32=False)
    ex = FileExchange(SHARE / "xchg", rank, world, timeout_s=cfg["op_timeout_s"])
    mgmt = {"engine_ip": cfg["mgmt_ip"], "engine_mac": bytes.fromhex(cfg["mgmt_mac"])}
    c0 = rxe_counters()
    comm = VerbsComm(rank, world, ex, vc, mgmt=mgmt)
    rep["jobs"] = comm.jobs
    rep["t_setup"] = uptime()
    stage(f"rings up (jobs {comm.jobs}); waiting for every rank")
    rng = np.random.default_rng([cfg["seed"], rank])
    x = rng.integers(-2**31, 2**31, cfg["elems"], dtype=np.int64).astype(np.int32)
    ex(None)  # start together
    stage("all-reduce started")
    t0 = time.monotonic()
    y = comm.allreduce(x)
    rep["allreduce_s"] = time.monotonic() - t0
    stage(f"all-reduce done in {rep['allreduce_s']:.2f} s; closing")
    np.save(SHARE / "out" / f"rank{rank}.npy", y)
    if rank == 0:
        rep["engine"] = comm.engine_counters()
    if cfg.get("qp_error_check"):
        rep["qp_error_check"] = qp_error_check(comm, rank, x, ex)
    comm.close(barrier=not cfg.get("qp_error_check"))
    c1 = rxe_counters()
    rep["rxe"] = {k: c1[k] - c0.get(k, 0) for k in c1}
    rep["ok"] = True
    rep["t_done"] = uptime()
    return rep


def qp_error_check(comm, rank, x, ex) -> dict:
    """A second all-reduce with rank 0's remote key corrupted: rank 1 must refuse rank 0's
    (engine-summed) WRITE with a remote access NAK, so rank 0's send fails with a VerbsError
    naming the QP and the work request; the others see no result and time out."""
    import dataclasses

    from netreduce.sw_driver.verbs import VerbsError

    ex(None)  # everyone is done with the real all-reduce
    ring = comm.rings["int"]
    if rank == 0:
        ring.remote_rkey ^= 0x5A5A
    comm.cfg = dataclasses.replace(comm.cfg, op_timeout_s=20.0)
    try:
        comm.allreduce(x)
    except VerbsError as e:
        return {"raised": True, "error": str(e)}
    return {"raised": False, "error": None}


if __name__ == "__main__":
    r = int(sys.argv[1])
    try:
        rep = main(r)
    except BaseException as e:  # reported to the host, which fails the run
        rep = {"rank": r, "ok": False, "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc()}
    out = SHARE / "out" / f"rank{r}.json"
    out.with_suffix(".tmp").write_text(json.dumps(rep, indent=1, default=str))
    out.with_suffix(".tmp").replace(out)
    print(json.dumps({k: v for k, v in rep.items() if k != "traceback"}, default=str))
    if "traceback" in rep:
        print(rep["traceback"])
