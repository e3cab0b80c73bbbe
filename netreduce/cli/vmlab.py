"""``netreduce vmlab``: real soft-RoCE peers in QEMU VMs, all-reducing through the engine.

``netreduce vmlab build`` builds (or shows) the cached guest image from Debian packages;
``netreduce vmlab run --workers N`` boots N VMs, runs the all-reduce with the verbs backend
inside them through the switch service (``--backend model``: the reference engine;
``--backend verilator``: the engine RTL, a 64-bit build) and checks every result bit-exactly (see
:mod:`netreduce.sim.vmlab.lab`). Exit status: 0 all bit-exact, 1 any mismatch, guest error,
invalid ICRC or hang (the report says which), 2 when the lab cannot run on this host.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from netreduce.cli._console import console


@click.group()
def vmlab():
    """Linux soft-RoCE (rdma_rxe) in QEMU VMs through the engine: correctness, not speed."""


@vmlab.command()
@click.option("--cache", type=click.Path(file_okay=False), default=None,
              help="Image cache (default $NETREDUCE_CACHE/vmlab, ~/.cache/netreduce/vmlab).")
@click.option("--force", is_flag=True, help="Rebuild even when a cached image exists.")
def build(cache, force):
    """Build the guest image (debootstrap bookworm + rdma-core, pyverbs, perftest; cached)."""
    from netreduce.sim.vmlab.image import ImageError, build_image, ensure_image, host_problems

    con = console()
    probs = host_problems(build=True)
    if probs:
        con.print(f"[red]cannot build the image here:[/] {'; '.join(probs)}")
        raise SystemExit(2)
    try:
        img = (build_image if force else ensure_image)(Path(cache) if cache else None,
                                                      log=con.print)
    except ImageError as e:
        con.print(f"[red]{e}[/]")
        raise SystemExit(1) from None
    m = img.manifest
    con.print(f"image {img.dir}: guest kernel {m['kernel_version']}, built {m['built_at']} in "
              f"{m['build_s']:.0f} s, root {m['root_used_mb']:.0f} MB used")


@vmlab.command()
@click.option("--workers", "-n", type=click.IntRange(2, 16), default=2, show_default=True,
              help="Number of VMs (ranks); 4 is the practical ceiling on 2 cores.")
@click.option("--backend", type=click.Choice(["model", "verilator"]), default="model",
              show_default=True, help="The engine in the switch service: the reference model or "
              "the engine RTL under Verilator (64-bit datapath; built on first use, cached).")
@click.option("--loss", type=click.FloatRange(0.0, 0.49), default=0.0, show_default=True,
              help="Seeded loss probability per frame, towards and from the engine.")
@click.option("--pmtu", type=click.Choice(["1024", "4096"]), default="1024", show_default=True,
              help="Path MTU (netdev MTU 1500 or 4200).")
@click.option("--pcap", metavar="PREFIX", default=None,
              help="Keep the captures as PREFIX.in.pcap / PREFIX.out.pcap.")
@click.option("--elems", type=click.IntRange(1, 1 << 24), default=64 * 1024,
              show_default=True, help="int32 elements per rank.")
@click.option("--seed", type=int, default=1, show_default=True, help="Data and fault seed.")
@click.option("--icrc-control", is_flag=True,
              help="Control experiment: one result payload is rewritten with a stale ICRC.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(10, 24 * 3600), default=900,
              show_default=True, help="Watchdog over the whole run (seconds).")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Run folder (share, consoles, captures, report.json); default a temp dir.")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Also write the report JSON here.")
def run(workers, backend, loss, pmtu, pcap, elems, seed, icrc_control, timeout_s, run_dir,
        report):
    """Boot N VMs, all-reduce with the verbs backend through the engine, check bit-exactly."""
    from netreduce.sim.vmlab.image import ImageError
    from netreduce.sim.vmlab.lab import LabConfig, lab_problems, run_lab

    con = console()
    if backend == "verilator":
        from netreduce.sim.rtl.fastsim import verilator_missing

        reason = verilator_missing()
        if reason:
            con.print(f"[red]--backend verilator: {reason} (use --backend model)[/]")
            raise SystemExit(2)
    probs = lab_problems()
    if probs:
        con.print(f"[red]the VM lab cannot run here:[/] {'; '.join(probs)}")
        raise SystemExit(2)
    cfg = LabConfig(workers=workers, backend=backend, loss=loss, pmtu=int(pmtu), pcap=pcap,
                    elems=elems, seed=seed, icrc_control=icrc_control, timeout_s=timeout_s,
                    run_dir=run_dir)
    try:
        res = run_lab(cfg, log=con.print)
    except (ImageError, RuntimeError) as e:
        con.print(f"[red]{e}[/]")
        raise SystemExit(2) from None
    if report:
        Path(report).write_text(json.dumps(res.report, indent=1, default=str) + "\n")
    from rich.table import Table

    t = Table(title=f"vmlab: {workers} VMs, backend {backend}, loss {loss:g}, PMTU {pmtu}")
    t.add_column("figure", no_wrap=True)
    t.add_column("value", justify="right")
    for k, v in res.report["figures"].items():
        t.add_row(k, f"{v:.1f}" if isinstance(v, float) else str(v))
    con.print(t)
    if res.ok:
        con.print(f"[green]OK[/]: every guest's result is bit-exact ({res.run_dir}/report.json)")
    else:
        con.print(f"[red]FAILED[/] ({res.run_dir}/report.json):")
        for p in res.problems:
            con.print(f"  - {p}")
        raise SystemExit(1)
