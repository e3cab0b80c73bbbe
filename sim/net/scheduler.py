"""Fabrics: what carries Ethernet frames between software endpoints, on a discrete-event clock.

The driver never knows what sits between its endpoints (docs/design.md section 9): the reference
model, the RTL under cocotb or a loopback tunnel. It only sees a :class:`Fabric`:

* ``attach(mac, deliver)`` registers an endpoint; frames whose destination MAC is ``mac`` are
  handed to ``deliver(frame)``.
* ``send(frame)`` is called by an endpoint; the fabric delivers it later (never synchronously, so
  an endpoint never re-enters itself).
* the event clock: ``now()`` in nanoseconds, ``call_at(t_ns, fn, *args)``, ``run_until(pred, ...)``.
* optionally ``bus``: the engine's register bus (None on a fabric without an engine).

:class:`Scheduler` is the event clock every in-process fabric shares. Ties are broken by insertion
order, so a run is a pure function of its inputs and seeds. :meth:`Scheduler.run_until` is the only
loop; its watchdog turns a hang (no events left, simulated-time limit, event limit) into a
:class:`SimulationHang` that says what was still pending.

:class:`LoopbackFabric` delivers every frame to the endpoint owning its destination MAC after a
fixed latency, with no loss: the simplest fabric, for tests of the RC endpoint model.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from netreduce.wire.view import dst_mac, src_mac

__all__ = [
    "Fabric", "Scheduler", "Timer", "SimulationHang", "LoopbackFabric", "mac_str", "frame_dmac",
    "frame_smac",
]


class SimulationHang(RuntimeError):
    """The event loop cannot reach its goal: no events left, or a time/event limit was hit."""


def mac_str(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


frame_dmac = dst_mac  # Ethernet destination / source MAC of a frame (bytes)
frame_smac = src_mac


class Timer:
    """Handle of a scheduled call; :meth:`cancel` makes it a no-op (lazy deletion)."""

    __slots__ = ("time", "cancelled")

    def __init__(self, time: int):
        self.time = time
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Discrete-event clock in integer nanoseconds.

    Contract: events run in (time, insertion order); an event scheduled in the past runs "now"
    (after the events already queued for the current time). Callbacks may schedule further events.
    Exceptions raised by a callback propagate out of :meth:`run_until` unchanged.
    """

    def __init__(self):
        self._now = 0
        self._queue: list = []
        self._seq = itertools.count()
        self.events = 0  # callbacks run so far

    def now(self) -> int:
        return self._now

    def call_at(self, t_ns: int, fn: Callable, *args) -> Timer:
        t = max(int(t_ns), self._now)
        h = Timer(t)
        heapq.heappush(self._queue, (t, next(self._seq), h, fn, args))
        return h

    def call_later(self, delay_ns: int, fn: Callable, *args) -> Timer:
        return self.call_at(self._now + int(delay_ns), fn, *args)

    def pending(self) -> int:
        return sum(1 for e in self._queue if not e[2].cancelled)

    def step(self) -> bool:
        """Run the next live event; False if none is left."""
        q = self._queue
        while q:
            t, _, h, fn, args = heapq.heappop(q)
            if h.cancelled:
                continue
            self._now = t
            self.events += 1
            fn(*args)
            return True
        return False

    def run_until(self, pred: Callable[[], bool], timeout_ns: int | None = None, *,
                  max_events: int | None = None, describe: Callable[[], str] | None = None,
                  progress: Callable[[], None] | None = None, progress_every: int = 2000) -> int:
        """Run events until ``pred()`` is true; return the simulated time.

        Watchdog: raises :class:`SimulationHang` when the queue runs dry with ``pred`` still false
        (a deadlock: nobody will ever send again), when the simulated time would pass
        ``timeout_ns`` (relative to the call), or after ``max_events`` callbacks. ``describe`` adds
        the caller's view of what is still pending to the message. ``progress`` is called every
        ``progress_every`` events (progress bars).
        """
        deadline = None if timeout_ns is None else self._now + int(timeout_ns)
        start_events = self.events
        n = 0
        while not pred():
            q = self._queue
            while q and q[0][2].cancelled:
                heapq.heappop(q)
            if not q:
                self._hang("no events left (deadlock)", describe)
            if deadline is not None and q[0][0] > deadline:
                self._hang(f"simulated-time limit of {timeout_ns} ns reached", describe)
            if max_events is not None and self.events - start_events >= max_events:
                self._hang(f"event limit of {max_events} reached", describe)
            self.step()
            n += 1
            if progress is not None and n % progress_every == 0:
                progress()
        return self._now

    def run_all(self, timeout_ns: int | None = None, *, max_events: int | None = None) -> int:
        """Run until no event is left (a quiet network); same watchdog limits as run_until."""
        def empty():
            q = self._queue
            while q and q[0][2].cancelled:
                heapq.heappop(q)
            return not q
        return self.run_until(empty, timeout_ns, max_events=max_events)

    def _hang(self, why: str, describe) -> None:
        msg = f"simulation hang at t={self._now} ns: {why}"
        if describe is not None:
            msg += f"; {describe()}"
        raise SimulationHang(msg)


@runtime_checkable
class Fabric(Protocol):
    """What the driver needs from whatever carries its frames (see the module docstring)."""

    sched: Scheduler
    bus: object | None

    def attach(self, mac: bytes, deliver: Callable[[bytes], None]) -> None: ...

    def is_attached(self, mac: bytes) -> bool: ...

    def send(self, frame: bytes) -> None: ...

    def now(self) -> int: ...

    def call_at(self, t_ns: int, fn: Callable, *args) -> Timer: ...

    def run_until(self, pred: Callable[[], bool], timeout_ns: int | None = None,
                  **kw) -> int: ...


class SchedulerMixin:
    """Delegates the clock methods of :class:`Fabric` to ``self.sched``."""

    sched: Scheduler

    def now(self) -> int:
        return self.sched.now()

    def call_at(self, t_ns: int, fn: Callable, *args) -> Timer:
        return self.sched.call_at(t_ns, fn, *args)

    def call_later(self, delay_ns: int, fn: Callable, *args) -> Timer:
        return self.sched.call_later(delay_ns, fn, *args)

    def run_until(self, pred, timeout_ns=None, **kw) -> int:
        return self.sched.run_until(pred, timeout_ns, **kw)

    def run_all(self, timeout_ns=None, **kw) -> int:
        return self.sched.run_all(timeout_ns, **kw)


class LoopbackFabric(SchedulerMixin):
    """Every frame reaches the owner of its destination MAC ``latency_ns`` later; nothing is lost.

    Frames to an unknown MAC are counted in ``unroutable`` and dropped. An optional ``tap(frame)``
    sees (and may replace, by returning bytes, or drop, by returning None) every frame: tests use
    it to inject faults.
    """

    bus = None

    def __init__(self, latency_ns: int = 1000, sched: Scheduler | None = None, tap=None):
        if latency_ns < 0:
            raise ValueError(f"latency_ns must be >= 0, got {latency_ns}")
        self.sched = sched or Scheduler()
        self.latency_ns = latency_ns
        self.tap = tap
        self._ends: dict[bytes, Callable[[bytes], None]] = {}
        self.frames = 0
        self.unroutable = 0

    def attach(self, mac: bytes, deliver: Callable[[bytes], None]) -> None:
        mac = bytes(mac)
        if mac in self._ends:
            raise ValueError(f"MAC {mac_str(mac)} is already attached")
        self._ends[mac] = deliver

    def is_attached(self, mac: bytes) -> bool:
        return bytes(mac) in self._ends

    def send(self, frame: bytes) -> None:
        self.frames += 1
        if self.tap is not None:
            frame = self.tap(frame)
            if frame is None:
                return
        dst = self._ends.get(frame_dmac(frame))
        if dst is None:
            self.unroutable += 1
            return
        self.sched.call_later(self.latency_ns, dst, bytes(frame))
