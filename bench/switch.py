"""Throughput of the switch service (``netreduce switch``), and DDP step time.

Runs the service as its own process (as in use), with the reference engine (``--backend model``)
or the engine RTL under Verilator (``--backend verilator``: the 64-bit build of the RTL tests by
default, ``--data-width`` to change it), and measures, over loopback TCP:

* ``bypass``: frames/s through the switch and engine for non-RoCE traffic (the engine forwards it
  unchanged): one client streams 1024-byte frames to another, in batches;
* ``allreduce``: an int32 all-reduce of ``--mib`` MiB per rank by ``--workers`` software RC
  endpoints on one tunnel (every data frame is aggregated by the engine): frames/s through the
  switch and all-reduce goodput;
* ``ddp`` (when torch is installed, unless ``--no-ddp``): examples/train_ddp.py under torchrun,
  ``--ddp-ranks`` CPU ranks, once with the NetReduce hook and once with gloo's all-reduce: the
  mean time per training step and whether the loss curves agree (reported, not asserted).

Writes bench/results/switch.json: the model's figures at the top level, the RTL's under
``"verilator"`` (each run replaces only its own part). The machine matters: on a 2-core VM every
cross-process loopback send costs a wake-up (about 0.5 ms here), which dominates small exchanges;
with the RTL, the Verilator model's cycles dominate (``rtl`` in the figures: cycles and seconds
spent in the model).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


SWITCH_ARGS: list[str] = []  # engine options (--backend ...), set by main()


def rtl_args(data_width: int) -> list[str]:
    """``netreduce switch`` options of the RTL build: the parameters of the RTL tests
    (tests/sim/test_rtl_backend.py), at ``data_width`` bits."""
    from netreduce.sim.net.simrun import SimConfig
    from netreduce.sim.rtl.fabric import rtl_params

    p = {**rtl_params(SimConfig(workers=4)), "data_width": data_width, "pmtu_max": 1024}
    return ["--backend", "verilator", "--ports", str(p["ports"]), "--jobs", str(p["jobs"]),
            "--flows", str(p["flows"]), "--slots", str(p["slots"]), "--max-world",
            str(p["max_world"]), "--pmtu-max", str(p["pmtu_max"]), "--data-width",
            str(p["data_width"])]


def start_switch(extra=()) -> tuple[subprocess.Popen, int, Path]:
    d = Path(tempfile.mkdtemp(prefix="nr-switch-"))
    pf = d / "port"
    p = subprocess.Popen([sys.executable, "-m", "netreduce", "switch", "--listen", "127.0.0.1:0",
                          "--port-file", str(pf), "--stats-json", str(d / "stats.json"), "-q",
                          *SWITCH_ARGS, *extra], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    end = time.monotonic() + (3600 if SWITCH_ARGS else 60)  # the RTL may be built first
    while not (pf.exists() and pf.read_text().strip()):
        if p.poll() is not None or time.monotonic() > end:
            raise SystemExit("the switch service did not start")
        time.sleep(0.05)
    return p, int(pf.read_text()), d


def stop_switch(p: subprocess.Popen, d: Path) -> dict:
    p.terminate()
    p.wait(30)
    stats = json.loads((d / "stats.json").read_text())
    shutil.rmtree(d, ignore_errors=True)
    return stats


def bench_bypass(frames: int, batch: int = 256) -> dict:
    from netreduce.sim.emu.tunnel import FrameReader, frame_bytes

    p, port, d = start_switch()
    a = socket.create_connection(("127.0.0.1", port))
    b = socket.create_connection(("127.0.0.1", port))
    mac_a, mac_b = bytes.fromhex("02000000000a"), bytes.fromhex("02000000000b")
    b.sendall(frame_bytes(mac_a + mac_b + b"\x88\xb6" + bytes(46)))  # teach the switch mac_b
    rd_a = FrameReader()
    while not rd_a.feed(a.recv(65536)):
        pass
    f = frame_bytes(mac_b + mac_a + b"\x88\xb6" + bytes(1024 - 14))
    chunk = f * batch
    rd = FrameReader()
    got = 0
    t0 = time.perf_counter()
    sent = 0
    b.setblocking(False)
    while got < frames:
        if sent < frames and sent - got < 4 * batch:  # keep a few batches in flight
            a.sendall(chunk)
            sent += batch
        try:
            got += len(rd.feed(b.recv(1 << 20)))
        except BlockingIOError:
            time.sleep(0.0002)
    wall = time.perf_counter() - t0
    a.close()
    b.close()
    stats = stop_switch(p, d)
    return {"frames": got, "frame_bytes": 1024, "wall_s": round(wall, 3),
            "frames_per_s": round(got / wall), "mbit_per_s": round(got * 1024 * 8 / wall / 1e6),
            "switch_frames_in": stats["frames_in"], **_rtl_figures(stats)}


def _rtl_figures(stats: dict) -> dict:
    if "rtl.runs" not in stats:
        return {}
    return {"rtl": {k.removeprefix("rtl."): v for k, v in stats.items()
                    if k.startswith("rtl.") and v}}


def bench_allreduce(workers: int, mib: float) -> dict:
    from netreduce.sim.emu.tunnel import Tunnel
    from netreduce.sim.net.collective import CollectiveConfig, Communicator

    p, port, d = start_switch()
    n = int(mib * 1024 * 1024) // 4
    rng = np.random.default_rng(0)
    xs = [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(workers)]
    with Tunnel(("127.0.0.1", port)) as t:
        # the RTL handles a few hundred frames per second: a window of every rank takes seconds
        comm = Communicator(t, workers, CollectiveConfig(timeout=20 if SWITCH_ARGS else 17))
        t0 = time.perf_counter()
        res = comm.allreduce(xs)
        wall = time.perf_counter() - t0
    stats = stop_switch(p, d)
    ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    ok = all(np.array_equal(y, ref) for y in res.results)
    frames = stats["engine.rx_data"] + stats["engine.fwd_ack"] + stats["engine.results_sent"]
    return {"workers": workers, "bytes_per_rank": n * 4, "wall_s": round(wall, 3),
            "data_frames": stats["engine.rx_data"], "switch_frames_in": stats["frames_in"],
            "switch_frames_out": stats["frames_out"],
            "frames_per_s": round(frames / wall),
            "goodput_mbit_per_s": round(n * 4 * 8 / wall / 1e6, 1),
            "retransmitted": res.stats["retransmitted"], "exact": ok,
            "note": "wall includes job registration over the management protocol",
            **_rtl_figures(stats)}


def bench_ddp(ranks: int, epochs: int) -> dict:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    out = {}
    p, port, d = start_switch()
    try:
        for backend in ("netreduce", "gloo"):
            js = d / f"{backend}.json"
            cmd = [torchrun, "--nproc-per-node", str(ranks), str(ROOT / "examples/train_ddp.py"),
                   "--backend", backend, "--switch", f"127.0.0.1:{port}", "--epochs",
                   str(epochs), "--json", str(js)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            if r.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
            out[backend] = json.loads(js.read_text())
    finally:
        stop_switch(p, d)
    nr, gl = out["netreduce"]["curve"], out["gloo"]["curve"]
    # the first epoch includes warm-up (DDP bucket rebuild, first registrations): skip it
    step = {k: round(float(np.mean([c["step_ms"] for c in v["curve"][1:] or v["curve"]])), 2)
            for k, v in out.items()}
    return {"ranks": ranks, "epochs": epochs, "step_ms": step,
            "max_loss_diff": max(abs(a["loss"] - b["loss"]) for a, b in zip(nr, gl,
                                                                             strict=True)),
            "final_test_acc": {"netreduce": nr[-1]["test_acc"], "gloo": gl[-1]["test_acc"]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=None, help="default 20000 (RTL: 4000)")
    ap.add_argument("--workers", type=int, default=None, help="default 4 (RTL: 2)")
    ap.add_argument("--mib", type=float, default=None, help="default 2.0 (RTL: 0.25)")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--ddp-ranks", type=int, default=4)
    ap.add_argument("--ddp-epochs", type=int, default=3)
    ap.add_argument("--backend", choices=["model", "verilator"], default="model")
    ap.add_argument("--data-width", type=int, choices=[64, 128, 256, 512], default=64,
                    help="RTL datapath width (verilator; 64 is the build the tests use)")
    a = ap.parse_args()
    rtl = a.backend == "verilator"  # a few hundred frames/s: smaller runs
    a.frames = a.frames or (4000 if rtl else 20000)
    a.workers = a.workers or (2 if rtl else 4)
    a.mib = a.mib or (0.25 if rtl else 2.0)
    out = {"bench": "switch", "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "backend": a.backend, "cpus": os.cpu_count(),
           "load_1min": round(os.getloadavg()[0], 1)}  # the RTL's speed scales with it
    if a.backend == "verilator":
        SWITCH_ARGS[:] = rtl_args(a.data_width)
        out["switch_args"] = " ".join(SWITCH_ARGS)
    out["bypass"] = bench_bypass(a.frames)
    print("bypass", out["bypass"], flush=True)
    out["allreduce"] = bench_allreduce(a.workers, a.mib)
    print("allreduce", out["allreduce"], flush=True)
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    if a.no_ddp or not have_torch:
        out["ddp"] = "skipped (" + ("--no-ddp" if a.no_ddp else "torch not installed") + ")"
    else:
        out["ddp"] = bench_ddp(a.ddp_ranks, a.ddp_epochs)
        print("ddp", out["ddp"], flush=True)
    p = Path(__file__).parent / "results" / "switch.json"
    p.parent.mkdir(exist_ok=True)
    try:
        old = json.loads(p.read_text())
    except (OSError, ValueError):
        old = {}
    if a.backend == "verilator":  # keep the model's figures at the top level
        new = {k: v for k, v in old.items() if k != "verilator"} or {"bench": "switch"}
        new["verilator"] = out
    else:
        new = {**out, **({"verilator": old["verilator"]} if "verilator" in old else {})}
    p.write_text(json.dumps(new, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    if not out["allreduce"]["exact"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
