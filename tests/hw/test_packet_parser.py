"""Parser (Amaranth simulator): fields, payload, bypass copy and verdicts against netreduce.wire.

Oracle: :func:`netreduce.wire.parse` (fields, payload, reason of every malformed frame) and scapy
(BTH fields). Widths 64 (long randomised runs) and 512 (short runs: pysim of a 512-bit CRC is
slow-ish).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from netreduce.hw.packet.layout import REASON_NAMES, Kind, Reason
from netreduce.hw.packet.testing import random_frame, run_parser

from netreduce.wire import (
    BTH,
    ETH,
    IPV4,
    MIN_FRAME,
    NOT_ROCE_REASONS,
    OPCODES,
    UDP,
    RoceFrame,
    WireError,
    icrc_bytes,
    ipv4_checksum,
    parse,
)

VECTORS = Path(__file__).resolve().parents[1] / "data" / "roce_vectors.json"


def _vectors() -> list[bytes]:
    if not VECTORS.exists():
        pytest.skip(f"no vector file at {VECTORS}")
    return [bytes.fromhex(v["frame_hex"]) for v in json.loads(VECTORS.read_text())["vectors"]]


def expected(frame: bytes, mac_error: bool = False):
    """(kind, reason name, RoceFrame or None) as netreduce.wire sees the frame."""
    if mac_error:
        return Kind.MALFORMED, "mac_error", None
    try:
        r = parse(frame)
    except WireError as e:
        kind = Kind.NOT_ROCE if e.reason in NOT_ROCE_REASONS else Kind.MALFORMED
        return kind, e.reason, None
    info = OPCODES[r.opcode]
    if info.rc_data:
        kind = Kind.DATA
    else:
        kind = {"ACK": Kind.ACK, "CNP": Kind.CNP}.get(info.kind, Kind.OTHER)
    return kind, "none", r


def check_fields(rec: dict, r: RoceFrame, frame: bytes):
    """Header record fields against the RoceFrame that netreduce.wire.parse returned."""
    info = OPCODES[r.opcode]
    assert rec["vlan"] == (r.vlan_tci is not None)
    assert rec["hdr_len"] == r.payload_offset
    assert bytes(rec["raw"][:r.payload_offset]) == frame[:r.payload_offset]
    assert rec["eth"]["dst"] == int.from_bytes(r.dmac, "big")
    assert rec["eth"]["src"] == int.from_bytes(r.smac, "big")
    assert rec["eth"]["ethertype"] == 0x0800
    if r.vlan_tci is not None:
        assert rec["dot1q"]["tci"] == r.vlan_tci
    ip = rec["ipv4"]
    assert (ip["src"], ip["dst"], ip["tos"], ip["ttl"], ip["identification"], ip["flags_frag"]) \
        == (r.src_ip, r.dst_ip, r.tos, r.ttl, r.ident, r.flags_frag)
    assert ip["ecn"] == r.ecn and ip["checksum"] == r.ip_checksum
    assert rec["udp"]["sport"] == r.sport and rec["udp"]["dport"] == 4791
    bth = rec["bth"]
    for name in ("opcode", "se", "m", "tver", "pkey", "fecn", "becn", "dqpn", "ackreq", "psn"):
        assert bth[name] == getattr(r, name), name
    assert bth["padcnt"] == r.pad
    if info.reth:
        assert (rec["reth"]["va"], rec["reth"]["rkey"], rec["reth"]["dmalen"]) \
            == (r.va, r.rkey, r.dmalen)
    if info.immdt:
        assert rec["immdt"]["imm"] == r.imm
    if info.aeth:
        assert (rec["aeth"]["syndrome"], rec["aeth"]["msn"]) == (r.syndrome, r.msn)
    assert rec["plen"] == (len(r.payload) if info.rc_data else 0)


def check_run(frames, out, mac_errors=None):
    """Every output of a parser run against the oracle; returns the number of DATA frames."""
    mac_errors = mac_errors or [False] * len(frames)
    n = len(frames)
    assert len(out["hdr"]) == n and len(out["verdict"]) == n and len(out["frame"]) == n
    # the bypass copy is the input, unchanged
    assert [f for f, _ in out["frame"]] == list(frames)
    assert [bool(lb["error"]) for _, lb in out["frame"]] == list(mac_errors)
    pay = iter(out["payload"])
    ndata = 0
    for i, (f, rec, ver) in enumerate(zip(frames, out["hdr"], out["verdict"], strict=True)):
        kind, reason, r = expected(f, mac_errors[i])
        got = (ver["kind"], REASON_NAMES[ver["reason"]])
        assert got == (kind, reason), f"frame {i} ({len(f)} B {f[:60].hex()}): {got}"
        assert ver["frame_len"] == len(f)
        if r is not None:
            assert rec["kind"] == kind and rec["reason"] == Reason.NONE
            check_fields(rec, r, f)
        if rec["kind"] == Kind.DATA:
            ndata += 1
            data, last = next(pay)
            assert bool(last["error"]) == (reason != "none"), f"frame {i}"
            if r is not None:
                assert data == r.payload, f"frame {i}"
        elif reason == "none":
            assert rec["kind"] == kind
    assert next(pay, None) is None, "payload stream has more frames than DATA records"
    return ndata


@pytest.mark.parametrize("width", [64, 512])
def test_packet_parser_vectors(width):
    frames = _vectors()
    # with random stalls on the input and on every output (line_rate covers the clean case)
    out = run_parser(width, frames, idle=0.3, stall=0.3, seed=5)
    assert check_run(frames, out) == sum(expected(f)[0] == Kind.DATA for f in frames) > 0


def test_packet_parser_fields_match_scapy():
    pytest.importorskip("scapy")
    from scapy.contrib.roce import BTH as ScapyBTH
    from scapy.layers.l2 import Ether

    rng = random.Random(11)
    frames = [random_frame(rng).pack() for _ in range(12)]
    out = run_parser(64, frames)
    for f, rec in zip(frames, out["hdr"], strict=True):
        b = Ether(f)[ScapyBTH]
        got = rec["bth"]
        assert (got["opcode"], got["se"], got["m"], got["padcnt"], got["tver"], got["pkey"],
                got["fecn"], got["becn"], got["dqpn"], got["ackreq"], got["psn"]) == \
            (b.opcode, b.solicited, b.migreq, b.padcount, b.version, b.pkey, b.fecn, b.becn,
             b.dqpn, b.ackreq, b.psn)


@pytest.mark.parametrize("width,count,idle,stall", [
    (64, 48, 0.3, 0.4), (128, 30, 0.2, 0.2), (512, 30, 0.2, 0.3)])
def test_packet_parser_random_valid(width, count, idle, stall):
    rng = random.Random(width * 1000 + count)
    frames = []
    for op in sorted(OPCODES):  # every opcode, tagged and untagged
        for vlan in (False, True):
            frames.append(random_frame(rng, opcode=op, vlan=vlan).pack())
    frames += [random_frame(rng, max_plen=120).pack() for _ in range(count - len(frames))]
    rng.shuffle(frames)
    out = run_parser(width, frames, idle=idle, stall=stall, seed=count)
    assert check_run(frames, out) > 0


def _set(frame: bytearray, field, value, base):
    field.put(frame, value, base)


def malformed_frames(rng: random.Random) -> list[bytes]:
    """One or more frames per reason the parser reports (the oracle decides the reason)."""
    out = []
    good = random_frame(rng, opcode=0x0A, plen=40, vlan=False).pack()
    tagged = random_frame(rng, opcode=0x04, plen=33, vlan=True).pack()
    l3 = ETH.size
    # truncation inside every header, runts and a cut inside the payload
    for cut in (0, 1, 10, 13, 14, 15, 20, 33, 34, 40, 41, 47, 50, 53, 60, 69, 75, 90):
        out.append(good[:cut] if cut else good[:1])
    for cut in (14, 16, 17, 18, 30, 45):
        out.append(tagged[:cut])

    def mutate(src, fn, fix_csum=True, fix_icrc=False, l2=l3):
        b = bytearray(src)
        fn(b)
        if fix_csum:
            IPV4.checksum.put(b, ipv4_checksum(b[l2:l2 + 20]), l2)
        if fix_icrc:
            total = IPV4.total_length.get(b, l2)
            b[l2 + total - 4:l2 + total] = icrc_bytes(memoryview(b)[l2:l2 + total - 4])
        return bytes(b)

    out.append(mutate(good, lambda b: ETH.ethertype.put(b, 0x86DD), False))       # not IPv4
    out.append(mutate(good, lambda b: IPV4.version.put(b, 6, l3)))
    out.append(mutate(good, lambda b: IPV4.ihl.put(b, 6, l3)))                    # IHL != 5
    out.append(mutate(good, lambda b: IPV4.protocol.put(b, 6, l3)))               # TCP
    out.append(mutate(good, lambda b: IPV4.flags_frag.put(b, 0x2000, l3)))        # MF
    out.append(mutate(good, lambda b: IPV4.frag_offset.put(b, 8, l3)))
    out.append(mutate(good, lambda b: UDP.dport.put(b, 4792, l3 + 20)))           # other port
    total = IPV4.total_length.get(good, l3)
    for t in (0, 20, 43, total - 1, total + 1, total + 100):                      # ip length
        out.append(mutate(good, lambda b, t=t: IPV4.total_length.put(b, t, l3)))
    out.append(good + bytes(8))                                                   # trailing
    out.append(mutate(good, lambda b: UDP.length.put(b, total - 19, l3 + 20)))   # udp length
    out.append(mutate(good, lambda b: IPV4.checksum.put(b, 0x1234, l3), False))  # ip checksum
    out.append(mutate(good, lambda b: b.__setitem__(60, b[60] ^ 0x40)))           # icrc
    out.append(mutate(good, lambda b: b.__setitem__(len(b) - 1, b[-1] ^ 1)))     # icrc
    out.append(mutate(tagged, lambda b: b.__setitem__(70, b[70] ^ 1), l2=18))     # icrc, tagged
    b0 = l3 + 28
    out.append(mutate(good, lambda b: BTH.tver.put(b, 1, b0), fix_icrc=True))    # tver
    out.append(mutate(good, lambda b: BTH.opcode.put(b, 0x1F, b0), fix_icrc=True))  # opcode
    out.append(mutate(good, lambda b: BTH.opcode.put(b, 0x64, b0), fix_icrc=True))  # opcode
    # extension headers that do not fit the datagram: WRITE_ONLY relabelled from a short SEND
    short = random_frame(rng, opcode=0x04, plen=4, vlan=False).pack()
    out.append(mutate(short, lambda b: BTH.opcode.put(b, 0x0A, b0), fix_icrc=True))
    # an ACK with a payload, a data frame with PadCnt > its payload
    out.append(mutate(short, lambda b: BTH.opcode.put(b, 0x11, b0), fix_icrc=True))
    empty = random_frame(rng, opcode=0x04, plen=0, vlan=False).pack()
    out.append(mutate(empty, lambda b: BTH.padcnt.put(b, 3, b0), fix_icrc=True))
    # ECN / TTL changes alone break the checksum, not the ICRC
    out.append(mutate(good, lambda b: IPV4.ttl.put(b, 3, l3), False))
    return out


@pytest.mark.parametrize("width,idle,stall", [(64, 0.3, 0.3), (512, 0.2, 0.2)])
def test_packet_parser_malformed_then_good(width, idle, stall):
    """Every malformed frame gets the oracle's reason and the next good frame parses."""
    rng = random.Random(7)
    bad = malformed_frames(rng)
    frames = []
    for f in bad:
        frames.append(f)
        frames.append(random_frame(rng, max_plen=12).pack())
    reasons = {expected(f)[1] for f in bad}
    assert {"truncated", "ethertype", "ip_version", "ihl", "fragment", "protocol", "udp_port",
            "ip_length", "udp_length", "ip_checksum", "tver", "opcode", "padcnt",
            "icrc"} <= reasons
    if width == 512:
        frames = frames[::2][:24] + frames[1::2][:6]   # keep the 512-bit run short
    mac = [i % 17 == 5 for i in range(len(frames))]
    out = run_parser(width, frames, errors=mac, idle=idle, stall=stall, seed=3)
    check_run(frames, out, mac)


@pytest.mark.parametrize("width,jumbo_len", [(64, 1518), (512, 9018)])
def test_packet_parser_line_rate_jumbo_runts(width, jumbo_len):
    """Back-to-back minimum, runt, maximum and jumbo frames: one input beat per cycle."""
    rng = random.Random(1)
    frames = [RoceFrame(opcode=0x11, psn=i).pack() for i in range(16)]          # 62 B ACKs
    frames += [random_frame(rng, opcode=0x0A, plen=0).pack() for _ in range(8)]
    runt = RoceFrame(opcode=0x04).pack()                       # padded to 60 bytes
    assert len(runt) == MIN_FRAME
    jumbo = random_frame(rng, opcode=0x0A, plen=jumbo_len - 74, vlan=False).pack()
    assert len(jumbo) == jumbo_len
    frames += [runt, jumbo, runt[:58], jumbo + b"\0", runt, jumbo[:jumbo_len // 2]]
    frames += [random_frame(rng, opcode=0x07, plen=4096 if width > 64 else 1024).pack()]
    out = run_parser(width, frames)
    # every beat was taken in consecutive cycles (the source never idles here)
    assert out["in_span"] == out["in_beats"], (out["in_span"], out["in_beats"])
    check_run(frames, out)
