"""Long soak of the engine: seeded scenarios (netreduce.sim.verif.soak) until a time budget runs
out, in parallel worker processes, on the reference model or on the engine RTL (Verilator). Writes
bench/results/soak.json: per scenario the outcome and figures, totals, every violation (with the
seed that reproduces it), and the command. The model run is the file's top level; an RTL run is
stored under the key "verilator" (each run keeps the other's figures).

    .venv/bin/python bench/soak.py --hours 4 --workers 2          # the real soak (model)
    .venv/bin/python bench/soak.py --minutes 2 --profile ci       # a quick look
    .venv/bin/python bench/soak.py --backend verilator --hours 1  # the RTL (profile "rtl")
    .venv/bin/python bench/soak.py --backend verilator --lanes 2 --minutes 30  # 2-port lanes

The RTL backend runs the 64-bit engine build of netreduce.sim.rtl.soak_rtl.soak_params
(built once, cached under build/fastsim/) with the "rtl" profile: scenarios sized for that build
(2 jobs, N <= 8, PMTU <= 1024, short QP timeouts), since the RTL simulates every cycle.
``--lanes 2``: the 2-port per-port-lanes build instead (``soak_params(lanes=2)``, model D20),
stored under the key "verilator-lanes2".

Reproduce one scenario: ``run_scenario(random_scenario(seed, profile))`` (RTL: pass
``netreduce.sim.rtl.soak_rtl.rtl_backend()`` as the backend). Exit status 1 if any scenario broke
a guarantee.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from netreduce.sim.verif.soak import PROFILES, model_backend, random_scenario, run_scenario


def one(seed: int, profile: str, backend: str = "model", lanes: int = 1) -> dict:
    sc = random_scenario(seed, profile)
    try:
        if backend == "verilator":
            from netreduce.sim.rtl.soak_rtl import rtl_backend, soak_params

            rep = run_scenario(sc, rtl_backend(soak_params(lanes=lanes)))
        else:
            rep = run_scenario(sc, model_backend)
    except Exception as e:  # a crash of the model or the harness is a finding too
        return {"seed": seed, "name": sc.name, "ok": False, "violations": [f"crash: {e!r}"]}
    c = rep.counters
    extra = {}
    if rep.backend:
        extra = {k: rep.backend[k] for k in ("cycles", "sim_us", "rtl_seconds", "cycles_per_s",
                                             "protocol_errors") if k in rep.backend}
    return {"seed": seed, "name": sc.name, "ok": rep.ok, "violations": rep.violations,
            "allreduces": rep.allreduces, "bytes": rep.bytes_reduced,
            "sim_ms": rep.sim_time_ns / 1e6, "wall_s": round(rep.wall_s, 2),
            "engine_rx": c.get("rx_frames", 0),
            "counters": {k: c[k] for k in ("contributions", "duplicates", "reemits",
                                           "behind_window", "drop_ahead", "drop_icrc",
                                           "fwd_unregistered", "ack_stale", "cnp_sent",
                                           "cnp_suppressed") if k in c},
            "retransmitted": rep.endpoint.get("retransmitted", 0),
            "timeouts": rep.endpoint.get("timeouts", 0),
            "outage_drops": rep.links.get("outage_drops", {}),
            "adversary": rep.adversary, **extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=0.0)
    ap.add_argument("--minutes", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--backend", choices=("model", "verilator"), default="model")
    ap.add_argument("--profile", choices=PROFILES, default=None,
                    help="default: soak (model), rtl (verilator)")
    ap.add_argument("--lanes", type=int, default=1,
                    help="verilator: > 1 runs the per-port-lanes build of that many ports")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-scenarios", type=int, default=0, help="0: until the time is up")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    a = ap.parse_args()
    if a.lanes < 1 or (a.lanes > 1 and a.backend != "verilator"):
        ap.error(f"--lanes {a.lanes}: a positive number of lanes, > 1 only with --backend "
                 "verilator")
    if a.profile is None:
        a.profile = "rtl" if a.backend == "verilator" else "soak"
    if a.backend == "verilator":
        from netreduce.sim.net.simrun import BackendUnavailable
        from netreduce.sim.rtl.fabric import engine_top, probe_rtl
        from netreduce.sim.rtl.fastsim import build_fastsim
        from netreduce.sim.rtl.soak_rtl import soak_params

        try:
            probe_rtl("verilator")
        except BackendUnavailable as e:
            print(f"bench/soak.py: {e}", file=sys.stderr)
            return 2
        build_fastsim(engine_top(soak_params(lanes=a.lanes)))  # once, before the workers start
    budget = a.hours * 3600 + a.minutes * 60 or 600.0
    t0 = time.time()
    seed = a.first_seed
    results = []
    with ProcessPoolExecutor(a.workers) as ex:
        running = set()
        while True:
            while (len(running) < a.workers and time.time() - t0 < budget
                   and (not a.max_scenarios or seed - a.first_seed < a.max_scenarios)):
                running.add(ex.submit(one, seed, a.profile, a.backend, a.lanes))
                seed += 1
            if not running:
                break
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                r = f.result()
                results.append(r)
                flag = "ok " if r["ok"] else "BAD"
                print(f"{flag} {r['name']:24s} {r.get('allreduces', 0):3d} all-reduces "
                      f"{r.get('engine_rx', 0):8d} frames {r.get('wall_s', 0):7.1f} s", flush=True)
                for v in r["violations"]:
                    print(f"    {v}", flush=True)
    results.sort(key=lambda r: r["seed"])
    styles = Counter(r["name"].split("-")[-1] for r in results)
    tot = {k: sum(r.get(k, 0) for r in results) for k in ("allreduces", "bytes", "engine_rx",
                                                          "retransmitted", "timeouts")}
    bad = [r for r in results if not r["ok"]]
    out = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "backend": a.backend,
        "profile": a.profile,
        "wall_s": round(time.time() - t0, 1),
        "scenarios": len(results),
        "scenarios_by_style": dict(styles),
        "failed": len(bad),
        "failed_seeds": [r["seed"] for r in bad],
        "totals": tot,
        "engine_frames_per_s": round(tot["engine_rx"] / max(1e-9, time.time() - t0), 1),
        "violations": {r["seed"]: r["violations"] for r in bad},
        "results": results,
    }
    if a.backend == "verilator":
        rtl = out
        totals_rtl = {k: sum(r.get(k, 0) for r in results) for k in ("cycles", "rtl_seconds")}
        rtl["rtl_totals"] = {**totals_rtl, "cycles_per_s": round(
            totals_rtl["cycles"] / max(1e-9, totals_rtl["rtl_seconds"]))}
    p = Path(a.out)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = json.loads(p.read_text())
    except (OSError, ValueError):
        old = {}
    key = "verilator" if a.lanes <= 1 else f"verilator-lanes{a.lanes}"
    if a.backend == "verilator":
        out = {**old, key: rtl}
    else:
        out.update({k: v for k, v in old.items() if k.startswith("verilator")})
    p.write_text(json.dumps(out, indent=1) + "\n")
    run = out[key] if a.backend == "verilator" else out
    print(json.dumps({k: v for k, v in run.items()
                      if k != "results" and not k.startswith("verilator")},
                     indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
