"""DCQCN-like rate control for the software RNIC (:mod:`netreduce.sim.net.rnic`).

rxe has no congestion control; hardware RNICs run DCQCN (Zhu et al., SIGCOMM 2015; the reaction
point of ConnectX NICs). :class:`Dcqcn` is its reaction point, per QP, simplified to what a
flow-level simulation needs:

* **Rate cut on CNP.** A CNP for the QP sets the target rate R_T = R_C, cuts the current rate
  R_C = R_C x (1 - alpha / 2) (not below ``min_gbps``) and raises alpha = (1 - g) alpha + g. At
  most one cut per ``cut_interval_ns`` (the NIC's rate-reduce monitor period, 4 us); CNPs in
  between only count.
* **Alpha decay.** Every ``alpha_ns`` (55 us) without a CNP: alpha = (1 - g) alpha.
* **Recovery timer.** Every ``recover_ns`` (55 us) without a cut: the first ``fast_steps`` (5)
  steps are fast recovery, R_C = (R_T + R_C) / 2; after that additive increase, R_T += ``ai_gbps``
  then R_C = (R_T + R_C) / 2; both capped at the line rate. A cut restarts the count.

Pacing: the QP sends a packet only when its pacer allows (:meth:`gap_ns`: the packet's wire
time at R_C); at the line rate the pacer never holds anything back, so a QP with DCQCN behaves
exactly as one without until its first CNP. No byte counter (DCQCN's B) and no hyper increase:
the timer alone recovers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DcqcnConfig", "Dcqcn", "WIRE_EXTRA"]

WIRE_EXTRA = 24  # preamble+SFD 8, FCS 4, inter-frame gap 12


@dataclass(frozen=True)
class DcqcnConfig:
    """Reaction-point parameters (defaults after the DCQCN paper and ConnectX defaults)."""

    line_gbps: float = 100.0
    min_gbps: float = 1.0
    g: float = 1 / 16
    cut_interval_ns: int = 50_000
    alpha_ns: int = 55_000
    recover_ns: int = 55_000
    fast_steps: int = 5
    ai_gbps: float = 5.0

    def __post_init__(self):
        if not (self.line_gbps > 0 and 0 < self.min_gbps <= self.line_gbps):
            raise ValueError(f"DCQCN rates: need 0 < min_gbps {self.min_gbps} <= line_gbps "
                             f"{self.line_gbps}")
        if not 0 < self.g <= 1:
            raise ValueError(f"DCQCN g must be in (0, 1], got {self.g}")
        for n in ("cut_interval_ns", "alpha_ns", "recover_ns"):
            if not (isinstance(getattr(self, n), int) and getattr(self, n) > 0):
                raise ValueError(f"DCQCN {n} must be a positive integer, got {getattr(self, n)!r}")
        if self.ai_gbps < 0 or self.fast_steps < 0:
            raise ValueError(f"DCQCN ai_gbps {self.ai_gbps} / fast_steps {self.fast_steps} < 0")


class Dcqcn:
    """One QP's reaction point. ``now`` is a callable giving simulated ns."""

    def __init__(self, cfg: DcqcnConfig):
        self.cfg = cfg
        self.rc = self.rt = cfg.line_gbps
        self.alpha = 1.0
        self.last_cut: int | None = None
        self.last_cnp: int | None = None
        self._alpha_at = 0
        self._recover_at = 0
        self._steps = 0
        self.cuts = 0
        self.min_rate = cfg.line_gbps

    def _tick(self, now: int) -> None:
        """Apply the timers that expired up to ``now`` (evaluated lazily, in order)."""
        c = self.cfg
        if self.last_cnp is not None:
            while self._alpha_at + c.alpha_ns <= now:
                self._alpha_at += c.alpha_ns
                if self.last_cnp < self._alpha_at - c.alpha_ns:
                    self.alpha *= 1 - c.g
        while self.rc < c.line_gbps and self._recover_at + c.recover_ns <= now:
            self._recover_at += c.recover_ns
            if self._steps >= c.fast_steps:
                self.rt = min(c.line_gbps, self.rt + c.ai_gbps)
            self.rc = min(c.line_gbps, (self.rt + self.rc) / 2)
            self._steps += 1

    def on_cnp(self, now: int) -> bool:
        """A CNP arrived at ``now``; returns whether the rate was cut."""
        self._tick(now)
        c = self.cfg
        if self.last_cnp is None:
            self._alpha_at = now
        self.last_cnp = now
        self.alpha = (1 - c.g) * self.alpha + c.g
        if self.last_cut is not None and now - self.last_cut < c.cut_interval_ns:
            return False
        self.last_cut = now
        self.rt = self.rc
        self.rc = max(c.min_gbps, self.rc * (1 - self.alpha / 2))
        self.min_rate = min(self.min_rate, self.rc)
        self._recover_at, self._steps = now, 0
        self.cuts += 1
        return True

    def rate(self, now: int) -> float:
        self._tick(now)
        return self.rc

    def gap_ns(self, nbytes: int, now: int) -> int:
        """Wire time of a frame of ``nbytes`` at the current rate (the pacer's spacing)."""
        return math.ceil((nbytes + WIRE_EXTRA) * 8 / self.rate(now))
