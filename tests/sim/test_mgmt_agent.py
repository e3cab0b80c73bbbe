"""The management agent in the reference Engine: accepted requests act, every rejected frame is
counted under its reason and changes no register (full register dump before/after)."""

import random

import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.mgmt import REJECT_COUNTERS, attach_mgmt
from netreduce.sw_driver.mgmt import MgmtSettings, MgmtSource

from netreduce.regmap import DISPOSITIONS
from netreduce.wire import ip, ipv4_checksum
from netreduce.wire.mgmt import (
    MGMT_DEFAULT_PORT,
    NO_ERROR_INDEX,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtStatus,
    MgmtType,
    mgmt_tag,
    pack_mgmt,
    parse_mgmt,
    udp_checksum,
)

KEY = bytes(range(100, 116))
E_IP, E_MAC = ip("10.0.0.254"), b"\x02\xee\x00\x00\x00\x01"
C_IP, C_MAC, C_PORT = ip("10.0.0.1"), b"\x02\xcc\x00\x00\x00\x01", 40000
C2_IP, C2_MAC, C2_PORT = ip("10.0.0.2"), b"\x02\xcc\x00\x00\x00\x02", 40002


def _engine(key=KEY):
    eng = Engine(jobs=2, flows=8, slots=64)
    agent = attach_mgmt(eng, MgmtSettings(E_IP, E_MAC, sources=[
        MgmtSource(C_IP), MgmtSource(C2_IP, mac=C2_MAC, port=C2_PORT)], key=key))
    return eng, agent


def _req(ops, seq, key=KEY, src_ip=C_IP, src_mac=C_MAC, sport=C_PORT, vlan=None,
         dport=MGMT_DEFAULT_PORT, dst_ip=E_IP):
    fr = MgmtFrame(MgmtMessage(MgmtType.REQUEST, seq, list(ops)), src_mac, E_MAC, src_ip, dst_ip,
                   sport, dport, vlan)
    return pack_mgmt(fr, key)


def _send(eng, frame):
    return eng.receive(0, frame, 0)


def _resp(eng, frame, key=KEY):
    out = _send(eng, frame)
    assert len(out) == 1, out
    fr = parse_mgmt(out[0].frame, strict=False)
    assert fr.msg.type == MgmtType.RESPONSE
    if key is not None:
        l3 = 18 if fr.vlan_tci is not None else 14
        total = int.from_bytes(out[0].frame[l3 + 2:l3 + 4], "big")
        assert fr.msg.tag == mgmt_tag(key, fr.src_ip, fr.dst_ip, fr.sport, fr.dport,
                                      out[0].frame[l3 + 28:l3 + total])
    return fr


def _dump(eng):
    """Every register except the counter tables (CNT, whose changes are checked separately, and
    PORT, which counts the request and its answer as traffic on the port)."""
    skip = {"CNT", "PORT"}
    return {i.name: eng.regs.read(i.addr) for i in eng.regmap.instances()
            if i.table.name not in skip}


def _counts(eng):
    return eng.counters()


def _check_invariants(eng):
    c = _counts(eng)
    assert c["rx_frames"] == sum(c[d] for d in DISPOSITIONS)
    assert c["mgmt_rx"] == c["mgmt_accepted"] + sum(c[r] for r in REJECT_COUNTERS)


def _addr(eng, path, i=0):
    return eng.regmap.addr(path, i)


def test_write_read_back_and_last_seq():
    eng, agent = _engine()
    s = _addr(eng, "GLOBAL.SCRATCH")
    fr = _resp(eng, _req([MgmtOp.write(s, 0xCAFEF00D), MgmtOp.read(s), MgmtOp.read(0)], 5))
    assert fr.msg.status == MgmtStatus.OK and fr.msg.err_index == NO_ERROR_INDEX
    assert [o.value for o in fr.msg.ops] == [0xCAFEF00D, 0xCAFEF00D, 0x4E524443]
    assert all(o.status == MgmtStatus.OK for o in fr.msg.ops)
    assert eng.regs.read(s) == 0xCAFEF00D
    assert eng.regs.read(_addr(eng, "MGMT_SRC.LAST_SEQ", 0)) == 5 == fr.msg.last_seq
    # response goes back to the requester, from the management addresses
    assert (fr.src_ip, fr.dst_ip, fr.sport, fr.dport) == (E_IP, C_IP, MGMT_DEFAULT_PORT, C_PORT)
    assert (fr.src_mac, fr.dst_mac) == (E_MAC, C_MAC)
    c = _counts(eng)
    assert c["mgmt_rx"] == c["mgmt_accepted"] == 1 and c["tx_frames"] == 1
    _check_invariants(eng)
    # gaps in the sequence are fine; it only has to grow
    assert _resp(eng, _req([MgmtOp.read(s)], 1000)).msg.status == MgmtStatus.OK


def test_vlan_request_gets_vlan_response_and_job_enables():
    eng, _ = _engine()
    ops = []
    for r in range(2):
        ops += [MgmtOp.write(_addr(eng, "FLOW.FWD_IP", r), 0x0A000100 + r),
                MgmtOp.write(_addr(eng, "FLOW.FWD_QPN", r), 0x10 + r),
                MgmtOp.write(_addr(eng, "FLOW.REV_IP", r), 0x0A000100 + 1 - r),
                MgmtOp.write(_addr(eng, "FLOW.REV_QPN", r), 0x20 + r),
                MgmtOp.write(_addr(eng, "FLOW.CFG", r), 1 | r << 16)]
    ops += [MgmtOp.write(_addr(eng, p), v) for p, v in (
        ("JOB.WORLD", 2), ("JOB.WINDOW", 8), ("JOB.PMTU", 1024), ("JOB.CTRL", 1))]
    ops += [MgmtOp.read(_addr(eng, "JOB.STATUS"))]
    fr = _resp(eng, _req(ops, 1, vlan=0x0123))
    assert fr.vlan_tci == 0x0123 and fr.msg.status == MgmtStatus.OK
    assert fr.msg.ops[-1].value & 1  # enabled
    assert eng.job_state(0) is not None


REFUSALS = [
    ("opcode", lambda e: [MgmtOp(3, _addr(e, "GLOBAL.SCRATCH"), 0)], MgmtStatus.BAD_OPCODE),
    ("opcode0", lambda e: [MgmtOp(0, _addr(e, "GLOBAL.SCRATCH"), 0)], MgmtStatus.BAD_OPCODE),
    ("unmapped", lambda e: [MgmtOp.write(0x0380, 1)], MgmtStatus.BAD_ADDR),
    ("unaligned", lambda e: [MgmtOp.write(_addr(e, "GLOBAL.SCRATCH") + 1, 1)],
     MgmtStatus.BAD_ADDR),
    ("beyond", lambda e: [MgmtOp.read(e.regmap.size)], MgmtStatus.BAD_ADDR),
    ("huge", lambda e: [MgmtOp.read(0xFFFFFFFC)], MgmtStatus.BAD_ADDR),
    ("key_read", lambda e: [MgmtOp.read(_addr(e, "MGMT.KEY0"))], MgmtStatus.DENIED),
    ("key_write", lambda e: [MgmtOp.write(_addr(e, "MGMT.KEY3"), 0)], MgmtStatus.DENIED),
]
_REASON = {MgmtStatus.BAD_OPCODE: "mgmt_reject_opcode", MgmtStatus.BAD_ADDR: "mgmt_reject_addr",
           MgmtStatus.DENIED: "mgmt_reject_denied"}


@pytest.mark.parametrize("name,bad,status", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_op_runs_nothing(name, bad, status):
    eng, _ = _engine()
    s = _addr(eng, "GLOBAL.SCRATCH")
    # valid writes before and after the bad op: none of them may run
    ops = [MgmtOp.write(s, 0x11111111), MgmtOp.write(_addr(eng, "JOB.WORLD"), 7), *bad(eng),
           MgmtOp.write(s, 0x22222222)]
    before, c0 = _dump(eng), _counts(eng)
    fr = _resp(eng, _req(ops, 3))
    assert fr.msg.status == status and fr.msg.err_index == 2
    assert [o.status for o in fr.msg.ops] == [MgmtStatus.SKIPPED] * 2 + [status] + \
        [MgmtStatus.SKIPPED]
    assert fr.msg.last_seq == 0
    assert _dump(eng) == before
    c = _counts(eng)
    diff = {k: c[k] - c0[k] for k in c if c[k] != c0[k]}
    assert diff == {"rx_frames": 1, "tx_frames": 1, "mgmt_rx": 1, _REASON[status]: 1}
    _check_invariants(eng)
    # the same sequence number is still usable: the refusal consumed nothing
    assert _resp(eng, _req([MgmtOp.write(s, 9)], 3)).msg.status == MgmtStatus.OK


def _silent(eng, frame, reason):
    before, c0 = _dump(eng), _counts(eng)
    assert _send(eng, frame) == []
    assert _dump(eng) == before
    c = _counts(eng)
    diff = {k: c[k] - c0[k] for k in c if c[k] != c0[k]}
    assert diff == {"rx_frames": 1, "mgmt_rx": 1, reason: 1}, diff
    _check_invariants(eng)


def test_unauthorised_sources_dropped_silently():
    eng, _ = _engine()
    w = [MgmtOp.write(_addr(eng, "GLOBAL.SCRATCH"), 1)]
    _silent(eng, _req(w, 1, src_ip=ip("10.0.0.9")), "mgmt_reject_source")
    # entry 1 wants MAC and port too
    _silent(eng, _req(w, 1, src_ip=C2_IP, src_mac=C2_MAC, sport=C2_PORT + 1),
            "mgmt_reject_source")
    _silent(eng, _req(w, 1, src_ip=C2_IP, src_mac=C_MAC, sport=C2_PORT), "mgmt_reject_source")
    assert _resp(eng, _req(w, 1, src_ip=C2_IP, src_mac=C2_MAC, sport=C2_PORT)).msg.status == 0
    # an invalidated entry no longer admits its source
    eng.bus.write(_addr(eng, "MGMT_SRC.CFG", 0), 0)
    _silent(eng, _req(w, 2), "mgmt_reject_source")


def test_bad_tag_dropped_silently():
    eng, _ = _engine()
    w = [MgmtOp.write(_addr(eng, "GLOBAL.SCRATCH"), 1)]
    _silent(eng, _req(w, 1, key=None), "mgmt_reject_auth")  # untagged
    _silent(eng, _req(w, 1, key=bytes(16)), "mgmt_reject_auth")  # wrong key
    # a frame captured from source 0 and re-sent as source 1 (fresh sequence space) fails
    good = bytearray(_req(w, 1, src_ip=C_IP, src_mac=C2_MAC, sport=C2_PORT))
    good[26:30] = C2_IP.to_bytes(4, "big")
    fixed = parse_mgmt(bytes(_fix_ip_udp(good)))
    assert fixed.src_ip == C2_IP
    _silent(eng, bytes(_fix_ip_udp(good)), "mgmt_reject_auth")
    # any modified op (with checksums fixed) fails
    m = bytearray(_req(w, 1))
    m[42 + 24 + 11] ^= 0xFF
    _silent(eng, bytes(_fix_ip_udp(m)), "mgmt_reject_auth")


def _fix_ip_udp(b):
    """Recompute IPv4 and UDP checksums of an untagged frame after an edit."""
    b[24:26] = b"\0\0"
    b[24:26] = ipv4_checksum(b[14:34]).to_bytes(2, "big")
    end = 14 + int.from_bytes(b[16:18], "big")
    b[40:42] = b"\0\0"
    b[40:42] = udp_checksum(int.from_bytes(b[26:30], "big"), int.from_bytes(b[30:34], "big"),
                            bytes(b[34:end])).to_bytes(2, "big")
    return b


def test_no_auth_mode_ignores_tag():
    eng, _ = _engine(key=None)
    s = _addr(eng, "GLOBAL.SCRATCH")
    fr = _resp(eng, _req([MgmtOp.write(s, 3)], 1, key=None), key=None)
    assert fr.msg.status == MgmtStatus.OK and fr.msg.tag == bytes(8)
    assert eng.regs.read(s) == 3


def test_replay_and_old_sequence_refused():
    eng, _ = _engine()
    s = _addr(eng, "GLOBAL.SCRATCH")
    first = _req([MgmtOp.write(s, 5)], 10)
    assert _resp(eng, first).msg.status == MgmtStatus.OK
    eng.bus.write(s, 77)  # host changes it; a replay must not undo that
    for frame in (first, _req([MgmtOp.write(s, 6)], 9), _req([MgmtOp.write(s, 6)], 0)):
        before, c0 = _dump(eng), _counts(eng)
        fr = _resp(eng, frame)
        assert fr.msg.status == MgmtStatus.REPLAY and fr.msg.last_seq == 10
        assert all(o.status == MgmtStatus.SKIPPED for o in fr.msg.ops)
        assert _dump(eng) == before
        c = _counts(eng)
        assert c["mgmt_reject_replay"] == c0["mgmt_reject_replay"] + 1
    assert eng.regs.read(s) == 77
    _check_invariants(eng)
    # sequence spaces are per entry
    r = _resp(eng, _req([MgmtOp.read(s)], 1, src_ip=C2_IP, src_mac=C2_MAC, sport=C2_PORT))
    assert r.msg.status == MgmtStatus.OK


@pytest.mark.parametrize("vlan", [None, 7])
def test_truncated_and_malformed_frames(vlan):
    eng, _ = _engine()
    s = _addr(eng, "GLOBAL.SCRATCH")
    raw = _req([MgmtOp.write(s, 5), MgmtOp.write(s, 6)], 1, vlan=vlan)
    l3 = 18 if vlan else 14
    # every cut from "the UDP port cannot be read" to "one byte short" is consumed and rejected
    for n in range(l3 + 20, len(raw)):
        cut = raw[:n]
        if n >= l3 + 24 and n < 60:
            cut += bytes(60 - n)  # what a MAC delivers: padded; lengths still disagree
        _silent(eng, cut, "mgmt_reject_malformed")
    # ... but padding over the port bytes makes it a frame to port 0: not management traffic
    out = _send(eng, raw[:l3 + 22] + bytes(60 - l3 - 22))
    assert len(out) == 1 and _counts(eng)["fwd_not_roce"] == 1
    # a response (type 2) sent to the engine, and a fragment
    resp = pack_mgmt(MgmtFrame(MgmtMessage(MgmtType.RESPONSE, 1, [MgmtOp.read(s)]), C_MAC,
                               E_MAC, C_IP, E_IP, C_PORT, MGMT_DEFAULT_PORT, vlan), KEY)
    _silent(eng, resp, "mgmt_reject_malformed")
    frag = bytearray(raw)
    frag[l3 + 6] |= 0x20
    frag[l3 + 10:l3 + 12] = b"\0\0"
    frag[l3 + 10:l3 + 12] = ipv4_checksum(frag[l3:l3 + 20]).to_bytes(2, "big")
    _silent(eng, bytes(frag), "mgmt_reject_malformed")
    assert eng.regs.read(s) == 0


def test_frames_not_for_the_agent_are_ordinary_traffic():
    eng, agent = _engine()
    s = _addr(eng, "GLOBAL.SCRATCH")
    other_port = _req([MgmtOp.write(s, 5)], 1, dport=MGMT_DEFAULT_PORT + 1)
    other_ip = _req([MgmtOp.write(s, 5)], 1, dst_ip=E_IP + 1)
    for f in (other_port, other_ip):
        out = _send(eng, f)
        assert [e.frame for e in out] == [f]
    assert _counts(eng)["fwd_not_roce"] == 2 and _counts(eng)["mgmt_rx"] == 0
    # disabled management: even a perfect request is forwarded untouched
    eng.bus.write(_addr(eng, "MGMT.CTRL"), 0)
    good = _req([MgmtOp.write(s, 5)], 1)
    assert [e.frame for e in _send(eng, good)] == [good]
    assert eng.regs.read(s) == 0 and agent.counts["mgmt_rx"] == 0
    # the management port follows MGMT.PORT
    eng.bus.write(_addr(eng, "MGMT.CTRL"), 0b11)
    eng.bus.write(_addr(eng, "MGMT.PORT"), MGMT_DEFAULT_PORT + 1)
    assert _resp(eng, other_port).msg.status == MgmtStatus.OK and eng.regs.read(s) == 5
    _check_invariants(eng)


def test_key_reachable_over_host_bus_only():
    eng, _ = _engine()
    assert eng.bus.read(_addr(eng, "MGMT.KEY0")) == int.from_bytes(KEY[:4], "little")


def test_clear_counters_clears_management_counters():
    eng, _ = _engine()
    _send(eng, _req([MgmtOp.read(0)], 1, src_ip=1))
    assert _counts(eng)["mgmt_reject_source"] == 1
    eng.bus.write(_addr(eng, "GLOBAL.CONTROL"), 1)
    assert eng.bus.read(eng.regmap.addr("CNT.MGMT_REJECT_SOURCE")) == 0


def test_mutated_frames_never_change_a_register():
    """Seeded fuzz: random byte edits of a valid tagged request. Whatever the agent decides, no
    register but LAST_SEQ changes unless the frame is accepted with the original ops, and the
    counters always add up."""
    eng, _ = _engine()
    s = _addr(eng, "GLOBAL.SCRATCH")
    rng = random.Random(11)
    seq = 1
    last = _addr(eng, "MGMT_SRC.LAST_SEQ", 0)
    for _ in range(300):
        seq += 1
        raw = bytearray(_req([MgmtOp.write(s, seq)], seq))
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        before = _dump(eng)
        out = _send(eng, bytes(raw))
        after = _dump(eng)
        changed = {k for k in after if after[k] != before[k]}
        if changed:
            # only an accepted request with its own, authentic op could do this
            assert changed <= {"GLOBAL.SCRATCH", "MGMT_SRC[0].LAST_SEQ"}, changed
            assert eng.regs.read(s) == seq and eng.regs.read(last) == seq
            assert len(out) == 1
    _check_invariants(eng)
    c = _counts(eng)
    assert c["mgmt_reject_auth"] + c["mgmt_reject_malformed"] > 100


def test_docs_example_bytes():
    """The worked example of docs/management.md, byte for byte."""
    eng, _ = _engine()
    raw = _req([MgmtOp.write(0x30, 0xCAFEF00D), MgmtOp.read(0x30)], 5)
    req = raw[42:42 + 48].hex()
    assert req == ("4e4d0101000000050200000000000000" "4670ed9f9a1aa90f"
                   "02000000" "00000030" "cafef00d" "01000000" "00000030" "00000000")
    out = _send(eng, raw)[0].frame[42:42 + 48].hex()
    assert out == ("4e4d01020000000502" "00ff00" "00000005" "f052902e2381d3d4"
                   "02000000" "00000030" "cafef00d" "01000000" "00000030" "cafef00d")
    again = parse_mgmt(_send(eng, raw)[0].frame, strict=False).msg
    assert (again.status, again.last_seq) == (MgmtStatus.REPLAY, 5)
    assert [o.status for o in again.ops] == [MgmtStatus.SKIPPED] * 2
