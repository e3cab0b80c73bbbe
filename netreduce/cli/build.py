"""``netreduce build``: a complete Vivado project tree for a board (Vivado optional).

Writes Verilog, the Vivado Tcl flow with the CMAC IP creation, the XDC constraints, the build
script and a manifest to ``-o DIR`` (see :mod:`netreduce.hw.boards.project`); checks the tree
structurally; runs Vivado on it if ``vivado`` is on ``PATH`` (``--run`` / ``--no-run`` force it).
The default core is the engine with the board's build parameters
(:func:`netreduce.hw.boards.project.board_params`: with two cages, one contribution lane per
port); its Verilog is converted the first time
(26-39 s of CPU with a native Yosys, 59-113 s cold under a load average of 11-15, see
bench/results/verilog.json; then cached), with the phases shown on the status line.
"""

from __future__ import annotations

import shutil
import subprocess

import click
from rich.table import Table

from netreduce.cli._console import console, phases

BOARDS = ("vcu118", "vcu108")


def _ports(text):
    if text is None:
        return None
    try:
        ports = [int(p) for p in text.replace(" ", "").split(",") if p != ""]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of cage numbers",
                                 param_hint="--ports") from None
    if not ports:
        raise click.BadParameter("empty port list", param_hint="--ports")
    return ports


def _sites(items):
    out = {}
    for it in items:
        cage, sep, site = it.partition("=")
        if not sep or not cage.strip().isdigit() or not site.strip():
            raise click.BadParameter(f"{it!r} is not CAGE=SITE", param_hint="--cmac-site")
        out[int(cage)] = site.strip()
    return out


@click.command()
@click.option("--board", type=click.Choice(BOARDS), required=True, help="Target board.")
@click.option("--ports", default=None, metavar="LIST",
              help="QSFP28 cages to use, comma separated (default: every cage of the board).")
@click.option("-o", "--out", "out_dir", required=True,
              type=click.Path(file_okay=False, writable=True), help="Output directory.")
@click.option("--rs-fec/--no-rs-fec", default=None,
              help="RS-FEC in the CMAC (default: on for VCU118, off for VCU108).")
@click.option("--cmac-site", multiple=True, metavar="CAGE=SITE",
              help="Override the CMAC site of a cage (repeatable).")
@click.option("--core", default="engine", show_default=True, metavar="SPEC",
              help="Core in the shell: engine (the NetReduce engine with the board's build "
                   "parameters, its own Verilog file), engine-inline (one netlist), loopback, "
                   "loopback-lite (no register bank) or package.module:attr (called with "
                   "ports= / data_width= if it takes them).")
@click.option("--run/--no-run", default=None,
              help="Run Vivado on the tree (default: when vivado is on PATH).")
@click.option("--clean", is_flag=True, help="Delete the output directory first.")
def build(board, ports, out_dir, rs_fec, cmac_site, core, run, clean):
    """Write the Vivado project tree of BOARD (and run Vivado if it is installed)."""
    from netreduce.hw.boards.project import write_project
    from netreduce.hw.verilog import ConversionError

    con = console()
    try:
        with phases(con) as progress:
            proj = write_project(board, out_dir, ports=_ports(ports), rs_fec=rs_fec,
                                 cmac_site=_sites(cmac_site), core=core, clean=clean,
                                 progress=progress)
    except (ValueError, ConversionError) as e:
        raise click.ClickException(str(e)) from None

    t = Table(title=f"netreduce build: {board} ({proj.part})")
    t.add_column("file")
    t.add_column("bytes", justify="right")
    for path, text in sorted(proj.files.items()):
        t.add_row(path, str(len(text.encode())))
    con.print(t)
    params = proj.manifest.get("core_params") or {}
    extra = (" (" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")") if params \
        else ""
    con.print(f"core: {proj.manifest['core']}{extra}, ports (QSFP28 cages): {proj.ports}, "
              f"MAC IP: {proj.manifest['cmac_ip']}")
    for note in proj.manifest["unconfirmed"]:
        con.print(f"[yellow]unconfirmed:[/yellow] {note}")
    con.print(f"structural checks: [green]passed[/green]; project in {proj.out_dir}")

    vivado = shutil.which("vivado")
    if run is None:
        run = vivado is not None
    if not run:
        con.print("vivado not run (not on PATH or --no-run): "
                  f"run {proj.out_dir}/build_netreduce_top.sh where Vivado is installed")
        return
    if vivado is None:
        raise click.ClickException("--run given but vivado is not on PATH")
    con.print(f"running Vivado ({vivado}) ...")
    r = subprocess.run(["sh", "build_netreduce_top.sh"], cwd=proj.out_dir)
    if r.returncode:
        raise click.ClickException(f"Vivado flow failed (exit {r.returncode}); see "
                                   f"{proj.out_dir}/netreduce_top.log")
    con.print(f"[green]bitstream:[/green] {proj.out_dir}/netreduce_top.bit")
