"""What every engine backend shares: the "cannot run here" error.

A leaf module (it imports nothing of the project), so the simulation, the RTL harnesses, replay
and the switch service can all raise and catch the same exception without importing each other.
"""

from __future__ import annotations

__all__ = ["BackendUnavailable"]


class BackendUnavailable(RuntimeError):
    """The backend is registered but cannot run here; the message is one line."""
