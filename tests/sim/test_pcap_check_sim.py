"""``netreduce sim --pcap``: the captures validated independently of netreduce.wire (scapy, zlib,
numpy): ICRC and IPv4 checksum of every frame, per-flow PSN order and opcode sequencing of every
result flow, and every result payload equal to the lane-wise reduction of the matching inputs.

On the model and on both RTL backends (Verilator and Icarus), with loss, duplication and
reordering. The RTL runs use the 64-bit engine of :data:`RTL_PARAMS` (the build shared with the
other RTL tests; the command line's backend names are re-registered with it), and a short RC
timeout (``--qp-timeout``) so that a tail loss costs thousands of idle cycles, not 338k."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from collections import defaultdict

import numpy as np
import pytest
from click.testing import CliRunner
from netreduce.sim.net import simrun
from netreduce.sim.net.simrun import Backend, BackendUnavailable, SimConfig, get_backend
from netreduce.sim.rtl.fabric import make_rtl_backend, rtl_params

from netreduce.cli import main

scapy_all = pytest.importorskip("scapy.all")
from scapy.contrib.roce import BTH  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.utils import rdpcap  # noqa: E402

# payload offset from the start of the BTH, per data opcode (docs/roce.md table)
_PAYLOAD_OFF = {0x06: 28, 0x0A: 28, 0x0B: 32, 0x07: 12, 0x08: 12, 0x09: 16}
_FIRST, _MIDDLE, _LAST, _LAST_IMM, _ONLY, _ONLY_IMM = 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B


def _icrc(l3: bytes) -> bytes:  # docs/roce.md, written out here on purpose (independent of wire/)
    b = bytearray(l3)
    b[1] = b[8] = 0xFF
    b[10:12] = b[26:28] = b"\xff\xff"
    b[32] = 0xFF
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(b)))


def _frames(path):
    out = []
    for p in rdpcap(str(path)):
        assert IP in p and UDP in p and p[UDP].dport == 4791, p.summary()
        ip = p[IP]
        raw = bytes(ip)[:ip.len]
        # IPv4 checksum: scapy recomputes it when the field is deleted
        fresh = IP(raw[:20])
        fresh.chksum = None
        assert IP(bytes(fresh)).chksum == ip.chksum, f"IPv4 checksum of {p.summary()}"
        assert _icrc(raw[:-4]) == raw[-4:], f"ICRC of {p.summary()}"
        bth = p[BTH]
        pad = (raw[20 + 8 + 1] >> 4) & 3
        body = raw[28:-4]
        off = _PAYLOAD_OFF.get(bth.opcode)
        payload = body[off:len(body) - pad] if off is not None else None
        out.append({"t": float(p.time), "src": ip.src, "dqpn": bth.dqpn, "psn": bth.psn,
                    "opcode": bth.opcode, "payload": payload})
    return out


def _run_sim(tmp_path, *args):
    prefix = tmp_path / "cap"
    rep = tmp_path / "rep.json"
    r = CliRunner().invoke(main, ["sim", *args, "--pcap", str(prefix), "--json", str(rep)])
    assert r.exit_code == 0, r.output
    return prefix, json.loads(rep.read_text())


# the 64-bit engine build every RTL test shares (one Verilator build, one Icarus build)
RTL_PARAMS = {**rtl_params(SimConfig(workers=4)), "data_width": 64, "pmtu_max": 1024}


@pytest.fixture
def rtl_backend(monkeypatch):
    """``use(sim)`` makes ``netreduce sim --backend sim`` run the 64-bit engine of RTL_PARAMS
    (skips when the simulator or the engine top is missing)."""

    def use(sim):
        try:
            get_backend(sim).probe()
        except BackendUnavailable as e:
            pytest.skip(str(e))
        desc, make, probe = make_rtl_backend(sim, **RTL_PARAMS)
        monkeypatch.setitem(simrun.BACKENDS, sim, Backend(sim, desc + ", 64-bit test build",
                                                          make, probe))

    return use


def _check_captures(prefix, rep, lossless: bool):
    ins, outs = _frames(f"{prefix}.in.pcap"), _frames(f"{prefix}.out.pcap")
    assert len(ins) == rep["capture"]["roce_frames_in"] and len(outs) == (
        rep["capture"]["roce_frames_out"])
    for fr in (ins, outs):  # timestamps from the cycle count: monotonic
        ts = [f["t"] for f in fr]
        assert ts == sorted(ts)
    pmtu = rep["config"]["pmtu"]
    flows = {(f["src_ip"], f["dqpn"]): f for f in rep["flows"]}
    by_pass = defaultdict(dict)
    for f in rep["flows"]:
        by_pass[f["pass_id"]][f["rank"]] = f
    # inputs: (flow, psn) -> payload; retransmissions and duplicates must carry the same bytes
    inp: dict = {}
    for f in ins:
        key = (f["src"], f["dqpn"])
        if f["payload"] is None or key not in flows:
            continue
        old = inp.setdefault((key, f["psn"]), f["payload"])
        assert old == f["payload"], f"flow {key} PSN {f['psn']}: retransmission differs"
    # result flows
    per_flow = defaultdict(list)
    for f in outs:
        key = (f["src"], f["dqpn"])
        if f["payload"] is not None and key in flows:
            per_flow[key].append(f)
    assert set(per_flow) == set(flows), "every registered flow gets results"
    checked = 0
    for key, frames in per_flow.items():
        fl = flows[key]
        first: dict[int, dict] = {}
        nxt = fl["start_psn"]
        for f in frames:
            if f["psn"] in first:
                assert not lossless, f"flow {key}: PSN {f['psn']} emitted twice without loss"
                if f["opcode"] == _MIDDLE and f["payload"] == b"":
                    continue  # a behind-window duplicate probe (engine D15) of a sent result
                # a re-emit: same PSN, opcode and payload as the first time
                assert f["opcode"] == first[f["psn"]]["opcode"]
                assert f["payload"] == first[f["psn"]]["payload"]
                continue
            assert f["psn"] == nxt, f"flow {key}: result PSN {f['psn']}, expected {nxt}"
            first[f["psn"]] = f
            nxt = (nxt + 1) & 0xFFFFFF
        ops = [first[(fl["start_psn"] + i) & 0xFFFFFF]["opcode"] for i in range(len(first))]
        assert len(ops) == fl["packets"], f"flow {key}: {len(ops)} of {fl['packets']} results"
        in_msg = False
        for i, op in enumerate(ops):  # opcode sequencing as a receiver enforces it
            f = first[(fl["start_psn"] + i) & 0xFFFFFF]
            if in_msg:
                assert op in (_MIDDLE, _LAST, _LAST_IMM), f"flow {key}: {op:#x} inside a message"
            else:
                assert op in (_FIRST, _ONLY, _ONLY_IMM), f"flow {key}: {op:#x} starts a message"
            if op in (_FIRST, _MIDDLE):
                assert len(f["payload"]) == pmtu
            else:
                assert 0 < len(f["payload"]) <= pmtu
            in_msg = op in (_FIRST, _MIDDLE)
        assert not in_msg
        # payload = lane-wise reduction of the inputs of the same index over the pass's flows
        ranks = by_pass[fl["pass_id"]]
        for psn, f in first.items():
            k = (psn - fl["start_psn"]) & 0xFFFFFF
            lanes = []
            for g in ranks.values():
                pk = ((g["src_ip"], g["dqpn"]), (g["start_psn"] + k) & 0xFFFFFF)
                assert pk in inp, f"result {key} PSN {psn} has no input from rank {g['rank']}"
                lanes.append(np.frombuffer(inp[pk], "<i4").astype(np.int64))
            got = np.frombuffer(f["payload"], "<i4").astype(np.int64)
            if fl["op"] == "MAX":
                want = np.max(lanes, axis=0)
            elif fl["op"] == "SUM_SAT":  # no clipping by construction (quantisation bound)
                want = np.sum(lanes, axis=0)
                assert np.all(np.abs(want) < 2**31)
            else:
                want = (np.sum(lanes, axis=0) + 2**31) % 2**32 - 2**31
            assert np.array_equal(got, want), f"flow {key} PSN {psn}: wrong aggregate"
            checked += 1
    assert checked == sum(fl["packets"] for fl in flows.values())
    return checked


def test_pcap_lossless_int32(tmp_path):
    prefix, rep = _run_sim(tmp_path, "-n", "3", "-s", "20004", "--dtype", "int32", "--pmtu",
                           "1024", "--seed", "4")
    assert rep["ok"] and rep["recovery"]["retransmitted"] == 0
    assert _check_captures(prefix, rep, lossless=True) == 3 * 20


def test_pcap_faulty_float32(tmp_path):
    # float: a MAX pass (exponents) then a SUM_SAT pass; loss/dup/reorder give re-emits
    # in the star (no ToR hop): this seed's faults put data frames behind the window there
    prefix, rep = _run_sim(tmp_path, "-n", "3", "-s", "16KiB", "--pmtu", "512", "--loss", "0.03",
                           "--dup", "0.02", "--reorder", "0.02", "--seed", "11",
                           "--port-gbps", "0")
    assert rep["ok"] and rep["recovery"]["retransmitted"] > 0
    assert rep["engine_counters"]["reemits"] > 0 and rep["engine_counters"]["behind_window"] > 0
    assert {f["op"] for f in rep["flows"]} == {"MAX", "SUM_SAT"}
    assert _check_captures(prefix, rep, lossless=False) > 0


def test_pcap_checker_catches_a_corrupted_result(tmp_path):
    prefix, rep = _run_sim(tmp_path, "-n", "2", "-s", "4096", "--dtype", "int32", "--pmtu",
                           "1024", "--seed", "2")
    path = tmp_path / "cap.out.pcap"
    data = bytearray(path.read_bytes())
    data[24 + 16 + 14 + 20 + 8 + 12 + 16 + 4] ^= 1  # one payload bit of the first result frame
    path.write_bytes(bytes(data))
    with pytest.raises(AssertionError, match="ICRC"):
        _check_captures(prefix, rep, lossless=True)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_pcap_opens_in_tshark(tmp_path):
    prefix, rep = _run_sim(tmp_path, "-n", "2", "-s", "8192", "--dtype", "int32")
    for side, n in (("in", rep["capture"]["roce_frames_in"]),
                    ("out", rep["capture"]["roce_frames_out"])):
        r = subprocess.run(["tshark", "-r", f"{prefix}.{side}.pcap", "-d",
                            "udp.port==4791,infiniband", "-T", "fields", "-e",
                            "infiniband.bth.psn"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.split()) == n


# ------------------------------------------------------------------------------ RTL backends
def _faults_seen(rep) -> int:
    return sum(rep["links"][d][k] for d in ("up", "down")
               for k in ("lost", "duplicated", "reordered"))


@pytest.mark.xdist_group("fastsim_engine")
def test_pcap_rtl_verilator_faulty_float32(tmp_path, rtl_backend):
    rtl_backend("verilator")
    prefix, rep = _run_sim(tmp_path, "-n", "3", "-s", "16KiB", "--pmtu", "512", "--loss", "0.03",
                           "--dup", "0.02", "--reorder", "0.02", "--seed", "11",
                           "--qp-timeout", "4", "--backend", "verilator")
    assert rep["ok"] and rep["backend"]["name"] == "verilator"
    assert "64-bit test build" in rep["backend"]["description"]
    assert rep["links"]["up"]["lost"] + rep["links"]["down"]["lost"] > 0
    assert rep["recovery"]["retransmitted"] > 0
    assert rep["engine_counters"]["drop_icrc"] == 0 and rep["slots"]["left_allocated"] == 0
    assert {f["op"] for f in rep["flows"]} == {"MAX", "SUM_SAT"}
    assert _check_captures(prefix, rep, lossless=False) > 0


@pytest.mark.xdist_group("fastsim_engine")
def test_pcap_rtl_verilator_lossless_int32(tmp_path, rtl_backend):
    rtl_backend("verilator")
    prefix, rep = _run_sim(tmp_path, "-n", "4", "-s", "12004", "--dtype", "int32", "--pmtu",
                           "1024", "--seed", "5", "--backend", "verilator")
    assert rep["ok"] and rep["recovery"]["retransmitted"] == 0
    assert _check_captures(prefix, rep, lossless=True) == 4 * 12


@pytest.mark.xdist_group("fastsim_engine_icarus")
def test_pcap_rtl_icarus_faulty_int32(tmp_path, rtl_backend):
    # Icarus runs the engine at a few hundred cycles/s: 2 ranks, 8 packets each, a 16 us RC
    # timeout (qp-timeout 2), and the same faults as above
    rtl_backend("icarus")
    prefix, rep = _run_sim(tmp_path, "-n", "2", "-s", "2KiB", "--dtype", "int32", "--pmtu",
                           "256", "--loss", "0.05", "--dup", "0.05", "--reorder", "0.05",
                           "--seed", "3", "--qp-timeout", "2", "--backend", "icarus")
    assert rep["ok"] and rep["backend"]["name"] == "icarus"
    assert _faults_seen(rep) > 0
    assert rep["engine_counters"]["drop_icrc"] == 0 and rep["slots"]["left_allocated"] == 0
    assert _check_captures(prefix, rep, lossless=False) == 2 * 8
