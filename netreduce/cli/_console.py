"""One rich Console factory for every command: full width on a terminal, 120 columns in logs."""

from __future__ import annotations

import contextlib
import sys
import time

from rich.console import Console


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Rich falls back to 80 columns when not on a terminal, which truncates summary tables in CI
    # logs and pipes; 120 keeps every cell readable.
    return Console(stderr=stderr, width=None if stream.isatty() else 120)


@contextlib.contextmanager
def phases(c: Console):
    """A status line for a job in phases: yields ``progress(phase, text)``, which shows ``text``
    with the time spent so far and prints one line per finished phase with its duration."""
    t0 = time.monotonic()
    cur: list = []  # [phase, text, start]

    def done():
        if cur:
            c.print(f"  {cur[0]}: {time.monotonic() - cur[2]:.1f} s")

    with c.status("starting") as st:
        def progress(phase: str, text: str):
            done()
            cur[:] = [phase, text, time.monotonic()]
            st.update(f"{text} ({phase}; {time.monotonic() - t0:.0f} s so far)")

        yield progress
        done()
