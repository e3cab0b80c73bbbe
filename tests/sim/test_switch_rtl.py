"""The switch service on the engine RTL (Verilator): ``netreduce switch --backend verilator``.

Software-RNIC workers reach the RTL through the TCP tunnel exactly as they reach the reference
model (tests/sim/test_switch_service.py, tests/sim/test_tunnel_allreduce.py). Every test
uses the 64-bit engine build of tests/sim/test_rtl_backend.py (same parameters: one Verilator
build serves all RTL tests; the 512-bit build is the same design with wider beats).
"""

from __future__ import annotations

import functools
import json
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from netreduce.sim.emu.rank import RankComm, RankCommConfig, thread_exchange
from netreduce.sim.emu.switch import RawClient, SwitchConfig, SwitchThread, connect_clients
from netreduce.sim.emu.tunnel import Tunnel, frame_bytes
from netreduce.sim.net.collective import CollectiveConfig, Communicator
from netreduce.sim.net.simrun import BackendUnavailable, SimConfig
from netreduce.sim.rtl.fabric import probe_rtl, rtl_params
from netreduce.sim.rtl.switch_engine import RtlSwitchEngine
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import MAGIC, BusError

# exactly the build of tests/sim/test_rtl_backend.py (4 ports, 2 jobs, 16 flows, 512 slots)
SMALL = {**rtl_params(SimConfig(workers=4)), "data_width": 64, "pmtu_max": 1024}

A = bytes.fromhex("02000000000a")
B = bytes.fromhex("02000000000b")
C = bytes.fromhex("02000000000c")
BCAST = b"\xff" * 6

rtl = pytest.mark.xdist_group("fastsim_engine")
# RC timeout exponent of the workers: 18 = 1.07 s. The 64-bit RTL handles a few hundred frames per
# second on a loaded 2-core machine, so a window of packets ahead of a frame delays its answer by
# up to a second; shorter timeouts only fill the RTL with spurious retransmissions.
QP_TIMEOUT = 18


@functools.cache
def _unavailable() -> str | None:
    try:
        probe_rtl("verilator")
    except BackendUnavailable as e:
        return str(e)
    return None


def _engine(**kw) -> RtlSwitchEngine:
    if _unavailable():
        pytest.skip(_unavailable())
    return RtlSwitchEngine(**SMALL, **kw)


SLOW = dict(recv_timeout=10.0, quiet_wait=0.3)  # the RTL engine turns ~200 frames/s

def _frame(dst: bytes, src: bytes, tag: int, size: int = 60) -> bytes:
    """A non-RoCE frame (EtherType 0x88B6): the engine forwards it unchanged."""
    return dst + src + b"\x88\xb6" + struct.pack(">I", tag) + bytes(max(0, size - 18))


def _tags(frames):
    return [struct.unpack(">I", f[14:18])[0] for f in frames]








def _clean(n: dict) -> None:
    """The adapter saw nothing unusual: no watchdog, no straggler, no error-flagged output."""
    assert n["rtl.watchdog"] == 0 and n["rtl.out_error"] == 0, n
    assert n["rtl.late_outputs"] == 0, n  # quiet_cycles covers the engine's internal gaps
    assert n["rtl.frames_in"] == n["engine_in"] and n["rtl.frames_out"] == n["engine_out"]


# ------------------------------------------------------------------------------ adapter
@rtl
def test_adapter_runs_until_idle_and_keeps_outputs_of_register_accesses():
    eng = _engine()
    woken = []
    eng.wake = lambda: woken.append(1)
    f1, f2 = _frame(B, A, 1, 200), _frame(A, B, 2, 61)
    eng.send(0, f1)
    eng.send(3, f2)
    got = eng.run()
    assert sorted((g.port, g.frame) for g in got) == [(0, f1), (3, f2)]
    assert eng.sim.idle() and not eng.more
    # a frame queued, then register reads (which advance the clock) complete it: kept for run()
    eng.send(1, f1)
    for _ in range(100):
        eng.bus.read(eng.regmap.addr("GLOBAL.MAGIC"))
        if woken:
            break
    assert woken, "the frame did not complete during 100 register reads"
    assert [(g.port, g.frame) for g in eng.run()] == [(1, f1)]
    assert eng.counters()["fwd_not_roce"] == 3
    with pytest.raises(BusError, match="DECERR"):
        eng.bus.read(eng.regmap.size + 0x40)
    with pytest.raises(BusError):
        eng.bus.write(eng.regmap.addr("GLOBAL.SCRATCH"), 1 << 32)
    with pytest.raises(ValueError, match="port 4"):
        eng.send(4, f1)
    s = eng.stats()
    assert s["frames_in"] == 3 and s["frames_out"] == 3 and s["late_outputs"] == 1
    # a frame queued just before the straggler sweep: an ordinary run, not a straggler
    eng.send(2, f2)
    assert [(g.port, g.frame) for g in eng.sweep()] == [(2, f2)]
    assert eng.sweep() == []
    s = eng.stats()
    assert s["late_outputs"] == 1 and s["sweeps"] == 2 and s["frames_out"] == 4
    eng.close()


@rtl
def test_watchdog_counts_and_the_next_runs_finish_the_work(caplog):
    # a watchdog of 64 cycles: a 1500-byte frame needs 188 beats in and as many out
    eng = _engine(quiet_cycles=8, mgmt_quiet_cycles=8, max_run=64)
    f = _frame(B, A, 7, 1500)
    eng.send(2, f)
    got = eng.run()
    assert got == [] and eng.more and not eng.sim.idle()
    assert eng.stats()["watchdog"] == 1 and "not idle after 64 cycles" in caplog.text
    for _ in range(40):  # the caller runs again (the service: on the next loop turn)
        got += eng.run()
        if got:
            break
    assert [(g.port, g.frame) for g in got] == [(2, f)]
    assert eng.stats()["watchdog"] >= 3
    with pytest.raises(ValueError, match="quiet_cycles"):
        _engine(quiet_cycles=100, max_run=64)
    eng.close()


# ------------------------------------------------------------------------------ service
@rtl
def test_learning_and_flooding_exclude_the_sender():
    with SwitchThread(_engine()) as sw:
        a, b, c = connect_clients(sw, 3, 10.0, **SLOW)
        try:
            a.send(_frame(B, A, 1))  # B unknown: flooded to b and c, never back to a
            assert _tags(b.recv(1)) == [1] and _tags(c.recv(1)) == [1]
            b.send(_frame(A, B, 2))
            assert _tags(a.recv(1)) == [2]
            c.send(_frame(BCAST, C, 3))  # broadcast: everyone but the sender
            assert _tags(a.recv(2)) == [2, 3] and _tags(b.recv(2)) == [1, 3]
            assert _tags(c.quiet()) == [1]
            # a burst in one go: one run per loop turn, order kept, sizes up to the MTU
            burst = [_frame(B, A, i, size=60 + 53 * i) for i in range(4, 32)]
            a.send(*burst)
            assert b.recv(30)[2:] == burst
            n = sw.counters()
            assert n["frames_in"] == n["engine_in"] == n["engine.fwd_not_roce"] == 31
            assert n["flooded"] == 1 and n["unknown_unicast"] == 1 and n["macs_learned"] == 3
            assert n["rtl.runs"] <= 31 and n["rtl.cycles"] > 0
        finally:
            for x in (a, b, c):
                x.close()
        _clean(sw.stop())


@rtl
def test_bad_datagrams_are_counted_and_the_service_survives():
    with SwitchThread(_engine()) as sw:
        a, b = connect_clients(sw, 2, 10.0, **SLOW)
        try:
            b.send(_frame(A, B, 0))
            a.recv(1)
            bad = (struct.pack(">I", 0) + struct.pack(">I", 5) + b"12345"
                   + struct.pack(">I", 70_000) + bytes(70_000))
            a.send_raw(bad + frame_bytes(_frame(B, A, 7)))
            junk = [A + bytes(8), A + bytes(range(30))]  # garbage after the MAC: forwarded
            a.send(*junk)
            assert _tags(b.recv(1)) == [7]
            assert a.recv(3)[1:] == junk
            n = sw.counters()
            assert n["bad_datagrams"] == 3 and n["frames_in"] == 4
            assert n["engine.fwd_not_roce"] == 4 and n["rtl.frames_out"] == 4
            # a stream that is not framed: that connection is closed
            c = RawClient(sw.address, **SLOW)
            c.send_raw(b"GET / HTTP/1.1\r\n\r\n")
            assert c.sock.recv(10) == b""
            c.close()
            b.send(_frame(A, B, 8))
            assert _tags(a.recv(4)[3:]) == [8]
            with Tunnel(sw.address) as t:  # management still answers, through the RTL
                assert EngineControl(t.bus).identify().magic == MAGIC
            n = sw.counters()
            assert n["bad_streams"] == 1  # (its length prefix also counts a bad datagram)
            assert n["frames_in"] == n["engine.fwd_not_roce"] + n["engine.mgmt_rx"]
        finally:
            a.close()
            b.close()


@rtl
def test_management_is_the_rtls_own():
    key = bytes(range(16))
    eng = _engine()
    ip = (10 << 24) | 99
    with SwitchThread(eng, SwitchConfig(mgmt_sources=(ip,), mgmt_key=key)) as sw:
        with Tunnel(sw.address) as t:
            bus = t.mgmt_bus(ip=ip, key=key)
            info = EngineControl(bus).identify()
            assert (info.ports, info.data_width, info.jobs, info.flows) == (
                SMALL["ports"], 64, SMALL["jobs"], SMALL["flows"])
            scratch = eng.regmap.addr("GLOBAL.SCRATCH")
            bus.write(scratch, 0x5EED_CAFE)
            assert bus.read(scratch) == 0x5EED_CAFE
            # the write went into the RTL's register bank: the AXI4-Lite port reads it too
            assert sw.call(eng.bus.read, scratch) == 0x5EED_CAFE
            no_key = t.mgmt_bus(ip=ip, timeout_s=0.1, retries=1)
            with pytest.raises(Exception, match="no response"):
                no_key.read(scratch)
            other = t.mgmt_bus(key=key, timeout_s=0.1, retries=1)  # 10.255.255.1: not allowed
            with pytest.raises(Exception, match="no response"):
                other.read(scratch)
        n = sw.counters()
    assert n["engine.mgmt_accepted"] >= 3
    assert n["engine.mgmt_reject_auth"] >= 1 and n["engine.mgmt_reject_source"] >= 1
    _clean(n)


def test_switch_service_model_still_has_its_python_agent():
    # the model path is unchanged: the agent, not MGMT registers, answers
    with SwitchThread() as sw, Tunnel(sw.address) as t:
        assert EngineControl(t.bus).identify().data_width == 512
        assert sw.service.engine.mgmt is not None


# ------------------------------------------------------------------------------ all-reduce
@rtl
def test_collective_bit_exact_through_the_rtl_switch():
    """Three software RNICs on one tunnel: int32 sums bit-exact; the float path's results are
    bit-identical to the reference model's (same quantisation, same engine arithmetic)."""
    rng = np.random.default_rng(5)
    xi = [rng.integers(-2**31, 2**31, 12_000, dtype=np.int64).astype(np.int32)
          for _ in range(3)]
    xf = [(rng.standard_normal(9_000) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
          for _ in range(3)]
    cfg = CollectiveConfig(timeout=QP_TIMEOUT, msg_packets=16)
    out = {}
    for name, eng in (("rtl", _engine()), ("model", None)):
        with SwitchThread(eng) as sw, Tunnel(sw.address) as t:
            comm = Communicator(t, 3, cfg)
            ri = comm.allreduce(xi)
            rf = comm.allreduce(xf)
            assert rf.stats["slots_left"] == 0
            assert EngineControl(t.bus).enabled_jobs() == []
            n = sw.counters()
        out[name] = (ri.results, rf.results, n)
    ref = np.sum(np.array(xi, dtype=np.int64), axis=0).astype(np.int32)
    assert all(np.array_equal(y, ref) for y in out["rtl"][0])
    for y, m in zip(out["rtl"][1], out["model"][1], strict=True):
        assert np.array_equal(y.view(np.uint32), m.view(np.uint32))
    n = out["rtl"][2]
    assert n["engine.contributions"] > 0 and n["engine.drop_icrc"] == 0
    assert n["engine.contributions"] == out["model"][2]["engine.contributions"]
    _clean(n)


def _rankcomm_run(address, xs, cfg):
    world = len(xs)
    ex = thread_exchange(world)
    res: list = [None] * world

    def rank(r):
        try:
            comm = RankComm(address, r, world, functools.partial(ex, r), cfg, seed=r)
            res[r] = comm.allreduce(xs[r])
            comm.close()
        except Exception as e:  # reported below
            res[r] = e

    th = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world)]
    for t in th:
        t.start()
    for t in th:
        t.join(300)
        assert not t.is_alive(), "a rank hung"
    for r in range(world):
        assert not isinstance(res[r], Exception), res[r]
    return res


@rtl
def test_rankcomm_ranks_on_their_own_ports():
    """One tunnel (connection, engine port) per rank, RankComm as under torchrun: the float path
    (exponents through a MAX job, fixed point through a SUM_SAT job) gives every rank the same
    bits as the reference model does."""
    eng = _engine()
    rng = np.random.default_rng(8)
    xs = [(rng.standard_normal(6_000) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
          for _ in range(3)]
    cfg = RankCommConfig(msg_packets=8, max_bytes=64 << 10, timeout=QP_TIMEOUT)
    with SwitchThread(eng) as sw:
        got = _rankcomm_run(sw.address, xs, cfg)
        with Tunnel(sw.address) as t:
            assert EngineControl(t.bus).enabled_jobs() == []  # rank 0 removed its jobs
        n = sw.counters()
    with SwitchThread() as sw:
        want = _rankcomm_run(sw.address, xs, cfg)
    for r in range(3):
        assert np.array_equal(got[r].view(np.uint32), want[r].view(np.uint32)), r
    assert n["connections"] >= 3 and n["engine.contributions"] > 0
    _clean(n)


# ------------------------------------------------------------------------------ CLI
def _cli_args():
    return ["--ports", str(SMALL["ports"]), "--jobs", str(SMALL["jobs"]),
            "--flows", str(SMALL["flows"]), "--slots", str(SMALL["slots"]),
            "--max-world", str(SMALL["max_world"]), "--pmtu-max", str(SMALL["pmtu_max"]),
            "--data-width", str(SMALL["data_width"])]


@rtl
def test_cli_verilator_runs_until_sigterm_and_prints_counters(tmp_path):
    if _unavailable():
        pytest.skip(_unavailable())
    port_file = tmp_path / "port"
    stats = tmp_path / "stats.json"
    p = subprocess.Popen([sys.executable, "-m", "netreduce", "switch", "--backend", "verilator",
                          "--listen", "127.0.0.1:0", "--port-file", str(port_file),
                          "--stats-json", str(stats), *_cli_args()],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 2400  # builds the RTL if no other test did yet (~20 min)
        while not (port_file.exists() and port_file.read_text().strip()):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < end, "the switch did not start"
            time.sleep(0.1)
        port = int(port_file.read_text())
        a, b = RawClient(("127.0.0.1", port), **SLOW), RawClient(("127.0.0.1", port), **SLOW)
        time.sleep(0.2)
        a.send(_frame(BCAST, A, 1), _frame(BCAST, A, 2))
        a.send_raw(struct.pack(">I", 3) + b"abc")
        assert _tags(b.recv(2)) == [1, 2]
        with Tunnel(("127.0.0.1", port)) as t:
            assert EngineControl(t.bus).identify().data_width == 64
        a.close()
        b.close()
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "backend verilator" in err and "first run" in err  # says it builds on first use
    assert "shutting down" in err
    assert "rtl.runs" in out and "frames_in" in out  # the counter table
    n = json.loads(stats.read_text())
    assert n["bad_datagrams"] == 1 and n["engine.fwd_not_roce"] == 2
    assert n["engine.mgmt_accepted"] >= 1 and n["rtl.frames_in"] == n["engine_in"]


def test_cli_without_verilator_is_one_line(monkeypatch):
    from click.testing import CliRunner

    from netreduce.cli import main

    monkeypatch.setattr("netreduce.sim.rtl.fastsim.verilator_missing",
                        lambda: "verilator not found (test)")
    r = CliRunner().invoke(main, ["switch", "--backend", "verilator", *_cli_args()])
    assert r.exit_code == 2 and "verilator not found (test)" in r.output
    assert "Traceback" not in r.output
    srcs = [x for i in range(9) for x in ("--mgmt-source", f"10.0.0.{i + 1}")]
    r = CliRunner().invoke(main, ["switch", *srcs])
    assert r.exit_code == 2 and "allow-list holds 8" in r.output
