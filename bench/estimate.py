"""Yosys resource and logic-depth estimates of NetReduce gateware at full width (512 bits).

Runs :func:`netreduce.hw.estimate.estimate` (``synth_xilinx -flatten -noiopad -noclkbuf``, plus
``-uram`` on xcup; ``ltp`` over LUT/CARRY/MUXF/INV cells for the logic depth) on each design of a
set and family, and reports LUT / FF / CARRY / DSP / BRAM36 / URAM with the utilisation of the
family's board device (xcup: VCU118 xcvu9p; xcu: VCU108 xcvu095). Each run takes minutes.

Usage::

    .venv/bin/python bench/estimate.py [--runs core:xcup,parser:xcup,...] [--data-width 512]
                                       [--timeout SECONDS]

Results go to bench/results/estimate.json after every run (a run that fails or times out is
recorded with its error), together with the command line. Results already in the file for other
design/family/width combinations are kept (one entry per combination, the newest wins);
``--out`` writes elsewhere and ``--merge FILE`` folds the entries of another results file in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from netreduce.hw.boards.project import platform_for
from netreduce.hw.estimate import YosysError, estimate, make_design

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "estimate.json"
BOARD = {"xcup": "vcu118", "xcu": "vcu108"}
# the shell-side designs first (quick); the core with the register bank takes over an hour of
# Yosys on a loaded machine; the packet path blocks have their own benches too
DEFAULT_RUNS = "lbus_rx:xcu,rxfifo:xcup,core:xcup,core:xcu,parser:xcup,deparser:xcup,lanes:xcup"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="design:family,... (default: %(default)s)")
    ap.add_argument("--data-width", type=int, default=512)
    ap.add_argument("--ports", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--merge", type=Path, default=None,
                    help="fold the results of this file into --out and exit")
    args = ap.parse_args(argv)
    command = "python bench/estimate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge is not None:
        for entry in json.loads(args.merge.read_text())["results"]:
            _store(args.out, entry)
        print(f"merged {args.merge} into {args.out}")
        return
    runs = [r.split(":") for r in args.runs.split(",") if r]
    for design, family in runs:
        cap = type(platform_for(BOARD[family])).capacity
        params = {"data_width": args.data_width, "ports": args.ports}
        t0 = time.monotonic()
        entry = {"design": design, "family": family, "device": cap.part, "command": command}
        try:
            comp = make_design(design, **params)
            est = estimate(comp, family=family, capacity=cap, design=design, params=params,
                           timeout=args.timeout)
            entry.update(status="ok", **{k: v for k, v in est.as_dict().items()
                                         if k not in ("design", "family")})
        except (YosysError, ValueError) as e:
            entry.update(status="error", error=str(e)[-2000:])
        entry["wall_seconds"] = round(time.monotonic() - t0, 1)
        _store(args.out, entry)
        r = entry.get("resources", {})
        print(f"{design:10s} {family:5s} {entry['status']:6s} LUT={r.get('LUT')} FF={r.get('FF')}"
              f" CARRY={r.get('CARRY')} DSP={r.get('DSP')} BRAM36={r.get('BRAM36')} "
              f"URAM={r.get('URAM')} depth={entry.get('logic_depth')} "
              f"({entry['wall_seconds']} s)", flush=True)
    print(f"wrote {args.out}")


def _key(e):
    return (e["design"], e["family"], (e.get("params") or {}).get("data_width"))


def _store(path: Path, entry: dict) -> None:
    """Add ``entry`` to the results file (replacing an older one of the same combination)."""
    doc = json.loads(path.read_text()) if path.exists() else {"results": []}
    results = [e for e in doc.get("results", []) if _key(e) != _key(entry)]
    results.append(entry)
    doc = {"note": "Yosys synth_xilinx estimates; each entry has the command that made it",
           "results": sorted(results, key=lambda e: (e["design"], e["family"]))}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    main()
