"""``netreduce sim --racks R``: the spine-leaf run (:mod:`netreduce.sim.net.spine_leaf`); glue.

Exit status as ``netreduce sim``: 0 pass; 1 wrong result or a slot left held by any engine;
3 hang or RC error; 2 bad arguments (one line).
"""

from __future__ import annotations

import json
from pathlib import Path

from netreduce.cli._console import console

_SHOWN = ("contributions", "partials_up", "totals", "released", "results_sent", "reemits",
          "duplicates", "behind_window", "drop_ahead", "drop_role", "fwd_ack", "freed")


def run_racks(cfg, racks: int, pcap, json_path, fail) -> None:
    from rich.table import Table

    from netreduce.sim.net.spine_leaf import run_rack_sim

    con = console()
    con.print(f"[bold]netreduce sim[/]: {cfg.workers} ranks in {racks} racks x {cfg.size} B "
              f"{cfg.dtype}, PMTU {cfg.pmtu}, loss {cfg.loss:g} dup {cfg.dup:g} reorder "
              f"{cfg.reorder:g} on every link, seed {cfg.seed}, "
              f"{'model' if cfg.backend == 'model' else cfg.backend + ' RTL'} engines")
    try:
        run = run_rack_sim(cfg, racks, pcap=pcap)
    except ValueError as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"cannot write capture {pcap!r}: {e.strerror}") from None
    t = Table(title=f"all-reduce {run.sim_ns / 1000:.1f} us simulated, {run.wall_s:.1f} s wall")
    t.add_column("counter")
    for n in run.engines:
        t.add_column(n, justify="right")
    for k in _SHOWN:
        t.add_row(k, *(str(c.get(k, 0)) for c in run.engines.values()))
    t.add_row("slots left", *(str(run.slots_left.get(n, 0)) for n in run.engines))
    con.print(t)
    for k, v in run.link_stats.items():
        con.print(f"links {k}: {v.get('frames', 0)} frames, lost {v.get('lost', 0)}, "
                  f"duplicated {v.get('duplicated', 0)}, reordered {v.get('reordered', 0)}")
    for c in run.checks:
        con.print(f"check: {c['kind']}: {'ok' if c['ok'] else 'FAILED'}")
    if run.pcaps:
        con.print("capture: " + ", ".join(run.pcaps))
    if json_path:
        rep = {"racks": racks, "config": vars(cfg) if hasattr(cfg, "__dict__") else {},
               "ok": run.ok, "error": run.error, "sim_ns": run.sim_ns, "wall_s": run.wall_s,
               "checks": run.checks, "stats": run.stats, "engines": run.engines,
               "slots_left": run.slots_left, "links": run.link_stats, "pcaps": run.pcaps}
        try:
            Path(json_path).write_text(json.dumps(rep, indent=1, default=_num) + "\n")
        except OSError as e:
            raise fail(f"cannot write {json_path!r}: {e.strerror}") from None
        con.print(f"report: {json_path}")
    if run.error is not None:
        con.print(f"[bold red]FAIL[/]: {run.error}")
        raise SystemExit(3)
    if not run.ok:
        why = [f"{n}: {v} slots left held" for n, v in run.slots_left.items() if v]
        why += [f"{c['kind']} failed" for c in run.checks if not c["ok"]]
        con.print(f"[bold red]FAIL[/]: {'; '.join(why)}")
        raise SystemExit(1)
    con.print("[bold green]PASS[/]")


def _num(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
