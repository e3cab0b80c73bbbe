"""Yosys resource and logic-depth estimates of the NetReduce engine (the board shell's core).

The engine is estimated block by block from Amaranth's RTLIL with the native Yosys
(:func:`netreduce.hw.estimate.estimate_design`: ``synth_xilinx -flatten -noiopad -noclkbuf``,
plus ``-uram`` on xcup, per block; ``ltp`` over LUT/CARRY/MUXF/INV cells for the logic depth, and
from the netlist ``lut_levels`` / ``carry_levels``: LUT-class cells and CARRY8 on the worst
register-to-register path, checked against the budget of the clock plan):
control, flow table, register bank, parsers (and their ICRC checkers), slot memory, deparser,
and the rest of the top (header store, dispatcher, emitter, FIFOs, TX arbiters). The engine's
figure is the sum; every block is cached by its RTLIL digest (``~/.cache/netreduce/estimate``),
so a rerun of an unchanged design is instant. Each 512-bit block takes minutes to tens of
minutes of Yosys (ABC on the packet path's shifters and CRC trees): run it with ``nice``.

Engine sets (``--sets``):

* ``default-1p`` / ``default-2p``: the default build parameters (``build_regmap()``, the VCU118
  build) with 1 / 2 ports, on the VCU118's xcvu9p (``xcup``);
* ``vcu108-1p`` / ``vcu108-2p``: the VCU108 build parameters
  (:data:`netreduce.hw.boards.project.BOARD_PARAMS`: 512 slots, max_world 32; the xcvu095 has no
  URAM) on the xcvu095 (``xcu``);
* ``lanes-2p`` / ``lanes-4p``: per-port contribution lanes (``lanes = ports``) with 2 / 4 ports
  on the xcvu9p, 512 slots x max_world 32 / 256 slots x max_world 64 (docs/engine.md's lane
  memory table: one SLR each); ``vcu108-lanes-2p``: 2 lanes on the xcvu095, 256 slots x
  max_world 32;
* ``ci-small``: the CI parameter set (64 bits, 1 port, 8 slots) on the xcvu9p.

Usage::

    nice .venv/bin/python bench/estimate.py [--sets default-1p,default-2p,vcu108-1p]
                                            [--runs design:family,...] [--timeout SECONDS]

Results go to bench/results/estimate.json after every block (an engine set is ``partial`` until
all its blocks are done, ``error`` if one failed), with the command, the engine's
``design_digest`` (``tests/hw/test_boards_estimate.py`` checks the recorded default-set figure
against the current design and the 15% LUT budget) and the logic depth of the critical blocks.
``--runs`` estimates single designs of :data:`netreduce.hw.estimate.DESIGNS` (data width
``--data-width``); their entries are kept in ``results``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from netreduce.hw.boards.project import BOARD_PARAMS, platform_for
from netreduce.hw.estimate import Estimate, YosysError, design_digest, estimate_design

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "estimate.json"
BOARD = {"xcup": "vcu118", "xcu": "vcu108"}
SETS = {
    "default-1p": ("xcup", {"ports": 1}),
    "default-2p": ("xcup", {"ports": 2}),
    "vcu108-1p": ("xcu", dict(BOARD_PARAMS["vcu108"], ports=1)),
    "vcu108-2p": ("xcu", dict(BOARD_PARAMS["vcu108"], ports=2)),
    # per-port contribution lanes (lanes = ports, docs/engine.md "Every port at line rate") with
    # the memory sizes of docs/engine.md's lane memory table: one SLR of the xcvu9p each; on the
    # xcvu095 256 slots (4 block-RAM copies of the slot memory)
    "lanes-2p": ("xcup", dict(ports=2, lanes=2, slots=512, max_world=32)),
    "lanes-4p": ("xcup", dict(ports=4, lanes=4, slots=256, max_world=64)),
    "vcu108-lanes-2p": ("xcu", dict(BOARD_PARAMS["vcu108"], ports=2, lanes=2, slots=256)),
    # the CI parameter set of tests/hw/test_boards_estimate.py (64 bits, 8 slots): minutes, not
    # hours, so its per-block figures follow every design change
    "ci-small": ("xcup", dict(data_width=64, ports=1, jobs=2, flows=8, slots=8, pmtu_max=256,
                              max_world=4)),
}
DEFAULT_SETS = "default-1p,default-2p,vcu108-1p"
# block label -> what it stands for in the logic-depth table
CRITICAL = {"slotmem": "slot memory pipeline (read-modify-write + forwarding)",
            "ctl": "control decision stage (flow lookup, window, slot state)",
            "parser0": "parser (header extraction, realignment)",
            "parser0.checker": "ICRC checker (512-bit CRC)",
            "deparser": "deparser (header insert, checksum, ICRC)"}
COLUMNS = ("LUT", "FF", "CARRY", "DSP", "BRAM36", "URAM")


# Logic-depth budget per register-to-register path (docs/engine.md, "Clock plan"): the core
# runs at 250 MHz (4 ns): at most 8 LUT-class cells (LUT, MUXF7/8/9) and at most 8 CARRY8 more.
CORE_MHZ = 250
LUT_BUDGET = {250: 8, 322: 6}[CORE_MHZ]
CARRY_BUDGET = 8


def _brief(e: Estimate) -> dict:
    d = {"resources": {k: e.resources[k] for k in COLUMNS + ("LUTRAM", "SRL")},
         "utilisation": e.utilisation, "logic_depth": e.logic_depth,
         "lut_levels": e.lut_levels, "carry_levels": e.carry_levels, "carry_max": e.carry_max,
         "yosys_seconds": e.seconds}
    if e.lut_levels is not None:
        d["within_budget"] = e.lut_levels <= LUT_BUDGET and e.carry_max <= CARRY_BUDGET
        d["lut_path"] = e.lut_path
        if e.lut_nets:   # results cached before the names were recorded have none
            d.update(lut_nets=e.lut_nets, lut_from=e.lut_from, lut_to=e.lut_to)
    return d


def run_set(name: str, out: Path, command: str, timeout: float, skip=()) -> dict:
    family, params = SETS[name]
    cap = type(platform_for(BOARD[family])).capacity
    p = dict({"data_width": 512}, **params)
    entry = {"set": name, "family": family, "device": cap.part, "params": p,
             "design_digest": design_digest(p), "command": command, "status": "partial",
             "budget": {"core_mhz": CORE_MHZ, "lut_levels": LUT_BUDGET,
                        "carry_levels": CARRY_BUDGET},
             "blocks": {}}
    t0 = time.monotonic()

    def progress(label, r):
        if r == "skipped":
            entry["blocks"][label] = {"skipped": "not run (--skip): the set's command without "
                                                 "--skip runs it"}
            print(f"  {name} {label:16s} skipped", flush=True)
        elif isinstance(r, Estimate):
            entry["blocks"][label] = _brief(r)
            print(f"  {name} {label:16s} LUT={r.resources['LUT']} FF={r.resources['FF']} "
                  f"BRAM36={r.resources['BRAM36']} URAM={r.resources['URAM']} "
                  f"depth={r.logic_depth} lut={r.lut_levels} carry={r.carry_levels}/"
                  f"{r.carry_max} ({r.seconds} s)", flush=True)
        else:
            entry["blocks"][label] = {"error": r}
            print(f"  {name} {label:16s} ERROR {r[-200:]}", flush=True)
        _store_engine(out, entry)

    print(f"{name}: {family} {cap.part} {p} (design {entry['design_digest']})", flush=True)
    try:
        total, _ = estimate_design("core", family=family, capacity=cap, timeout=timeout,
                                   progress=progress, skip=skip, **p)
        entry.update(status="ok", total=_brief(total), yosys=total.yosys,
                     logic_depth={k: entry["blocks"][k]["logic_depth"] for k in CRITICAL
                                  if k in entry["blocks"]})
    except YosysError as e:
        skipped = [k for k, b in entry["blocks"].items() if "skipped" in b]
        if skipped and not any("error" in b for b in entry["blocks"].values()):
            entry.update(status="partial", not_run=skipped)
        else:
            entry.update(status="error", error=str(e)[-2000:])
    entry["wall_seconds"] = round(time.monotonic() - t0, 1)
    _store_engine(out, entry)
    if entry["status"] == "ok":
        r, u = entry["total"]["resources"], entry["total"]["utilisation"]
        print(f"{name}: " + " ".join(f"{k}={r[k]:g} ({u[k]:.2f}%)" if u.get(k) is not None
                                     else f"{k}={r[k]:g}" for k in COLUMNS), flush=True)
    return entry


def run_design(design: str, family: str, out: Path, command: str, data_width: int,
               timeout: float) -> dict:
    cap = type(platform_for(BOARD[family])).capacity
    params = {"data_width": data_width}
    t0 = time.monotonic()
    entry = {"design": design, "family": family, "device": cap.part, "command": command}
    try:
        est, _ = estimate_design(design, family=family, capacity=cap, timeout=timeout, **params)
        entry.update(status="ok", **{k: v for k, v in est.as_dict().items()
                                     if k not in ("design", "family")})
    except (YosysError, ValueError) as e:
        entry.update(status="error", error=str(e)[-2000:])
    entry["wall_seconds"] = round(time.monotonic() - t0, 1)
    _store(out, entry)
    r = entry.get("resources", {})
    print(f"{design:10s} {family:5s} {entry['status']:6s} LUT={r.get('LUT')} FF={r.get('FF')} "
          f"BRAM36={r.get('BRAM36')} URAM={r.get('URAM')} depth={entry.get('logic_depth')} "
          f"({entry['wall_seconds']} s)", flush=True)
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default=DEFAULT_SETS,
                    help=f"engine sets, comma separated, of {sorted(SETS)} ('' for none; "
                         f"default: %(default)s)")
    ap.add_argument("--runs", default="", help="single designs design:family,...")
    ap.add_argument("--data-width", type=int, default=512, help="for --runs")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per Yosys run")
    ap.add_argument("--skip", default="",
                    help="engine block labels not to synthesise unless cached (e.g. bank,ctl,"
                         "ctl.ft: the slow ones); such a set is recorded as partial")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--markdown", action="store_true",
                    help="print the README tables from --out and exit (no Yosys run)")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(_load(args.out)))
        return
    command = "nice python bench/estimate.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in [s for s in args.sets.split(",") if s]:
        if name not in SETS:
            ap.error(f"unknown set {name!r}; expected one of {sorted(SETS)}")
        run_set(name, args.out, command.strip(), args.timeout,
                skip=[b for b in args.skip.split(",") if b])
    for run in [r for r in args.runs.split(",") if r]:
        design, _, family = run.partition(":")
        run_design(design, family or "xcup", args.out, command.strip(), args.data_width,
                   args.timeout)
    print(f"wrote {args.out}")


def markdown(doc: dict) -> str:
    """The README's resource and logic-depth tables from a results document."""
    lines = ["| engine set | device | status | " + " | ".join(COLUMNS) + " |",
             "|---|---|---|" + "---:|" * len(COLUMNS)]
    for name in SETS:
        e = doc["engine"].get(name)
        if e is None:
            lines.append(f"| {name} | | not run | " + " | ".join("" for _ in COLUMNS) + " |")
            continue
        if e["status"] == "ok":
            r, u = e["total"]["resources"], e["total"]["utilisation"]
            cells = [f"{r[k]:g} ({u[k]:.2f}%)" if u.get(k) is not None else f"{r[k]:g}"
                     for k in COLUMNS]
            status = "ok"
        else:
            done = [b for b in e["blocks"].values() if "resources" in b]
            cells = []
            for k in COLUMNS:
                used = sum(b["resources"][k] for b in done)
                pct = [b["utilisation"].get(k) for b in done]
                cells.append(f"≥{used:g}" + (f" ({sum(pct):.2f}%)" if pct and None not in pct
                                             else ""))
            status = f"{e['status']} ({len(done)} blocks done)"
        lines.append(f"| {name} | {e['device']} | {status} | " + " | ".join(cells) + " |")
    lines += ["", "ltp / LUT-class levels / CARRY8 on that path (budget at "
              f"{CORE_MHZ} MHz: {LUT_BUDGET} LUT levels + {CARRY_BUDGET} CARRY8)", "",
              "| block | " + " | ".join(SETS) + " |", "|---|" + "---:|" * len(SETS)]
    labels = list(CRITICAL) + sorted({k for e in doc["engine"].values()
                                      for k in e.get("blocks", {}) if k not in CRITICAL})
    for label in labels:
        row = []
        for name in SETS:
            b = doc["engine"].get(name, {}).get("blocks", {}).get(label, {})
            cell = str(b.get("logic_depth", ""))
            if b.get("lut_levels") is not None:
                cell += f" / {b['lut_levels']} / {b['carry_levels']}"
            row.append(cell)
        what = CRITICAL.get(label, "")
        lines.append(f"| {label}{': ' + what if what else ''} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _load(path: Path) -> dict:
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault("results", [])
    doc.setdefault("engine", {})
    return doc


def _save(path: Path, doc: dict) -> None:
    doc["note"] = ("Yosys 0.23 synth_xilinx estimates (not Vivado's figures); engine = sum of its "
                   "blocks, each synthesised on its own; every entry has the command that made it")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.replace(path)


def _store_engine(path: Path, entry: dict) -> None:
    doc = _load(path)
    doc["engine"][entry["set"]] = entry
    _save(path, doc)


def _key(e):
    return (e["design"], e["family"], (e.get("params") or {}).get("data_width"))


def _store(path: Path, entry: dict) -> None:
    """Add a single-design ``entry`` (replacing an older one of the same combination)."""
    doc = _load(path)
    results = [e for e in doc["results"] if _key(e) != _key(entry)]
    results.append(entry)
    doc["results"] = sorted(results, key=lambda e: (e["design"], e["family"]))
    _save(path, doc)


if __name__ == "__main__":
    main()
