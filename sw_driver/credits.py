"""The credit loop and the ring knobs every all-reduce transport shares, written once.

Used by the in-process collective (:mod:`netreduce.sim.net.collective`), the one-rank-per-process
communicator over the switch service (:mod:`netreduce.sim.emu.tunnel`) and the verbs backend
(:mod:`.verbs`). Host side: imports only the wire format.
"""

from __future__ import annotations

from collections import deque

from netreduce.wire.batch import PMTUS

__all__ = ["check_ring_knobs", "RingKnobs", "Credits"]


def check_ring_knobs(cfg, *, pmtus: tuple[int, ...] = PMTUS, min_window: int = 2) -> None:
    """Validate the ring knobs every transport shares (``pmtu``, ``window``, ``exp_window``,
    ``margin``, ``msg_packets``, ``timeout``, ``retry_cnt`` attributes of ``cfg``); raises
    ValueError naming the knob and its value. The engine's window is a power of two and the
    credit scheme needs ``msg_packets <= window - margin``."""
    if cfg.pmtu not in pmtus:
        raise ValueError(f"pmtu must be one of {pmtus}, got {cfg.pmtu!r}")
    for name in ("window", "exp_window"):
        w = getattr(cfg, name)
        if not isinstance(w, int) or w < min_window or w & (w - 1):
            raise ValueError(f"{name} must be a power of two >= {min_window}, got {w!r}")
    if not isinstance(cfg.margin, int) or not 0 <= cfg.margin < cfg.window:
        raise ValueError(f"margin must be 0..window-1 ({cfg.window - 1}), got {cfg.margin!r}")
    room = cfg.window - cfg.margin
    if not isinstance(cfg.msg_packets, int) or not 1 <= cfg.msg_packets <= room:
        raise ValueError(f"msg_packets must be 1..window-margin ({room}), got "
                         f"{cfg.msg_packets!r}")
    # the QP attributes, as ibv_modify_qp (and the software RNIC's QPConfig) check them
    if not 0 <= cfg.timeout <= 31:
        raise ValueError(f"timeout must be 0..31 (4.096us*2^timeout), got {cfg.timeout}")
    if not 0 <= cfg.retry_cnt <= 7:
        raise ValueError(f"retry_cnt is 3 bits (0..7), got {cfg.retry_cnt}")


class RingKnobs:
    """Sizes every transport's ring config derives from its ``msg_packets`` and ``pmtu`` (a
    mixin of their config dataclasses)."""

    @property
    def msg_bytes(self) -> int:
        return self.msg_packets * self.pmtu

    @property
    def chunk_elems(self) -> int:
        """Elements per quantisation chunk (one message of int32)."""
        return self.msg_bytes // 4


class Credits:
    """Message-level credits of one rank's send QP in a ring (the loop every transport runs).

    The engine holds ``window`` slots per job and frees slot i only once every receiver has
    ACKed result i, so a rank keeps its packets within ``R + window - margin``, where R counts
    the packets of the messages whose results it has received (in order). A message of ``n``
    bytes is ``max(1, ceil(n / pmtu))`` packets (a zero-length WRITE is one packet). The counts
    are cumulative: a persistent ring continues them from one all-reduce to the next.

    Use: :meth:`fits` before posting a message, :meth:`post` when it is posted, :meth:`received`
    when the result of the oldest outstanding message has arrived."""

    def __init__(self, window: int, margin: int, pmtu: int):
        self.window, self.margin, self.pmtu = window, margin, pmtu
        self.posted_pkts = 0  # packets of every message posted
        self.recvd_pkts = 0  # packets of the messages whose results have arrived
        self._ends: deque[int] = deque()  # cumulative packet end of each outstanding message

    @property
    def limit(self) -> int:
        """Packets may be posted up to (not beyond) this cumulative count."""
        return self.recvd_pkts + self.window - self.margin

    def packets(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.pmtu))

    def fits(self, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` may be posted now."""
        return self.posted_pkts + self.packets(nbytes) <= self.limit

    def post(self, nbytes: int) -> None:
        self.posted_pkts += self.packets(nbytes)
        self._ends.append(self.posted_pkts)

    def received(self) -> None:
        """The result of the oldest outstanding message arrived: its packets free credit."""
        self.recvd_pkts = self._ends.popleft()
