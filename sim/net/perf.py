"""System performance of all-reduce algorithms: an analytic model and the simulations it is
checked against.

Notation: N ranks (H hosts x G devices when hierarchical), S bytes per rank, workers' (host
NIC) link rate B, engine P ports of C, intra-host link I (per device and direction), PMTU with
82 bytes of per-frame overhead on Ethernet (efficiency e = PMTU / (PMTU + 82)); the engine's
datapath per port D (from bench/results/engine_512_p1.json, :class:`.topology.EngineTiming`).
All rates payload rates (x e on Ethernet); ``alpha_*`` are latency terms, fitted from the
simulation (:func:`fit_alphas`).

=====================  =========================================================================
algorithm              time
=====================  =========================================================================
NetReduce flat         S * max(1 / Be, ceil(N / P) / Ce) + a_nr       (rank r on port r mod P)
NetReduce striped      S * max(1 / Be, N / (P Ce)) + a_nr             (E >= P stripes)
ring                   2 (N-1) (S / (N Be) + a_r)
NetReduce hier.        2 (G-1) (S / (G I) + a_i) + S * max(1 / Be, H / (P Ce)) + a_nr
hierarchical ring      2 (G-1) (S / (G I) + a_i) + 2 (H-1) (S / (H Be) + a_r)
NetReduce flat, H x G  S * max(G / Be, H G / (P Ce)) + a_nr           (G ranks share a NIC)
ring flat, H x G       2 (N-1) (S / (N min(Be, I)) + a_r)
=====================  =========================================================================

with Be = B e and Ce = min(C e, D e_D) (e_D: payload share of the datapath's beats).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .simrun import WIRE_OVERHEAD, SimConfig, make_inputs, net_config, run_sim
from .topology import engine_timing

__all__ = ["Alphas", "ALPHAS", "eff", "engine_port_rate", "t_netreduce", "t_ring", "t_hier_nr",
           "t_hier_ring", "t_flat_nr_hosts", "t_flat_ring_hosts", "sim_netreduce", "sim_ring",
           "sim_hier_nr", "fit_alphas"]


@dataclass(frozen=True)
class Alphas:
    """Latency terms (ns): NetReduce's start-up + drain, one ring step, one intra-host step."""

    nr: float = 6000.0
    ring: float = 1500.0
    intra: float = 1000.0


ALPHAS = Alphas()


def eff(pmtu: int) -> float:
    return pmtu / (pmtu + WIRE_OVERHEAD)


def engine_port_rate(port_gbps: float, pmtu: int) -> float:
    """Payload Gb/s one engine port carries: its link, or the datapath if that is slower (a
    frame of PMTU payload + 62 header/ICRC bytes takes ceil(len / width) beats)."""
    tm = engine_timing()
    beats = math.ceil((pmtu + 62) * 8 / tm.data_width)
    dp = tm.port_gbps * pmtu * 8 / (beats * tm.data_width)
    return min(port_gbps * eff(pmtu), dp)


def _bits(size: int) -> float:
    return size * 8.0


def t_netreduce(n, size, link_gbps, ports, port_gbps, pmtu=4096, striped=False,
                a: Alphas = ALPHAS) -> float:
    """ns; flat (rank r on port r mod P) or striped over the P ports."""
    be, ce = link_gbps * eff(pmtu), engine_port_rate(port_gbps, pmtu)
    share = n / ports if striped else math.ceil(n / ports)
    return _bits(size) * max(1 / be, share / ce) + a.nr


def t_ring(n, size, link_gbps, pmtu=4096, a: Alphas = ALPHAS) -> float:
    be = link_gbps * eff(pmtu)
    return 2 * (n - 1) * (_bits(size) / (n * be) + a.ring)


def _intra(g, size, intra_gbps, a: Alphas) -> float:
    """One intra-host reduce-scatter or all-gather: G-1 steps of S/G at I."""
    return (g - 1) * (_bits(size) / (g * intra_gbps) + a.intra) if g > 1 else 0.0


def t_hier_nr(h, g, size, link_gbps, ports, port_gbps, intra_gbps, pmtu=4096,
              a: Alphas = ALPHAS) -> float:
    be, ce = link_gbps * eff(pmtu), engine_port_rate(port_gbps, pmtu)
    return (2 * _intra(g, size, intra_gbps, a)
            + _bits(size) * max(1 / be, h / (ports * ce)) + a.nr)


def t_hier_ring(h, g, size, link_gbps, intra_gbps, pmtu=4096, a: Alphas = ALPHAS) -> float:
    be = link_gbps * eff(pmtu)
    inter = 2 * (h - 1) * (_bits(size) / (h * be) + a.ring) if h > 1 else 0.0
    return 2 * _intra(g, size, intra_gbps, a) + inter


def t_flat_nr_hosts(h, g, size, link_gbps, ports, port_gbps, pmtu=4096,
                    a: Alphas = ALPHAS) -> float:
    be, ce = link_gbps * eff(pmtu), engine_port_rate(port_gbps, pmtu)
    return _bits(size) * max(g / be, h * g / (ports * ce)) + a.nr


def t_flat_ring_hosts(h, g, size, link_gbps, intra_gbps, pmtu=4096, a: Alphas = ALPHAS):
    n = h * g
    rate = min(link_gbps * eff(pmtu), intra_gbps)
    return 2 * (n - 1) * (_bits(size) / (n * rate) + a.ring)


# ------------------------------------------------------------------------------ simulations
def sim_netreduce(n, size, link_gbps, ports, port_gbps, pmtu=4096, stripes=1, seed=1) -> float:
    """Simulated ns of one int32 all-reduce through the timed engine model (checked)."""
    r = run_sim(SimConfig(workers=n, size=size, dtype="int32", pmtu=pmtu, seed=seed,
                          link_gbps=link_gbps, ports=ports, port_gbps=port_gbps,
                          stripes=stripes, timeout_ns=60_000_000_000))
    if not r.ok:
        raise RuntimeError(f"NetReduce N={n} S={size}: {r.error or r.checks}")
    return float(r.sim_ns)


def sim_ring(n, size, link_gbps, pmtu=4096, seed=1) -> float:
    """Simulated ns of the ring (sw_driver.ring) on the same worker links through the ToR
    (forwarding only), result checked."""
    from .network import NetworkFabric
    from .ring import ring_allreduce

    cfg = SimConfig(workers=n, size=size, dtype="int32", pmtu=pmtu, seed=seed,
                    link_gbps=link_gbps)
    xs = make_inputs(cfg)
    res = ring_allreduce(NetworkFabric(net_config(cfg), seed=seed), xs, pmtu=pmtu, seed=seed)
    ref = np.sum(np.array(xs, dtype=np.int64), axis=0).astype(np.int32)
    if not all(np.array_equal(y, ref) for y in res.results):
        raise RuntimeError(f"ring N={n} S={size}: wrong result")
    return float(res.sim_ns)


def sim_hier_nr(h, g, size, link_gbps, ports, port_gbps, intra_gbps, pmtu=4096, seed=1,
                a: Alphas = ALPHAS, engines=1) -> dict:
    """Hierarchical NetReduce, H hosts x G devices, int32, checked bit-exact, with the driver of
    :mod:`.hier`: intra-host reduce-scatter and all-gather timed by the
    intra-host link model (G-1 steps of S/G at I), the G shards all-reduced across the H hosts
    through the engine (G jobs striped over its ports, all through the host's one NIC:
    simulated with the collective driver, RC endpoints, ToR and timed engine). Returns the
    phases' ns and the total."""
    from .collective import CollectiveConfig, Communicator
    from .hier import hierarchical_allreduce
    from .simrun import get_backend

    if size % (4 * g):
        raise ValueError(f"size {size} must split into {g} shards of whole int32 elements")
    rng = np.random.default_rng([seed, h, g])
    xs = [[rng.integers(-2**31, 2**31, size // 4, dtype=np.int64).astype(np.int32)
           for _ in range(g)] for _ in range(h)]
    cfg = SimConfig(workers=h, size=size, dtype="int32", pmtu=pmtu, seed=seed,
                    link_gbps=link_gbps, ports=ports, port_gbps=port_gbps, stripes=g,
                    engines=engines)
    fab = get_backend("model").make(cfg, net_config(cfg), _NoCapture())
    comm = Communicator(fab, h, CollectiveConfig(pmtu=pmtu), seed=seed, name="hier")
    for r, rn in enumerate(comm.rnics):
        fab.rank_of_mac[rn.mac] = r
    t0 = time.perf_counter()
    res = hierarchical_allreduce(comm, xs, intra_gbps, a.intra,
                                 buses=fab.buses if engines > 1 else None,
                                 timeout_ns=60_000_000_000)
    ref = np.sum(np.array([x for d in xs for x in d], dtype=np.int64), axis=0).astype(np.int32)
    ok = all(np.array_equal(y, ref) for d in res.results for y in d)
    return {"intra_rs_ns": res.intra_rs_ns, "inter_ns": res.inter_ns,
            "intra_ag_ns": res.intra_ag_ns, "total_ns": res.total_ns, "ok": ok,
            "wall_s": round(time.perf_counter() - t0, 2)}


class _NoCapture:
    def frame_in(self, *a):
        pass

    def frame_out(self, *a):
        pass


def fit_alphas(link_gbps=100.0, pmtu=4096) -> Alphas:
    """The latency terms from small simulations: NetReduce at N=4, S=64 KiB on 4 ports (no
    capacity limit), one ring step from the ring at N=4, S=64 KiB (the intra-host step is a
    parameter, not fitted)."""
    size = 64 * 1024
    nr = sim_netreduce(4, size, link_gbps, 4, link_gbps, pmtu)
    a_nr = nr - _bits(size) / (link_gbps * eff(pmtu))
    ring = sim_ring(4, size, link_gbps, pmtu)
    a_r = ring / 6 - _bits(size) / (4 * link_gbps * eff(pmtu))
    return Alphas(nr=round(a_nr, 1), ring=round(a_r, 1), intra=ALPHAS.intra)
