"""Batch packetiser/parser: frame-for-frame equal to RoceFrame.pack(), and the inverse."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netreduce.wire import (
    PSN_MOD,
    FrameBatch,
    Opcode,
    RoceFrame,
    WireError,
    packetise_write,
    parse,
    parse_write_batch,
)
from netreduce.wire.batch import PMTUS

TEMPLATES = {
    "plain": RoceFrame(opcode=0, dqpn=0x000012, src_ip=0x0A000001, dst_ip=0x0A000002),
    "vlan_ecn": RoceFrame(opcode=0, dqpn=0xABCDEF, vlan_tci=0x6064, tos=0x6A, ttl=3,
                          ident=0xFFFE, sport=0xC123, pkey=0x8001, m=1,
                          dmac=b"\x0a\x0b\x0c\x0d\x0e\x0f", smac=b"\x10\x11\x12\x13\x14\x15"),
}


def reference(buf: bytes, template, pmtu, start_psn, va, rkey, imm=None, ack_every=64,
              solicited=False, ip_id_step=0) -> list[bytes]:
    """The message built one RoceFrame.pack() at a time, straight from docs/roce.md's rules."""
    n = max(1, -(-len(buf) // pmtu))
    out = []
    for i in range(n):
        first, last = i == 0, i == n - 1
        if first and last:
            op = Opcode.WRITE_ONLY if imm is None else Opcode.WRITE_ONLY_IMM
        elif first:
            op = Opcode.WRITE_FIRST
        elif last:
            op = Opcode.WRITE_LAST if imm is None else Opcode.WRITE_LAST_IMM
        else:
            op = Opcode.WRITE_MIDDLE
        ackreq = last or (ack_every > 0 and (i + 1) % ack_every == 0)
        out.append(template.copy(
            opcode=op, psn=(start_psn + i) % PSN_MOD, payload=buf[i * pmtu:(i + 1) * pmtu],
            ackreq=int(ackreq), va=va, rkey=rkey, dmalen=len(buf), imm=imm or 0,
            se=int(solicited and last), ident=(template.ident + i * ip_id_step) & 0xFFFF).pack())
    return out


def _check(buf, template, pmtu, start_psn, va=0x7F00_0000_1000, rkey=0x1234, imm=None, **kw):
    raw = bytes(buf) if isinstance(buf, bytes | bytearray) else np.ascontiguousarray(buf).tobytes()
    fb = packetise_write(buf, template, pmtu, start_psn, va, rkey, imm, **kw)
    want = reference(raw, template, pmtu, start_psn, va, rkey, imm, **kw)
    assert len(fb) == len(want)
    got = list(fb.frames())
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"frame {i} differs"
    assert [fb[i] for i in range(len(fb))] == want
    assert fb.lengths.tolist() == [len(w) for w in want]
    assert fb.psn.tolist() == [parse(w).psn for w in want]
    assert fb.opcode.tolist() == [parse(w).opcode for w in want]
    assert fb.ackreq.tolist() == [bool(parse(w).ackreq) for w in want]
    assert fb.payload_len.tolist() == [len(parse(w).payload) for w in want]
    for i, w in enumerate(want):  # the row tail after the frame stays zero
        assert not fb.data[i, len(w):].any()
    assert fb.nbytes == sum(map(len, want))
    return fb, raw


@pytest.mark.parametrize("tname", TEMPLATES)
@pytest.mark.parametrize("size", [0, 1, 3, 255, 256, 257, 512, 1000, 3 * 256 + 2, 64 * 256 + 5])
@pytest.mark.parametrize("imm", [None, 0xDEADBEEF])
def test_packetise_equals_per_frame_pack(tname, size, imm):
    rng = np.random.default_rng(size)
    buf = rng.integers(0, 256, size, dtype=np.uint8)
    fb, raw = _check(buf, TEMPLATES[tname], 256, 0xFFFFF0, imm=imm, ack_every=8,
                     solicited=imm is not None, ip_id_step=0 if tname == "plain" else 257)
    wb = parse_write_batch(fb, pmtu=256, expect_psn=0xFFFFF0)
    assert wb.payload.tobytes() == raw
    assert len(wb.messages) == 1
    m = wb.messages[0]
    assert (m.first, m.count, m.va, m.rkey, m.dmalen, m.imm, m.offset) == (
        0, len(fb), 0x7F00_0000_1000, 0x1234, size, imm, 0)
    assert wb.psn.tolist() == fb.psn.tolist()
    assert wb.opcode.tolist() == fb.opcode.tolist()
    assert wb.ackreq.tolist() == fb.ackreq.tolist()
    assert wb.se.tolist() == [imm is not None and i == len(fb) - 1 for i in range(len(fb))]
    assert set(wb.dqpn.tolist()) == {TEMPLATES[tname].dqpn}
    assert set(wb.ecn.tolist()) == {TEMPLATES[tname].tos & 3}


def test_int32_buffer_psn_wrap_and_ackreq_every_64():
    buf = np.arange(-5000, 300 * 1024 // 4 - 5000, dtype=np.int32)  # 300 packets at PMTU 1024
    fb, raw = _check(buf, TEMPLATES["plain"], 1024, PSN_MOD - 100)
    assert len(fb) == 300
    assert fb.psn[99] == PSN_MOD - 1 and fb.psn[100] == 0 and fb.next_psn == 200
    assert np.flatnonzero(fb.ackreq).tolist() == [63, 127, 191, 255, 299]
    wb = parse_write_batch(fb)
    assert np.array_equal(wb.payload_as(np.int32), buf)
    # payload is host memory, never byte-swapped
    assert fb.frame(0)[70:74] == np.int32(-5000).tobytes()


@pytest.mark.parametrize("pmtu", PMTUS)
def test_every_pmtu_sizes_around_multiples(pmtu):
    for size in (pmtu - 1, pmtu, pmtu + 1, 2 * pmtu, 3 * pmtu - 4):
        buf = np.frombuffer(np.random.default_rng(size).bytes(size), dtype=np.uint8)
        fb, raw = _check(buf, TEMPLATES["vlan_ecn"], pmtu, 5, imm=1, ack_every=2)
        assert parse_write_batch(fb, pmtu=pmtu).payload.tobytes() == raw


@settings(derandomize=True, max_examples=40, deadline=None, database=None)
@given(size=st.integers(0, 5000), pmtu=st.sampled_from(PMTUS[:3]),
       psn=st.integers(0, PSN_MOD - 1), imm=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
       ack_every=st.integers(0, 5), vlan=st.booleans(), step=st.integers(0, 3))
def test_packetise_property(size, pmtu, psn, imm, ack_every, vlan, step):
    buf = bytes(range(256)) * (size // 256) + bytes(size % 256)
    t = TEMPLATES["vlan_ecn" if vlan else "plain"]
    fb, raw = _check(buf, t, pmtu, psn, imm=imm, ack_every=ack_every, ip_id_step=step)
    assert parse_write_batch(list(fb.frames()), pmtu=pmtu).payload.tobytes() == raw


def test_inputs_and_views():
    buf = np.arange(3000, dtype=np.int32)[::2]  # non-contiguous: copied, same bytes
    fb = packetise_write(buf, TEMPLATES["plain"], 256, 0, 0, 0)
    assert parse_write_batch(fb).payload.tobytes() == np.ascontiguousarray(buf).tobytes()
    fb2 = packetise_write(bytearray(b"hello world"), TEMPLATES["plain"], 256, 0, 0, 0)
    assert parse(fb2[0]).payload == b"hello world"
    assert fb2.lengths[0] == 14 + 20 + 8 + 12 + 16 + 12 + 4
    # go-back-N: a slice from a PSN resends the very same frames
    big = packetise_write(bytes(10 * 256), TEMPLATES["plain"], 256, PSN_MOD - 3, 0, 0)
    k = big.index_of_psn(1)
    assert k == 4
    tail = big[k:]
    assert isinstance(tail, FrameBatch) and list(tail) == list(big.frames())[4:]
    assert Opcode(tail.opcode[0]) == Opcode.WRITE_MIDDLE
    with pytest.raises(ValueError, match="PSN 100 is not in this batch"):
        big.index_of_psn(100)
    # (data, lengths) arrays are accepted as they are
    wb = parse_write_batch((big.data, big.lengths))
    assert wb.payload.tobytes() == bytes(10 * 256)


@pytest.mark.parametrize(("kw", "match"), [
    ({"pmtu": 1000}, "pmtu = 1000"),
    ({"start_psn": PSN_MOD}, "start_psn"),
    ({"va": -1}, "va"),
    ({"rkey": 2**32}, "rkey"),
    ({"imm": 2**32}, "imm"),
    ({"ack_every": -1}, "ack_every"),
])
def test_packetise_rejects_bad_arguments(kw, match):
    args = {"buf": b"abc", "template": TEMPLATES["plain"], "pmtu": 256, "start_psn": 0,
            "va": 0, "rkey": 0}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        packetise_write(**args)


# ------------------------------------------------------------------------- parse errors
def _batch(n_pkts=6, imm=None, psn=0):
    return list(packetise_write(bytes(range(256)) * n_pkts, TEMPLATES["plain"], 256, psn,
                                0x1000, 9, imm).frames())


def _err(frames, **kw) -> WireError:
    with pytest.raises(WireError) as ei:
        parse_write_batch(frames, **kw)
    return ei.value


@pytest.mark.parametrize("k", [0, 3, 5])
def test_batch_bad_icrc_names_frame(k):
    frames = _batch()
    bad = bytearray(frames[k])
    bad[100] ^= 1
    frames[k] = bytes(bad)
    e = _err(frames)
    assert (e.reason, e.field, e.frame_index) == ("icrc", "ICRC", k)
    assert f"frame {k}" in str(e)
    off = 100 - (70 if k == 0 else 54)  # the flipped byte's place in frame k's payload
    assert parse_write_batch(frames, check=False).payload[k * 256 + off] == off ^ 1


@pytest.mark.parametrize(("edit", "reason", "field"), [
    (lambda f: f[:40], "truncated", "UDP"),
    (lambda f: f[:-1], "ip_length", "IPV4.total_length"),
    (lambda f: f[:12] + b"\x86\xdd" + f[14:], "ethertype", "ETH.ethertype"),
    (lambda f: f[:14] + b"\x46" + f[15:], "ihl", "IPV4.ihl"),
    (lambda f: f[:36] + b"\x12\xb8" + f[38:], "udp_port", "UDP.dport"),
    (lambda f: f[:24] + b"\0\0" + f[26:], "ip_checksum", "IPV4.checksum"),
    (lambda f: f[:43] + bytes([f[43] | 1]) + f[44:], "tver", "BTH.tver"),
    (lambda f: f[:42] + b"\x0c" + f[43:], "opcode", "BTH.opcode"),
])
def test_batch_structural_errors_match_parse(edit, reason, field):
    frames = _batch()
    frames[2] = edit(frames[2])
    e = _err(frames)
    assert (e.reason, e.field, e.frame_index) == (reason, field, 2)
    with pytest.raises(WireError) as single:
        parse(frames[2])
    assert (single.value.reason, single.value.field) == (e.reason, e.field)
    assert e.value == single.value.value


def test_batch_sequence_psn_length_dmalen():
    frames = _batch()
    e = _err(frames[:3] + frames[4:])  # a lost packet
    assert (e.reason, e.field, e.frame_index, e.value, e.expected) == ("psn", "BTH.psn", 3, 4, 3)
    e = _err(frames[:-1])
    assert (e.reason, e.frame_index) == ("sequence", 4) and "ends inside a message" in str(e)
    e = _err(frames[1:])
    assert (e.reason, e.frame_index) == ("sequence", 0) and "without a FIRST" in str(e)
    e = _err(frames[:3] + _batch(psn=3))
    assert (e.reason, e.frame_index) == ("sequence", 3) and "before the previous" in str(e)
    e = _err(frames, expect_psn=7)
    assert (e.reason, e.value, e.expected) == ("psn", 0, 7)
    e = _err(frames, pmtu=512)
    assert (e.reason, e.field, e.value, e.expected) == ("payload_length", "payload", 256, 512)
    ack = RoceFrame.ack(psn=6).pack()
    e = _err(frames + [ack])
    assert (e.reason, e.frame_index) == ("opcode", 6) and "not an RC WRITE" in str(e)
    send = RoceFrame(opcode=Opcode.SEND_ONLY, psn=6, payload=b"abcd").pack()
    assert _err(frames + [send]).reason == "opcode"
    # wrong DMA length in the RETH (frame rebuilt consistently, so only the sum is off)
    f0 = parse(frames[0]).copy(dmalen=6 * 256 + 1).pack()
    e = _err([f0] + frames[1:])
    assert (e.reason, e.field, e.value, e.expected, e.frame_index) == (
        "dmalen", "RETH.dmalen", 6 * 256 + 1, 6 * 256, 0)
    assert _err([]).reason == "sequence"


def test_batch_several_messages():
    a = packetise_write(b"A" * 700, TEMPLATES["plain"], 256, PSN_MOD - 2, 0x10, 1)
    b = packetise_write(b"B" * 40, TEMPLATES["plain"], 256, a.next_psn, 0x20, 2, imm=77)
    c = packetise_write(b"C" * 512, TEMPLATES["vlan_ecn"], 256, b.next_psn, 0x30, 3)
    wb = parse_write_batch(list(a) + list(b) + list(c))
    both = FrameBatch.concat([a, b, c])
    assert list(both) == list(a) + list(b) + list(c)
    assert both.psn.tolist() == a.psn.tolist() + b.psn.tolist() + c.psn.tolist()
    assert parse_write_batch(both).payload.tobytes() == wb.payload.tobytes()
    with pytest.raises(ValueError, match="at least one"):
        FrameBatch.concat([])
    assert wb.payload.tobytes() == b"A" * 700 + b"B" * 40 + b"C" * 512
    assert [(m.first, m.count, m.va, m.rkey, m.dmalen, m.imm, m.offset) for m in wb.messages] == [
        (0, 3, 0x10, 1, 700, None, 0), (3, 1, 0x20, 2, 40, 77, 700),
        (4, 2, 0x30, 3, 512, None, 740)]
