"""netreduce.sim.emu.replay: config parsing and validation, capture reading and timing, port
selection, replay through the model (stored capture, CNP limiter timing) and the RTL adapter
(fast harness on the engine stand-in)."""

from __future__ import annotations

import random
import struct
import tomllib
from pathlib import Path

import pytest
from netreduce.sim.emu import replay as rp
from netreduce.sim.model.kit import RingJob
from netreduce.sim.net.simrun import BackendUnavailable, cycles_to_ns

from netreduce.regmap import CLOCK_HZ, DEFAULT_CNP_INTERVAL, Op
from netreduce.wire import ECN_CE
from netreduce.wire.pcap import read_pcap, write_pcap

EX = Path(__file__).resolve().parents[2] / "examples" / "replay"

GOOD = """
[engine]
ports = 2

[[job]]
id = 3
world = 2
window = 16
pmtu = 256
op = "max"

[[job.flow]]
fwd_ip = "10.0.0.1"
fwd_qpn = "0x12"
rev_ip = "10.0.0.2"
rev_qpn = 0x11
start_psn = 100

[[job.flow]]
fwd_ip = "10.0.0.2"
fwd_qpn = 18
rev_ip = "10.0.0.1"
rev_qpn = "0x11"
start_psn = "0xffffff"

[[job]]
id = 0
world = 2
window = 16
pmtu = 512
op = "SUM_SAT"
cnp_interval = 77

[[job.flow]]
rank = 1
fwd_ip = "10.1.0.1"
fwd_qpn = 5
rev_ip = "10.1.0.2"
rev_qpn = 6
start_psn = 0

[[job.flow]]
rank = 0
fwd_ip = "10.1.0.2"
fwd_qpn = 5
rev_ip = "10.1.0.1"
rev_qpn = 6
start_psn = 0
"""


def _cfg(text=GOOD, path="f.toml"):
    return rp.parse_config(tomllib.loads(text), path)


def test_config_parses_and_allocates_slots():
    cfg = _cfg()
    assert cfg.engine.ports == 2 and cfg.engine.jobs == 8
    a, b = cfg.jobs
    assert (a.job, a.world, a.window, a.pmtu, a.op) == (3, 2, 16, 256, Op.MAX)
    assert [f.rank for f in a.flows] == [0, 1]  # rank defaults to the table's position
    assert a.flows[0].fwd_ip == 0x0A000001 and a.flows[0].fwd_qpn == 0x12
    assert a.flows[1].rev_qpn == 0x11 and a.flows[1].start_psn == 0xFFFFFF
    assert a.cnp_interval == DEFAULT_CNP_INTERVAL and b.cnp_interval == 77
    assert b.op == Op.SUM_SAT and [f.rank for f in b.flows] == [1, 0]
    # slot bases left open are allocated in file order, like the driver does
    assert (a.slot_base, b.slot_base) == (0, 16) and cfg.auto_slots == {0, 3}


def test_example_config_matches_the_sim_that_made_the_capture():
    cfg = rp.load_config(EX / "job.toml")
    assert [j.job for j in cfg.jobs] == [0, 1]
    assert all(j.world == 3 and j.op == Op.SUM_WRAP for j in cfg.jobs)


def _edit(old, new, text=GOOD, count=1):
    assert old in text, old
    return text.replace(old, new, count)


BAD = [  # (name, config text, substrings the one-line error must contain)
    ("missing key", _edit("window = 16\n", ""), ["job[0]", "missing key 'window'"]),
    ("missing flow key", _edit('fwd_ip = "10.0.0.1"\n', ""),
     ["job[0].flow[0]", "missing key 'fwd_ip'"]),
    ("wrong type", _edit("world = 2", 'world = "2"'), ["job[0].world", "'2'", "integer"]),
    ("bool", _edit("world = 2", "world = true"), ["job[0].world", "true"]),
    ("float", _edit("pmtu = 256", "pmtu = 256.0"), ["job[0].pmtu", "256.0"]),
    ("bad ip", _edit('"10.0.0.2"', '"10.0.0.256"'), ["job[0].flow[0].rev_ip", "10.0.0.256"]),
    ("ip as int", _edit('fwd_ip = "10.0.0.1"', "fwd_ip = 167772161"),
     ["job[0].flow[0].fwd_ip", "167772161", "dotted"]),
    ("bad hex", _edit('"0x12"', '"0xZZ"'), ["job[0].flow[0].fwd_qpn", "0xZZ"]),
    ("decimal string", _edit('"0x12"', '"18"'), ["job[0].flow[0].fwd_qpn", "'18'"]),
    ("unknown op", _edit('op = "max"', 'op = "min"'), ["job[0].op", "'min'", "sum_wrap"]),
    ("world/flows", _edit("world = 2", "world = 3"), ["job[0]", "world = 3", "2 [[job.flow]]"]),
    ("unknown job key", _edit("window = 16", "window = 16\nwindw = 4"), ["job[0]", "'windw'"]),
    ("unknown flow key", _edit("start_psn = 100", "start_psn = 100\npsn = 1"),
     ["job[0].flow[0]", "'psn'"]),
    ("unknown engine key", _edit("ports = 2", "portz = 2"), ["engine", "'portz'"]),
    ("unknown top key", "title = 'x'\n" + GOOD, ["top level", "'title'"]),
    ("engine value", _edit("ports = 2", "ports = 0"), ["engine.ports = 0"]),
    ("no job", "[engine]\nports = 1\n", ["no [[job]]"]),
    ("id range", _edit("id = 3", "id = 8"), ["job[0].id = 8", "0..7"]),
    ("id twice", _edit("id = 0", "id = 3"), ["job[1].id = 3", "job[0]"]),
    # rules of the driver (EngineControl), reached through the dry run
    ("window", _edit("window = 16", "window = 12"), ["job[0] (id 3)", "window = 12"]),
    ("pmtu", _edit("pmtu = 256", "pmtu = 300"), ["job[0] (id 3)", "pmtu = 300"]),
    ("psn range", _edit("start_psn = 100", "start_psn = 0x1000000"), ["start_psn = 16777216"]),
    ("rank set", _edit("rank = 1", "rank = 2"), ["job[1] (id 0)", "[0, 2]"]),
    ("slot overlap", _edit("cnp_interval = 77", "cnp_interval = 77\nslot_base = 8"),
     ["job[1] (id 0)", "overlap job 3"]),
    ("key across jobs", _edit('fwd_ip = "10.1.0.1"', 'fwd_ip = "10.0.0.1"').replace(
        "fwd_qpn = 5", "fwd_qpn = 0x12", 1), ["job[1] (id 0)", "forward key", "job 3"]),
    ("key twice in a job", _edit('fwd_ip = "10.0.0.2"', 'fwd_ip = "10.0.0.1"'),
     ["job[0] (id 3)", "forward key"]),
]


@pytest.mark.parametrize("text,needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_one_line_error(text, needles):
    with pytest.raises(rp.ReplayError) as ei:
        _cfg(text, "jobs/x.toml")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("jobs/x.toml: "), msg
    for n in needles:
        assert n in msg, (n, msg)


def test_load_config_file_errors(tmp_path):
    with pytest.raises(rp.ReplayError, match="cannot read"):
        rp.load_config(tmp_path / "none.toml")
    p = tmp_path / "x.toml"
    p.write_text("[[job]\nid = 1\n")
    with pytest.raises(rp.ReplayError, match=r"x\.toml: not valid TOML"):
        rp.load_config(p)
    p.write_bytes(b"id = '\xff'\n")
    with pytest.raises(rp.ReplayError, match="not valid TOML"):
        rp.load_config(p)


# ---------------------------------------------------------------------------------- capture
def test_cycle_ns_round_trip():
    rng = random.Random(5)
    for c in [0, 1, 2, 3, CLOCK_HZ - 1, CLOCK_HZ] + [rng.randrange(1 << 62) for _ in range(500)]:
        assert rp.ns_to_cycle_ceil(cycles_to_ns(c)) == c


def _pcap(path, recs, linktype=1, snap=65535):
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snap, linktype))
        for t, data, orig in recs:
            f.write(struct.pack("<IIII", t // 10**9, t % 10**9, len(data), orig))
            f.write(data)


def test_read_capture_timing(tmp_path):
    p = tmp_path / "t.pcap"
    cyc = [1000, 1000, 1001, 5000, 4000, 100_000]  # one step backwards
    _pcap(p, [(cycles_to_ns(c), bytes([i]) * 60, 60) for i, c in enumerate(cyc)])
    cap = rp.read_capture(p)
    assert cap.base_cycle == 1000 and cap.backwards == 1
    assert [f.cycle for f in cap.frames] == [0, 0, 1, 4000, 4000, 99_000]
    assert [f.data[0] for f in cap.frames] == list(range(6))  # capture order kept
    short = rp.read_capture(p, max_gap=100)
    assert [f.cycle for f in short.frames] == [0, 0, 1, 101, 101, 201]
    assert short.removed == 99_000 - 201


@pytest.mark.parametrize("kind,needle", [
    ("pcapng", "pcapng is not supported"), ("linktype", "link type 101"),
    ("snap", "cut by the capture's snap length"), ("cut", "record 1 data cut short"),
    ("empty record", "record 0 is empty"), ("empty file", "too short for a pcap header"),
    ("missing", "cannot read")])
def test_read_capture_errors(tmp_path, kind, needle):
    p = tmp_path / "c.pcap"
    if kind == "pcapng":
        p.write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(24))
    elif kind == "linktype":
        _pcap(p, [], linktype=101)
    elif kind == "snap":
        _pcap(p, [(0, bytes(64), 100)], snap=64)
    elif kind == "cut":
        _pcap(p, [(0, bytes(60), 60), (0, bytes(60), 60)])
        p.write_bytes(p.read_bytes()[:-10])
    elif kind == "empty record":
        _pcap(p, [(0, b"", 0)])
    elif kind == "empty file":
        p.write_bytes(b"")
    with pytest.raises(rp.ReplayError) as ei:
        rp.read_capture(p)
    assert needle in str(ei.value) and "\n" not in str(ei.value) and str(p) in str(ei.value)


# ---------------------------------------------------------------------------------- ports
def test_port_map():
    job = RingJob(world=3)
    vlan = RingJob(job=1, world=2, vlan_tci=5)
    frames = [job.data_bytes(r, 0, [r]) for r in range(3)] + [vlan.data_bytes(1, 0, [1])]
    frames.append(b"\x02\x00\x00\x00\x00\x09" * 2 + b"\x88\xb5" + bytes(50))  # not IPv4
    fr = [rp.InputFrame(i, 0, 0, f) for i, f in enumerate(frames)]
    m, d = rp.parse_port_map(["10.0.0.2=1", f"{job.mac(2).hex(':')}=2,*=3",
                              "10.1.0.2=2", "02-00-00-00-00-09=1"])
    assert d == 3 and m[bytes([10, 0, 0, 2])] == 1
    assert rp.assign_ports(fr, m, d, 4) == [3, 1, 2, 2, 1]
    assert rp.assign_ports(fr, {}, 0, 1) == [0] * 5
    for bad, needle in [("10.0.0.1", "expected SRC=PORT"), ("10.0.0.1=x", "expected SRC=PORT"),
                        ("1.2.3=1", "neither an IPv4 nor a MAC"),
                        ("zz:00:00:00:00:00=1", "not a MAC")]:
        with pytest.raises(rp.ReplayError, match=needle):
            rp.parse_port_map([bad])
    with pytest.raises(rp.ReplayError, match=r"10\.0\.0\.2=1: port outside 0\.\.0"):
        rp.assign_ports(fr, m, 0, 1)
    with pytest.raises(rp.ReplayError, match=r"\*=3: port outside"):
        rp.assign_ports(fr, {}, 3, 2)


# ---------------------------------------------------------------------------------- replay
def test_replay_example_reproduces_the_stored_output():
    cfg = rp.load_config(EX / "job.toml")
    cap = rp.read_capture(EX / "allreduce.in.pcap")
    run = rp.run_replay(cfg, cap)
    expect = read_pcap(EX / "allreduce.out.pcap")
    got = [(run.out_time_ns(e.time), e.frame) for e in run.emits]
    assert got == [(r.time_ns, r.data) for r in expect]
    c = run.engine_counters
    assert c["rx_frames"] == len(cap.frames) and c["tx_frames"] == len(expect)
    # 2 jobs x 3 ranks x 16 packets (4 KiB at PMTU 256), each accepted once
    assert c["contributions"] == 96 and c["results_sent"] == 96 and c["released"] == 32
    assert all(run.job_counters[j]["contributions"] == 48 for j in (0, 1))
    assert all(run.job_status[j]["slots_busy"] == 0 and run.job_status[j]["enabled"]
               for j in (0, 1))
    head, rows = rp.counter_rows(run)
    assert head == ["counter", "engine", "job 0", "job 1"]
    assert ["contributions", "96", "48", "48"] in rows and ["rx_frames", "268", "", ""] in rows
    assert not any(r[0] == "drop_icrc" for r in rows)
    assert any(r[0] == "drop_icrc" for r in rp.counter_rows(run, show_all=True)[1])


def test_replay_ports_follow_the_port_map():
    cfg = rp.parse_config({**tomllib.loads((EX / "job.toml").read_text()),
                           "engine": {"ports": 2}}, "x")
    cap = rp.read_capture(EX / "allreduce.in.pcap")
    m, d = rp.parse_port_map(["10.0.0.2=1"])
    ports = rp.assign_ports(cap.frames, m, d, 2)
    run = rp.run_replay(cfg, cap, ports=ports)
    one = rp.run_replay(cfg, cap)
    assert [e.frame for e in run.emits] == [e.frame for e in one.emits]
    # rank 1 of job 0 (10.0.0.2) gets its results and its forwarded ACKs on port 1
    on1 = {e.frame[26:30] for e in run.emits if e.port == 1}
    assert on1 == {bytes([10, 0, 0, 2])}
    assert sum(e.port == 1 for e in run.emits) > 16
    assert {e.port for e in one.emits} == {0}


def test_replay_time_drives_the_cnp_limiter(tmp_path):
    """CE-marked contributions 1000 cycles apart: the second CNP is suppressed with interval
    1289 and sent with 999; the capture's timestamps are what the engine sees."""
    job = RingJob(world=2, cnp_interval=1289)
    toml = "\n".join([
        "[[job]]", "id = 0", "world = 2", "window = 16", "pmtu = 1024", 'op = "sum_wrap"',
        "cnp_interval = {iv}"] + sum((["[[job.flow]]", f'fwd_ip = "10.0.0.{r + 1}"',
                                       f"fwd_qpn = {job.rq(job.succ(r))}",
                                       f'rev_ip = "10.0.0.{job.succ(r) + 1}"',
                                       f"rev_qpn = {job.sq(r)}",
                                       f"start_psn = {job.start_psns[r]}"]
                                      for r in range(2)), []))
    p = tmp_path / "ce.pcap"
    t0 = 123_456_789  # arbitrary capture start
    write_pcap(p, [(cycles_to_ns(t0 + c), job.data_bytes(0, k, [k], ecn=ECN_CE))
                   for k, c in enumerate((0, 1000))])
    cap = rp.read_capture(p)
    for iv, cnps in ((1289, 1), (999, 2)):
        cfg = rp.parse_config(tomllib.loads(toml.format(iv=iv)), "ce.toml")
        run = rp.run_replay(cfg, cap)
        assert run.engine_counters["cnp_sent"] == cnps
        assert run.engine_counters["cnp_suppressed"] == 2 - cnps
        cnp_times = [run.out_time_ns(e.time) for e in run.emits if e.frame[42] == 0x81]
        assert cnp_times == [cycles_to_ns(t0 + c) for c in (0, 1000)][:cnps]


def test_config_from_sim_report_round_trip():
    """The helper that wrote the example's flows: same jobs as the committed file."""
    rep = {"command": "netreduce sim ...", "config": {"dtype": "int32", "pmtu": 256},
           "flows": []}
    ex = rp.load_config(EX / "job.toml")
    for j in ex.jobs:
        for f in j.flows:
            ip = lambda v: ".".join(str(v >> s & 255) for s in (24, 16, 8, 0))  # noqa: E731
            rep["flows"].append({"pass_id": f"g{j.job}.sum", "op": "SUM_WRAP", "rank": f.rank,
                                 "src_ip": ip(f.fwd_ip), "dqpn": f.fwd_qpn,
                                 "rev_ip": ip(f.rev_ip), "rev_qpn": f.rev_qpn,
                                 "start_psn": f.start_psn, "group": j.job})
    cfg = rp.parse_config(tomllib.loads(rp.config_toml_from_sim_report(rep)), "gen")
    assert [(j.job, j.world, j.window, j.slot_base, j.pmtu, j.op, j.flows) for j in cfg.jobs] == \
        [(j.job, j.world, j.window, j.slot_base, j.pmtu, j.op, j.flows) for j in ex.jobs]
    with pytest.raises(rp.ReplayError, match="int32"):
        rp.config_toml_from_sim_report({**rep, "config": {"dtype": "float32", "pmtu": 256}})


def test_backends_unavailable_one_line(monkeypatch):
    with pytest.raises(rp.ReplayError, match="unknown backend 'x'"):
        rp.probe_backend("x")
    from netreduce.sim.rtl import backend, fastsim, icarus
    monkeypatch.setattr(fastsim, "verilator_missing", lambda: None)
    monkeypatch.setattr(icarus, "icarus_missing", lambda: "Icarus Verilog is not installed")
    monkeypatch.setattr(backend, "engine_module", lambda: None)
    with pytest.raises(BackendUnavailable, match=r"engine top \(netreduce.hw.engine\) is not"):
        rp.open_engine("verilator", rp.EngineParams())
    with pytest.raises(BackendUnavailable, match="'icarus': Icarus Verilog is not installed"):
        rp.probe_backend("icarus")
    monkeypatch.setitem(__import__("sys").modules, "netreduce.sim.rtl.fastsim", None)
    with pytest.raises(BackendUnavailable, match="not importable") as ei:
        rp.probe_backend("verilator")
    assert "\n" not in str(ei.value)


@pytest.mark.xdist_group("fastsim_standin")
def test_fastsim_adapter_on_the_standin():
    """The RTL adapter end to end on the engine stand-in (pass-through + register bank): jobs
    programmed over AXI4-Lite, frames queued at their cycles on their ports, all frames back
    unchanged on the same port after their input cycle, counters read over the bus."""
    from netreduce.sim.rtl.fastsim import verilator_missing
    from netreduce.sim.rtl.standin import standin_regmap, standin_top

    reason = verilator_missing()
    if reason:
        pytest.skip(reason)
    top = standin_top(standin_regmap(2, 64))  # the build test_rtl_fastsim.py uses
    params = {k: standin_regmap(2, 64).params[k] for k in rp.EngineParams.__dataclass_fields__}
    monkey = dict(rp.ENGINES)
    rp.ENGINES["standin"] = rp.rtl_factory("verilator", lambda params: top)
    try:
        text = _edit("pmtu = 512", "pmtu = 256").replace("window = 16", "window = 8")
        text = text.replace("id = 3", "id = 1")
        text = text.replace("ports = 2", "\n".join(f"{k} = {v}" for k, v in params.items()))
        cfg = _cfg(text)
        job = RingJob(world=2)
        rng = random.Random(2)
        frames = [(rng.randrange(2), job.data_bytes(rng.randrange(2), k, [k] * rng.randint(1, 40)),
                   k * rng.randrange(0, 400)) for k in range(12)]
        frames.sort(key=lambda f: f[2])
        cap = rp.Capture("x", [rp.InputFrame(i, 0, c, d) for i, (_, d, c) in enumerate(frames)],
                         0, 0)
        run = rp.run_replay(cfg, cap, "standin", ports=[p for p, _, _ in frames])
    finally:
        rp.ENGINES.clear()
        rp.ENGINES.update(monkey)
    assert sorted((e.port, e.frame) for e in run.emits) == sorted((p, d) for p, d, _ in frames)
    first = {}
    for e in run.emits:
        first.setdefault(e.frame, e.time)
    for _, d, c in frames:
        assert first[d] > c
    times = [e.time for e in run.emits]
    assert times == sorted(times)
    assert run.engine_counters["rx_frames"] == run.engine_counters["tx_frames"] == 12
    assert run.job_status[1]["enabled"] and run.job_status[0]["enabled"]


@pytest.mark.xdist_group("fastsim_engine")
def test_replay_example_on_the_engine_rtl():
    """The stored capture through the engine RTL (Verilator fast harness): the model's frames,
    in the model's order per output port and flow, each after its model time; same counters."""
    try:
        rp.probe_backend("verilator")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    from collections import defaultdict

    from netreduce.sim.net.simrun import SimConfig
    from netreduce.sim.rtl.fabric import rtl_params

    data = tomllib.loads((EX / "job.toml").read_text())
    data["engine"] = rtl_params(SimConfig(workers=4))  # the build test_rtl_backend.py uses
    cfg = rp.parse_config(data, "job.toml")
    cap = rp.read_capture(EX / "allreduce.in.pcap")
    rtl = rp.run_replay(cfg, cap, "verilator")
    model = rp.run_replay(cfg, cap, "model")

    def per_flow(run):
        d = defaultdict(list)
        for e in run.emits:  # (port, IPv4 source, destination, DestQP): one flow of frames
            d[(e.port, e.frame[26:30], e.frame[30:34], e.frame[46:49])].append(e)
        return d

    got, want = per_flow(rtl), per_flow(model)
    assert len(rtl.emits) == len(model.emits) > 0
    assert {k: [e.frame for e in v] for k, v in got.items()} == \
        {k: [e.frame for e in v] for k, v in want.items()}
    for k in want:
        assert all(g.time > w.time for g, w in zip(got[k], want[k], strict=True))
    assert rtl.engine_counters == model.engine_counters
    assert rtl.job_counters == model.job_counters
