"""One rich Console factory for every command: full width on a terminal, 120 columns in logs."""

from __future__ import annotations

import sys

from rich.console import Console


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Rich falls back to 80 columns when not on a terminal, which truncates summary tables in CI
    # logs and pipes; 120 keeps every cell readable.
    return Console(stderr=stderr, width=None if stream.isatty() else 120)
