"""``netreduce replay``: replay a capture through the engine after programming a job file.

Glue only: :mod:`netreduce.sim.emu.replay` does the work (config format: docs/replay.md).
Exit status: 0 replayed; 2 bad arguments, a bad config file or capture, an unwritable output or
an unavailable backend (one ``Error: ...`` line, no traceback, nothing written); 3 the RTL
engine failed during the run (harness error or still busy long after the last frame; one
``FAIL`` line, the output so far is kept).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from netreduce.cli._console import console


class _Fail(click.ClickException):
    exit_code = 2


class _OneLine(click.Command):
    """Usage errors as a single ``Error: ...`` line (no usage block), exit status 2."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise _Fail(e.format_message()) from None


@click.command(cls=_OneLine)
@click.option("--config", "-c", "config_path", required=True, metavar="JOB.toml",
              help="Jobs and flows to program (TOML, docs/replay.md).")
@click.option("--in", "-i", "in_path", required=True, metavar="CAPTURE.pcap",
              help="Frames entering the engine (classic libpcap, Ethernet), in capture order.")
@click.option("--out", "-o", "out_path", required=True, metavar="OUT.pcap",
              help="Frames the engine sends (timestamps from its cycle count).")
@click.option("--backend", type=click.Choice(["model", "verilator", "icarus"]), default="model",
              show_default=True, help="Engine: the reference model, or the RTL under a simulator.")
@click.option("--port-map", "port_map", multiple=True, metavar="SRC=PORT[,...]",
              help="Engine port of frames by IPv4 or MAC source ('*' = the rest; default 0). "
                   "Repeatable.")
@click.option("--max-gap", type=click.IntRange(min=0), default=None, metavar="CYCLES",
              help="Shorten idle gaps between input frames to at most CYCLES (long captures "
                   "on the RTL backends).")
@click.option("--json", "json_path", metavar="FILE", default=None,
              help="Write counters and job states as JSON.")
@click.option("--all", "show_all", is_flag=True, help="Show counters that stayed 0 too.")
def replay(config_path, in_path, out_path, backend, port_map, max_gap, json_path, show_all):
    """Replay CAPTURE.pcap through the NetReduce engine and write what it sends to OUT.pcap.

    The jobs and flows of JOB.toml are programmed through the register bus first (as the driver
    would); frames then enter in capture order at their capture times (in cycles of the
    250 MHz core clock). Prints the engine-wide and per-job counters.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from netreduce.regmap.clock import cycles_to_ns
    from netreduce.sim.backend import BackendUnavailable
    from netreduce.sim.emu import replay as rp
    from netreduce.wire.pcap import PcapWriter

    try:
        if Path(in_path).resolve() == Path(out_path).resolve():
            raise rp.ReplayError(f"--out {out_path!r} is the input capture")
        cfg = rp.load_config(config_path)
        mapping, default = rp.parse_port_map(port_map)
        cap = rp.read_capture(in_path, max_gap)
        ports = rp.assign_ports(cap.frames, mapping, default, cfg.engine.ports)
        rp.probe_backend(backend)
    except (rp.ReplayError, BackendUnavailable) as e:
        raise _Fail(str(e)) from None
    try:
        writer = PcapWriter(out_path)
    except OSError as e:
        raise _Fail(f"cannot write --out {out_path!r}: {e.strerror}") from None
    con = console()
    con.print(f"[bold]netreduce replay[/]: {len(cap.frames)} frames from {in_path}, "
              f"{len(cfg.jobs)} job(s) from {config_path}, backend {backend}")
    try:
        with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=con, transient=True,
                      disable=not con.is_terminal) as prog:
            task = prog.add_task("replay", total=len(cap.frames))
            run = rp.run_replay(cfg, cap, backend, ports,
                                on_emit=lambda e: writer.write(
                                    e.frame, cycles_to_ns(cap.base_cycle + e.time)),
                                progress=lambda n: prog.update(task, completed=n))
    except (rp.ReplayError, BackendUnavailable) as e:
        writer.close()
        Path(out_path).unlink(missing_ok=True)  # no half-written output next to an error
        raise _Fail(str(e)) from None
    except RuntimeError as e:  # the RTL harness: AXI4-Lite timeout, engine still busy, ...
        writer.close()
        con.print(f"[bold red]FAIL[/]: engine on backend {backend}: {e} "
                  f"(output so far kept in {out_path})")
        raise SystemExit(3) from None
    finally:
        writer.close()

    head, rows = rp.counter_rows(run, show_all)
    t = Table(title="engine counters" + ("" if show_all else " (non-zero)"))
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    con.print(t)
    js = Table(title="jobs")
    for h in ("job", "op", "N", "W", "slots", "enabled", "error", "free", "release", "busy",
              "flags"):
        js.add_column(h, justify="right" if h not in ("op", "error", "flags") else "left")
    for j in cfg.jobs:
        st = run.job_status[j.job]
        flags = [n for n in ("mismatch", "saturated") if st[n]]
        js.add_row(str(j.job), j.op.name.lower(), str(j.world), str(j.window),
                   f"{j.slot_base}..{j.slot_base + j.window - 1}", "yes" if st["enabled"] else
                   "no", st["error"], str(st["free_ptr"]), str(st["release_ptr"]),
                   str(st["slots_busy"]), ",".join(flags) or "-")
    con.print(js)
    con.print(f"out: {out_path} ({len(run.emits)} frames, {run.last_cycle} cycles)")
    if cap.backwards:
        con.print(f"note: {cap.backwards} input record(s) had a timestamp earlier than the one "
                  "before; they entered in capture order at the previous frame's cycle")
    if cap.removed:
        con.print(f"note: --max-gap {max_gap} took {cap.removed} idle cycles out of the input; "
                  "output timestamps follow the shortened timeline")
    if json_path:
        argv = ["netreduce", "replay", "--config", config_path, "--in", in_path, "--out",
                out_path, "--backend", backend]
        for pm in port_map:
            argv += ["--port-map", pm]
        if max_gap is not None:
            argv += ["--max-gap", str(max_gap)]
        doc = run.to_json(command=shlex.join(argv), out_path=out_path)
        try:
            Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as e:
            raise _Fail(f"cannot write --json {json_path!r}: {e.strerror}") from None
        con.print(f"json: {json_path}")
