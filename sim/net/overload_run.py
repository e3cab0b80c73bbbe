"""The 2:1 overloaded engine port scenario (issue 22): :func:`run_overload` runs one all-reduce
through :class:`.overload.OverloadFabric` with PFC, ECN/CNP (D19), DCQCN and the fast
retransmit on or off (:data:`MODES`) and returns its figures (bench/fabric_overload.py,
docs/fabric.md, tests/sim/test_fabric_overload.py)."""

from __future__ import annotations

from dataclasses import asdict

from .overload import BufferConfig, OverloadFabric, make_overload_model

__all__ = ["MODES", "run_overload"]


#: The scenarios of :func:`run_overload`: (PFC, ECN/CNP at the engine, the RNICs' DCQCN,
#: the engine's fast retransmit D16).
MODES = {
    "pfc": (True, True, True, False),
    "pfc_only": (True, False, False, False),
    "ecn_dcqcn": (False, True, True, False),
    "ecn_dcqcn_fast_retx": (False, True, True, True),
    "no_reaction": (False, True, False, False),
}


def run_overload(mode: str, size: int = 1 << 20, *, workers: int = 2, port_gbps: float = 100.0,
                 overload: float = 2.0, seed: int = 1, latency_ns: int = 500,
                 buf: BufferConfig | None = None) -> dict:
    """One int32 all-reduce of ``size`` bytes per rank, ``workers`` ranks at ``port_gbps`` on
    as many engine ports of ``port_gbps`` (rank r's flow on port r), each port's datapath share
    ``port_gbps / overload``: every engine port is ``overload``:1 overloaded; ``latency_ns`` per
    hop (the control loop's delay: ECN/CNP and PFC act one round trip late). ``mode`` is a key
    of :data:`MODES`. Returns the figures of the run (docs/fabric.md, bench/fabric_overload.py).
    """
    from .dcqcn import DcqcnConfig
    from .simrun import SimConfig, run_sim

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if not overload >= 1:
        raise ValueError(f"overload {overload!r} must be >= 1")
    pfc, ecn, dcqcn, fast_retx = MODES[mode]
    b = buf or BufferConfig()
    b = BufferConfig(b.buffer_bytes, port_gbps / overload, pfc, b.xoff_bytes, b.xon_bytes,
                     b.ecn_bytes if ecn else 0)
    cfg = SimConfig(workers=workers, size=size, dtype="int32", ports=workers,
                    port_gbps=port_gbps, link_gbps=port_gbps, seed=seed, latency_ns=latency_ns)
    fabs: list[OverloadFabric] = []

    def make(c, net, cap):
        fabs.append(make_overload_model(c, net, cap, b))
        return fabs[0]

    r = run_sim(cfg, make_fabric=make, collective={
        "ecn": True, "fast_retx": fast_retx,
        "dcqcn": DcqcnConfig(line_gbps=port_gbps) if dcqcn else None})
    fab = fabs[0]
    st = r.stats
    into = sum(lk.stats["frames"] for lk in fab.ein)
    bound_ns = size * 8 / b.drain_gbps  # each port's flow through its datapath share
    return {
        "mode": mode, "pfc": pfc, "ecn": ecn, "dcqcn": dcqcn, "fast_retx": fast_retx,
        "ok": r.ok, "error": r.error, "size": size, "workers": workers, "latency_ns": latency_ns,
        "port_gbps": port_gbps, "drain_gbps": b.drain_gbps, "buffer": asdict(b),
        "sim_us": round(r.sim_ns / 1000, 1), "bound_us": round(bound_ns / 1000, 1),
        "packets": r.stats.get("sent", 0) - st.get("retransmitted", 0),
        "frames_into_ports": into,
        "drops": sum(fab.rx_drop_full), "pfc_tx": sum(fab.pfc_tx),
        "congested_frames": sum(fab.ce_frames), "max_level": max(fab.max_level),
        "cnp_sent": r.engine_counters.get("cnp_sent", 0),
        "cnp_suppressed": r.engine_counters.get("cnp_suppressed", 0),
        "cnps_received": st.get("cnps", 0), "rate_cuts": st.get("rate_cuts", 0),
        "retransmitted": st.get("retransmitted", 0), "timeouts": st.get("timeouts", 0),
        "naks_received": st.get("naks_received", 0),
        "engine_in": fab.stats["engine_in"], "in_buffer_at_end": sum(fab.held),
    }
