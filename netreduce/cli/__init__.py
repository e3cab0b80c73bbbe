"""The ``netreduce`` command line: glue only (docs/design.md section 9).

Each subcommand lives in its own module and is imported only when it runs, so ``--help`` stays fast
and a command's heavy imports (Amaranth, cocotb) never slow the others down.
"""

from __future__ import annotations

import importlib

import click

from netreduce import __version__

# name -> (module, attribute, one-line help). Keep in the order --help should show.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("netreduce.cli.demo", "demo", "All-reduce through the engine RTL on a lossy net."),
    "sim": ("netreduce.cli.sim", "sim", "All-reduce of N RC endpoints through the engine; report."),
    "switch": ("netreduce.cli.switch", "switch", "Switch service: the engine on a loopback L2 "
               "switch."),
    "vmlab": ("netreduce.cli.vmlab", "vmlab", "Soft-RoCE QEMU VMs all-reducing via the engine."),
    "replay": ("netreduce.cli.replay", "replay", "Replay a pcap through the engine after "
               "programming a job file."),
    "decode": ("netreduce.cli.decode", "decode", "Decode the RoCEv2 frames of a pcap file."),
    "regs": ("netreduce.cli.regs", "regs", "Register reference (docs/registers.md) from the map."),
    "verilog": ("netreduce.cli.verilog", "verilog", "Engine top (board-agnostic core) as "
                "Verilog."),
    "build": ("netreduce.cli.build", "build", "Vivado project tree for a board (VCU118/VCU108)."),
    "estimate": ("netreduce.cli.estimate", "estimate", "Yosys resource and logic-depth estimate."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        mod, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="netreduce")
def main():
    """NetReduce: in-network all-reduce inside standard RoCEv2 reliable connections."""


__all__ = ["main", "COMMANDS"]
