"""``netreduce switch``: the switch service, a long-running process (see netreduce.sim.emu.switch).

Workers (software RNICs through ``netreduce.sim.emu.tunnel``, or QEMU VMs with
``-netdev socket,id=n0,connect=HOST:PORT``) connect over TCP; the engine sits on every frame's
path. SIGINT/SIGTERM stop it cleanly; it then prints its counters (and writes them as JSON with
``--stats-json``). Exit status 0 after a clean stop, 2 on bad options or when it cannot listen
(or Verilator is missing, with ``--backend verilator``), 1 when the RTL build fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path

import click

from netreduce.cli._console import console

_PROB = click.FloatRange(0.0, 0.99)
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def _ip(text: str) -> int:
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        raise click.BadParameter(f"{text!r} is not a dotted IPv4 address")
    return int.from_bytes(bytes(int(p) for p in parts), "big")


@click.command()
@click.option("--listen", "-l", default="127.0.0.1:7000", show_default=True,
              help="HOST:PORT to accept workers on (port 0: any free port, see --port-file).")
@click.option("--backend", type=click.Choice(["model", "verilator"]), default="model",
              show_default=True, help="The engine on the path: the bit-exact reference model, "
              "or the engine RTL under Verilator (built on first use, then cached).")
@click.option("--ports", "-p", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Engine Ethernet ports; connection i enters port i mod P.")
@click.option("--jobs", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Engine job table size.")
@click.option("--flows", type=click.IntRange(1, 65535), default=256, show_default=True,
              help="Engine flow table size.")
@click.option("--slots", type=click.IntRange(1, 1 << 24), default=1024, show_default=True,
              help="Aggregation slots in the engine's pool.")
@click.option("--max-world", type=click.IntRange(1, 65535), default=64, show_default=True,
              help="Largest world size N the engine takes.")
@click.option("--pmtu-max", type=click.Choice(["256", "512", "1024", "2048", "4096"]),
              default="4096", show_default=True, help="Largest PMTU a slot holds.")
@click.option("--data-width", type=click.Choice(["64", "128", "256", "512"]), default="512",
              show_default=True, help="RTL datapath width in bits (verilator; 64 builds in a "
              "fraction of the time of 512, same behaviour).")
@click.option("--up-loss", type=_PROB, default=0.0, help="Loss probability into the engine.")
@click.option("--up-dup", type=_PROB, default=0.0, help="Duplication probability into the engine.")
@click.option("--up-reorder", type=_PROB, default=0.0,
              help="Reordering probability into the engine.")
@click.option("--down-loss", type=_PROB, default=0.0, help="Loss probability towards workers.")
@click.option("--down-dup", type=_PROB, default=0.0,
              help="Duplication probability towards workers.")
@click.option("--down-reorder", type=_PROB, default=0.0,
              help="Reordering probability towards workers.")
@click.option("--reorder-ms", type=click.FloatRange(0, 10_000), default=2.0, show_default=True,
              help="A reordered frame is held back up to this long.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Seed of the fault injection.")
@click.option("--pcap", "pcap", metavar="PREFIX", default=None,
              help="Capture to PREFIX.in.pcap (into the engine) and PREFIX.out.pcap (out of it).")
@click.option("--mgmt-ip", default="10.255.255.254", show_default=True,
              help="The engine's management IPv4 address.")
@click.option("--mgmt-source", "mgmt_sources", multiple=True, default=("10.255.255.1",),
              show_default=True, help="IPv4 allowed to send management requests (repeatable).")
@click.option("--mgmt-key", default=None, metavar="HEX32",
              help="16-byte SipHash key (32 hex digits): management requests must be tagged.")
@click.option("--port-file", type=click.Path(dir_okay=False), default=None,
              help="Write the TCP port actually bound to this file once listening.")
@click.option("--stats-json", type=click.Path(dir_okay=False), default=None,
              help="Write the counters as JSON here on shutdown.")
@click.option("--verbose", "-v", count=True, help="-v: debug logs of the service.")
@click.option("--quiet", "-q", is_flag=True, help="Warnings and errors only.")
def switch(listen, backend, ports, jobs, flows, slots, max_world, pmtu_max, data_width, up_loss,
           up_dup, up_reorder, down_loss, down_dup, down_reorder, reorder_ms, seed, pcap, mgmt_ip,
           mgmt_sources, mgmt_key, port_file, stats_json, verbose, quiet):
    """Play the switch with the NetReduce engine on its path (QEMU socket framing over TCP).

    A small L2 switch with MAC learning: every frame from a worker enters the engine, every frame
    the engine emits goes to the worker owning its destination MAC. Jobs and flows are registered
    through the register map over the in-band management protocol. Runs until SIGINT/SIGTERM,
    then prints its counters.

    With --backend verilator the engine is the RTL (netreduce.hw.engine) under Verilator: the
    first run of a parameter set elaborates and compiles it (minutes at 512 bits, cached after);
    its own management path answers the management frames; the RTL runs only while it has
    frames (its cycles are not the wall clock).
    """
    from netreduce.sim.backend import open_engine
    from netreduce.sim.emu.switch import COUNTER_HELP, FaultConfig, SwitchConfig, SwitchService
    from netreduce.sim.emu.tunnel import parse_address

    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format=LOG_FORMAT)
    log = logging.getLogger("netreduce.switch")
    try:
        host, port = parse_address(listen)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen") from None
    from netreduce.regmap import build_regmap

    params = dict(ports=ports, jobs=jobs, flows=flows, slots=slots, max_world=max_world,
                  pmtu_max=int(pmtu_max), data_width=int(data_width))
    try:
        build_regmap(**params)
    except ValueError as e:
        raise click.UsageError(f"engine build parameters: {e}") from None
    key = None
    if mgmt_key is not None:
        try:
            key = bytes.fromhex(mgmt_key)
        except ValueError:
            key = b""
        if len(key) != 16:
            raise click.BadParameter(f"{mgmt_key!r} is not 32 hex digits", param_hint="--mgmt-key")
    cfg = SwitchConfig(host=host, port=port, seed=seed, pcap=pcap,
                       up=FaultConfig(up_loss, up_dup, up_reorder, reorder_ms),
                       down=FaultConfig(down_loss, down_dup, down_reorder, reorder_ms),
                       mgmt_ip=_ip(mgmt_ip), mgmt_sources=tuple(_ip(s) for s in mgmt_sources),
                       mgmt_key=key)
    help_ = dict(COUNTER_HELP)
    if backend == "verilator":
        engine = _rtl_engine(params, seed, log)
        from netreduce.sim.rtl.switch_engine import RTL_COUNTER_HELP

        help_.update(RTL_COUNTER_HELP)
    else:
        engine = open_engine("model", params)
    try:
        svc = SwitchService(engine, cfg)
    except ValueError as e:  # e.g. more management sources than the allow-list holds
        raise click.UsageError(str(e)) from None

    async def main() -> dict:
        try:
            addr = await svc.start()
        except OSError as e:
            log.error("cannot listen on %s:%d: %s", host, port, e)
            raise SystemExit(2) from None
        if port_file:
            Path(port_file).write_text(f"{addr[1]}\n")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda s=sig: (log.info("%s: shutting down",
                                                                 signal.Signals(s).name),
                                                        stop.set()))
        await stop.wait()
        return await svc.stop()

    try:
        counters = asyncio.run(main())
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    if stats_json:
        Path(stats_json).write_text(json.dumps(counters, indent=1, sort_keys=True) + "\n")
    from rich.table import Table

    table = Table(title="netreduce switch counters", show_header=True)
    table.add_column("counter", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_column("meaning")
    for k, v in counters.items():
        if v or not k.startswith("engine."):
            table.add_row(k, str(v), help_.get(k, ""))
    console().print(table)


def _rtl_engine(params: dict, seed: int, log):
    """The RTL adapter for ``params``; a one-line error (exit 2) when it cannot be built."""
    from netreduce.sim.backend import BackendUnavailable, BuildFailed, probe_backend

    try:
        probe_backend("verilator", need_engine=False)
    except BackendUnavailable as e:
        raise click.UsageError(f"--backend verilator: {str(e).split(': ', 1)[1]}") from None
    from netreduce.sim.rtl.switch_engine import RtlSwitchEngine

    log.info("backend verilator: engine RTL %s; the first run of these parameters elaborates "
             "and compiles it (minutes at 512 bits), later runs reuse the build",
             ", ".join(f"{k} {v}" for k, v in params.items()))
    t0 = time.monotonic()
    try:
        eng = RtlSwitchEngine(**params, seed=seed)
    except BuildFailed as e:
        log.error("%s", e.log)
        raise click.ClickException(f"the RTL build failed: {str(e).split('failed: ', 1)[1]}"
                                   ) from None
    except BackendUnavailable as e:  # netreduce.hw.engine missing
        raise click.UsageError(f"--backend verilator: {str(e).split(': ', 1)[1]}") from None
    log.info("engine RTL ready in %.1f s (%s)", time.monotonic() - t0, eng.sim.lib_path)
    return eng
