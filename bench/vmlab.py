"""VM lab figures: Linux soft-RoCE guests under TCG all-reducing through the reference engine.

Per scenario (2 VMs; 2 VMs with 1 % loss each way; 2 VMs with the ICRC control experiment; 4
VMs; PMTU 4096; 2 VMs through the engine RTL under Verilator, 64-bit build): image build/cache
time, time until the guests' rxe0 is ACTIVE, the
all-reduce time inside the guests, frames checked and their ICRC validity, NAKs and
retransmissions, frames lost by the injected loss, and whether every result was bit-exact.
This measures correctness against a real RC stack, not speed: TCG runs each guest at tens of
Mbit/s and the times depend on the host's load.

Writes bench/results/vmlab.json (scenarios not run this time are kept from the previous file).

    .venv/bin/python bench/vmlab.py [--quick] [--elems N] [--only 2vm_rtl ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from netreduce.sim.vmlab.lab import LabConfig, lab_problems, run_lab

RESULTS = Path(__file__).resolve().parent / "results" / "vmlab.json"

SCENARIOS = {
    "2vm": dict(workers=2),
    "2vm_loss1pct": dict(workers=2, loss=0.01, seed=3),
    "2vm_icrc_control": dict(workers=2, icrc_control=True, qp_error_check=True, seed=4),
    "4vm": dict(workers=4, seed=5),
    "2vm_pmtu4096": dict(workers=2, pmtu=4096, seed=6),
    "2vm_rtl": dict(workers=2, backend="verilator", seed=7),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elems", type=int, default=64 * 1024, help="int32 per rank")
    ap.add_argument("--quick", action="store_true", help="only 2vm and 2vm_loss1pct")
    ap.add_argument("--only", nargs="*", default=None, help="scenario names")
    a = ap.parse_args()
    probs = lab_problems()
    if probs:
        print("VM lab unavailable: " + "; ".join(probs), file=sys.stderr)
        return 2
    names = a.only or (["2vm", "2vm_loss1pct"] if a.quick else list(SCENARIOS))
    out = {"command": " ".join(["bench/vmlab.py", *sys.argv[1:]]),
           "note": "correctness against a real RoCEv2 stack (rdma_rxe under QEMU TCG), not speed",
           "scenarios": {}}
    ok = True
    for name in names:
        t0 = time.monotonic()
        load0 = os.getloadavg()[0]
        res = run_lab(LabConfig(elems=a.elems, timeout_s=1800, boot_timeout_s=240,
                                op_timeout_s=300, **SCENARIOS[name]))
        rep = res.report
        out["image"] = rep["image"]
        fig = dict(rep["figures"])
        # the host's 1-min load average before and after: TCG times scale with it
        fig.update(ok=res.ok, problems=res.problems, wall_s=round(time.monotonic() - t0, 1),
                   command=" ".join(["bench/vmlab.py", *sys.argv[1:]]),
                   engine_s=rep.get("engine_s"),
                   load_1min=[round(load0, 1), round(os.getloadavg()[0], 1)],
                   boot_retries=rep.get("boot_retries"),
                   image_s=rep["image_s"], icrc_control=rep.get("icrc_control"),
                   rxe=[r.get("rxe") for r in rep["ranks"]],
                   retransmitted_out=rep["capture"].get("out", {}).get("retransmitted", 0))
        out["scenarios"][name] = fig
        ok &= res.ok
        print(f"{name}: {res}", flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    try:
        prev = json.loads(RESULTS.read_text()).get("scenarios", {})
    except (OSError, ValueError):
        prev = {}
    out["scenarios"] = {**prev, **out["scenarios"]}
    RESULTS.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps(out["scenarios"], indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
