"""Simulation speed (simulated cycles per wall second) per ``netreduce sim`` backend.

For each backend the all-reduce of ``--workers`` ranks x ``--size`` bytes runs end to end (RC
endpoint models, network model, engine) and we report:

* ``end_to_end_cycles_per_s``: simulated cycles / wall time of the whole run (everything: RTL,
  Python endpoint models and network);
* ``rtl_cycles_per_s`` (RTL backends): simulated cycles / wall time spent inside the simulator
  (the harness calls: stepping the RTL, queuing and collecting frames, AXI4-Lite), i.e. the speed
  of the fast harness itself with this traffic;
* the same per CPU second (``*_per_cpu_s``: process / thread CPU time), which a shared machine
  disturbs much less than wall time; the load average at start and end is recorded;
* the harness ceiling: the pass-through stand-in (2 x 512-bit ports back to back), where nearly
  all time is the harness's own work; with ``--harness`` also the engine with no job registered,
  every port fed back to back (every frame is forwarded), no network model.

``--fabric`` picks how the RTL fabric runs the engine (``threaded``: windows bounded by the down
links' latency, each run in the harness's own thread while Python models the network; the
default; ``windowed``: the same windows in line; ``per-event``: stopping at every network event
and output frame, as before windows). All three give the same outputs.

Writes bench/results/sim_speed.json with the command line. Builds are cached (build/fastsim/);
the first run of a parameter set builds the engine (minutes).

    .venv/bin/python bench/sim_speed.py                          # the issue's target run
    .venv/bin/python bench/sim_speed.py --workers 8 --size 1MiB --ports 4 --data-width 64

The default engine has one 512-bit port (every rank reaches it through that port, as behind a
switch; the aggregation pipeline takes one beat per cycle whatever the port count), which is the
build ``netreduce demo`` makes: 8 ports of 512 bits are ~4x the C++ (58 MB) and hours of
compiling on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from netreduce.sim.net import simrun
from netreduce.sim.net.simrun import SimConfig, get_backend, register_backend, run_sim
from netreduce.sim.rtl import fabric as rtl_fabric

OUT = Path(__file__).parent / "results" / "sim_speed.json"


def _size(s: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1000, "m": 10**6}
    low = s.lower()
    for u, m in units.items():
        if low.endswith(u):
            return int(float(low[: -len(u)]) * m)
    return int(s)


FABRIC_MODES = {"threaded": {"threaded": True}, "windowed": {"windowed": True, "threaded": False},
                "per-event": {"windowed": False, "threaded": False}}


def run_backend(name: str, cfg: SimConfig, overrides: dict, mode: str = "threaded",
                fast_edge: bool = True) -> dict:
    """One end-to-end run on backend ``name``; the fabric is kept to read the harness time.
    ``mode`` (RTL backends): how the fabric runs the RTL (:data:`FABRIC_MODES`; Icarus has no
    thread mode and runs windowed)."""
    base = get_backend(name)
    base.probe()
    kept = {}
    if name in ("verilator", "icarus"):
        params = dict(overrides)
        top_path = params.pop("top", None)
        top = None
        if top_path is not None:
            from netreduce.sim.rtl.fastsim import load_top
            top = load_top(top_path)
        opts = dict(FABRIC_MODES[mode])
        if name != "verilator":
            opts["threaded"] = False
        _, base_make, _ = rtl_fabric.make_rtl_backend(name, top=top, fabric_options=opts,
                                                      **params)
    else:
        base_make = base.make

    def make(c, net, cap):
        fab = base_make(c, net, cap)
        if not fast_edge and hasattr(fab.sim, "set_fast_edge"):
            fab.sim.set_fast_edge(False)
        kept["fab"] = fab
        return fab

    tag = f"{name}-bench"
    register_backend(tag, base.description, make)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        r = run_sim(SimConfig(**{**cfg.__dict__, "backend": tag}))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        simrun.BACKENDS.pop(tag, None)
    out = {"backend": name, "ok": r.ok, "error": r.error, "cycles": r.cycles,
           "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "run_wall_s": round(r.wall_s, 3),
           "end_to_end_cycles_per_s": round(r.cycles / r.wall_s) if r.wall_s else None,
           "end_to_end_cycles_per_cpu_s": round(r.cycles / cpu) if cpu else None,
           "frames": len(r.capture.ins) + len(r.capture.outs)}
    fab = kept.get("fab")
    sim = getattr(fab, "sim", None)
    if sim is not None:
        st = sim.stats()
        rcpu = st.get("run_cpu_seconds")
        out.update(rtl_seconds=round(st["run_seconds"], 3), rtl_cycles=st["cycles"],
                   rtl_cycles_per_s=round(st["cycles"] / st["run_seconds"])
                   if st["run_seconds"] else None,
                   rtl_cpu_seconds=None if rcpu is None else round(rcpu, 3),
                   rtl_cycles_per_cpu_s=round(st["cycles"] / rcpu) if rcpu else None,
                   beats_in=st["beats_in"], beats_out=st["beats_out"],
                   pumps=fab.stats["pumps"], late_outputs=fab.stats["late_outputs"],
                   fabric=mode if name == "verilator" or mode != "threaded" else "windowed",
                   fast_edge=getattr(sim, "fast_edge", None),
                   window_cycles=fab.window_cycles,
                   rtl_params=fab.rtl_params)
        fab.close()
    return out


def harness_loop(sim_name: str, params: dict, frames_per_port: int, size: int) -> dict:
    """The engine with nothing registered, every port fed back to back: pure harness speed."""
    top = rtl_fabric.engine_top(params)
    if sim_name == "verilator":
        from netreduce.sim.rtl.fastsim import FastSim
        sim = FastSim(top)
    else:
        from netreduce.sim.rtl.icarus import IcarusSim
        sim = IcarusSim(top)
    frame = bytes.fromhex("02000000000102000000000208004500") + bytes(size - 16)
    t0 = time.perf_counter()
    for p in range(params["ports"]):
        for _ in range(frames_per_port):
            sim.send(p, frame)
    got = 0
    while got < frames_per_port * params["ports"]:
        got += len(sim.run(10_000))
        if sim.cycle > 100 * frames_per_port * (size // 8 + 10):
            break
    wall = time.perf_counter() - t0
    st = sim.stats()
    sim.close() if hasattr(sim, "close") else None
    return {"backend": sim_name, "what": "engine, no job, all ports back to back",
            "ports": params["ports"], "frames_out": got, "cycles": st["cycles"],
            "wall_s": round(wall, 3), "cycles_per_s": round(st["cycles"] / wall),
            "beats_per_s": round((st["beats_in"] + st["beats_out"]) / wall)}


def standin_loop(ports: int = 2, width: int = 512, cycles: int = 170_000) -> dict:
    """The harness ceiling: the pass-through stand-in (FIFOs + register bank) with every port
    fed back to back, so nearly all time is the harness's own per-cycle work."""
    from netreduce.sim.rtl.fastsim import FastSim
    from netreduce.sim.rtl.standin import standin_regmap, standin_top

    sim = FastSim(standin_top(standin_regmap(ports, width)))
    frame = bytes(1082)  # a PMTU-1024 RoCE frame
    for p in range(ports):
        for _ in range(cycles // 17 + 1):
            sim.send(p, frame)
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    while sim.cycle < cycles:
        n += len(sim.run(10_000))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = sim.stats()
    sim.close()
    return {"backend": "verilator", "what": f"stand-in, {ports} x {width}-bit ports back to back",
            "cycles": st["cycles"], "frames_out": n, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "cycles_per_cpu_s": round(st["cycles"] / cpu),
            "cycles_per_s": round(st["cycles"] / wall),
            "beats_per_s": round((st["beats_in"] + st["beats_out"]) / wall)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--size", type=_size, default=16 << 20)
    ap.add_argument("--dtype", default="int32", choices=["int32", "float32"])
    ap.add_argument("--ports", type=int, default=1,
                    help="engine ports (0: one per worker). Default 1: the board build "
                         "(VCU118 default-1p) and the same engine build as `netreduce demo`")
    ap.add_argument("--data-width", type=int, default=512, help="engine datapath bits")
    ap.add_argument("--pmtu", type=int, default=1024)
    ap.add_argument("--top", type=Path, default=None,
                    help="use this stored engine top (JSON from build/fastsim/gen/) as it is")
    ap.add_argument("--backends", default="verilator,model")
    ap.add_argument("--icarus-workers", type=int, default=2)
    ap.add_argument("--icarus-size", type=_size, default=16 << 10)
    ap.add_argument("--harness", action="store_true", help="also the pure harness loop")
    ap.add_argument("--fabric", default="threaded", choices=list(FABRIC_MODES),
                    help="how the RTL fabric runs the engine: windows in the harness's thread "
                         "(default), windows in line, or stopping at every network event (the "
                         "old pump)")
    ap.add_argument("--no-fast-edge", action="store_true",
                    help="Verilator: the model's full eval() at every rising edge (FastSim "
                         "fast_edge off), to measure what the fast edge gains")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
           "runs": []}
    overrides = {"data_width": a.data_width, "pmtu_max": max(1024, a.pmtu)}
    if a.top is not None:
        res["top"] = str(a.top)
    for name in a.backends.split(","):
        if name == "icarus":
            cfg = SimConfig(workers=a.icarus_workers, size=a.icarus_size, dtype=a.dtype,
                            backend=name, ports=a.ports, pmtu=a.pmtu, timeout_ns=10**11)
        else:
            cfg = SimConfig(workers=a.workers, size=a.size, dtype=a.dtype, backend=name,
                            ports=a.ports, pmtu=a.pmtu, timeout_ns=10**11)
        print(f"{name}: {cfg.workers} workers x {cfg.size} bytes ...", flush=True)
        r = run_backend(name, cfg, {**overrides, "top": a.top}, a.fabric,
                        fast_edge=not a.no_fast_edge)
        r["config"] = {"workers": cfg.workers, "size": cfg.size, "dtype": cfg.dtype,
                       "ports": cfg.nports, "pmtu": cfg.pmtu}
        print(json.dumps(r), flush=True)
        res["runs"].append(r)
    h0 = standin_loop()
    print(json.dumps(h0), flush=True)
    res["harness_standin"] = h0
    if a.harness:
        params = {**rtl_fabric.rtl_params(SimConfig(workers=a.workers, ports=a.ports)),
                  **overrides}
        h = harness_loop("verilator", params, 200, 1024)
        print(json.dumps(h), flush=True)
        res["harness"] = h
    res["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0 if all(r["ok"] for r in res["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
