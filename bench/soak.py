"""Long soak of the reference engine: seeded scenarios (netreduce.sim.soak) until a time budget
runs out, in parallel worker processes. Writes bench/results/soak.json: per scenario the outcome
and figures, totals, every violation (with the seed that reproduces it), and the command.

    .venv/bin/python bench/soak.py --hours 4 --workers 2          # the real soak
    .venv/bin/python bench/soak.py --minutes 2 --profile ci       # a quick look

Reproduce one scenario: ``run_scenario(random_scenario(seed, profile))``. Exit status 1 if any
scenario broke a guarantee.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from netreduce.sim.soak import random_scenario, run_scenario


def one(seed: int, profile: str) -> dict:
    sc = random_scenario(seed, profile)
    try:
        rep = run_scenario(sc)
    except Exception as e:  # a crash of the model or the harness is a finding too
        return {"seed": seed, "name": sc.name, "ok": False, "violations": [f"crash: {e!r}"]}
    c = rep.counters
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
            "adversary": rep.adversary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=0.0)
    ap.add_argument("--minutes", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile", choices=("ci", "soak"), default="soak")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-scenarios", type=int, default=0, help="0: until the time is up")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    a = ap.parse_args()
    budget = a.hours * 3600 + a.minutes * 60 or 600.0
    t0 = time.time()
    seed = a.first_seed
    results = []
    with ProcessPoolExecutor(a.workers) as ex:
        running = set()
        while True:
            while (len(running) < a.workers and time.time() - t0 < budget
                   and (not a.max_scenarios or seed - a.first_seed < a.max_scenarios)):
                running.add(ex.submit(one, seed, a.profile))
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
    p = Path(a.out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "results"}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
