"""NetReduce as a ``torch.distributed`` backend: ``init_process_group(backend="netreduce")``.

Importing this module registers the backend (:func:`register`, idempotent) for the CPU, so both
``backend="netreduce"`` and ``backend="cpu:netreduce"`` work under ``torchrun``::

    import netreduce.sw_driver.torch_backend                     # registers "netreduce"
    dist.init_process_group("netreduce")                         # env://, NETREDUCE_SWITCH
    dist.all_reduce(t)                                           # through the engine
    DistributedDataParallel(model)                               # no hook needed

Every ``all_reduce`` crosses the engine in the switch service (``netreduce switch``) inside the
ranks' RoCEv2 RC connections (:class:`~netreduce.sim.emu.rank.RankComm`); the other
collectives (broadcast, all_gather, all_gather_into_tensor, gather, scatter, reduce,
reduce_scatter, reduce_scatter_tensor, all_to_all, all_to_all_single, send, recv, barrier) are
delegated to a gloo process group built on the same store. Engine all-reduces run in order on one
worker thread per process group; ``async_op=True`` returns a ``Work`` at once, whose future holds
the result (or the error).

Reductions (``docs/torch.md`` has the table and the bounds):

=============  ==========================================  =====================================
op             dtypes                                      result
=============  ==========================================  =====================================
SUM, AVG       int32, int64, int16, int8, uint8, bool      exact (wrapping like torch); int AVG
                                                           truncates towards zero (as NCCL)
SUM, AVG       float32, bfloat16, float16                  quantised: ``quant.error_bound``
MAX, MIN       every dtype above and float64               exact (NaN propagates)
PRODUCT, BAND, BOR, BXOR, PREMUL_SUM; SUM/AVG of float64 and complex: RuntimeError
=============  ==========================================  =====================================

int32 (and narrower) sums travel as int32 through a SUM_WRAP job; int64 as three 24/24/16-bit
limbs in int32 lanes (1.5x the bytes; limb sums of up to 255 ranks cannot wrap), recombined mod
2^64. MAX/MIN use the engine's signed int32 MAX on an order-preserving integer image of the
values (floats: sign-magnitude to two's complement; MIN: bitwise NOT; 64-bit values: the high
words, then the low words of the ranks that hold the maximal high word). float16/bfloat16 travel
as float32 and are rounded back once, so their bound adds half an ulp of the result.

Hierarchy: when several ranks share a host (grouping below) and there are at least two hosts of
equal size L, an all-reduce is an intra-host reduce-scatter (gloo, in the engine's working dtype),
L shard all-reduces across the H hosts through the engine (L engine job sets: local rank i of
every host forms communicator i), and an intra-host all-gather. Host of a rank: the env var
``NETREDUCE_HOST`` if set, else ``NETREDUCE_LOCAL_SIZE=k`` (emulation: ranks r // k share a
host), else torchrun's ``GROUP_RANK`` (the node rank; its ``LOCAL_WORLD_SIZE`` is checked against
the grouping), else the host name; exchanged through the store. ``NETREDUCE_HIERARCHICAL=0``
forces the flat path, ``=1`` requires the hierarchical one.

Configuration: :class:`Options` (``pg_options=`` of ``init_process_group``) or the environment
(``NETREDUCE_SWITCH`` = HOST:PORT, required; ``NETREDUCE_OP_TIMEOUT_S``,
``NETREDUCE_INIT_TIMEOUT_S``, ``NETREDUCE_RC_TIMEOUT``, ``NETREDUCE_RC_RETRIES``,
``NETREDUCE_INT=0`` to register no integer job (engines with few jobs), ``NETREDUCE_EXACT=1``
to refuse the quantised float sums).

Errors are ``RuntimeError`` naming the rank, the op and the QP: a dead rank (RC retries run out,
``(retry_cnt + 1) x 4.096 us x 2^timeout``), an unsupported op, a dtype that cannot be exact, a
switch that is not there (at init, within ``Options.connect_timeout_s``); a failed communicator
stays failed. No call waits longer than its timeout.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import threading
from dataclasses import dataclass, replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from netreduce.sim.emu.rank import CollectiveError, RankComm, RankCommConfig
from netreduce.sim.emu.tunnel import Tunnel, TunnelClosed
from torch._C._distributed_c10d import ProcessGroupGloo, Work

__all__ = ["BACKEND", "Options", "ProcessGroupNetReduce", "register", "host_groups",
           "UNSUPPORTED_OPS"]

log = logging.getLogger("netreduce.torch")

BACKEND = "netreduce"
RedOp = dist.ReduceOp.RedOpType
UNSUPPORTED_OPS = (RedOp.PRODUCT, RedOp.BAND, RedOp.BOR, RedOp.BXOR, RedOp.PREMUL_SUM)
_INT_EXACT = (torch.int8, torch.int16, torch.int32, torch.uint8, torch.bool)
_FLOAT_Q = (torch.float32, torch.bfloat16, torch.float16)
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not a number") from None


@dataclass(frozen=True)
class Options:
    """Backend options (``init_process_group(..., pg_options=Options(...))``); every field left
    at None is read from the environment (module docstring), then the default.

    The rings default to a window of 128 packets of 1 KiB, 16-packet messages (4096-element
    quantisation chunks) and a margin of 64 packets (4 messages: ranks in different processes
    see each other's ACKs late; a margin of one message let packets reach the engine ahead of
    its window under load, each costing an RC timeout): 384 engine slots and 3 jobs per
    communicator, so two shard communicators (hierarchy with 2 ranks per host) fit the default
    engine (8 jobs, 1024 slots).
    """

    switch: str | None = None
    comm: RankCommConfig | None = None
    hierarchical: bool | None = None  # None: when the host grouping allows it
    local_size: int | None = None  # emulate hosts of this many consecutive ranks
    host: str | None = None
    init_timeout_s: float | None = None
    connect_timeout_s: float = 10.0
    ints: bool | None = None  # register the integer (SUM_WRAP) job
    exact: bool | None = None  # refuse the quantised float sums
    seed: int | None = None

    def resolved(self, timeout: timedelta | None) -> Options:
        env = os.environ
        switch = self.switch or env.get("NETREDUCE_SWITCH")
        if not switch:
            raise RuntimeError("the netreduce backend needs the switch address: set "
                               "NETREDUCE_SWITCH=HOST:PORT or pass pg_options=Options(switch=...)")
        pg_s = timeout.total_seconds() if timeout else 120.0
        ints = self.ints if self.ints is not None else env.get("NETREDUCE_INT", "1") != "0"
        comm = self.comm
        if comm is None:
            comm = RankCommConfig(
                window=128, margin=64, msg_packets=16, exp_window=128,
                timeout=int(_env_float("NETREDUCE_RC_TIMEOUT", 17)),
                retry_cnt=int(_env_float("NETREDUCE_RC_RETRIES", 7)),
                op_timeout_s=_env_float("NETREDUCE_OP_TIMEOUT_S", min(pg_s, 120.0)),
                max_bytes=4 << 20, int32=ints, exp_bytes=1 << 20)
        else:
            comm = replace(comm, int32=ints if self.ints is not None else comm.int32)
        hier = self.hierarchical
        if hier is None and env.get("NETREDUCE_HIERARCHICAL", "") not in ("", "auto"):
            hier = env["NETREDUCE_HIERARCHICAL"] != "0"
        ls = self.local_size
        if ls is None and env.get("NETREDUCE_LOCAL_SIZE"):
            ls = int(_env_float("NETREDUCE_LOCAL_SIZE", 0))
        return replace(self, switch=switch, comm=comm, hierarchical=hier, local_size=ls,
                       host=self.host or env.get("NETREDUCE_HOST") or None,
                       init_timeout_s=self.init_timeout_s or _env_float(
                           "NETREDUCE_INIT_TIMEOUT_S", min(pg_s, 60.0)),
                       ints=comm.int32,
                       exact=self.exact if self.exact is not None else
                       env.get("NETREDUCE_EXACT", "0") == "1")


# ============================================================================ store exchange
class _Failed:
    """Published through the store instead of a value: this rank failed; peers raise at once."""

    def __init__(self, rank: int, why: str):
        self.rank, self.why = rank, why


class _StoreExchange:
    """All-gather of small picklable objects through the c10d store (the RankComm rendezvous):
    call k sets ``PREFIX/k/rank`` and waits (bounded) for every rank's key."""

    def __init__(self, store, prefix: str, rank: int, world: int, timeout_s: float,
                 who: str):
        self.store, self.prefix, self.rank, self.world = store, prefix, rank, world
        self.timeout = timedelta(seconds=timeout_s)
        self.who = who
        self.n = 0

    def __call__(self, obj):
        k = self.n
        self.n += 1
        self.store.set(f"{self.prefix}/{k}/{self.rank}", pickle.dumps(obj))
        keys = [f"{self.prefix}/{k}/{r}" for r in range(self.world)]
        try:
            self.store.wait(keys, self.timeout)
        except Exception as e:  # DistStoreError: a peer never came
            missing = [r for r, key in enumerate(keys) if not self.store.check([key])]
            raise RuntimeError(f"{self.who}: ranks {missing} did not arrive within "
                               f"{self.timeout.total_seconds():g} s (dead, or failed before "
                               f"reaching the switch): {e}") from None
        out = [pickle.loads(self.store.get(key)) for key in keys]
        for o in out:
            if isinstance(o, _Failed):
                raise RuntimeError(f"{self.who}: rank {o.rank} failed: {o.why}")
        return out


# ============================================================================ host grouping
def _host_key(opts: Options, rank: int) -> str:
    if opts.host:
        return f"host:{opts.host}"
    if opts.local_size:
        return f"emulated:{rank // opts.local_size}"
    if os.environ.get("GROUP_RANK"):
        return f"node:{os.environ['GROUP_RANK']}"
    return f"name:{socket.gethostname()}"


def host_groups(keys: list[str]) -> list[list[int]] | None:
    """Ranks grouped by host key, hosts in order of their first rank; None when the grouping
    does not allow the hierarchical path (one host, one rank per host, or unequal hosts)."""
    hosts: dict[str, list[int]] = {}
    for r, k in enumerate(keys):
        hosts.setdefault(k, []).append(r)
    groups = list(hosts.values())
    sizes = {len(g) for g in groups}
    if len(groups) < 2 or len(sizes) != 1 or sizes == {1}:
        return None
    return groups


# ============================================================================ Work
class _Job:
    """One queued engine all-reduce: ``fn`` runs on the worker thread, then ``fut`` resolves to
    ``result`` (the tensors) or carries ``error``."""

    def __init__(self, fn, result: list, what: str):
        self.fn = fn
        self.result = result
        self.fut = torch.futures.Future()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.what = what


class _NRWork(Work):
    """A queued engine all-reduce: ``wait()`` blocks (bounded) and raises its error;
    ``get_future()`` resolves to the list of result tensors."""

    def __init__(self, job: _Job, limit_s: float):
        super().__init__()
        self.job = job
        self.limit_s = limit_s

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        t = timeout.total_seconds() if timeout else 0.0
        limit = t if t > 0 else self.limit_s
        if not self.job.done.wait(limit):
            raise RuntimeError(f"{self.job.what}: not complete within {limit:g} s")
        if self.job.error is not None:
            raise self.job.error
        return True

    def get_future(self) -> torch.futures.Future:
        return self.job.fut

    def is_completed(self) -> bool:
        return self.job.done.is_set()

    def is_success(self) -> bool:
        return self.job.done.is_set() and self.job.error is None

    def exception(self):
        return self.job.error

    def result(self):
        return self.job.result

    def synchronize(self) -> None:
        self.wait()


class _DoneWork(Work):
    def __init__(self, result):
        super().__init__()
        self.fut = torch.futures.Future()
        self.fut.set_result(result)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def get_future(self):
        return self.fut

    def is_completed(self) -> bool:
        return True


# ============================================================================ the process group
class _EngineComm(RankComm):
    """RankComm plus raw ring reductions of int32 arrays (MAX through the exponent ring)."""

    def ring_reduce(self, name: str, a: np.ndarray) -> np.ndarray:
        if self.error is not None:
            raise self.error
        if self.tunnel.closed:
            raise CollectiveError(f"rank {self.rank}: communicator is closed")
        ring = self.rings[name]
        out = np.empty_like(a)
        seg = ring.region.nbytes // 4
        self.calls += 1
        for s in range(0, a.size, seg):
            out[s:s + seg] = ring.reduce(a[s:s + seg].view(np.uint8)).view(np.int32)
        return out

    def qp_label(self, name: str) -> str:
        """The send QP(s) and engine job(s) an op uses ("float": exponents, then values)."""
        names = ("exp", "sum") if name == "float" else (name if name in self.rings else "sum",)
        rings = [self.rings[n] for n in names]
        return (f"QP {'/'.join(f'{r.sq.qpn:#08x}' for r in rings)} ("
                f"{'+'.join(r.name for r in rings)} ring{'s' if len(rings) > 1 else ''}, "
                f"engine job{'s' if len(rings) > 1 else ''} "
                f"{', '.join(str(r.job) for r in rings)})")


class ProcessGroupNetReduce(dist.ProcessGroup):
    """The backend's process group (see the module docstring). ``comm`` is this rank's engine
    communicator (the shard communicator under the hierarchy), ``gloo`` the delegate."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | None,
                 options: Options | None = None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.opts = opts = (options or Options()).resolved(timeout)
        self.timeout = timeout or timedelta(minutes=30)
        init_s = opts.init_timeout_s
        self.gloo = ProcessGroupGloo(dist.PrefixStore("nr-gloo/", store), rank, size,
                                     self.timeout)
        who = f"rank {rank}: init_process_group(backend='netreduce')"
        ex = _StoreExchange(store, "nr-hosts", rank, size, init_s, who)
        keys = ex(_host_key(opts, rank))
        groups = host_groups(keys)
        if opts.hierarchical and groups is None:
            raise RuntimeError(f"{who}: hierarchical path requested but the host grouping "
                               f"{keys} has not >= 2 hosts of equal size >= 2")
        if opts.hierarchical is False:
            groups = None
        lws = os.environ.get("LOCAL_WORLD_SIZE")
        if lws and not (opts.host or opts.local_size) and os.environ.get("GROUP_RANK"):
            sizes = sorted({keys.count(k) for k in keys})
            if sizes != [int(lws)]:
                raise RuntimeError(f"{who}: torchrun's LOCAL_WORLD_SIZE={lws} disagrees with "
                                   f"the ranks per node seen through the store ({sizes})")
        self.hosts = groups
        self.local = None  # the intra-host gloo group
        if groups is None:
            members, me, tag = list(range(size)), rank, "flat"
            self.local_rank, self.local_size, self.host_index = 0, 1, rank
        else:
            h = next(i for i, g in enumerate(groups) if rank in g)
            li = groups[h].index(rank)
            self.host_index, self.local_rank, self.local_size = h, li, len(groups[h])
            self.local = ProcessGroupGloo(dist.PrefixStore(f"nr-local{h}/", store), li,
                                          len(groups[h]), self.timeout)
            members, me, tag = [g[li] for g in groups], h, f"shard{li}"
        self.members = members
        self._store, self._shard = store, (0 if groups is None else self.local_rank)
        self._shards = 1 if groups is None else self.local_size
        # shard communicators register their engine jobs one after the other (one configuring
        # client at a time: EngineControl picks the first free job)
        shard = 0 if groups is None else self.local_rank
        if shard > 0:
            self._wait_key(store, f"nr-ready/shard{shard - 1}", init_s, who)
        cex = _StoreExchange(store, f"nr-{tag}", me, len(members), init_s, who)
        self.comm: _EngineComm | None = None
        if size == 1:  # nothing to reduce with: no switch, no QP (the ops are checked alike)
            self._start_worker(rank)
            return
        try:
            tunnel = Tunnel(opts.switch, connect_timeout_s=opts.connect_timeout_s,
                            name=f"rank{rank}")
        except TunnelClosed as e:
            msg = (f"{who}: all_reduce setup, no QP created: the switch is not there: {e} "
                   f"(start `netreduce switch --listen {opts.switch}` or set NETREDUCE_SWITCH)")
            try:
                cex(_Failed(rank, msg))
            except RuntimeError:
                pass
            raise RuntimeError(msg) from None
        try:
            self.comm = _EngineComm(None, me, len(members), cex, opts.comm, seed=opts.seed,
                                    tunnel=tunnel)
        except RuntimeError as e:
            raise RuntimeError(f"{who}: engine communicator: {e}") from None
        if groups is not None and me == 0:
            store.set(f"nr-ready/shard{shard}", b"1")
        self._start_worker(rank)
        log.info("rank %d/%d: netreduce backend ready (%s, hosts %s)", rank, size, tag,
                 None if groups is None else len(groups))

    def _start_worker(self, rank: int) -> None:
        self._q: queue.Queue = queue.Queue()
        self._error: RuntimeError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name=f"netreduce-pg-r{rank}",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _wait_key(store, key: str, timeout_s: float, who: str) -> None:
        try:
            store.wait([key], timedelta(seconds=timeout_s))
        except Exception as e:
            raise RuntimeError(f"{who}: {key} not set within {timeout_s:g} s: {e}") from None

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:  # noqa: N802 (the c10d name)
        return BACKEND

    def name(self) -> str:
        return BACKEND

    # ------------------------------------------------------------------ worker thread
    def _worker(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                if self._error is not None:
                    raise RuntimeError(f"{job.what}: the communicator failed earlier: "
                                       f"{self._error}")
                job.fn()
            except BaseException as e:  # noqa: BLE001 (set on the future, raised by wait)
                err = e if isinstance(e, RuntimeError) and str(e).startswith(job.what) else \
                    RuntimeError(f"{job.what}: {e}")
                if isinstance(e, CollectiveError | TimeoutError) and self._error is None:
                    self._error = err  # the communicator is broken for good
                job.error = err
                job.done.set()
                job.fut.set_exception(err)
                continue
            job.done.set()
            job.fut.set_result(job.result)

    def _submit(self, fn, result, what: str) -> _NRWork:
        if self._closed:
            raise RuntimeError(f"{what}: the process group was shut down")
        job = _Job(fn, result, what)
        # each ring pass of each segment is bounded by op_timeout_s (RankComm); wait() allows
        # all of them (int64: 1.5x the bytes; MAX of 64-bit values and floats: 2 passes)
        cc = self.opts.comm
        nbytes = sum(t.numel() * 8 for t in result)
        passes = 2 * (1 + nbytes // min(cc.max_bytes, max(cc.exp_bytes, cc.msg_bytes)))
        self._q.put(job)
        return _NRWork(job, cc.op_timeout_s * passes + 30)

    def _drain(self) -> None:
        """Wait (bounded) for every queued engine all-reduce of this rank."""
        ev = threading.Event()
        self._q.put(_Job(ev.set, [], "drain"))
        ev.wait(self.opts.comm.op_timeout_s * 4 + 30)

    # ------------------------------------------------------------------ all-reduce
    def _what(self, op, t: torch.Tensor, ring: str = "sum") -> str:
        name = op.name if hasattr(op, "name") else str(op)
        qp = self.comm.qp_label(ring) if self.comm is not None else "no QP (world size 1)"
        return f"rank {self._rank}: all_reduce({name}, {t.dtype}{list(t.shape)}) on {qp}"

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts.reduceOp.op if opts is not None else RedOp.SUM
        for t in tensors:
            self._check(op, t)
        plans = [(t, op) for t in tensors]

        def run():
            for t, o in plans:
                self._allreduce_one(t, o)
        return self._submit(run, list(tensors), self._what(op, tensors[0], _ring_of(op,
                                                                                   tensors[0])))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(list(tensors), opts)

    def _check(self, op, t: torch.Tensor) -> None:
        what = self._what(op, t, _ring_of(op, t))
        if t.device.type != "cpu":
            raise RuntimeError(f"{what}: tensor on {t.device}; the netreduce backend is for CPU "
                               f"tensors (use 'cpu:netreduce,cuda:nccl')")
        if op in UNSUPPORTED_OPS:
            raise RuntimeError(f"{what}: op {op.name} is not supported: the engine adds and "
                               f"takes maxima (SUM, AVG, MAX, MIN); use gloo for {op.name}")
        if op not in (RedOp.SUM, RedOp.AVG, RedOp.MAX, RedOp.MIN):
            raise RuntimeError(f"{what}: op {op} is not supported (SUM, AVG, MAX, MIN)")
        dt = t.dtype
        if op in (RedOp.SUM, RedOp.AVG):
            if dt in _FLOAT_Q:
                if self.opts.exact:
                    raise RuntimeError(
                        f"{what}: dtype {dt} cannot be summed exactly (the engine adds int32 "
                        f"lanes: floats are quantised per chunk, see quant.error_bound) and "
                        f"NETREDUCE_EXACT=1 asks for exact results")
            elif dt in _INT_EXACT or dt == torch.int64:
                if not self.opts.ints:
                    raise RuntimeError(f"{what}: integer sums need the SUM_WRAP job, which this "
                                       f"process group did not register (NETREDUCE_INT=0)")
            else:
                raise RuntimeError(
                    f"{what}: dtype {dt} cannot be summed exactly or within a useful bound "
                    f"(the engine adds int32 lanes; a float64 or complex sum would keep about "
                    f"31 bits per chunk); supported: float32, bfloat16, float16 (bounded), "
                    f"int64, int32, int16, int8, uint8, bool (exact)")
        elif dt not in _FLOAT_Q + _INT_EXACT + (torch.int64, torch.float64):
            raise RuntimeError(f"{what}: dtype {dt} has no exact {op.name} on the engine")

    def _allreduce_one(self, t: torch.Tensor, op) -> None:
        """Runs on the worker thread."""
        if t.numel() == 0:
            return
        dt = t.dtype
        # the working dtype: what the hierarchy reduces and the engine carries
        if dt in _FLOAT_Q:
            wdt = torch.float32
        elif dt in _INT_EXACT:
            wdt = torch.int32
        else:
            wdt = dt  # int64, float64
        w = t.detach().reshape(-1).to(wdt, copy=True).contiguous()
        sop = RedOp.SUM if op == RedOp.AVG else op
        if self.local is None:
            res = self._engine(w.numpy(), sop)
        else:
            res = self._hierarchical(w, sop)
        r = torch.from_numpy(res)
        if op == RedOp.AVG:
            if r.dtype.is_floating_point:
                r = r / self._size
            else:
                r = torch.div(r, self._size, rounding_mode="trunc")
        with torch.no_grad():
            t.copy_(r.reshape(t.shape).to(dt) if dt != torch.bool else
                    (r != 0).reshape(t.shape))

    def _hierarchical(self, w: torch.Tensor, op) -> np.ndarray:
        L = self.local_size
        n = w.numel()
        shard = -(-n // L)
        if shard * L != n:
            pad = torch.zeros(shard * L - n, dtype=w.dtype)
            w = torch.cat([w, pad])
        rop = {RedOp.SUM: dist.ReduceOp.SUM, RedOp.MAX: dist.ReduceOp.MAX,
               RedOp.MIN: dist.ReduceOp.MIN}[op]
        mine = torch.empty(shard, dtype=w.dtype)
        ro = dist.ReduceScatterOptions()
        ro.reduceOp = rop
        self._gloo_wait(self.local._reduce_scatter_base(mine, w, ro), "intra-host "
                        "reduce-scatter")
        red = torch.from_numpy(self._engine(mine.numpy(), op))
        full = torch.empty(shard * L, dtype=w.dtype)
        self._gloo_wait(self.local._allgather_base(full, red), "intra-host all-gather")
        return full[:n].numpy()

    def _gloo_wait(self, work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except Exception as e:
            raise RuntimeError(f"{what} (gloo, host {self.host_index}): {e}") from None

    # the engine side, on numpy arrays of the working dtype
    def _engine(self, a: np.ndarray, op) -> np.ndarray:
        c = self.comm
        if c is None:
            return a.copy()  # one rank: its own values are the sum, the maximum, the minimum
        if op == RedOp.SUM:
            if a.dtype == np.float32:
                return c.allreduce(a)
            if a.dtype == np.int32:
                return c.allreduce(a)
            if a.dtype == np.int64:
                return _int64_sum(c, a)
        else:
            fl = a.dtype.kind == "f"  # NaN rule: only floats have a NaN key
            if a.dtype in (np.int32, np.float32):
                return _unkey32(_max32(c, _key32(a), op, fl), a.dtype)
            if a.dtype in (np.int64, np.float64):
                return _unkey64(_max64(c, _key64(a), op, fl), a.dtype)
        raise AssertionError(f"no engine path for {a.dtype} {op}")  # _check() prevents it

    # ------------------------------------------------------------------ delegated to gloo
    def _gl(self):
        self._drain_if_pending()
        return self.gloo

    def _drain_if_pending(self) -> None:
        if not self._q.empty():
            self._drain()

    def broadcast(self, tensors, opts):
        return self._gl().broadcast(tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts):
        return self._gl().allgather(output_tensors, input_tensors, opts)

    def _allgather_base(self, output, input, opts):
        return self._gl()._allgather_base(output, input, opts)

    def allgather_coalesced(self, output_lists, input_list, opts):
        return self._gl().allgather_coalesced(output_lists, input_list, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        return self._gl().allgather_into_tensor_coalesced(outputs, inputs, opts)

    # torch >= 2.10 names of the single-tensor collectives
    def all_gather_single(self, output, input, opts):
        return self._gl()._allgather_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return self._gl().allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output, input, opts):
        return self._gl()._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return self._gl().reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self._gl().alltoall_base(output, input, output_split_sizes, input_split_sizes,
                                        opts)

    def gather(self, output_tensors, input_tensors, opts):
        return self._gl().gather(output_tensors, input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts):
        return self._gl().scatter(output_tensors, input_tensors, opts)

    def reduce(self, tensors, opts):
        return self._gl().reduce(tensors, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        return self._gl().reduce_scatter(output_tensors, input_tensors, opts)

    def _reduce_scatter_base(self, output, input, opts):
        return self._gl()._reduce_scatter_base(output, input, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        return self._gl().reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def alltoall(self, output_tensors, input_tensors, opts):
        return self._gl().alltoall(output_tensors, input_tensors, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self._gl().alltoall_base(output, input, output_split_sizes, input_split_sizes,
                                        opts)

    def send(self, tensors, dst, tag):
        return self._gl().send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._gl().recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag):
        return self._gl().recv_anysource(tensors, tag)

    def barrier(self, opts=None):
        self._drain()  # this rank's engine all-reduces first, then gloo's barrier
        return self.gloo.barrier(opts) if opts is not None else self.gloo.barrier()

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self._drain()
        return self.gloo.monitored_barrier(timeout or self.timeout, wait_all_ranks)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Stop the worker; rank 0 of each communicator removes its engine jobs. Not collective
        (peers may already be gone): the jobs of a communicator whose rank 0 dies stay until the
        switch restarts."""
        if self._closed:
            return
        self._closed = True
        self._drain()
        self._q.put(None)
        self._thread.join(5)
        c = self.comm
        if c is None:
            return
        try:
            if c.rank == 0 and c.jobs:
                # shard communicators share the management source: one after the other, each
                # resynchronising its sequence number first (bounded: a dead peer costs 5 s)
                if self._shard > 0:
                    try:
                        self._store.wait([f"nr-closed/shard{self._shard - 1}"],
                                         timedelta(seconds=5))
                    except Exception:  # noqa: BLE001 (remove ours anyway)
                        pass
                bus = c.ctrl.bus
                getattr(bus, "client", bus).synced = False
            c.close(barrier=False)
            if c.rank == 0 and self._shards > 1:
                self._store.set(f"nr-closed/shard{self._shard}", b"1")
        except Exception as e:  # noqa: BLE001 (best effort at exit)
            log.warning("rank %d: closing the engine communicator: %s", self._rank, e)

    def abort(self) -> None:
        self.shutdown()

    def __del__(self):
        try:
            if not self._closed:
                self._closed = True
                self._q.put(None)
                if self.comm is not None:
                    self.comm.tunnel.close()
        except Exception:  # noqa: BLE001 (interpreter exit)
            pass


def _ring_of(op, t: torch.Tensor) -> str:
    if op in (RedOp.MAX, RedOp.MIN):
        return "exp"
    if t.dtype in _FLOAT_Q:
        return "float"
    return "int" if t.dtype in _INT_EXACT or t.dtype == torch.int64 else "sum"


# ============================================================================ exact integer maps
_LIMBS = ((0, 0xFFFFFF), (24, 0xFFFFFF), (48, 0xFFFF))


def _int64_sum(c: _EngineComm, a: np.ndarray) -> np.ndarray:
    """Wrapping int64 sum: three limbs (24, 24, 16 bits) summed as int32; sums of up to 255
    ranks stay below 2^32, read back as uint32, recombined mod 2^64."""
    u = a.view(np.uint64)
    limbs = np.empty((3, a.size), np.int32)
    for i, (sh, m) in enumerate(_LIMBS):
        limbs[i] = ((u >> np.uint64(sh)) & np.uint64(m)).astype(np.int32)
    s = c.allreduce(limbs.reshape(-1)).reshape(3, a.size).view(np.uint32).astype(np.uint64)
    out = s[0] + (s[1] << np.uint64(24)) + (s[2] << np.uint64(48))  # numpy uint64 wraps
    return out.view(np.int64)


def _key32(a: np.ndarray) -> np.ndarray:
    """Order-preserving int32 image: ints as they are; floats sign-magnitude -> two's
    complement, every NaN the largest key (so it wins MAX, and MIN through the NaN rule of
    :func:`_max32`)."""
    if a.dtype == np.int32:
        return a.copy()
    i = a.view(np.int32)
    k = np.where(i < 0, i ^ np.int32(INT32_MAX), i)
    k[np.isnan(a)] = INT32_MAX  # a NaN bit pattern too: the key no number reaches
    return k


def _unkey32(k: np.ndarray, dt) -> np.ndarray:
    if dt == np.int32:
        return k
    return np.where(k < 0, k ^ np.int32(INT32_MAX), k).view(np.float32)


def _max32(c: _EngineComm, k: np.ndarray, op, floats: bool) -> np.ndarray:
    if op == RedOp.MAX:
        return c.ring_reduce("exp", k)
    # MIN = NOT(MAX(NOT k)); for floats a NaN (the largest key) stays largest so it still wins
    m = np.invert(k)
    if floats:
        m[k == INT32_MAX] = INT32_MAX
    r = c.ring_reduce("exp", m)
    out = np.invert(r)
    if floats:
        out[r == INT32_MAX] = INT32_MAX
    return out


def _key64(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.int64:
        return a.copy()
    i = a.view(np.int64)
    k = np.where(i < 0, i ^ np.int64((1 << 63) - 1), i)
    k[np.isnan(a)] = (1 << 63) - 1
    return k


def _unkey64(k: np.ndarray, dt) -> np.ndarray:
    if dt == np.int64:
        return k
    return np.where(k < 0, k ^ np.int64((1 << 63) - 1), k).view(np.float64)


def _max64(c: _EngineComm, k: np.ndarray, op, floats: bool) -> np.ndarray:
    """int64 MAX/MIN in two int32 MAX passes: the high words, then the low words (unsigned order
    mapped to signed) of the ranks holding the maximal high word."""
    imax = np.int64((1 << 63) - 1)
    if op == RedOp.MIN:
        nan = k == imax
        k = np.invert(k)
        if floats:
            k[nan] = imax
    hi = (k >> np.int64(32)).astype(np.int32)
    lo = ((k & np.int64(0xFFFFFFFF)).astype(np.uint32) ^ np.uint32(0x80000000)).view(np.int32)
    mh = c.ring_reduce("exp", hi)
    ml = c.ring_reduce("exp", np.where(hi == mh, lo, np.int32(INT32_MIN)).astype(np.int32))
    r = (mh.astype(np.int64) << np.int64(32)) | (
        ml.view(np.uint32) ^ np.uint32(0x80000000)).astype(np.int64)
    if op == RedOp.MIN:
        out = np.invert(r)
        if floats:
            out[r == imax] = imax
        return out
    return r


# ============================================================================ registration
def _create(dist_opts, pg_options) -> ProcessGroupNetReduce:
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"pg_options for the netreduce backend must be "
                        f"netreduce.sw_driver.torch_backend.Options, got {type(pg_options)}")
    return ProcessGroupNetReduce(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                                 dist_opts.timeout, pg_options)


def register() -> None:
    """Register the "netreduce" backend for CPU tensors (idempotent)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


register()
