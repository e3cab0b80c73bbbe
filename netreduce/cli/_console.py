"""One rich Console factory for every command: full width on a terminal, 120 columns in logs."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from rich.console import Console


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Rich falls back to 80 columns when not on a terminal, which truncates summary tables in CI
    # logs and pipes; 120 keeps every cell readable.
    return Console(stderr=stderr, width=None if stream.isatty() else 120)


@contextlib.contextmanager
def phases(c: Console, tick: float = 1.0):
    """A status line for a job in phases: yields ``progress(phase, text)``, which shows ``text``
    with the seconds spent in the phase and in all, counting while the phase runs (refreshed
    every ``tick`` seconds), and prints one line per finished phase with its duration."""
    t0 = time.monotonic()
    cur: list = []  # [phase, text, start]
    lock = threading.Lock()
    stop = threading.Event()

    def done():
        if cur:
            c.print(f"  {cur[0]}: {time.monotonic() - cur[2]:.1f} s")

    with c.status("starting") as st:
        def show():
            now = time.monotonic()
            st.update(f"{cur[1]} ({cur[0]}: {now - cur[2]:.0f} s; {now - t0:.0f} s in all)")

        def progress(phase: str, text: str):
            with lock:
                done()
                cur[:] = [phase, text, time.monotonic()]
                show()

        def ticker():
            while not stop.wait(tick):
                with lock:
                    if cur:
                        show()

        th = threading.Thread(target=ticker, name="phases-status", daemon=True)
        th.start()
        try:
            yield progress
        finally:
            stop.set()
            th.join()
        with lock:
            done()
