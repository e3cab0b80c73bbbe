"""``netreduce regmap``: print the engine's register map as Markdown, Python, C or JSON."""

from __future__ import annotations

import json

import click

from netreduce.regmap import DEFAULT_PARAMS, build_regmap, c_header, python_module, to_dict
from netreduce.regmap import to_markdown as _md

_FORMATS = {
    "md": _md,
    "py": python_module,
    "c": c_header,
    "json": lambda rm: json.dumps(to_dict(rm), indent=1) + "\n",
}


@click.command()
@click.option("--format", "fmt", type=click.Choice(list(_FORMATS)), default="md",
              show_default=True, help="Markdown reference, Python constants, C header or JSON.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help=f"Build parameter ({', '.join(DEFAULT_PARAMS)}); repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of stdout.")
def regmap(fmt, params, output):
    """Generate the register map reference or driver constants from netreduce.regmap."""
    kw = {}
    for p in params:
        name, sep, value = p.partition("=")
        if not sep or not value.strip().isdigit():
            raise click.BadParameter(f"{p!r} is not NAME=INTEGER", param_hint="--param")
        kw[name.strip()] = int(value)
    try:
        rm = build_regmap(**kw)
    except (TypeError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--param") from None
    text = _FORMATS[fmt](rm)
    if output:
        with open(output, "w") as f:
            f.write(text)
    else:
        click.echo(text, nl=False)
