"""The ring knobs every all-reduce transport shares, checked once.

Used by the in-process collective (:mod:`netreduce.sim.net.collective`), the one-rank-per-process
communicator over the switch service (:mod:`netreduce.sim.emu.tunnel`) and the verbs backend
(:mod:`.verbs`). Host side: imports only the wire format.
"""

from __future__ import annotations

from netreduce.wire.batch import PMTUS

__all__ = ["check_ring_knobs"]


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
