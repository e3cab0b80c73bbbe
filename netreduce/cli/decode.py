"""``netreduce decode``: list the frames of a pcap file as RoCEv2."""

from __future__ import annotations

import click
from rich.table import Table

from netreduce.cli._console import console
from netreduce.wire import Opcode, WireError, ip_str, parse
from netreduce.wire.pcap import iter_pcap


@click.command()
@click.argument("pcap", type=click.Path(exists=True, dir_okay=False))
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most N frames.")
@click.option("--no-check", is_flag=True, help="Skip the IPv4 checksum and ICRC checks.")
def decode(pcap, limit, no_check):
    """Decode the RoCEv2 frames of PCAP (one row per frame; errors name the field)."""
    table = Table(title=pcap)
    for col in ("#", "time ns", "len", "src", "dst", "opcode", "QP", "PSN", "payload", "note"):
        table.add_column(col)
    bad = 0
    try:
        for n, rec in enumerate(iter_pcap(pcap)):
            if limit is not None and n >= limit:
                break
            try:
                f = parse(rec.data, check=not no_check)
            except WireError as e:
                bad += not e.not_roce
                table.add_row(str(n), str(rec.time_ns), str(len(rec.data)), "", "", "", "", "",
                              "", ("not RoCEv2: " if e.not_roce else "malformed: ") + str(e))
                continue
            try:
                name = Opcode(f.opcode).name
            except ValueError:
                name = hex(f.opcode)
            table.add_row(str(n), str(rec.time_ns), str(len(rec.data)), ip_str(f.src_ip),
                          ip_str(f.dst_ip), name, f"0x{f.dqpn:06x}", str(f.psn),
                          str(len(f.payload)), f"ECN {f.ecn}" if f.ecn else "")
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    console().print(table)
    if bad:
        raise SystemExit(1)
