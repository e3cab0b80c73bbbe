"""How long the Verilog of the default build takes, cold, phase by phase.

Runs, each in a fresh process with an empty cache (``NETREDUCE_CACHE`` pointed at a temporary
directory, so nothing converted earlier is reused):

* ``netreduce verilog -o F`` at the default parameters (512 bits, 2 ports, 1024 slots, 4096 B
  PMTU, max_world 64): elaboration, RTLIL, Yosys, with the RTLIL size, the Verilog size and
  whether the large RAMs came out without initial content and with ``ram_style``;
* ``netreduce build --board vcu118`` and ``--board vcu108`` (the engine Verilog plus the board
  shell and the Vivado project tree), wall time of the whole command;
* with ``--builtin``, the same ``netreduce verilog`` through Amaranth's built-in WebAssembly Yosys
  (what happens when no native Yosys is installed): minutes more.

Usage::

    nice .venv/bin/python bench/verilog.py [--builtin] [--out bench/results/verilog.json]

The budget: ``verilog`` <= 180 s, ``build`` <= 300 s, cold, on the 2-core machine. Each run also
records its CPU seconds (``cpu_s``), which do not depend on what else the machine is running.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "verilog.json"
BUDGET = {"verilog": 180, "build": 300}

_PHASES = """
import json, sys, time
from netreduce.hw.engine import engine_verilog
from netreduce.regmap import build_regmap
t0 = time.monotonic(); tim = {}
top = engine_verilog(build_regmap(), sys.argv[1], yosys=sys.argv[2], timings=tim)
tim["total_s"] = round(time.monotonic() - t0, 2)
print(json.dumps(tim))
"""


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "netreduce"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "netreduce"]


_CPU = {}


def _timed(cmd, env) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of ``cmd``; its CPU seconds (user + system, children included) go to
    ``_CPU["last"]``: on a shared machine the wall time depends on the load, the CPU time not."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    _CPU["load_avg_at_start"] = round(os.getloadavg()[0], 2)
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    _CPU["last"] = round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 1)
    _CPU["load_avg_at_end"] = round(os.getloadavg()[0], 2)
    return round(time.monotonic() - t0, 1), r


def _cli_phases(out: str) -> dict:
    """The per-phase lines the CLI prints (``  rtlil: 12.3 s``) as ``{phase: seconds}``."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^  (\w+): ([0-9.]+) s$", out, re.M)}


def _verilog_facts(path: Path) -> dict:
    text = path.read_text()
    big = re.findall(r'\(\* ram_style = "(\w+)" \*\)\s*reg \[(\d+):0\] (\S+) \[(\d+):0\];', text)
    large = [n for _, _, n, _ in big]
    init = [n for n in large if re.search(rf"^\s*{re.escape(n)}\[\d+\] = ", text, re.M)]
    return {"bytes": len(text), "lines": text.count("\n"),
            "large_rams": [{"name": n, "ram_style": s, "width": int(w) + 1, "depth": int(d) + 1}
                           for s, w, n, d in big],
            "large_rams_with_initial_content": init}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builtin", action="store_true",
                    help="also time the conversion with Amaranth's built-in WebAssembly Yosys")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    from netreduce.hw.verilog import native_yosys

    nat = native_yosys()
    doc = {"command": ("nice " if os.nice(0) > 0 else "") + "python bench/verilog.py "
           + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_avg_at_start": os.getloadavg()[0]},
           "native_yosys": f"{nat[0]} {nat[1][0]}.{nat[1][1]}" if nat else None,
           "budget_s": BUDGET, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="nr-bench-verilog-") as d:
        dp = Path(d)
        modes = ["native"] if nat else []
        if args.builtin or not nat:
            modes.append("builtin")
        for mode in modes:
            env = dict(os.environ, NETREDUCE_CACHE=str(dp / f"cache-{mode}"))
            out = dp / f"engine-{mode}.v"
            secs, r = _timed([sys.executable, "-c", _PHASES, str(out), mode], env)
            run = {"command": "netreduce verilog -o F (default parameters)", "yosys": mode,
                   "wall_s": secs, "cpu_s": _CPU["last"], "ok": r.returncode == 0,
                   "load_avg": [_CPU["load_avg_at_start"], _CPU["load_avg_at_end"]]}
            if r.returncode == 0:
                run["phases_s"] = json.loads(r.stdout.strip().splitlines()[-1])
                run["verilog"] = _verilog_facts(out)
            else:
                run["error"] = (r.stderr or r.stdout)[-1500:]
            doc["runs"][f"verilog-{mode}"] = run
            print(f"verilog ({mode}): {secs} s {run.get('phases_s', run.get('error'))}",
                  flush=True)
            # the CLI itself, cold (its own process, fresh cache)
            env = dict(os.environ, NETREDUCE_CACHE=str(dp / f"cache-cli-{mode}"))
            if mode == "builtin":
                env["NETREDUCE_YOSYS"] = str(dp / "no-such-yosys")  # as if none installed
            secs, r = _timed(_cli() + ["verilog", "-o", str(dp / f"cli-{mode}.v")], env)
            doc["runs"][f"cli-verilog-{mode}"] = {
                "command": "netreduce verilog -o F", "yosys": mode, "wall_s": secs,
                "cpu_s": _CPU["last"],
                "load_avg": [_CPU["load_avg_at_start"], _CPU["load_avg_at_end"]],
                "phases_s": _cli_phases(r.stdout),
                "ok": r.returncode == 0, "within_budget": secs <= BUDGET["verilog"],
                "output": r.stdout[-800:] if r.returncode == 0 else (r.stderr or r.stdout)[-800:]}
            print(f"netreduce verilog ({mode}): {secs} s", flush=True)
            if mode != "native":
                continue
            for board in ("vcu118", "vcu108"):
                env = dict(os.environ, NETREDUCE_CACHE=str(dp / f"cache-{board}"))
                secs, r = _timed(_cli() + ["build", "--board", board, "--no-run", "-o",
                                           str(dp / board)], env)
                doc["runs"][f"build-{board}"] = {
                    "command": f"netreduce build --board {board}", "yosys": mode,
                    "wall_s": secs, "cpu_s": _CPU["last"], "ok": r.returncode == 0,
                    "load_avg": [_CPU["load_avg_at_start"], _CPU["load_avg_at_end"]],
                    "phases_s": _cli_phases(r.stdout),
                    "within_budget": secs <= BUDGET["build"],
                    "output": (r.stdout if r.returncode == 0 else r.stderr or r.stdout)[-1200:]}
                print(f"netreduce build --board {board}: {secs} s", flush=True)
    doc["machine"]["load_avg_at_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
