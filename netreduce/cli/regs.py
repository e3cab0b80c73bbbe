"""``netreduce regs``: the register reference, generated from the register map.

Prints the map (:func:`netreduce.regmap.build_regmap`) for a set of build parameters as Markdown
(default; ``docs/registers.md`` is this output for the default parameters), JSON, a Python
constants module or a C header. One option per build parameter, named after
:data:`netreduce.regmap.DEFAULT_PARAMS`. ``--check FILE`` compares instead of printing (exit 1 with
a diff when FILE is stale), so CI can keep generated files honest.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import click

from netreduce.regmap import (
    DEFAULT_PARAMS,
    build_regmap,
    c_header,
    python_module,
    to_dict,
    to_markdown,
)

FORMATS = {
    "markdown": to_markdown,
    "json": lambda rm: json.dumps(to_dict(rm), indent=2) + "\n",
    "python": python_module,
    "c": c_header,
}


def render(fmt: str = "markdown", **params) -> str:
    """The text ``netreduce regs`` prints (parameters left at None take their defaults)."""
    given = {k: v for k, v in params.items() if v is not None}
    return FORMATS[fmt](build_regmap(**given))


def _param_options(f):
    for name, default in reversed(DEFAULT_PARAMS.items()):
        f = click.option(f"--{name.replace('_', '-')}", name, type=int, default=None,
                         metavar="N", help=f"Build parameter {name} (default {default}).")(f)
    return f


@click.command()
@click.option("--format", "-f", "fmt", type=click.Choice(list(FORMATS)), default="markdown",
              show_default=True, help="Output format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of standard output.")
@click.option("--check", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Compare with this file instead of printing; exit 1 if it differs.")
@_param_options
def regs(fmt, output, check, **params):
    """Print the register map reference for a set of build parameters."""
    try:
        text = render(fmt, **params)
    except (TypeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if check is not None:
        have = Path(check).read_text()
        if have != text:
            diff = difflib.unified_diff(have.splitlines(True), text.splitlines(True),
                                        f"{check} (committed)", "generated")
            click.echo("".join(diff), nl=False)
            args = ([] if fmt == "markdown" else ["-f", fmt]) + [
                f"--{k.replace('_', '-')} {v}" for k, v in params.items() if v is not None]
            raise click.ClickException(f"{check} is stale: regenerate it with "
                                       f"`netreduce regs {' '.join(args + ['-o', check])}`")
        click.echo(f"{check} is up to date")
        return
    if output is not None:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)
