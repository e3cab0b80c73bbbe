"""Once-per-beat AXI-Stream driver and monitor for cocotb, plus test-module helpers.

cocotbext-axi moves frames byte by byte in Python (0.5-1k beats/s at 512 bits): it stays the
protocol reference (see ``tb_cocotbext``). These classes move one whole beat per clock with
integer arithmetic on ``tdata`` (no per-byte Python) and are what long runs use (about 20k
cycles/s at 512 bits on Verilator, ~75 % of one 512-bit write + read per cycle; see
bench/packet_path_rtl.py). All ports of one clock are stepped by a single coroutine, one trigger
per cycle.

Timing contract (the one cocotbext-axi follows): ports wake on every rising edge of ``clock``;
values read there are those the flops sampled at that edge, so a beat counts as transferred when
``tvalid`` and ``tready`` were both high at the edge. New values are written right after the
edge and hold for the whole next cycle. Cycle stamps (:meth:`now`) come from simulation time, so
they agree between ports.

* :class:`AxisSource` queues frames (``send``) and drives them back to back, or with idle cycles
  from a pause generator (``set_pause_generator(itertools.cycle([0, 1]))``: truthy = idle cycle).
  A frame of n bytes takes ceil(n / byte lanes) beats; the last beat has ``tlast`` and a ``tkeep``
  with the low bytes set. ``tuser`` is the frame's ``user`` on every beat (``user_last`` on the
  last beat, when given).
* :class:`AxisSink` collects frames (``recv``), with backpressure from a pause generator (truthy =
  ``tready`` low that cycle). It fails the test on protocol errors: ``tkeep`` not a contiguous
  low-byte mask, a short beat without ``tlast``, an empty beat (unless ``allow_empty_last`` and it
  is a last beat: then it adds no bytes), X/Z on a sampled signal.
* :class:`RecordSink` collects a record stream (a struct per beat, e.g. parsed headers) as dicts.
* ``recv``/``wait`` fail the test after a timeout in cycles instead of hanging.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import Event, RisingEdge, SimTimeoutError, with_timeout

__all__ = ["AxisSource", "AxisSink", "RecordSink", "RxFrame", "diff", "cycle_pattern", "tb_args",
           "top_info", "report", "start_clock", "reset", "quiet", "PERIOD_NS"]

PERIOD_NS = 4  # 250 MHz simulated clock; results are reported in cycles


def tb_args() -> dict:
    """Keyword arguments the pytest wrapper passed to :func:`~.runner.run`."""
    return json.loads(os.environ.get("NETREDUCE_TB_ARGS", "{}"))


def top_info() -> dict:
    """The top's port map (:meth:`netreduce.hw.verilog.AxisTop.info`)."""
    return json.loads(os.environ.get("NETREDUCE_TOP", "{}"))


def report(**metrics) -> None:
    """Merge ``metrics`` into the JSON the runner returns as ``RunResult.metrics``."""
    path = os.environ.get("NETREDUCE_TB_OUT")
    if not path:
        return
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    old.update(metrics)
    with open(path, "w") as f:
        json.dump(old, f, indent=1, sort_keys=True)


def quiet(dut, *prefixes: str) -> None:
    """Silence cocotbext-axi's banner and per-frame INFO logs for ``<prefix>`` buses of ``dut``.

    Call before constructing the cocotbext-axi objects (their banner logs at construction);
    warnings and errors stay.
    """
    for p in prefixes:
        logging.getLogger(f"cocotb.{dut._name}.{p}").setLevel(logging.WARNING)


def start_clock(dut, period_ns: int = PERIOD_NS):
    clk = dut.clk
    cocotb.start_soon(Clock(clk, period_ns, unit="ns").start())
    return clk


async def reset(dut, cycles: int = 4) -> None:
    """Hold ``rst`` for ``cycles`` rising edges (synchronous, active high)."""
    dut.rst.value = 1
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


def _reader(handle, name: str):
    """A fast ``int`` reader for ``handle``.

    Uses the simulator's binary string directly (cocotb's LogicArray costs several times more at
    512 bits). X/Z raise with the signal's name.
    """
    get = handle._handle.get_signal_val_binstr

    def read() -> int:
        s = get()
        try:
            return int(s, 2)
        except ValueError:
            raise AssertionError(f"{name} = {s} holds X/Z while it is sampled") from None
    return read


def _ones(pause: Iterable | None) -> Iterator | None:
    return None if pause is None else iter(pause)


class _ClockLoop:
    """One coroutine per clock that steps every port once per rising edge.

    Each port is a plain generator advanced with ``next()``: one trigger per cycle for all ports
    together instead of one task switch per port, which is where cocotb spends most of its time.
    """

    def __init__(self, clock):
        self.clock = clock
        self.steps: list = []
        self.task = cocotb.start_soon(self._run())

    async def _run(self):
        edge = RisingEdge(self.clock)
        steps = self.steps
        while True:
            await edge
            for step in steps:
                next(step)


_LOOPS: dict = {}


def _attach(clock, stepper) -> None:
    loop = _LOOPS.get(clock._path)
    if loop is None or loop.task.done():  # cocotb cancels it when a test ends
        loop = _LOOPS[clock._path] = _ClockLoop(clock)
    next(stepper)  # run up to the first yield (set-up)
    loop.steps.append(stepper)


def diff(got: bytes, want: bytes) -> str:
    """Where two frames differ, for assertion messages ("" when equal)."""
    if got == want:
        return ""
    i = next((j for j, (x, y) in enumerate(zip(got, want, strict=False)) if x != y),
             min(len(got), len(want)))
    return (f"{len(got)} B vs {len(want)} B expected, first difference at byte {i}: "
            f"{got[i:i + 8].hex()} vs {want[i:i + 8].hex()}")


@dataclass
class RxFrame:
    """A received frame: bytes, ``tuser`` of each beat, cycles of its first and last beat."""

    data: bytes
    user: list[int] = field(default_factory=list)
    first_cycle: int = 0
    last_cycle: int = 0

    @property
    def user_last(self) -> int:
        return self.user[-1] if self.user else 0

    @property
    def user_any(self) -> int:
        u = 0
        for x in self.user:
            u |= x
        return u


class _Port:
    def __init__(self, dut, prefix: str, clock, period_ns: float = PERIOD_NS):
        self.period_ns = period_ns
        self.dut = dut
        self.prefix = prefix
        self.clock = clock if clock is not None else dut.clk

        def sig(n):
            return getattr(dut, f"{prefix}_{n}", None)
        self.tdata = sig("tdata")
        if self.tdata is None:
            raise AttributeError(f"{dut._name} has no {prefix}_tdata")
        self.tkeep, self.tlast, self.tuser = sig("tkeep"), sig("tlast"), sig("tuser")
        self.tvalid, self.tready = sig("tvalid"), sig("tready")
        self.width = len(self.tdata)
        if self.width % 8:
            raise ValueError(f"{prefix}_tdata is {self.width} bits, not whole bytes")
        self.lanes = self.width // 8
        self.cycle = 0
        self._pause: Iterator | None = None
        self.log = logging.getLogger(f"cocotb.{dut._name}.{prefix}")

    def now(self) -> int:
        """The current clock cycle, from simulation time (common to every port)."""
        return round(get_sim_time("ns") / self.period_ns)

    def set_pause_generator(self, gen: Iterable | None) -> None:
        """Truthy items pause one cycle each; ``None`` (default) never pauses."""
        self._pause = _ones(gen)

    def _paused(self) -> bool:
        if self._pause is None:
            return False
        try:
            return bool(next(self._pause))
        except StopIteration:
            self._pause = None
            return False


class AxisSource(_Port):
    """Drives frames into ``<prefix>_t*`` one beat per cycle (see module doc)."""

    def __init__(self, dut, prefix: str = "s_axis", clock=None):
        super().__init__(dut, prefix, clock)
        self._queue: deque = deque()
        self._idle = Event()
        self._idle.set()
        self.frames_sent = 0
        self.beats_sent = 0
        self.sent: list[tuple[int, int]] = []  # (cycle of first beat, of last beat) per frame
        # drive every input from the start: an undriven input reads Z on four-state simulators
        # (Icarus), and a register that captures it while tvalid is low can leak it later
        for h in (self.tdata, self.tkeep, self.tlast, self.tuser, self.tvalid):
            if h is not None:
                h.value = 0
        _attach(self.clock, self._stepper())

    def send(self, data: bytes, user: int = 0, user_last: int | None = None) -> None:
        """Queue one frame (at least one byte); returns at once."""
        if not data:
            raise ValueError(f"{self.prefix}: cannot send an empty frame")
        self._queue.append((bytes(data), user, user if user_last is None else user_last))
        self._idle.clear()

    def idle(self) -> bool:
        return self._idle.is_set()

    async def wait(self, timeout_cycles: int | None = 1_000_000) -> None:
        """Until every queued frame has been accepted (fails the test after ``timeout_cycles``)."""
        if timeout_cycles is None:
            await self._idle.wait()
            return
        try:
            await with_timeout(self._idle.wait(), timeout_cycles * self.period_ns, "ns")
        except SimTimeoutError:
            raise AssertionError(f"{self.prefix}: {len(self._queue)} frames still queued after "
                                 f"{timeout_cycles} cycles (stuck tready?)") from None

    def _beats(self, frame):
        data, user, user_last = frame
        n = self.lanes
        full = (1 << n) - 1
        out = []
        for off in range(0, len(data), n):
            chunk = data[off:off + n]
            last = off + n >= len(data)
            keep = full if len(chunk) == n else (1 << len(chunk)) - 1
            out.append((int.from_bytes(chunk, "little"), keep, int(last),
                        user_last if last else user))
        return out

    def _stepper(self):
        tdata, tvalid = self.tdata, self.tvalid
        tkeep, tlast, tuser = self.tkeep, self.tlast, self.tuser
        ready = _reader(self.tready, f"{self.prefix}_tready") if self.tready is not None else None
        beats: list = []
        idx = 0
        valid = 0
        first = 0
        last_kw = [None, None, None]  # last written tkeep, tlast, tuser: skip rewriting them
        while True:
            yield
            self.cycle += 1
            if valid:
                if ready is not None and not ready():
                    continue  # AXI-Stream: a presented beat holds until it is taken
                self.beats_sent += 1
                if idx == 0:
                    first = self.now()
                idx += 1
                if idx == len(beats):
                    self.sent.append((first, self.now()))
                    beats, idx = [], 0
                    self.frames_sent += 1
            if not beats and self._queue:
                beats = self._beats(self._queue.popleft())
                idx = 0
            if beats and not self._paused():
                d, k, la, u = beats[idx]
                tdata.value = d
                if tkeep is not None and last_kw[0] != k:
                    tkeep.value = k
                    last_kw[0] = k
                if tlast is not None and last_kw[1] != la:
                    tlast.value = la
                    last_kw[1] = la
                if tuser is not None and last_kw[2] != u:
                    tuser.value = u
                    last_kw[2] = u
                if not valid:
                    tvalid.value = 1
                    valid = 1
            else:
                if valid:
                    tvalid.value = 0
                    valid = 0
                if not beats and not self._queue:
                    self._idle.set()


class AxisSink(_Port):
    """Collects frames from ``<prefix>_t*`` one beat per cycle (see module doc)."""

    def __init__(self, dut, prefix: str = "m_axis", clock=None, *,
                 allow_empty_last: bool = False):
        super().__init__(dut, prefix, clock)
        self.allow_empty_last = allow_empty_last
        self.frames: deque[RxFrame] = deque()
        self._got = Event()
        self.beats_received = 0
        self.busy_cycles = 0  # cycles with tvalid high (transfer or stall)
        if self.tready is not None:
            self.tready.value = 1
        _attach(self.clock, self._stepper())

    def __len__(self) -> int:
        return len(self.frames)

    def empty(self) -> bool:
        return not self.frames

    def recv_nowait(self) -> RxFrame:
        return self.frames.popleft()

    async def recv(self, timeout_cycles: int | None = 200_000) -> RxFrame:
        """The next frame; fails the test if none completes within ``timeout_cycles``."""
        while not self.frames:
            self._got.clear()
            if timeout_cycles is None:
                await self._got.wait()
                continue
            try:
                await with_timeout(self._got.wait(), timeout_cycles * self.period_ns, "ns")
            except SimTimeoutError:
                raise AssertionError(
                    f"{self.prefix}: no frame completed within {timeout_cycles} cycles "
                    f"({self.beats_received} beats received so far)") from None
        return self.frames.popleft()

    def _stepper(self):
        p = self.prefix
        valid = (_reader(self.tvalid, f"{p}_tvalid") if self.tvalid is not None
                 else lambda: 1)  # no tvalid: a beat every cycle
        data = _reader(self.tdata, f"{p}_tdata")
        keep = _reader(self.tkeep, f"{p}_tkeep") if self.tkeep is not None else None
        last = _reader(self.tlast, f"{p}_tlast") if self.tlast is not None else None
        user = _reader(self.tuser, f"{p}_tuser") if self.tuser is not None else None
        tready = self.tready
        lanes = self.lanes
        full = (1 << lanes) - 1
        rdy = 1
        parts: list[bytes] = []
        users: list[int] = []
        first = 0
        while True:
            yield
            self.cycle += 1
            if valid():
                self.busy_cycles += 1
                if rdy:
                    k = keep() if keep is not None else full
                    la = last() if last is not None else 1
                    if k & (k + 1) or not (k or (la and self.allow_empty_last)):
                        raise AssertionError(
                            f"{p}: tkeep = {k:#x} at cycle {self.cycle} is not a contiguous "
                            "low-byte mask" + ("" if k else " (empty beat)"))
                    n = k.bit_length()
                    if not la and n != lanes:
                        raise AssertionError(f"{p}: tkeep = {k:#x} on a beat without tlast at "
                                             f"cycle {self.cycle}")
                    if not parts:
                        first = self.now()
                    parts.append(data().to_bytes(lanes, "little")[:n])
                    users.append(user() if user is not None else 0)
                    self.beats_received += 1
                    if la:
                        self.frames.append(RxFrame(b"".join(parts), users, first, self.now()))
                        parts, users = [], []
                        self._got.set()
            if tready is not None:
                r = 0 if self._paused() else 1
                if r != rdy:
                    tready.value = r
                    rdy = r


class RecordSink:
    """Collects a record stream (``tdata`` = a packed struct, one record per beat) as dicts.

    Field positions come from the top's port map (:func:`top_info`, ``data_fields``). Without
    ``tready`` the stream is a tap: every cycle with ``tvalid`` is one record.
    """

    def __init__(self, dut, prefix: str, clock=None, period_ns: float = PERIOD_NS):
        info = next((s for s in top_info().get("streams", []) if s["prefix"] == prefix), None)
        if info is None:
            raise KeyError(f"no stream {prefix!r} in the top's port map")
        self.fields = [tuple(f) for f in info["data_fields"]] or [("data", 0,
                                                                   info["data_width"])]
        self.prefix = prefix
        self.period_ns = period_ns
        self.tdata = getattr(dut, f"{prefix}_tdata")
        self.tvalid = getattr(dut, f"{prefix}_tvalid", None)
        self.tready = getattr(dut, f"{prefix}_tready", None)
        self.records: deque[dict] = deque()
        self._got = Event()
        if self.tready is not None:
            self.tready.value = 1
        _attach(clock if clock is not None else dut.clk, self._stepper())

    def now(self) -> int:
        return round(get_sim_time("ns") / self.period_ns)

    def decode(self, value: int) -> dict:
        return {n: (value >> lsb) & ((1 << w) - 1) for n, lsb, w in self.fields}

    def _stepper(self):
        valid = _reader(self.tvalid, f"{self.prefix}_tvalid") if self.tvalid is not None else None
        data = _reader(self.tdata, f"{self.prefix}_tdata")
        while True:
            yield
            if valid is None or valid():
                r = self.decode(data())
                r["_cycle"] = self.now()
                self.records.append(r)
                self._got.set()

    async def recv(self, timeout_cycles: int = 200_000) -> dict:
        """The next record; fails the test if none arrives within ``timeout_cycles``."""
        while not self.records:
            self._got.clear()
            try:
                await with_timeout(self._got.wait(), timeout_cycles * self.period_ns, "ns")
            except SimTimeoutError:
                raise AssertionError(f"{self.prefix}: no record within {timeout_cycles} cycles"
                                     ) from None
        return self.records.popleft()


def cycle_pattern(pattern: str) -> Iterator[int]:
    """An endless pause generator from a string: ``"0001"`` = pause one cycle in four."""
    return itertools.cycle([int(c) for c in pattern])
