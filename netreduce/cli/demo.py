"""``netreduce demo``: an all-reduce of N software RC endpoints through the NetReduce engine.

Every rank is a software RNIC (rxe behaviour) on a seeded lossy network; the engine sits in the
middle: by default its RTL (the 512-bit engine top on Verilator, registers programmed over
AXI4-Lite by the driver), else the bit-exact reference model. The command checks the result
(int32: bit-exact; float32: within the quantisation bound), prints traffic, recovery and engine
counters, and exits non-zero on any mismatch, any RC error or hang, or any engine slot left
allocated.

RTL backend
    The engine is built for the demo's configuration by :func:`demo_rtl_params`: one Ethernet
    port (every rank reaches the engine through it, as behind a switch), the flow table and slot
    pool that one all-reduce of N ranks needs, 512-bit datapath (the real design). The first run
    of a configuration converts it (Amaranth -> Verilog, cached outside the tree) and verilates
    it (cached under ``build/fastsim``): minutes, announced on the terminal; later runs reuse
    both. When Verilator cannot run here (missing tool, failed build, no engine top), the demo
    says so in one line and runs on the model. ``NETREDUCE_DEMO_RTL_PARAMS`` (a JSON object of
    build parameters, e.g. ``{"data_width": 64}``) overrides the build for tests only.
"""

from __future__ import annotations

import json
import os
import re
import time

import click
import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from netreduce.cli._console import console
from netreduce.regmap import CLOCK_HZ

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}
MAX_SIZE = 256 * 1024**2
MAX_TOTAL = 1024**3  # all ranks together: inputs, receive regions and results stay in memory


def parse_size(text: str) -> int:
    """'1MiB', '64k', '4096' -> bytes (ValueError with the offending text otherwise)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read size {text!r} (examples: 4096, 64KiB, 1MiB)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


class _Size(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            n = value
        else:
            try:
                n = parse_size(value)
            except ValueError as e:
                self.fail(str(e), param, ctx)
        if n < 4 or n % 4 or n > MAX_SIZE:
            self.fail(f"{value!r} = {n} B: need a multiple of 4 bytes in 4..{MAX_SIZE}", param,
                      ctx)
        return n


_PROB = click.FloatRange(0.0, 0.5)


@click.command()
@click.option("--workers", "-n", type=click.IntRange(2, 64), default=4, show_default=True,
              help="Number of ranks.")
@click.option("--size", "-s", type=_Size(), default="1MiB", show_default=True,
              help="Bytes per rank (multiple of 4; e.g. 1MiB, 300000).")
@click.option("--dtype", type=click.Choice(["float32", "int32"]), default="float32",
              show_default=True)
@click.option("--pmtu", type=click.Choice(["256", "512", "1024", "2048", "4096"]), default="1024",
              show_default=True)
@click.option("--loss", type=_PROB, default=0.01, show_default=True,
              help="Per-frame loss probability on every link and direction.")
@click.option("--dup", type=_PROB, default=0.0, show_default=True,
              help="Per-frame duplication probability on every link and direction.")
@click.option("--reorder", type=_PROB, default=0.0, show_default=True,
              help="Per-frame reordering probability on every link and direction.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=1, show_default=True)
@click.option("--backend", type=click.Choice(["verilator", "model"]), default="verilator",
              show_default=True,
              help="What sits in the middle: the engine RTL on Verilator (falls back to the "
                   "model when Verilator cannot run here), or the bit-exact reference model.")
def demo(workers, size, dtype, pmtu, loss, dup, reorder, seed, backend):
    """All-reduce SIZE bytes on each of N ranks through the NetReduce engine.

    The engine is its RTL on Verilator (first run: a build of minutes, then cached) or the
    reference model. The ranks are software RoCEv2 RC endpoints that behave like Linux soft-RoCE,
    on links that lose, duplicate and reorder frames (seeded). Exit status 1 on any wrong result,
    RC error, hang or engine slot left allocated.
    """
    from netreduce.sim.backend import open_engine
    from netreduce.sim.net.collective import CollectiveConfig, Communicator
    from netreduce.sim.net.model_fabric import ModelFabric
    from netreduce.sim.net.network import NetConfig
    from netreduce.sim.net.rnic import RCError
    from netreduce.sim.net.scheduler import SimulationHang
    from netreduce.sw_driver.control import EngineControl

    if workers * size > MAX_TOTAL:
        raise click.UsageError(f"--workers {workers} x --size {size} B = {workers * size} B is "
                               f"more than the {MAX_TOTAL} B an in-process run holds")
    con = console()
    pmtu = int(pmtu)
    n = size // 4
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        xs = [rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
              for _ in range(workers)]
    else:
        # gradients: normal values with per-rank magnitudes spanning 6 decades
        xs = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
              for _ in range(workers)]
    overrides = _test_overrides()
    net = NetConfig.faulty(loss=loss, dup=dup, reorder=reorder)
    fabric = None
    if backend == "verilator":
        fabric = _rtl_fabric(con, workers, pmtu, seed, net, overrides)
        if fabric is None:
            backend = "model"
    if fabric is None:
        fabric = ModelFabric(open_engine("model", {}), net=net, seed=seed)
    cfg = CollectiveConfig(pmtu=pmtu)
    comm = Communicator(fabric, workers, cfg, seed=seed)
    if hasattr(fabric, "rank_of_mac"):
        for r, rn in enumerate(comm.rnics):
            fabric.rank_of_mac[rn.mac] = r
    what = ("engine RTL on Verilator, " + _params_text(fabric.rtl_params)
            if backend == "verilator" else "reference model")
    con.print(f"[bold]NetReduce demo[/]: {workers} ranks x {size} B {dtype}, PMTU {pmtu}, "
              f"loss {loss:g} dup {dup:g} reorder {reorder:g} on every link, seed {seed}, "
              f"engine: {what}")
    t0 = time.perf_counter()
    failed = None
    with Progress(TextColumn("all-reduce"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                  TimeElapsedColumn(), console=con, transient=False) as prog:
        task = prog.add_task("all-reduce", total=1.0)
        try:
            res = comm.allreduce(xs, progress=lambda f: prog.update(task, completed=f))
        except (RCError, SimulationHang) as e:
            failed = e
    wall = time.perf_counter() - t0
    if failed is not None:
        con.print(f"[bold red]FAILED[/]: {type(failed).__name__}: {failed}")
        _close(fabric)
        raise SystemExit(1)

    ok = True
    rows: list[tuple[str, str]] = []
    if dtype == "int32":
        ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
        bad = [r for r, y in enumerate(res.results) if not np.array_equal(y, ref)]
        ok &= not bad
        rows.append(("result (int32, bit-exact)", "[green]all ranks exact[/]" if not bad else
                     f"[red]MISMATCH on ranks {bad}[/]"))
    else:
        ref = np.sum(np.array(xs, dtype=np.float64), axis=0)
        bound = res.error_bound()
        worst = max(float(np.max(np.abs(y.astype(np.float64) - ref) / bound))
                    for y in res.results)
        same = all(np.array_equal(y, res.results[0]) for y in res.results)
        err = max(float(np.max(np.abs(y.astype(np.float64) - ref))) for y in res.results)
        ok &= worst <= 1.0 and same
        rows.append(("result (float32 vs float64 sum)",
                     f"{'[green]' if worst <= 1 and same else '[red]'}max |err| {err:.3g}, "
                     f"worst err/bound {worst:.3f}{'' if same else ', ranks differ'}[/]"))
    st = res.stats
    rows += [
        ("engine", "RTL (Verilator)" if backend == "verilator" else "reference model"),
        ("wall time", f"{wall:.2f} s"),
        ("simulated time", f"{fabric.now() / 1e3:.1f} us"),
    ]
    if backend == "verilator":
        sim = fabric.sim
        rows.append((f"RTL cycles simulated (at {CLOCK_HZ / 1e6:g} MHz)",
                     f"{sim.cycle} ({sim.cycle / wall:,.0f} cycles/s wall)"))
    rows += [
        ("frames out / in (endpoints)", f"{st['frames_out']} / {st['frames_in']}"),
        ("data packets sent / retransmitted", f"{st['sent']} / {st['retransmitted']}"),
        ("NAKs sent / received", f"{st['naks_sent']} / {st['naks_received']}"),
        ("retransmit timeouts", str(st["timeouts"])),
        ("duplicates re-ACKed", str(st["duplicates"])),
    ]
    for d, c in fabric.link_stats().items():
        rows.append((f"links {d}: frames lost/dup/reordered",
                     f"{c['frames']}: {c['lost']} / {c['duplicated']} / {c['reordered']}"))
    for name, v in sorted(st["engine"].items()):
        if v:
            rows.append((f"engine {name}", str(v)))
    ctrl = EngineControl(fabric.bus)
    left = st["slots_left"] + ctrl.slots_in_use()
    ok &= left == 0
    for name, v in sorted(ctrl.counters().items()):
        if v and name not in st["engine"]:
            rows.append((f"engine (global) {name}", str(v)))
    rows.append(("slots left allocated", "[green]0[/]" if left == 0 else f"[red]{left}[/]"))
    _close(fabric)
    table = Table(title="NetReduce demo summary", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for k, v in rows:
        table.add_row(k, v)
    con.print(table)
    con.print("[bold green]PASS[/]" if ok else "[bold red]FAIL[/]")
    if not ok:
        raise SystemExit(1)


# ------------------------------------------------------------------------------- RTL backend
OVERRIDE_ENV = "NETREDUCE_DEMO_RTL_PARAMS"


def demo_rtl_params(workers: int, pmtu: int, overrides: dict | None = None) -> dict:
    """Engine build parameters for the demo: :func:`~netreduce.sim.rtl.fabric.rtl_params` of a
    one-port run of ``workers`` ranks (flow table and slot pool as small as one all-reduce
    allows; powers of two, so similar runs share a build), 512-bit datapath; ``overrides``
    replace entries (tests: a 64-bit engine)."""
    from netreduce.sim.net.simrun import SimConfig
    from netreduce.sim.rtl.fabric import rtl_params

    return {**rtl_params(SimConfig(workers=workers, pmtu=pmtu, ports=1)), **(overrides or {})}


def _test_overrides() -> dict:
    text = os.environ.get(OVERRIDE_ENV)
    if not text:
        return {}
    try:
        d = json.loads(text)
    except ValueError as e:
        raise click.UsageError(f"{OVERRIDE_ENV}: not JSON ({e})") from None
    if not isinstance(d, dict) or not all(isinstance(v, int) for v in d.values()):
        raise click.UsageError(f"{OVERRIDE_ENV}: want a JSON object of integer build "
                               f"parameters, got {text!r}")
    return d


def _params_text(p: dict) -> str:
    return (f"{p['data_width']}-bit, {p['ports']} port{'s' if p['ports'] > 1 else ''}, "
            f"{p['slots']} slots x {p['pmtu_max']} B, {p['flows']} flows")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _fallback(con, why: str) -> None:
    # soft_wrap: one line whatever its length (the terminal wraps it, rich does not split it)
    con.print(f"[yellow]Engine RTL not usable here ({why}): running on the reference model "
              f"instead.[/]", soft_wrap=True)


def _rtl_fabric(con, workers: int, pmtu: int, seed: int, net, overrides: dict):
    """The RTL fabric of the demo, building the engine first if needed (announced: it takes
    minutes once); None after a one-line message when Verilator cannot be used."""
    from netreduce.sim.backend import BackendUnavailable, probe_backend
    from netreduce.sim.net.simrun import Capture, SimConfig
    from netreduce.sim.rtl import backend as rtl
    from netreduce.sim.rtl import fastsim
    from netreduce.sim.rtl.fabric import make_rtl_backend

    reason = rtl.simulator_missing("verilator")
    if reason:
        _fallback(con, reason)
        return None
    try:
        probe_backend("verilator")
    except BackendUnavailable as e:
        _fallback(con, str(e).split(" (use --backend")[0])
        return None
    params = demo_rtl_params(workers, pmtu, overrides)
    try:
        path = rtl.engine_top_path(params)
        if not path.exists():
            con.print(f"Building the engine RTL for this configuration "
                      f"({_params_text(params)}), first run only: Amaranth -> Verilog "
                      f"(cached in {path.parent}), then Verilator (cached in "
                      f"{fastsim.fastsim_root()}). This takes minutes (about 3 on an idle 2-core "
                      f"machine, 10-30 on a busy one); later runs start at once.", soft_wrap=True)
            t0 = time.perf_counter()
            with con.status("converting the engine to Verilog (Amaranth)..."):
                top = rtl.engine_top(params)
            con.print(f"  Verilog ready ({time.perf_counter() - t0:.0f} s)")
        else:
            top = rtl.engine_top(params)
        if not fastsim.fastsim_cached(top):
            con.print(f"Verilating the engine and compiling the C++ harness (first run of this "
                      f"build; cached in {fastsim.fastsim_root()})...")
            t0 = time.perf_counter()
            with con.status("verilator + g++ ..."):
                fastsim.build_fastsim(top)
            con.print(f"  simulator ready ({time.perf_counter() - t0:.0f} s)")
        cfg = SimConfig(workers=workers, pmtu=pmtu, seed=seed, ports=params["ports"],
                        backend="verilator")
        _, make, _ = make_rtl_backend("verilator", top=top)
        fab = make(cfg, net, Capture())
        fab.rtl_params = params
        return fab
    except Exception as e:  # noqa: BLE001 - any build failure: say it in one line, use the model
        _fallback(con, f"build failed: {_first_line(e)}")
        return None


def _close(fabric) -> None:
    close = getattr(fabric, "close", None)
    if close is not None:
        close()
