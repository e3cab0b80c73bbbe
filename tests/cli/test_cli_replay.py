"""``netreduce replay``: the stored example capture replays to the stored output, whose result
payloads are checked independently (scapy, zlib, numpy) to be the sums of the inputs; counters
printed; bad arguments, configs and captures give one ``Error:`` line and exit status 2."""

from __future__ import annotations

import json
import struct
import sys
import tomllib
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netreduce.cli import main
from netreduce.regmap import CLOCK_HZ

EX = Path(__file__).resolve().parents[2] / "examples" / "replay"
CONFIG, CAPTURE, EXPECT = EX / "job.toml", EX / "allreduce.in.pcap", EX / "allreduce.out.pcap"


def _replay(*args):
    return CliRunner().invoke(main, ["replay", *map(str, args)])


def test_replay_example(tmp_path):
    out, js = tmp_path / "out.pcap", tmp_path / "r.json"
    r = _replay("--config", CONFIG, "--in", CAPTURE, "--out", out, "--json", js)
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == EXPECT.read_bytes()  # frames and timestamps
    assert "engine counters" in r.output and "job 0" in r.output and "job 1" in r.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in r.output.splitlines() if line.count("│") == 5}
    assert rows["rx_frames"][0] == "268" and rows["contributions"] == ["96", "48", "48"]
    doc = json.loads(js.read_text())
    assert doc["schema"] == "netreduce-replay/1" and doc["backend"] == "model"
    assert doc["input"]["frames"] == 268 and doc["output"]["frames"] == doc["engine_counters"][
        "tx_frames"] > 0
    assert doc["job_counters"]["1"]["results_sent"] == 48
    assert doc["job_status"]["0"]["slots_busy"] == 0
    assert "--config" in doc["command"] and doc["clock_hz"] == CLOCK_HZ


# ------------------------------------------------------------------ independent check (scapy)
_PAYLOAD_OFF = {0x06: 28, 0x0A: 28, 0x0B: 32, 0x07: 12, 0x08: 12, 0x09: 16}  # from the BTH


def _icrc(l3: bytes) -> bytes:  # docs/roce.md, written out here (independent of netreduce.wire)
    b = bytearray(l3)
    b[1] = b[8] = 0xFF
    b[10:12] = b[26:28] = b"\xff\xff"
    b[32] = 0xFF
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(b)))


def _roce(path):
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.utils import rdpcap

    out = []
    for p in rdpcap(str(path)):
        assert IP in p and UDP in p and p[UDP].dport == 4791, p.summary()
        ip = p[IP]
        raw = bytes(ip)[:ip.len]
        fresh = IP(raw[:20])
        fresh.chksum = None
        assert IP(bytes(fresh)).chksum == ip.chksum, f"IPv4 checksum of {p.summary()}"
        assert _icrc(raw[:-4]) == raw[-4:], f"ICRC of {p.summary()}"
        bth = p[BTH]
        pad = (raw[29] >> 4) & 3
        body = raw[28:-4]
        off = _PAYLOAD_OFF.get(bth.opcode)
        payload = body[off:len(body) - pad] if off is not None else None
        out.append((ip.src, bth.dqpn, bth.psn, bth.opcode, payload))
    return out


def test_stored_output_is_the_sum_of_the_inputs(tmp_path):
    pytest.importorskip("scapy")
    cfg = tomllib.loads(CONFIG.read_text())
    flows = {}  # (src ip, dqpn) -> (job, rank, start psn)
    for job in cfg["job"]:
        assert job["op"] == "sum_wrap"
        for r, f in enumerate(job["flow"]):
            flows[(f["fwd_ip"], int(str(f["fwd_qpn"]), 0))] = (job["id"], r, f["start_psn"])
    world = {j["id"]: j["world"] for j in cfg["job"]}
    contrib = {}  # (job, index, rank) -> payload; retransmissions must repeat the same bytes
    for src, dqpn, psn, _op, pl in _roce(CAPTURE):
        if (src, dqpn) in flows and pl:
            j, r, s = flows[(src, dqpn)]
            k = (psn - s) % (1 << 24)
            assert contrib.setdefault((j, k, r), pl) == pl
    results = defaultdict(set)  # (job, index) -> ranks that got a result
    out = tmp_path / "o.pcap"
    assert _replay("-c", CONFIG, "-i", CAPTURE, "-o", out).exit_code == 0
    for src, dqpn, psn, _op, pl in _roce(out):
        if (src, dqpn) not in flows or not pl:
            continue  # ACK/NAK forwarded, duplicate probes (no payload)
        j, r, s = flows[(src, dqpn)]
        k = (psn - s) % (1 << 24)
        parts = [np.frombuffer(contrib[(j, k, q)], "<i4").astype(np.int64)
                 for q in range(world[j])]
        want = (np.sum(parts, axis=0) & 0xFFFFFFFF).astype("<u4").tobytes()
        assert pl == want, (j, k, r)
        results[(j, k)].add(r)
    # every index of both jobs: 16 packets (4 KiB at PMTU 256), a result for every rank
    assert set(results) == {(j, k) for j in (0, 1) for k in range(16)}
    assert all(v == {0, 1, 2} for v in results.values())


# ------------------------------------------------------------------ errors: one line, exit 2
def _one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("args,needles", [
    (["--in", CAPTURE, "--out", "o.pcap"], ["Missing option '--config'"]),
    (["--config", CONFIG, "--out", "o.pcap"], ["Missing option '--in'"]),
    (["--config", CONFIG, "--in", CAPTURE], ["Missing option '--out'"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", "o.pcap", "--backend", "vcs"], ["'vcs'"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", "o.pcap", "--speed", "2"], ["--speed"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", "o.pcap", "--max-gap", "-1"], ["--max-gap"]),
    (["-c", CONFIG, "-i", "nope.pcap", "-o", "o.pcap"], ["nope.pcap", "cannot read"]),
    (["-c", "nope.toml", "-i", CAPTURE, "-o", "o.pcap"], ["nope.toml", "cannot read"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", CAPTURE], ["is the input capture"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", "no/such/dir/o.pcap"], ["cannot write --out"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", "o.pcap", "--port-map", "10.0.0.1:1"],
     ["--port-map", "10.0.0.1:1"]),
    (["-c", CONFIG, "-i", CAPTURE, "-o", "o.pcap", "--port-map", "10.0.0.1=1"],
     ["port outside 0..0"]),
])
def test_bad_arguments(tmp_path, monkeypatch, args, needles):
    monkeypatch.chdir(tmp_path)
    r = _replay(*args)
    _one_line_error(r, *needles)
    assert not (tmp_path / "o.pcap").exists()  # nothing written on an error


def _example_with(old, new):
    text = CONFIG.read_text()
    assert old in text, old
    return text.replace(old, new, 1)


_BAD_FILES = [
    ("missing key", _example_with("window = 256\n", ""), ["job[1]", "missing key 'window'"]),
    ("wrong type", _example_with("world = 3", "world = [3]"), ["job[0].world = [3]"]),
    ("bad ip", _example_with('"10.0.0.2"', '"10.0.0"'),
     ["job[0].flow[0].rev_ip = '10.0.0'", "IPv4"]),
    ("unknown op", _example_with('"sum_wrap"', '"avg"'), ["job[0].op = 'avg'"]),
    ("world/flows", _example_with("world = 3", "world = 4"), ["job[0]", "world = 4", "3 [[job"]),
    ("unknown key", _example_with("pmtu = 256", "pmtu = 256\nmtu = 256"),
     ["job[0]", "unknown key 'mtu'"]),
    ("unknown flow key", _example_with("rank = 1", "rank = 1\nqpn = 1"),
     ["job[0].flow[1]", "'qpn'"]),
    ("driver rule", _example_with("window = 256", "window = 100"),
     ["job[0] (id 0)", "window = 100", "power of two"]),
    ("too many slots", _example_with("slots = 512", "slots = 300"), ["job[1] (id 1)", "slots"]),
    ("not toml", "[[job]\n", ["not valid TOML"]),
]


@pytest.mark.parametrize("text,needles", [b[1:] for b in _BAD_FILES],
                         ids=[b[0] for b in _BAD_FILES])
def test_bad_config_files(tmp_path, text, needles):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    r = _replay("-c", p, "-i", CAPTURE, "-o", tmp_path / "o.pcap")
    _one_line_error(r, str(p), *needles)
    assert not (tmp_path / "o.pcap").exists()


def test_bad_captures(tmp_path):
    ng = tmp_path / "x.pcapng"
    ng.write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(40))
    _one_line_error(_replay("-c", CONFIG, "-i", ng, "-o", tmp_path / "o.pcap"), "pcapng")
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(CAPTURE.read_bytes()[:5000])
    _one_line_error(_replay("-c", CONFIG, "-i", cut, "-o", tmp_path / "o.pcap"), "cut short")
    assert not (tmp_path / "o.pcap").exists()


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
@pytest.mark.parametrize("missing", ["harness", "engine"])
def test_rtl_backend_unavailable_is_one_line(tmp_path, monkeypatch, sim, missing):
    if missing == "harness":  # the simulator harness modules cannot be imported
        import netreduce.sim.net.simrun  # noqa: F401 - imported before, as in a real run
        for mod in ("netreduce.sim.rtl.fastsim", "netreduce.sim.rtl.icarus"):
            monkeypatch.setitem(sys.modules, mod, None)
    else:
        monkeypatch.setattr("netreduce.sim.rtl.backend.engine_module", lambda: None)
    r = _replay("-c", CONFIG, "-i", CAPTURE, "-o", tmp_path / "o.pcap", "--backend", sim)
    _one_line_error(r, f"backend {sim!r}", "--backend model")
    assert not (tmp_path / "o.pcap").exists()


def test_engine_failure_exit_3_keeps_the_output(tmp_path, monkeypatch):
    """An engine that dies mid-run (e.g. the RTL harness times out): exit 3, one FAIL line,
    the frames sent until then stay in --out."""
    from netreduce.sim.emu import replay as rp

    class Dying(rp._ModelEngine):
        def replay(self, frames):
            for n, e in enumerate(super().replay(frames)):
                if n == 10:
                    raise RuntimeError("AXI4-Lite read of 0x0: no response in 10000 cycles")
                yield e

    monkeypatch.setitem(rp.ENGINES, "verilator", Dying)
    out = tmp_path / "o.pcap"
    r = _replay("-c", CONFIG, "-i", CAPTURE, "-o", out, "--backend", "verilator")
    assert r.exit_code == 3 and "FAIL" in r.output and "no response" in r.output, r.output
    assert "Traceback" not in r.output
    from netreduce.wire.pcap import read_pcap
    assert [x.data for x in read_pcap(out)] == [x.data for x in read_pcap(EXPECT)][:10]


def test_port_map_and_max_gap(tmp_path):
    cfg = tmp_path / "two.toml"
    cfg.write_text(_example_with("ports = 1", "ports = 2"))
    out, js = tmp_path / "o.pcap", tmp_path / "r.json"
    r = _replay("-c", cfg, "-i", CAPTURE, "-o", out, "--json", js, "--port-map",
                "10.0.0.2=1,*=0", "--max-gap", "1000")
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    assert set(doc["input"]["per_port"]) == set(doc["output"]["per_port"]) == {"0", "1"}
    assert doc["input"]["idle_cycles_removed"] > 0 and "idle cycles" in r.output
    assert "--max-gap 1000" in doc["command"] and "--port-map '10.0.0.2=1,*=0'" in doc["command"]
    from netreduce.wire.pcap import read_pcap
    got, want = read_pcap(out), read_pcap(EXPECT)
    assert [x.data for x in got] == [x.data for x in want]  # same frames, shortened timeline
    assert got[-1].time_ns < want[-1].time_ns


def test_replay_of_link_local_frames_sends_nothing_back(tmp_path):
    """Issue 22: a capture of one PAUSE, one PFC, one LLDP and one STP BPDU (built by scapy, the
    independent reference) replays to an empty output; each is counted under its reason."""
    from scapy.contrib.lldp import (
        LLDPDUChassisID,
        LLDPDUEndOfLLDPDU,
        LLDPDUPortID,
        LLDPDUTimeToLive,
    )
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause
    from scapy.layers.l2 import LLC, STP, Dot3, Ether
    from scapy.utils import wrpcap

    sw = "02:00:00:00:00:aa"
    frames = [
        Ether(src=sw, dst="01:80:c2:00:00:01") / MACControlPause(pause_time=3000),
        Ether(src=sw, dst="01:80:c2:00:00:01") / MACControlClassBasedFlowControl(
            c3_enabled=1, c3_pause_time=0xFFFF),
        Ether(src=sw, dst="01:80:c2:00:00:0e") / LLDPDUChassisID(subtype=4, id=sw)
        / LLDPDUPortID(subtype=5, id="Ethernet1") / LLDPDUTimeToLive(ttl=120)
        / LLDPDUEndOfLLDPDU(),
        Dot3(src=sw, dst="01:80:c2:00:00:00") / LLC() / STP(),
    ]
    cap, out, js = tmp_path / "ll.pcap", tmp_path / "out.pcap", tmp_path / "r.json"
    wrpcap(str(cap), frames)
    r = _replay("--config", CONFIG, "--in", cap, "--out", out, "--json", js)
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[24:] == b""  # a pcap header, no frame
    c = json.loads(js.read_text())["engine_counters"]
    assert c["rx_frames"] == 4 and c["tx_frames"] == 0
    assert (c["ll_pause"], c["ll_pfc"], c["ll_group"], c["ll_mac_control"]) == (1, 1, 2, 0)
    port = json.loads(js.read_text())["port_counters"]["0"]        # PORT table, per port
    assert (port["rx_frames"], port["tx_frames"], port["pause_rx"]) == (4, 0, 2)
    assert port["rx_bytes"] == sum(len(bytes(f)) for f in frames)
