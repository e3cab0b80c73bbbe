"""pcap files written by netreduce.wire.pcap open in scapy and tshark; bad files fail clearly."""

import shutil
import subprocess
from decimal import Decimal

import pytest
from scapy.utils import rdpcap

from netreduce.wire import Opcode, RoceFrame, parse
from netreduce.wire.pcap import PcapWriter, read_pcap, write_pcap

FRAMES = [
    RoceFrame(opcode=Opcode.WRITE_FIRST, psn=0xFFFFFE, dqpn=0x12, payload=bytes(range(256)),
              va=0x1000, rkey=7, dmalen=600),
    RoceFrame(opcode=Opcode.WRITE_MIDDLE, psn=0xFFFFFF, dqpn=0x12, payload=bytes(256)),
    RoceFrame(opcode=Opcode.WRITE_LAST_IMM, psn=0, dqpn=0x12, payload=b"\x01" * 88, imm=3,
              ackreq=1, vlan_tci=0x2064),
    RoceFrame.ack(psn=0, msn=1, dqpn=0x34),
    RoceFrame.cnp(dqpn=0x12),
]
TIMES = [0, 999, 1_000_000_001, 5_123_456_789, 1_700_000_000_000_000_007]


@pytest.fixture
def packed():
    return [f.pack() for f in FRAMES]


@pytest.mark.parametrize("nanosecond", [True, False])
def test_round_trip_and_scapy(tmp_path, packed, nanosecond):
    path = tmp_path / "f.pcap"
    assert write_pcap(path, zip(TIMES, packed, strict=True), nanosecond=nanosecond) == len(packed)
    recs = read_pcap(path)
    want_t = TIMES if nanosecond else [t // 1000 * 1000 for t in TIMES]
    assert [r.data for r in recs] == packed
    assert [r.time_ns for r in recs] == want_t
    assert [r.orig_len for r in recs] == [len(p) for p in packed]
    pkts = rdpcap(str(path))
    assert [bytes(p) for p in pkts] == packed
    assert [int(Decimal(str(p.time)) * 10**9) for p in pkts] == want_t
    assert [parse(bytes(p)).psn for p in pkts] == [f.psn for f in FRAMES]


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_decodes(tmp_path, packed):
    path = tmp_path / "t.pcap"
    write_pcap(path, zip(TIMES, packed, strict=True))
    out = subprocess.run(
        ["tshark", "-n", "-r", str(path), "-d", "udp.port==4791,infiniband", "-T", "fields",
         "-e", "frame.time_epoch", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn",
         "-e", "infiniband.bth.destqp"],
        capture_output=True, text=True, timeout=120, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}).stdout
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    assert len(rows) == len(FRAMES)
    for row, f, t in zip(rows, FRAMES, TIMES, strict=True):
        assert Decimal(row[0]) == Decimal(t) / 10**9
        assert int(row[1]) == f.opcode
        assert int(row[2]) == f.psn
        assert int(row[3], 16) == f.dqpn


def test_truncated_pcap(tmp_path, packed):
    path = tmp_path / "c.pcap"
    write_pcap(path, packed)
    data = path.read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[:-5])  # inside the last record's data
    with pytest.raises(ValueError, match=r"record 4 data cut short \(\d+ of \d+ B\)"):
        read_pcap(cut)
    last_hdr = len(data) - len(packed[-1]) - 16
    cut.write_bytes(data[:last_hdr + 7])  # inside the last record's header
    with pytest.raises(ValueError, match=r"record 4 header cut short \(7 of 16 B\)"):
        read_pcap(cut)
    cut.write_bytes(data[:10])
    with pytest.raises(ValueError, match="10 B is too short for a pcap header"):
        read_pcap(cut)
    cut.write_bytes(b"\x0a\x0d\x0d\x0a" + data[4:])  # pcapng magic
    with pytest.raises(ValueError, match="not a classic pcap file"):
        read_pcap(cut)


def test_writer_rejects_negative_time_and_counts(tmp_path):
    with PcapWriter(tmp_path / "w.pcap") as w:
        w.write(FRAMES[0].pack(), 5)
        with pytest.raises(ValueError, match="-1 ns"):
            w.write(FRAMES[0].pack(), -1)
        assert w.count == 1
    assert len(read_pcap(tmp_path / "w.pcap")) == 1
