"""The field tables agree with docs/roce.md (its layout table, opcode table and reference ICRC)."""

import re
import struct
import zlib
from pathlib import Path

import pytest

from netreduce.wire import (
    AETH,
    BTH,
    ETH,
    ICRC_MASKED_BYTES,
    IMMDT,
    IPV4,
    OPCODES,
    RETH,
    UDP,
    icrc,
)

ROCE_MD = Path(__file__).resolve().parents[3] / "docs" / "roce.md"

needs_md = pytest.mark.skipif(not ROCE_MD.is_file(), reason=f"{ROCE_MD} not found")

# docs/roce.md's frame-layout row label -> (header, base offset of that header, our field names).
# Sub-byte rows list every bit field packed into those bytes, with (bits, shift) from the label.
LAYOUT = {
    "DMAC": (ETH, 0, ["dst"]),
    "SMAC": (ETH, 0, ["src"]),
    "EtherType 0x0800": (ETH, 0, ["ethertype"]),
    "version/IHL 0x45": (IPV4, 14, ["version", "ihl"]),
    "TOS = DSCP(6) ECN(2)": (IPV4, 14, ["tos", "dscp", "ecn"]),
    "IPv4 total length": (IPV4, 14, ["total_length"]),
    "identification": (IPV4, 14, ["identification"]),
    "flags/frag 0x4000 (DF)": (IPV4, 14, ["flags_frag", "flags", "frag_offset"]),
    "TTL": (IPV4, 14, ["ttl"]),
    "protocol 17": (IPV4, 14, ["protocol"]),
    "header checksum": (IPV4, 14, ["checksum"]),
    "source IPv4": (IPV4, 14, ["src"]),
    "destination IPv4": (IPV4, 14, ["dst"]),
    "UDP source port": (UDP, 34, ["sport"]),
    "UDP destination port 4791 (0x12B7)": (UDP, 34, ["dport"]),
    "UDP length": (UDP, 34, ["length"]),
    "UDP checksum": (UDP, 34, ["checksum"]),
    "BTH opcode": (BTH, 42, ["opcode"]),
    "SE(1) M(1) PadCnt(2) TVer(4)": (BTH, 42, ["se", "m", "padcnt", "tver"]),
    "P_Key": (BTH, 42, ["pkey"]),
    "FECN(1) BECN(1) resv(6)": (BTH, 42, ["fecn", "becn", "resv6"]),
    "DestQP": (BTH, 42, ["dqpn"]),
    "AckReq(1) resv(7)": (BTH, 42, ["ackreq", "resv7"]),
    "PSN": (BTH, 42, ["psn"]),
}


def _md() -> str:
    return ROCE_MD.read_text()


def _layout_rows():
    """(offset, length, label) of every row of docs/roce.md's frame-layout table with a length."""
    rows = []
    for m in re.finditer(r"^\| (\d+) \| (\d*) \| ([^|]+?) \|", _md(), re.M):
        if m.group(2):
            rows.append((int(m.group(1)), int(m.group(2)), m.group(3).strip()))
    return rows


@needs_md
def test_layout_table_matches_fields():
    rows = _layout_rows()
    assert len(rows) == len(LAYOUT), "docs/roce.md's layout table changed: update LAYOUT"
    for off, length, label in rows:
        hdr, base, names = LAYOUT[label]
        whole = hdr[names[0]] if len(names) == 1 or not hdr[names[0]].bits else None
        # every field of the row lives in exactly those bytes
        for name in names:
            f = hdr[name]
            assert (base + f.offset, f.size) == (off, length) or (
                f.bits and base + f.offset <= off and off + length <= base + f.offset + f.size
            ), (label, name)
        if whole is not None:
            assert (base + whole.offset, whole.size) == (off, length), label
        # bit widths written in the label, e.g. "SE(1) M(1) PadCnt(2) TVer(4)", MSB first
        widths = [int(w) for w in re.findall(r"\((\d)\)", label)]
        if widths:
            fields = [hdr[n] for n in names if hdr[n].bits]
            assert [f.bits for f in fields] == widths, label
            top = 8 * length
            for f, w in zip(fields, widths, strict=True):
                # shift is relative to the field's own big-endian integer
                lsb_in_row = f.shift + 8 * (base + f.offset + f.size - off - length)
                top -= w
                assert lsb_in_row == top, (label, f.name)


@needs_md
def test_extension_headers_match_text():
    md = _md()
    m = re.search(r"\*\*RETH\*\* (\d+) B = VA\((\d+)\) R_Key\((\d+)\) DMA length\((\d+)", md)
    size, va, rk, dl = (int(x) for x in m.groups())
    assert RETH.size == size
    assert [(f.offset, f.size * 8) for f in (RETH.va, RETH.rkey, RETH.dmalen)] == [
        (0, va), (va // 8, rk), ((va + rk) // 8, dl)]
    assert IMMDT.size == int(re.search(r"\*\*ImmDt\*\* (\d+) B", md).group(1))
    m = re.search(r"\*\*AETH\*\* (\d+) B = syndrome\((\d+)\) MSN\((\d+)\)", md)
    size, syn, msn = (int(x) for x in m.groups())
    assert AETH.size == size
    assert (AETH.syndrome.offset, AETH.syndrome.size * 8) == (0, syn)
    assert (AETH.msn.offset, AETH.msn.size * 8) == (syn // 8, msn)
    assert ETH.size + IPV4.size + UDP.size + BTH.size == 54


@needs_md
def test_opcode_table_payload_offsets():
    table = re.findall(r"^\| ((?:SEND|WRITE)[^|]+?) \| ([0-9xA-F/ ]+?) \| [^|]+ \| (\d+) \|",
                       _md(), re.M)
    seen = 0
    for _, codes, off in table:
        for code in re.findall(r"0x([0-9A-F]{2})", codes):
            assert OPCODES[int(code, 16)].payload_offset == int(off), code
            seen += 1
    assert seen == 12  # every RC SEND and WRITE opcode


def _roce_md_icrc():
    """The reference function printed in docs/roce.md, executed as written."""
    src = re.search(r"```python\n(def roce_icrc.*?)```", _md(), re.S).group(1)
    ns = {"struct": struct, "zlib": zlib}
    exec(src, ns)  # noqa: S102 - trusted project document
    return ns["roce_icrc"]


@needs_md
def test_icrc_masked_bytes_match_roce_md():
    ref = _roce_md_icrc()
    l3 = bytes(range(1, 81))
    masked = []
    for i in range(40):  # a byte is masked iff changing it leaves docs/roce.md's ICRC unchanged
        b = bytearray(l3)
        b[i] ^= 0x5A
        if ref(bytes(b)) == ref(l3):
            masked.append(i)
    assert tuple(masked) == ICRC_MASKED_BYTES == (1, 8, 10, 11, 26, 27, 32)
    for n in (40, 41, 44, 80):
        assert ref(l3[:n]) == icrc(l3[:n]).to_bytes(4, "little")
