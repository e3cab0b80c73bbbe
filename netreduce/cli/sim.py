"""``netreduce sim``: the all-reduce of N RC endpoint models through the engine on a backend.

Glue only: :mod:`netreduce.sim.net.simrun` runs it, :mod:`netreduce.sim.net.report` reports it.
Exit status: 0 pass; 1 wrong result or engine slot left allocated; 3 hang (watchdog) or RC error;
2 bad arguments or an unavailable backend (one line, no traceback).
"""

from __future__ import annotations

import shlex

import click

from netreduce.cli._console import console
from netreduce.cli.demo import MAX_TOTAL, _Size

_PROB = click.FloatRange(0.0, 0.5)


class _OneLine(click.Command):
    """Usage errors as a single ``Error: ...`` line (no usage block), exit status 2."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise _Fail(e.format_message()) from None


class _Fail(click.ClickException):
    exit_code = 2


@click.command(cls=_OneLine)
@click.option("--workers", "-n", type=click.IntRange(2, 64), default=4, show_default=True,
              help="RC endpoints (ranks) per all-reduce.")
@click.option("--size", "-s", type=_Size(), default="1MiB", show_default=True,
              help="Bytes each rank contributes (multiple of 4).")
@click.option("--dtype", type=click.Choice(["float32", "int32"]), default="float32",
              show_default=True)
@click.option("--pmtu", type=click.Choice(["256", "512", "1024", "2048", "4096"]),
              default="1024", show_default=True)
@click.option("--jobs", "-j", type=click.IntRange(1, 4), default=1, show_default=True,
              help="Concurrent all-reduces (engine jobs), each of N ranks.")
@click.option("--loss", type=_PROB, default=0.0, show_default=True,
              help="Per-frame loss probability on every link and direction.")
@click.option("--dup", type=_PROB, default=0.0, show_default=True,
              help="Per-frame duplication probability.")
@click.option("--reorder", type=_PROB, default=0.0, show_default=True,
              help="Per-frame reordering probability.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=1, show_default=True)
@click.option("--backend", type=click.Choice(["verilator", "icarus", "model"]), default="model",
              show_default=True, help="Engine: the RTL under a simulator, or the reference model.")
@click.option("--ports", type=click.IntRange(0, 64), default=0, show_default=True,
              help="Engine ports P on the ToR switch (0: one per rank); rank r's flows use "
                   "port r mod P.")
@click.option("--gbps", type=click.Choice(["10", "25", "40", "50", "100", "200", "400"]),
              default="100", show_default=True,
              help="Workers' link rate B in Gb/s (frames serialised with the wire overhead).")
@click.option("--port-gbps", type=click.FloatRange(0.0, 1000.0), default=100.0,
              show_default=True,
              help="Engine port rate C in Gb/s (0: no switch, each rank's own link is an engine "
                   "port and the model engine is untimed).")
@click.option("--stripes", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Split each all-reduce into E stripes, each its own engine job and QP ring "
                   "on engine port e mod P.")
@click.option("--engines", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Engines on the ToR switch (model backend), each with P ports; stripes go "
                   "round-robin over the engines.")
@click.option("--ack-priority/--ack-fifo", default=True, show_default=True,
              help="ACK/NAK/CNP overtake queued data on a link (NIC TX arbitration), or queue "
                   "behind it.")
@click.option("--pcap", "pcap", metavar="PREFIX", default=None,
              help="Write PREFIX.in.pcap / PREFIX.out.pcap (frames entering / leaving the "
                   "engine).")
@click.option("--json", "json_path", metavar="FILE", default=None, help="Write the JSON report.")
@click.option("--plot", "plot_path", metavar="FILE.png", default=None,
              help="PNG of per-port throughput and slots in flight over time.")
@click.option("--timeout-ms", type=click.IntRange(1, 600_000), default=10_000,
              show_default=True, help="Watchdog on simulated time.")
@click.option("--qp-timeout", type=click.IntRange(1, 31), default=8, show_default=True,
              help="RC local ACK timeout of the endpoints: 4.096 us x 2^T (8: 1.05 ms). Lower "
                   "it to shorten the idle waits after a tail loss on the slow RTL simulators.")
@click.option("--racks", type=click.IntRange(0, 4), default=0, show_default=True,
              help="Spine-leaf: the N workers in R racks (2..4), a leaf engine each and a spine "
                   "engine; pcaps PREFIX.<engine>.in/out.pcap per engine (0: one engine).")
@click.option("--datapath-gbps", type=click.FloatRange(0.0, 1000.0), default=0.0,
              show_default=True,
              help="Each engine port's datapath takes D Gb/s behind a 32 KiB input buffer that "
                   "drops (counted) when full (0: not limited; ToR, model backend; "
                   "docs/fabric.md).")
@click.option("--pfc/--no-pfc", default=False, show_default=True,
              help="Engine ports send PFC from their input buffer's watermarks (PORT.FC_*).")
@click.option("--ecn/--no-ecn", default=False, show_default=True,
              help="Ranks send ECT; congested engine ports CE-mark on arrival (D19), so "
                   "contributions get CNPs.")
@click.option("--dcqcn/--no-dcqcn", default=False, show_default=True,
              help="The ranks' RNICs cut their rate on CNPs (DCQCN-like; rxe has none).")
def sim(workers, size, dtype, pmtu, jobs, loss, dup, reorder, seed, backend, ports, gbps,
        port_gbps, stripes, engines, ack_priority, pcap, json_path, plot_path, timeout_ms,
        qp_timeout, racks, datapath_gbps, pfc, ecn, dcqcn):
    """All-reduce SIZE bytes from each of N RC endpoint models through the NetReduce engine.

    The ranks behave like Linux soft-RoCE on 100 Gb/s links that can lose, duplicate and reorder
    frames (seeded). Reports goodput per engine port against the wire limit, slot latencies,
    recovery and engine counters, and checks the result (int32 bit-exact, float32 within the
    quantisation bound).
    """
    from netreduce.sim.net import report
    from netreduce.sim.net.simrun import BackendUnavailable, SimConfig, get_backend, run_sim

    if workers * jobs * size > MAX_TOTAL:
        raise _Fail(f"--workers {workers} x --jobs {jobs} x --size {size} B = "
                    f"{workers * jobs * size} B is more than the {MAX_TOTAL} B an in-process "
                    f"run holds")
    if plot_path is not None and not plot_path.lower().endswith(".png"):
        raise _Fail(f"--plot {plot_path!r}: the file name must end in .png")
    try:
        cfg = SimConfig(workers=workers, size=size, dtype=dtype, pmtu=int(pmtu), jobs=jobs,
                        loss=loss, dup=dup, reorder=reorder, seed=seed, backend=backend,
                        ports=ports, link_gbps=float(gbps), port_gbps=port_gbps,
                        stripes=stripes, engines=engines, timeout_ns=timeout_ms * 1_000_000,
                        ack_priority=ack_priority, qp_timeout=qp_timeout,
                        datapath_gbps=datapath_gbps, pfc=pfc, ecn=ecn, dcqcn=dcqcn)
        get_backend(backend).probe()
    except (ValueError, BackendUnavailable) as e:
        raise _Fail(str(e)) from None
    if racks:
        from netreduce.cli.sim_racks import run_racks

        if stripes > 1 or engines > 1:
            raise _Fail(f"--racks {racks}: not with --stripes {stripes} / --engines {engines} "
                        "(the racks' engines are the spine-leaf tree)")
        if racks == 1 or plot_path is not None:
            raise _Fail(f"--racks {racks}: 2..4 racks, without --plot" if racks == 1 else
                        "--plot is not available with --racks")
        return run_racks(cfg, racks, pcap, json_path, _Fail)
    con = console()
    con.print(f"[bold]netreduce sim[/]: {jobs} x {workers} ranks x {size} B {dtype}, PMTU {pmtu}, "
              f"loss {loss:g} dup {dup:g} reorder {reorder:g}, seed {seed}, backend {backend}")
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        with Progress(TextColumn("all-reduce"), BarColumn(),
                      TextColumn("{task.percentage:>5.1f}%"), TimeElapsedColumn(), console=con,
                      transient=False) as prog:
            task = prog.add_task("all-reduce", total=1.0)
            run = run_sim(cfg, pcap=pcap, progress=lambda f: prog.update(task, completed=f))
    except BackendUnavailable as e:
        raise _Fail(str(e)) from None
    except OSError as e:  # pcap prefix in a missing directory, etc.
        raise _Fail(f"cannot write capture {pcap!r}: {e.strerror}") from None
    params = click.get_current_context().params
    argv = ["netreduce", "sim"]
    for k, v in params.items():
        if v is not None:
            name = k.replace("_path", "").replace("_", "-")
            if isinstance(v, bool):
                off = "--ack-fifo" if k == "ack_priority" else f"--no-{name}"
                argv.append(f"--{name}" if v else off)
            else:
                argv += [f"--{name}", str(v)]
    rep = report.build_report(run, command=shlex.join(argv))
    con.print(report.summary_table(rep))
    try:
        if json_path:
            report.write_json(rep, json_path)
            con.print(f"report: {json_path}")
        if plot_path:
            report.plot(rep, plot_path)
            con.print(f"plot: {plot_path}")
    except OSError as e:
        raise _Fail(f"cannot write {e.filename!r}: {e.strerror}") from None
    except ImportError as e:  # matplotlib is the optional extra "plot"
        raise _Fail(f"--plot needs matplotlib (pip install 'netreduce[plot]'): {e}") from None
    if run.capture is not None and run.capture.paths:
        con.print(f"capture: {run.capture.paths[0]} ({len(run.capture.ins)} RoCE frames), "
                  f"{run.capture.paths[1]} ({len(run.capture.outs)} RoCE frames)")
    if run.error is not None:
        con.print(f"[bold red]FAIL[/]: {run.error}")
        raise SystemExit(3)
    if not run.ok:
        why = [] if run.slots_left == 0 else [f"{run.slots_left} engine slots left allocated"]
        why += [f"group {c['group']}: {c['kind']} failed" for c in run.checks if not c["ok"]]
        con.print(f"[bold red]FAIL[/]: {'; '.join(why)}")
        raise SystemExit(1)
    con.print("[bold green]PASS[/]")
