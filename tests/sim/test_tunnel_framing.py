"""QEMU socket framing (FrameReader), addresses, and the Tunnel's own error paths."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from netreduce.sim.emu.tunnel import (
    MAX_FRAME,
    FrameReader,
    Tunnel,
    TunnelClosed,
    TunnelTimeout,
    frame_bytes,
    parse_address,
)


def _frames(sizes):
    return [bytes([i & 0xFF]) * n for i, n in enumerate(sizes)]


@given(st.lists(st.integers(14, 3000), max_size=20), st.lists(st.integers(1, 500), max_size=30))
def test_reader_reassembles_any_split(sizes, cuts):
    frames = _frames(sizes)
    stream = b"".join(frame_bytes(f) for f in frames)
    rd = FrameReader()
    got, pos = [], 0
    for c in cuts:
        got += rd.feed(stream[pos:pos + c])
        pos += c
    got += rd.feed(stream[pos:])
    assert got == frames and rd.bad == 0 and not rd.desync


def test_reader_skips_bad_lengths_even_when_split():
    good = b"\x02" * 60
    stream = (struct.pack(">I", 0) + struct.pack(">I", 13) + b"x" * 13
              + struct.pack(">I", MAX_FRAME + 1) + b"y" * (MAX_FRAME + 1) + frame_bytes(good))
    rd = FrameReader()
    got = []
    for i in range(0, len(stream), 1000):  # the oversized datagram spans many reads
        got += rd.feed(stream[i:i + 1000])
    assert got == [good]
    assert rd.bad == 3 and not rd.desync


def test_reader_gives_up_on_unframed_streams():
    rd = FrameReader()
    assert rd.feed(b"GET / HTTP/1.1\r\n" + frame_bytes(b"\x02" * 60)) == []
    assert rd.desync
    assert rd.feed(frame_bytes(b"\x02" * 60)) == []  # stays dead: the caller closes it


@pytest.mark.parametrize("text,want", [("127.0.0.1:7000", ("127.0.0.1", 7000)),
                                       ("7001", ("127.0.0.1", 7001)),
                                       ("localhost:0", ("localhost", 0))])
def test_parse_address(text, want):
    assert parse_address(text) == want


@pytest.mark.parametrize("text", ["host:port", "1.2.3.4:70000", ""])
def test_parse_address_rejects(text):
    with pytest.raises(ValueError, match="address|port"):
        parse_address(text)


def test_connect_refused_is_a_clear_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    with pytest.raises(TunnelClosed, match=f"cannot connect to the switch at 127.0.0.1:{port}"):
        Tunnel(("127.0.0.1", port), connect_timeout_s=0.3)


def _server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    return srv


def test_timers_and_timeout():
    srv = _server()
    with Tunnel(srv.getsockname()) as t:
        fired = []
        t.call_later(20_000_000, fired.append, "late")
        t.call_later(1_000_000, fired.append, "early")
        h = t.call_later(2_000_000, fired.append, "cancelled")
        h.cancel()
        t.run_until(lambda: len(fired) == 2, 5_000_000_000)
        assert fired == ["early", "late"]
        with pytest.raises(TunnelTimeout, match="wall-clock limit.*still waiting"):
            t.run_until(lambda: False, 50_000_000, describe=lambda: "still waiting")
    srv.close()


def test_peer_closing_raises_tunnel_closed():
    srv = _server()
    t = Tunnel(srv.getsockname())
    conn, _ = srv.accept()
    got = []
    t.attach(b"\x02\x00\x00\x00\x00\x01", got.append)
    frame = b"\x02\x00\x00\x00\x00\x01" + b"\x02" * 6 + b"\x88\xb6" + bytes(46)
    conn.sendall(frame_bytes(frame) + frame_bytes(b"\x02\x00\x00\x00\x00\x09" + bytes(54)))
    t.run_until(lambda: bool(got) and t.stats["rx_unknown_dst"] == 1, 5_000_000_000)
    assert got == [frame] and t.stats["rx_unknown_dst"] == 1
    threading.Timer(0.05, conn.close).start()
    with pytest.raises(TunnelClosed, match="closed the connection"):
        t.run_until(lambda: False, 5_000_000_000)
    t.close()
    srv.close()
