"""The ``netreduce sim`` report: analysis of a :class:`~netreduce.sim.net.simrun.SimRun`, the JSON
report (schema ``netreduce-sim/1``, documented in docs/sim.md), the terminal summary and the plot.

Everything here is derived from the frames that entered and left the engine (the capture) plus
the flow registrations, never from engine internals, so it works unchanged for the RTL backends.

Definitions (times are engine clock cycles at ``CLOCK_HZ``, shown in ns):

* *goodput of port p*: payload bytes of distinct result packets (first emission of each flow and
  PSN; re-emits excluded) leaving engine port p, times 8, over the simulated time of the run;
  compared with the payload ceiling of one link at the PMTU (docs/roce.md: 82 bytes of per-frame
  overhead).
* *slot latency* of index k of a job: from the first contribution of k entering the engine to the
  first emission of the last of its N results.
* *slots in flight* at t: indices of a job with a contribution in and not yet freed; an index is
  freed when every flow's receiver has acknowledged it (ACK at PSN p acknowledges up to p, a NAK
  at p those before p), as the engine's status monitor does.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import numpy as np

from netreduce.wire.view import OP_ACK

from .simrun import BACKENDS, CLOCK_HZ, WIRE_OVERHEAD, SimRun, wire_limit_gbps

__all__ = ["analyse", "build_report", "write_json", "summary_table", "plot", "SCHEMA"]

SCHEMA = "netreduce-sim/1"
_MASK = (1 << 24) - 1
_RECOVERY = ("retransmitted", "naks_sent", "naks_received", "naks_ignored", "timeouts",
             "retries", "duplicates", "out_of_seq_dropped", "stale_acks", "cnps")


def _ns(cycles) -> float:
    return float(cycles) * 1e9 / CLOCK_HZ


def _ipb(s: str) -> bytes:
    return bytes(int(x) for x in s.split("."))


def analyse(run: SimRun, bins: int = 100) -> dict:
    """Goodput per port, slot latencies and the timeline (see the module docstring)."""
    cap = run.capture
    flows = run.flows
    cfg = run.cfg
    nports = cfg.nports
    fwd = {(_ipb(f.src_ip), f.dqpn): i for i, f in enumerate(flows)}
    rev = {(_ipb(f.rev_ip), f.rev_qpn): i for i, f in enumerate(flows)}
    passes = sorted({f.pass_id for f in flows})
    pidx = {p: i for i, p in enumerate(passes)}
    fpass = [pidx[f.pass_id] for f in flows]
    nrank = {p: sum(1 for f in flows if f.pass_id == p) for p in passes}
    end = max(run.cycles, 1)
    edges = np.linspace(0, end, bins + 1)
    out_bytes = [0] * nports
    in_bytes = [0] * nports
    port_bins = np.zeros((nports, bins))
    first_in: dict[tuple, int] = {}
    seen_out: set = set()
    done_cnt: dict[tuple, int] = {}
    done_at: dict[tuple, int] = {}
    reemits = 0
    for cyc, port, ip, dqpn, op, psn, aux in (cap.ins if cap else ()):
        if op <= 0x0B:
            i = fwd.get((ip, dqpn))
            if i is None:
                continue
            if 0 <= port < nports:
                in_bytes[port] += aux
            key = (fpass[i], (psn - flows[i].start_psn) & _MASK)
            if key not in first_in:
                first_in[key] = cyc
    for cyc, port, ip, dqpn, op, psn, aux in (cap.outs if cap else ()):
        if op > 0x0B:
            continue
        i = fwd.get((ip, dqpn))
        if i is None:
            continue
        if (i, psn) in seen_out:
            reemits += 1
            continue
        seen_out.add((i, psn))
        if 0 <= port < nports:
            out_bytes[port] += aux
            b = min(bins - 1, int(cyc * bins // end))
            port_bins[port, b] += aux
        key = (fpass[i], (psn - flows[i].start_psn) & _MASK)
        c = done_cnt.get(key, 0) + 1
        done_cnt[key] = c
        if c == nrank[flows[i].pass_id]:
            done_at[key] = cyc
    lat = np.array([_ns(done_at[k] - first_in[k]) for k in done_at if k in first_in])
    # in flight: +1 when an index starts, -1 per index freed (ACK snooping per pass)
    events = [(c, 1) for c in first_in.values()]
    acked = [0] * len(flows)
    free = [0] * len(passes)
    members = [[i for i, f in enumerate(flows) if fpass[i] == p] for p in range(len(passes))]
    for cyc, _port, ip, dqpn, op, psn, aux in (cap.ins if cap else ()):
        if op != OP_ACK:
            continue
        i = rev.get((ip, dqpn))
        if i is None:
            continue
        cls = (aux >> 5) & 3
        if cls == 2:
            continue
        k = (psn - flows[i].start_psn) & _MASK
        cand = k + 1 if cls == 0 else k
        if cand > acked[i] and cand <= flows[i].packets:
            acked[i] = cand
            p = fpass[i]
            nf = min(acked[j] for j in members[p])
            if nf > free[p]:
                events.append((cyc, -(nf - free[p])))
                free[p] = nf
    events.sort()
    times = [e[0] for e in events]
    level = np.cumsum([e[1] for e in events]) if events else np.zeros(0)
    sample_at = edges[1:]
    inflight = []
    peak = []
    for b in range(bins):
        j = bisect.bisect_right(times, sample_at[b]) - 1
        inflight.append(int(level[j]) if j >= 0 else 0)
        lo = bisect.bisect_left(times, edges[b])
        seg = level[max(0, lo - 1):j + 1]
        peak.append(int(seg.max()) if len(seg) else 0)
    bin_ns = _ns(end) / bins
    gbps = port_bins * 8 / bin_ns
    return {"out_bytes": out_bytes, "in_bytes": in_bytes, "reemits_seen": reemits,
            "latencies_ns": lat, "indices": len(first_in), "indices_complete": len(done_at),
            "timeline": {"t_ns": [round(_ns(x), 1) for x in sample_at],
                         "port_gbps": [[round(float(v), 3) for v in row] for row in gbps],
                         "slots_in_flight": inflight, "slots_in_flight_peak": peak},
            "max_in_flight": int(level.max()) if len(level) else 0}


def _dist(lat: np.ndarray) -> dict:
    if not len(lat):
        return {"count": 0}
    hist, e = np.histogram(lat, bins=min(20, max(1, len(np.unique(lat)))))
    return {"count": int(len(lat)), "min": float(lat.min()), "mean": float(lat.mean()),
            "p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)),
            "p99": float(np.percentile(lat, 99)), "max": float(lat.max()),
            "histogram": {"edges_ns": [round(float(x), 2) for x in e],
                          "counts": [int(x) for x in hist]}}


def _topology(cfg, sim_ns: int) -> dict:
    """Workers' link rate, engine ports and port rate, the engine's timing source and the
    capacity bound N x S / (P x C) (docs/sim.md, Topology)."""
    if not cfg.port_gbps:
        shared = cfg.nports < cfg.workers
        return {"kind": "star", "link_gbps": cfg.link_gbps, "engine_ports": cfg.nports,
                "port_gbps": cfg.link_gbps, "engine_timing": "untimed" if cfg.backend == "model"
                else "RTL", "bound_ns": None, "time_over_bound": None,
                "warning": (f"star with {cfg.nports} engine port(s) for {cfg.workers} ranks: "
                            "each port takes several ranks' links at once, so its goodput is "
                            "not a physical rate (use the ToR topology: --port-gbps C)")
                if shared else None}
    from .topology import engine_timing, lower_bound_ns

    tm = engine_timing()
    bound = lower_bound_ns(cfg.workers * cfg.jobs, cfg.size, cfg.nports, cfg.port_gbps)
    return {"kind": "tor", "link_gbps": cfg.link_gbps, "engines": cfg.engines,
            "engine_ports": cfg.nports,
            "port_gbps": cfg.port_gbps,
            "engine_timing": (f"model: {tm.data_width}-bit x {tm.beats_per_cycle} beat/cycle at "
                              f"{CLOCK_HZ} Hz ({tm.port_gbps:.1f} Gb/s per port), latency "
                              f"{tm.latency_base} + beats cycles, from {tm.source}")
            if cfg.backend == "model" else "RTL",
            "bound_ns": round(bound, 1),
            "time_over_bound": round(sim_ns / bound, 4) if bound else None}


def build_report(run: SimRun, ana: dict | None = None, command: str = "") -> dict:
    """The JSON report (see docs/sim.md for the schema)."""
    ana = ana if ana is not None else analyse(run)
    cfg = run.cfg
    limit = wire_limit_gbps(cfg.pmtu, cfg.link_gbps)
    t_ns = _ns(max(run.cycles, 1))
    # an engine port's limit: its own link (ToR topology) or the rank's link (star)
    plimit = wire_limit_gbps(cfg.pmtu, cfg.port_gbps) if cfg.port_gbps else limit
    ports = []
    for p in range(cfg.nports):
        g = ana["out_bytes"][p] * 8 / t_ns
        ports.append({"port": p, "ranks": [r for r in range(cfg.workers) if r % cfg.nports == p],
                      "result_payload_bytes": ana["out_bytes"][p],
                      "contribution_payload_bytes": ana["in_bytes"][p],
                      "gbps": round(g, 4), "fraction_of_wire_limit": round(g / plimit, 5)})
    per_rank = cfg.size * 8 / t_ns
    st = run.stats
    cap = run.capture
    return {
        "schema": SCHEMA,
        "command": command,
        "ok": run.ok,
        "config": run.config_dict(),
        "backend": {"name": cfg.backend,
                    "description": BACKENDS[cfg.backend].description
                    if cfg.backend in BACKENDS else ""},
        "clock_hz": CLOCK_HZ,
        "simulated": {"cycles": run.cycles, "ns": run.sim_ns, "wall_s": round(run.wall_s, 3),
                      "frames_per_s": round(run.frames_per_s, 1)},
        "wire_limit": {"link_gbps": cfg.link_gbps, "pmtu": cfg.pmtu,
                       "overhead_bytes": WIRE_OVERHEAD, "efficiency": round(limit /
                                                                            cfg.link_gbps, 6),
                       "gbps": round(limit, 4)},
        "topology": _topology(cfg, run.sim_ns),
        "goodput": {"ports": ports,
                    "allreduce_gbps_per_rank": round(per_rank, 4),
                    "allreduce_fraction_of_wire_limit": round(per_rank / limit, 5)},
        "slot_latency_ns": _dist(ana["latencies_ns"]),
        "slots": {"indices_started": ana["indices"], "indices_complete": ana["indices_complete"],
                  "max_in_flight": ana["max_in_flight"], "left_allocated": run.slots_left},
        "recovery": {**{k: st.get(k, 0) for k in _RECOVERY},
                     "reemits_seen": ana["reemits_seen"]},
        "driver_stats": st,
        "engine_counters": run.engine_counters,
        "job_counters": run.job_counters,
        "links": run.link_stats,
        "capture": {"in_pcap": str(cap.paths[0]) if cap and cap.paths else None,
                    "out_pcap": str(cap.paths[1]) if cap and cap.paths else None,
                    "roce_frames_in": len(cap.ins) if cap else 0,
                    "roce_frames_out": len(cap.outs) if cap else 0,
                    "other_frames_in": cap.other_in if cap else 0,
                    "other_frames_out": cap.other_out if cap else 0},
        "flows": [vars(f) for f in run.flows],
        "check": {"ok": run.ok, "results": run.checks, "slots_left": run.slots_left,
                  "error": run.error, "error_kind": run.error_kind},
        "timeline": ana["timeline"],
    }


def write_json(report: dict, path) -> None:
    Path(path).write_text(json.dumps(report, indent=1, default=_default) + "\n")


def _default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def summary_rows(rep: dict) -> list[tuple[str, str]]:
    """(what, value) rows of the terminal summary, with rich markup."""
    sim = rep["simulated"]
    gp = rep["goodput"]
    rows = [("backend", rep["backend"]["name"]),
            ("simulated", f"{sim['cycles']} cycles @ {CLOCK_HZ / 1e6:.6f} MHz = "
                          f"{sim['ns'] / 1e3:.1f} us"),
            ("wall time", f"{sim['wall_s']:.2f} s ({sim['frames_per_s']:.0f} frames/s)"),
            ("wire limit (PMTU {})".format(rep["wire_limit"]["pmtu"]),
             f"{rep['wire_limit']['gbps']:.2f} Gb/s per link"),
            ("all-reduce goodput per rank", f"{gp['allreduce_gbps_per_rank']:.2f} Gb/s = "
                                            f"{100 * gp['allreduce_fraction_of_wire_limit']:.1f}"
                                            " % of the limit")]
    topo = rep.get("topology") or {}
    if topo.get("warning"):
        rows.append(("warning", f"[yellow]{topo['warning']}[/]"))
    if topo.get("kind") == "tor":
        rows.append(("topology", f"workers at {topo['link_gbps']:g} Gb/s, engine "
                                 f"{topo['engine_ports']} x {topo['port_gbps']:g} Gb/s"))
        rows.append(("time / N x S / (P x C)", f"{topo['time_over_bound']:.3f}"))
    ps = gp["ports"]
    shown = ps if len(ps) <= 8 else ps[:4] + ps[-2:]
    for p in shown:
        rows.append((f"port {p['port']} goodput", f"{p['gbps']:.2f} Gb/s = "
                                                  f"{100 * p['fraction_of_wire_limit']:.1f} %"))
    lat = rep["slot_latency_ns"]
    if lat.get("count"):
        rows.append(("slot latency p50/p99/max", f"{lat['p50']:.0f} / {lat['p99']:.0f} / "
                                                 f"{lat['max']:.0f} ns"))
    rows.append(("slots: indices / peak in flight", f"{rep['slots']['indices_started']} / "
                                                    f"{rep['slots']['max_in_flight']}"))
    rec = rep["recovery"]
    rows.append(("retransmitted / NAKs / timeouts",
                 f"{rec['retransmitted']} / {rec['naks_sent']} / {rec['timeouts']}"))
    for d, c in rep["links"].items():
        rows.append((f"links {d}: frames lost/dup/reord",
                     f"{c.get('frames', 0)}: {c.get('lost', 0)} / {c.get('duplicated', 0)} / "
                     f"{c.get('reordered', 0)}"))
    ein = rep["links"].get("engine_in", {})
    if "rx_drop_full" in ein:  # limited engine datapaths (--datapath-gbps, .overload)
        rows.append(("engine input buffers: dropped / PFC sent / frames marked",
                     f"{ein['rx_drop_full']} / {ein['pfc_tx']} / {ein['congested_frames']}"))
    for k, v in sorted(rep["engine_counters"].items()):
        if v and k not in ("rx_frames", "tx_frames"):
            rows.append((f"engine {k}", str(v)))
    for c in rep["check"]["results"]:
        extra = (f"worst err/bound {c['worst_error_over_bound']:.3f}"
                 if "worst_error_over_bound" in c else
                 f"{c['mismatched_elements']} elements differ" if not c["ok"] else "bit-exact")
        rows.append((f"check group {c['group']}", ("[green]ok[/] " if c["ok"] else "[red]FAIL[/] ")
                     + extra))
    left = rep["slots"]["left_allocated"]
    rows.append(("slots left allocated", "[green]0[/]" if left == 0 else f"[red]{left}[/]"))
    if rep["check"]["error"]:
        rows.append(("error", f"[red]{rep['check']['error']}[/]"))
    return rows


def summary_table(rep: dict):
    from rich.table import Table

    t = Table(title="netreduce sim summary", show_header=False)
    t.add_column("what", no_wrap=True)
    t.add_column("value", justify="right")
    for k, v in summary_rows(rep):
        t.add_row(k, v)
    return t


def plot(rep: dict, path) -> None:
    """PNG: per-port result throughput and slots in flight over simulated time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = rep["timeline"]
    t_us = np.array(tl["t_ns"]) / 1e3
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for p, row in enumerate(tl["port_gbps"]):
        a1.plot(t_us, row, lw=1, label=f"port {p}" if p < 8 else None)
    a1.axhline(rep["wire_limit"]["gbps"], color="k", ls="--", lw=1,
               label=f"wire limit {rep['wire_limit']['gbps']:.1f} Gb/s")
    topo0 = rep.get("topology") or {}
    if topo0.get("kind") == "tor" and topo0["port_gbps"] != topo0["link_gbps"]:
        lim = wire_limit_gbps(rep["wire_limit"]["pmtu"], topo0["port_gbps"])
        a1.axhline(lim, color="r", ls=":", lw=1, label=f"engine port limit {lim:.1f} Gb/s")
    a1.set_ylabel("result goodput (Gb/s)")
    a1.legend(fontsize=7, ncol=3, loc="lower center")
    cfg = rep["config"]
    topo = rep.get("topology") or {}
    where = (f"\nworkers at {topo['link_gbps']:g} Gb/s, engine {topo['engine_ports']} x "
             f"{topo['port_gbps']:g} Gb/s" if topo.get("kind") == "tor" else
             f"\nstar: every rank's {cfg['link_gbps']:g} Gb/s link is an engine port")
    a1.set_title(f"netreduce sim: {cfg['workers']} ranks x {cfg['size']} B {cfg['dtype']}, "
                 f"PMTU {cfg['pmtu']}, backend {cfg['backend']}" + where, fontsize=9)
    a2.step(t_us, tl["slots_in_flight_peak"], where="post", label="peak in bin")
    a2.step(t_us, tl["slots_in_flight"], where="post", label="at bin end")
    a2.set_ylabel("slots in flight")
    a2.set_xlabel("simulated time (us)")
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
