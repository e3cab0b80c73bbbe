"""Striped all-reduce ("parallel all-reduce"): one all-reduce split across engine ports and
engines.

The buffer of every rank is cut into E contiguous stripes of (nearly) equal size, element
aligned; stripe e is an ordinary all-reduce (:class:`~.collective.AllReduce`) with its own engine
job, its own ring of RC QPs and its own slots, pinned to engine port e mod P by the switch's
steering rules (the driver hands the port to the fabric with the job; see
``netreduce.sim.net.topology``). The stripes run concurrently; each recovers its own losses (its QPs
retransmit, its job re-emits), so a loss in one stripe stalls only that stripe. The result is
the concatenation of the stripes' results: int32 bit-exact, float32 within each stripe's
quantisation bound (each stripe has its own exponent pass).

Several engines (``buses``: one register bus per engine, all on the same fabric): stripe e
goes to engine e mod E, on that engine's port (e // E) mod P_e, P_e read from the engine's
identity; its job is registered on that engine. Global port numbers count engine k's ports
from k x P_e (the fabric's numbering).

Capacity: an engine port carries N x S / E of the contributions in and as many results out, so
with E >= P ports the all-reduce takes at least N x S / (P x C) instead of N x S / C.

"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence

import numpy as np
from netreduce.sw_driver.control import EngineControl

from .collective import AllReduce, AllReduceResult, Communicator

__all__ = ["StripedAllReduce", "StripedResult", "stripe_bounds", "striped_allreduce_async"]


def stripe_bounds(n: int, stripes: int) -> list[tuple[int, int]]:
    """``stripes`` contiguous [lo, hi) element ranges covering ``n`` elements, sizes differing by
    at most one; every stripe holds at least one element."""
    if not isinstance(stripes, int) or stripes < 1:
        raise ValueError(f"stripes must be an int >= 1, got {stripes!r}")
    if stripes > n:
        raise ValueError(f"{stripes} stripes for {n} elements: every stripe needs an element")
    q, r = divmod(n, stripes)
    out, lo = [], 0
    for e in range(stripes):
        hi = lo + q + (e < r)
        out.append((lo, hi))
        lo = hi
    return out


class StripedResult(AllReduceResult):
    """The concatenated result; ``stripes`` holds each stripe's own result."""

    def __init__(self, results, stats, stripes: list[AllReduceResult]):
        super().__init__(results, stats)
        self.stripes = stripes

    def error_bound(self) -> np.ndarray:
        shape = self.results[0].shape
        return np.concatenate([s.error_bound().reshape(-1) for s in self.stripes]).reshape(shape)


class StripedAllReduce:
    """E concurrent all-reduces over one communicator, stripe e on engine port ``ports[e]``
    (default e). Drive it with :func:`netreduce.sw_driver.collective.run` like an
    :class:`AllReduce`."""

    def __init__(self, comm: Communicator, arrays: Sequence[np.ndarray], stripes: int,
                 ports: Sequence[int] | None = None, buses: Sequence | None = None):
        if len(arrays) != comm.world:
            raise ValueError(f"need one array per rank ({comm.world}), got {len(arrays)}")
        flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        self.shape = np.asarray(arrays[0]).shape
        self.bounds = stripe_bounds(flat[0].size, stripes)
        comms = [comm] * stripes
        if buses:
            if ports is not None:
                raise ValueError("give ports or buses, not both")
            ctrls = [EngineControl(b) for b in buses]
            pe = ctrls[0].identify().ports
            ports, comms = [], []
            for e in range(stripes):
                k = e % len(ctrls)
                ports.append(k * pe + (e // len(ctrls)) % pe)
                comms.append(_on_engine(comm, ctrls[k]))
        ports = list(range(stripes)) if ports is None else list(ports)
        if len(ports) != stripes:
            raise ValueError(f"{len(ports)} ports given for {stripes} stripes")
        self.comm = comm
        self.ports = ports
        self.parts = [AllReduce(c, [x[lo:hi] for x in flat], port=p)
                      for (lo, hi), p, c in zip(self.bounds, ports, comms, strict=True)]
        self.error: BaseException | None = None
        self._result: StripedResult | None = None

    def start(self) -> None:
        for p in self.parts:
            p.start()

    @property
    def done(self) -> bool:
        return all(p.done for p in self.parts)

    @property
    def passes(self) -> list:
        return [q for p in self.parts for q in p.passes]

    def poll_error(self) -> BaseException | None:
        if self.error is None:
            self.error = next((e for e in (p.poll_error() for p in self.parts) if e), None)
        return self.error

    def abort(self) -> None:
        for p in self.parts:
            p.abort()

    def progress(self) -> float:
        return sum(p.progress() for p in self.parts) / len(self.parts)

    def describe(self) -> str:
        return "; ".join(f"stripe {e}: {p.describe()}" for e, p in enumerate(self.parts)
                         if not p.done)

    def result(self) -> StripedResult:
        if self._result is None:
            if not self.done:
                raise RuntimeError("all-reduce not finished; drive it with run()")
            rs = [p.result() for p in self.parts]
            n = self.comm.world
            results = [np.concatenate([r.results[k].reshape(-1) for r in rs]).reshape(self.shape)
                       for k in range(n)]
            st: Counter = Counter()
            eng: Counter = Counter()
            for r in rs:
                st.update({k: v for k, v in r.stats.items() if isinstance(v, int)})
                eng.update(r.stats.get("engine", {}))
            stats = dict(st)
            stats["engine"] = dict(eng)
            stats["bytes"] = sum(r.stats.get("bytes", 0) for r in rs)
            stats["stripes"] = len(rs)
            self._result = StripedResult(results, stats, rs)
        return self._result


def _on_engine(comm: Communicator, ctrl: EngineControl) -> Communicator:
    """``comm``'s ranks (the same RNICs) with their jobs registered on another engine."""
    c = copy.copy(comm)
    c.ctrl = ctrl
    c.info = ctrl.identify()
    return c


def striped_allreduce_async(comm: Communicator, arrays: Sequence[np.ndarray], stripes: int,
                            ports: Sequence[int] | None = None,
                            buses: Sequence | None = None) -> StripedAllReduce | AllReduce:
    """Start an all-reduce in ``stripes`` stripes (1 on one engine: a plain :class:`AllReduce`
    on any port); ``buses``: one register bus per engine (several engines)."""
    if stripes == 1 and ports is None and not buses:
        return comm.allreduce_async(arrays)
    op = StripedAllReduce(comm, arrays, stripes, ports, buses)
    op.start()
    return op
