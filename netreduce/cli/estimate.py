"""``netreduce estimate``: Yosys ``synth_xilinx`` resource and logic-depth estimates.

Runs :func:`netreduce.hw.estimate.estimate_design` on one or more designs (default: ``core``,
the engine that sits in the board shell, estimated block by block and summed) and prints LUT /
FF / CARRY / DSP / BRAM36 / URAM use against the device of the family (``xcup``: the VCU118's
xcvu9p; ``xcu``: the VCU108's xcvu095) and the logic depth (longest path in LUT / carry / mux
cells between registers). Writes the figures as JSON. Results are cached by the digest of each
block's RTLIL (``~/.cache/netreduce``), so a rerun is instant; the first run of a 512-bit engine
takes an hour or more of Yosys (``bench/estimate.py`` records the reference figures).
"""

from __future__ import annotations

import sys

import click
from rich.table import Table

from netreduce.cli._console import console

FAMILY_BOARD = {"xcup": "vcu118", "xcu": "vcu108"}


@click.command()
@click.option("--design", "designs", multiple=True, metavar="NAME",
              help="Design to estimate (repeatable): core (the engine), control, flowtable, "
                   "slotmem, hstore, parser, deparser, bank, lanes, loopback, rxfifo, lbus_rx, "
                   "or package.module:attr. Default: core.")
@click.option("--family", type=click.Choice(sorted(FAMILY_BOARD)), default="xcup",
              show_default=True, help="xcup = Virtex UltraScale+ (xcvu9p), xcu = UltraScale "
                                      "(xcvu095).")
@click.option("--data-width", type=int, default=512, show_default=True, help="Beat width.")
@click.option("--ports", type=int, default=1, show_default=True, help="Core ports.")
@click.option("--slots", type=int, default=1024, show_default=True, help="Slots.")
@click.option("--pmtu-max", type=int, default=4096, show_default=True, help="Largest PMTU.")
@click.option("--jobs", type=int, default=None, help="Jobs (engine; default: the register "
                                                      "map's).")
@click.option("--flows", type=int, default=None, help="Flows (engine; default: the map's).")
@click.option("--max-world", type=int, default=None, help="Largest world size (engine).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True),
              default="estimate.json", show_default=True, help="Where to write the figures.")
@click.option("--timeout", type=float, default=3600, show_default=True,
              help="Seconds allowed per Yosys run.")
def estimate(designs, family, data_width, ports, slots, pmtu_max, jobs, flows, max_world,
             json_path, timeout):
    """Estimate FPGA resources and logic depth of NetReduce gateware with Yosys."""
    from netreduce.hw.boards.project import platform_for
    from netreduce.hw.estimate import DESIGNS, YosysError, estimate_design, write_json

    con = console()
    cap = type(platform_for(FAMILY_BOARD[family])).capacity
    params = {"data_width": data_width, "ports": ports, "slots": slots, "pmtu_max": pmtu_max}
    for k, v in (("jobs", jobs), ("flows", flows), ("max_world", max_world)):
        if v is not None:
            params[k] = v
    results = []
    for name in designs or ("core",):
        if name not in DESIGNS and ":" not in name:
            raise click.BadParameter(f"unknown design {name!r}: use one of {sorted(DESIGNS)} "
                                     f"or 'package.module:attr'", param_hint="--design")
        con.print(f"synthesising {name} ({data_width}-bit, {family}) ...")

        def progress(label, r, name=name):
            if isinstance(r, str):
                con.print(f"  {name}/{label}: [red]failed[/red]")
            else:
                con.print(f"  {name}/{label}: LUT {r.resources['LUT']:g}, depth "
                          f"{r.logic_depth}, LUT levels {r.lut_levels} + CARRY8 "
                          f"{r.carry_levels} ({r.seconds:.0f} s)")
        try:
            total, blocks = estimate_design(name, family=family, capacity=cap,
                                            timeout=timeout, progress=progress, **params)
        except (ValueError, TypeError) as e:
            raise click.BadParameter(str(e), param_hint="--design") from None
        except YosysError as e:
            raise click.ClickException(str(e)) from None
        results.append(total)
        results += [b for b in blocks.values() if not isinstance(b, str)]

    t = Table(title=f"Yosys synth_xilinx -family {family}: use of {cap.part}")
    t.add_column("design")
    for col in ("LUT", "FF", "CARRY", "DSP", "BRAM36", "URAM"):
        t.add_column(col, justify="right")
    t.add_column("depth", justify="right")
    t.add_column("LUT lv", justify="right")
    t.add_column("carry", justify="right")
    t.add_column("s", justify="right")
    for e in results:
        row = [e.design]
        for col in ("LUT", "FF", "CARRY", "DSP", "BRAM36", "URAM"):
            used = e.resources[col]
            pct = e.utilisation.get(col)
            used_s = f"{used:g}"
            row.append(used_s if pct is None else f"{used_s} ({pct:.2f}%)")
        row += [str(e.logic_depth), str(e.lut_levels), str(e.carry_levels), f"{e.seconds:.0f}"]
        t.add_row(*row)
    t.add_row("device", *[f"{v:,}" for v in (cap.lut, cap.ff, cap.carry8, cap.dsp, cap.bram36,
                                             cap.uram)], "", "", "", "")
    con.print(t)
    con.print(f"{results[0].yosys}; depth = logic cells on the longest register-to-register "
              "path; LUT lv = LUT/MUXF cells on the worst path, carry = CARRY8 on it (budget at "
              "the 250 MHz core clock: 8 + 8, docs/engine.md). Vivado's figures will differ; "
              "Fmax needs Vivado.")
    write_json(results, json_path, command="netreduce estimate " + " ".join(sys.argv[2:]))
    con.print(f"JSON: {json_path}")
