"""``netreduce verilog``: the board-agnostic engine top as one Verilog file.

The module ``netreduce_engine`` has P AXI-Stream RX/TX pairs (``s_axis_p<k>_*`` / ``m_axis_p<k>_*``,
``tuser`` bit 0 = error) and one AXI4-Lite port (``s_axil_*``), clock ``clk`` and synchronous
active-high reset ``rst``. With ``--info`` a JSON port map (widths, tuser fields, build
parameters, register-map digest) is written next to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from netreduce.cli._console import console, phases
from netreduce.regmap import DEFAULT_PARAMS, PMTU_VALUES, build_regmap


def _positive(name):
    def check(ctx, param, value):
        if value is not None and value < 1:
            raise click.BadParameter(f"{value} must be >= 1", param_hint=name)
        return value
    return check


@click.command()
@click.option("--ports", type=int, default=DEFAULT_PARAMS["ports"], show_default=True,
              callback=_positive("--ports"), help="Ethernet ports (AXI-Stream RX/TX pairs).")
@click.option("--jobs", type=int, default=DEFAULT_PARAMS["jobs"], show_default=True,
              callback=_positive("--jobs"), help="Job table entries.")
@click.option("--flows", type=int, default=DEFAULT_PARAMS["flows"], show_default=True,
              callback=_positive("--flows"), help="Flow table entries (shared by all jobs).")
@click.option("--slots", type=int, default=DEFAULT_PARAMS["slots"], show_default=True,
              callback=_positive("--slots"), help="Aggregation slots in the shared pool.")
@click.option("--pmtu", type=click.Choice([str(p) for p in PMTU_VALUES]),
              default=str(DEFAULT_PARAMS["pmtu_max"]), show_default=True,
              help="Largest PMTU a slot holds (bytes).")
@click.option("--width", type=click.Choice(["64", "128", "256", "512"]),
              default=str(DEFAULT_PARAMS["data_width"]), show_default=True,
              help="Datapath width (bits).")
@click.option("--max-world", type=int, default=DEFAULT_PARAMS["max_world"], show_default=True,
              callback=_positive("--max-world"), help="Largest world size N.")
@click.option("--max-frame", type=int, default=None,
              help="Largest frame kept whole, bytes (default 9216).")
@click.option("--clock-hz", type=int, default=DEFAULT_PARAMS["clock_hz"], show_default=True,
              callback=_positive("--clock-hz"),
              help="Core clock the design will run at (GLOBAL.CLOCK_HZ; the default is the clock "
                   "plan's, the clock the boards' shell runs the core at).")
@click.option("--name", default="netreduce_engine", show_default=True, help="Top module name.")
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Verilog file to write.")
@click.option("--info", "info", type=click.Path(dir_okay=False), default=None,
              help="Also write the JSON port map here.")
@click.option("--roles/--no-roles", default=False, show_default=True,
              help="Flow roles (spine-leaf leaf and spine engines, docs/spine-leaf.md); the slot "
                   "memory doubles.")
def verilog(ports, jobs, flows, slots, pmtu, width, max_world, max_frame, clock_hz, name, out,
            info, roles):
    """Write the engine top (board-agnostic core) as Verilog."""
    from netreduce.hw.engine import DEFAULT_MAX_FRAME, engine_verilog
    from netreduce.hw.verilog import ConversionError

    try:
        rm = build_regmap(ports=ports, jobs=jobs, flows=flows, slots=slots, pmtu_max=int(pmtu),
                          data_width=int(width), max_world=max_world, clock_hz=clock_hz)
        with phases(console()) as progress:
            top = engine_verilog(rm, out, name=name, progress=progress,
                                 max_frame=max_frame if max_frame else DEFAULT_MAX_FRAME,
                                 roles=roles)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e)) from None
    except ConversionError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"cannot write {out}: {e.strerror}") from None
    if info:
        d = top.info()
        d["params"] = dict(rm.params, roles=True) if roles else dict(rm.params)
        Path(info).write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")
    c = console()
    c.print(f"wrote {out}: module {name}, {len(top.verilog.splitlines())} lines; "
            f"streams {', '.join(s.prefix for s in top.streams)}; s_axil")
