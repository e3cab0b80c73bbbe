"""``netreduce demo``: an all-reduce of N software RC endpoints through the reference engine.

Every rank is a software RNIC (rxe behaviour) on a seeded lossy network; the engine model sits in
the middle. The command checks the result (int32: bit-exact; float32: within the quantisation
bound), prints traffic, recovery and engine counters, and exits non-zero on any mismatch, any RC
error or hang, or any engine slot left allocated.
"""

from __future__ import annotations

import re
import time

import click
import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from netreduce.cli._console import console

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
@click.option("--backend", type=click.Choice(["model"]), default="model", show_default=True,
              help="What sits in the middle: the bit-exact reference model.")
def demo(workers, size, dtype, pmtu, loss, dup, reorder, seed, backend):
    """All-reduce SIZE bytes on each of N ranks through the NetReduce engine model.

    The ranks are software RoCEv2 RC endpoints that behave like Linux soft-RoCE, on links that
    lose, duplicate and reorder frames (seeded). Exit status 1 on any wrong result, RC error,
    hang or engine slot left allocated.
    """
    from netreduce.sim.fabric_model import ModelFabric
    from netreduce.sim.network import NetConfig
    from netreduce.sw_driver.collective import CollectiveConfig, Communicator
    from netreduce.sw_driver.control import EngineControl
    from netreduce.sw_driver.fabric import SimulationHang
    from netreduce.sw_driver.rnic import RCError

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
    fabric = ModelFabric(net=NetConfig.faulty(loss=loss, dup=dup, reorder=reorder), seed=seed)
    cfg = CollectiveConfig(pmtu=pmtu)
    comm = Communicator(fabric, workers, cfg, seed=seed)
    con.print(f"[bold]NetReduce demo[/]: {workers} ranks x {size} B {dtype}, PMTU {pmtu}, "
              f"loss {loss:g} dup {dup:g} reorder {reorder:g} on every link, seed {seed}, "
              f"backend {backend}")
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
        ("wall time", f"{wall:.2f} s"),
        ("simulated time", f"{fabric.now() / 1e3:.1f} us"),
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
    table = Table(title="NetReduce demo summary", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for k, v in rows:
        table.add_row(k, v)
    con.print(table)
    con.print("[bold green]PASS[/]" if ok else "[bold red]FAIL[/]")
    if not ok:
        raise SystemExit(1)
