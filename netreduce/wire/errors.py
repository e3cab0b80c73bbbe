"""The one exception type of the wire-format library."""

from __future__ import annotations

__all__ = ["WireError", "NOT_ROCE_REASONS"]

# Reasons that mean "this frame is not RoCEv2 traffic at all" (forward it untouched), as opposed to
# "this frame claims to be RoCEv2 but is broken" (a counted drop for a registered flow).
NOT_ROCE_REASONS = frozenset({"ethertype", "ip_version", "ihl", "protocol", "fragment", "udp_port"})


class WireError(ValueError):
    """A frame is truncated or inconsistent.

    Attributes:
        reason: short machine-readable cause, e.g. ``"truncated"``, ``"ip_length"``, ``"icrc"``.
        field: the header field at fault, as ``"HEADER.field"`` (e.g. ``"IPV4.total_length"``).
        value: the offending value as found in the frame.
        expected: what the value should have been (may be ``None`` when no single value fits).
        detail: free-text context (may be empty).
    """

    def __init__(self, reason: str, field: str, value, expected=None, detail: str = ""):
        self.reason = reason
        self.field = field
        self.value = value
        self.expected = expected
        self.detail = detail
        msg = f"{reason}: {field} = {_fmt(value)}"
        if expected is not None:
            msg += f", expected {_fmt(expected)}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    @property
    def not_roce(self) -> bool:
        """True if the frame is simply not RoCEv2 (non-IPv4, IHL != 5, not UDP port 4791...)."""
        return self.reason in NOT_ROCE_REASONS


def _fmt(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v} (0x{v:x})"
    if isinstance(v, bytes | bytearray):
        return v.hex()
    return repr(v)
