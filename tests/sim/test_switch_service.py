"""The switch service: L2 forwarding through the engine, management, faults, capture, bad input."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
from netreduce.sim.emu.switch import (
    FaultConfig,
    RawClient,
    SwitchConfig,
    SwitchThread,
    connect_clients,
)
from netreduce.sim.emu.tunnel import Tunnel, frame_bytes
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import MAGIC
from netreduce.wire.pcap import read_pcap

A = bytes.fromhex("02000000000a")
B = bytes.fromhex("02000000000b")
C = bytes.fromhex("02000000000c")
BCAST = b"\xff" * 6


def _frame(dst: bytes, src: bytes, tag: int, size: int = 60) -> bytes:
    """A non-RoCE frame (EtherType 0x88B6): the engine forwards it unchanged."""
    body = struct.pack(">I", tag)
    return dst + src + b"\x88\xb6" + body + bytes(max(0, size - 18))








@pytest.fixture
def switch():
    with SwitchThread() as sw:
        yield sw


def _tags(frames):
    return [struct.unpack(">I", f[14:18])[0] for f in frames]


def test_learning_and_flooding(switch):
    a, b, c = connect_clients(switch, 3, 5.0)
    try:
        a.send(_frame(B, A, 1))  # B unknown yet: flooded to b and c, never back to a
        assert _tags(b.recv(1)) == [1]
        assert _tags(c.recv(1)) == [1]
        b.send(_frame(A, B, 2))  # A learned from frame 1: unicast to a only
        assert _tags(a.recv(1)) == [2]
        c.send(_frame(BCAST, C, 3))  # broadcast: everyone but the sender
        assert _tags(a.recv(2)) == [2, 3]
        assert _tags(b.recv(2)) == [1, 3]
        a.send(_frame(C, A, 4))
        assert _tags(c.recv(2)) == [1, 4]
        assert _tags(b.quiet()) == [1, 3]  # c is known by now: b does not see frame 4
        n = switch.counters()
        assert n["frames_in"] == 4 and n["engine_in"] == 4 and n["engine_out"] == 4
        assert n["engine.fwd_not_roce"] == 4  # every frame crossed the engine
        assert n["unknown_unicast"] == 1 and n["flooded"] == 1
        assert n["macs_learned"] == 3
        assert n["frames_out"] == 6
    finally:
        for x in (a, b, c):
            x.close()


def test_frames_arrive_whole_and_in_order(switch):
    a, b = connect_clients(switch, 2, 5.0)
    try:
        b.send(_frame(A, B, 0))
        a.recv(1)
        frames = [_frame(B, A, i, size=60 + 37 * i) for i in range(1, 200)]
        a.send(*frames)
        got = b.recv(199)
        assert got == frames
    finally:
        a.close()
        b.close()


def test_bad_datagrams_are_counted_and_skipped(switch):
    a, b = connect_clients(switch, 2, 5.0)
    try:
        b.send(_frame(A, B, 0))
        a.recv(1)
        bad = (struct.pack(">I", 0) + struct.pack(">I", 5) + b"12345"
               + struct.pack(">I", 70_000) + os.urandom(70_000))
        a.send_raw(bad + frame_bytes(_frame(B, A, 7)))
        junk = [A + bytes(8), A + os.urandom(30)]  # garbage after the MAC: forwarded as it is
        a.send(*junk)
        assert _tags(b.recv(1)) == [7]
        assert a.recv(3)[1:] == junk
        n = switch.counters()
        assert n["bad_datagrams"] == 3
        assert n["frames_in"] == 4 and n["engine.fwd_not_roce"] == 4
        # a stream that is not framed at all: that connection is closed, nothing else
        c = RawClient(switch.address)
        c.send_raw(b"GET / HTTP/1.1\r\n\r\n")
        assert c.sock.recv(10) == b""
        c.close()
        n = switch.counters()
        assert n["bad_streams"] == 1
        b.send(_frame(A, B, 8))
        assert _tags(a.recv(4)[3:]) == [8]
        with Tunnel(switch.address) as t:  # and the service still answers management
            assert EngineControl(t.bus).identify().magic == MAGIC
    finally:
        a.close()
        b.close()


def test_management_and_source_check():
    with SwitchThread(cfg=SwitchConfig(mgmt_sources=((10 << 24) | 99,))) as sw:
        with Tunnel(sw.address) as t:
            ok = t.mgmt_bus(ip=(10 << 24) | 99)
            assert EngineControl(ok).identify().jobs == 8
            bad = t.mgmt_bus(timeout_s=0.05, retries=1)  # 10.255.255.1 is not allowed here
            with pytest.raises(Exception, match="no response"):
                bad.read(0)
        n = sw.counters()
        assert n["engine.mgmt_accepted"] >= 1
        assert n["engine.mgmt_reject_source"] == 2


def test_faults_are_seeded_and_per_direction():
    def run(seed):
        cfg = SwitchConfig(up=FaultConfig(loss=0.2, dup=0.2), down=FaultConfig(reorder=0.3,
                                                                               reorder_ms=5),
                           seed=seed)
        with SwitchThread(cfg=cfg) as sw:
            a, b = connect_clients(sw, 2, 5.0)
            b.send(_frame(A, B, 0))  # learned at ingress, before the faults, even if lost
            end = time.monotonic() + 5
            while sw.counters()["macs_learned"] < 1:
                assert time.monotonic() < end
                time.sleep(0.01)
            a.send(*[_frame(B, A, i) for i in range(1, 301)])
            end = time.monotonic() + 10
            while True:  # everything has entered the engine and the held frames are out
                n = sw.counters()
                if n["frames_in"] == 301 and n["engine_in"] == 301 - n["up_lost"] \
                        + n["up_duplicated"] or time.monotonic() > end:
                    break
                time.sleep(0.05)
            time.sleep(0.05)
            want = 300 - n["up_lost"] + n["up_duplicated"]
            got = _tags(b.recv(want))
            a.close()
            b.close()
        return n, got

    n, got = run(1)
    assert n["up_lost"] > 0 and n["up_duplicated"] > 0 and n["down_reordered"] > 0
    assert n["down_lost"] == 0 and n["down_duplicated"] == 0 and n["up_reordered"] == 0
    assert len(got) == 300 - n["up_lost"] + n["up_duplicated"]
    assert got != sorted(got)  # reordered on the way down
    n2, got2 = run(1)
    assert sorted(got2) == sorted(got)  # same seed: the same frames lost and duplicated
    assert n2["up_lost"] == n["up_lost"]


def test_pcap_capture(tmp_path):
    prefix = tmp_path / "cap"
    with SwitchThread(cfg=SwitchConfig(pcap=str(prefix))) as sw:
        a, b = connect_clients(sw, 2, 5.0)
        b.send(_frame(A, B, 0))
        a.recv(1)
        a.send(*[_frame(B, A, i) for i in range(1, 6)])
        b.recv(5)
        a.close()
        b.close()
        n = sw.stop()
    ins = read_pcap(f"{prefix}.in.pcap")
    outs = read_pcap(f"{prefix}.out.pcap")
    assert len(ins) == n["engine_in"] == 6
    assert len(outs) == n["engine_out"] == 6
    assert [r.data for r in ins] == [r.data for r in outs]  # bypass traffic is unchanged
    assert ins[-1].data == _frame(B, A, 5)
    assert all(r.time_ns > 1_600_000_000 * 10**9 for r in ins)  # wall-clock timestamps


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_runs_until_signal_and_prints_counters(tmp_path, sig):
    port_file = tmp_path / "port"
    stats = tmp_path / "stats.json"
    p = subprocess.Popen([sys.executable, "-m", "netreduce", "switch", "--listen",
                          "127.0.0.1:0", "--port-file", str(port_file), "--stats-json",
                          str(stats), "--up-loss", "0.1", "--seed", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < end, "the switch did not start"
            time.sleep(0.05)
        port = int(port_file.read_text())
        a = RawClient(("127.0.0.1", port))
        a.send(_frame(BCAST, A, 1), _frame(BCAST, A, 2))
        a.send_raw(struct.pack(">I", 3) + b"abc")
        time.sleep(0.3)
        a.close()
    finally:
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "listening on 127.0.0.1:" in err  # logging, usual format
    assert "shutting down" in err
    assert "bad_datagrams" in out and "frames_in" in out  # the counter table
    n = json.loads(stats.read_text())
    assert n["frames_in"] == 2 and n["bad_datagrams"] == 1 and n["connections"] == 1
    assert n["engine_in"] + n["up_lost"] == 2


def test_cli_rejects_bad_options():
    from click.testing import CliRunner

    from netreduce.cli import main

    r = CliRunner().invoke(main, ["switch", "--listen", "localhost:http"])
    assert r.exit_code == 2 and "cannot read address" in r.output
    r = CliRunner().invoke(main, ["switch", "--mgmt-key", "xyz"])
    assert r.exit_code == 2 and "32 hex digits" in r.output
