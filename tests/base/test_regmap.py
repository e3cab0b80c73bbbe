"""The register map (netreduce.regmap): layout invariants, generators, RegisterFile semantics."""

from __future__ import annotations

import pytest

from netreduce.regmap import (
    ALL_GLOBAL_COUNTERS,
    DISPOSITIONS,
    JOB_COUNTERS,
    MAGIC,
    Access,
    BusError,
    JobError,
    Op,
    RegisterBus,
    RegisterFile,
    build_regmap,
    c_header,
    constants,
    python_module,
    to_dict,
    to_markdown,
)


def test_layout_unique_aligned_and_decodable():
    rm = build_regmap(jobs=8, flows=64)
    addrs = [i.addr for i in rm.instances()]
    assert len(addrs) == len(set(addrs)) and all(a % 4 == 0 for a in addrs)
    for inst in rm.instances():
        assert rm.decode(inst.addr) == inst
    assert rm.decode(rm.size) is None and rm.size == max(addrs) + 4
    assert rm.reg("GLOBAL.MAGIC").reset == MAGIC == int.from_bytes(b"NRDC", "big")


def test_bases_do_not_depend_on_build_parameters():
    a, b = build_regmap(jobs=2, flows=16), build_regmap(jobs=64, flows=4096)
    for t in a.tables:
        tb = b.table(t.name)
        assert (t.base, t.stride, [r.offset for r in t.registers]) == \
            (tb.base, tb.stride, [r.offset for r in tb.registers])
    assert b.table("JOB_CNT").base + b.table("JOB_CNT").size <= b.table("FLOW").base


def test_build_parameters_in_identity_and_validated():
    rm = build_regmap(ports=2, jobs=4, flows=32, slots=1024, pmtu_max=1024, max_world=16,
                      lanes=2)
    for k in ("ports", "jobs", "flows", "slots", "pmtu_max", "max_world", "lanes"):
        assert rm.reg(f"GLOBAL.{k.upper()}").reset == rm.params[k]
    with pytest.raises(ValueError, match="jobs = 65"):
        build_regmap(jobs=65)
    with pytest.raises(ValueError, match="pmtu_max = 1500"):
        build_regmap(pmtu_max=1500)
    with pytest.raises(ValueError, match="lanes = 3 must be 1 or ports = 2"):
        build_regmap(ports=2, lanes=3)
    with pytest.raises(TypeError, match="unknown build parameters"):
        build_regmap(banks=3)


def test_counters_complete():
    rm = build_regmap()
    names = {r.name.lower() for r in rm.table("CNT").registers}
    assert names == {c.name for c in ALL_GLOBAL_COUNTERS}
    assert [r.name.lower() for r in rm.table("JOB_CNT").registers] == [c.name for c in
                                                                       JOB_COUNTERS]
    for need in ("drop_icrc", "drop_ip_checksum", "drop_length", "drop_opcode", "drop_pmtu",
                 "drop_align", "drop_mismatch", "drop_ahead", "behind_window", "duplicates",
                 "reemits", "cnp_sent", "saturations", "fwd_not_roce", "fwd_unregistered",
                 "fwd_ack", "fwd_nak", "fwd_cnp"):
        assert need in names
    assert set(DISPOSITIONS) <= names and "rx_frames" not in DISPOSITIONS


def test_generated_constants_markdown_and_c_agree():
    rm = build_regmap()
    c = constants(rm)
    assert c["JOB_CTRL"] == rm.addr("JOB.CTRL", 0) and c["JOB_STRIDE"] == 0x40
    assert c["JOB_STATUS_ERROR_SHIFT"] == 8 and c["OP_SUM_SAT"] == Op.SUM_SAT
    assert c["JOBERROR_SLOT_OVERLAP"] == JobError.SLOT_OVERLAP
    assert c["FLOW_CFG_RANK_MASK"] == 0xFFFF0000
    ns: dict = {}
    exec(python_module(rm), ns)  # noqa: S102 - generated text from our own map
    assert {k: ns[k] for k in c} == c
    hdr = c_header(rm)
    assert f"#define NR_JOB_CTRL 0x{c['JOB_CTRL']:X}u" in hdr
    md = to_markdown(rm)
    for inst in rm.tables:
        assert f"## {inst.name}" in md
        for r in inst.registers:
            assert f"| {r.name} |" in md
    d = to_dict(rm)
    assert d["tables"][0]["registers"][0]["reset"] == MAGIC


def test_registerfile_access_semantics():
    rm = build_regmap(jobs=2, flows=4)
    rf = RegisterFile(rm)
    assert isinstance(rf, RegisterBus)
    a = rm.addr("GLOBAL.MAGIC")
    rf.write(a, 0)  # RO: ignored
    assert rf.read(a) == MAGIC
    s = rm.addr("GLOBAL.SCRATCH")
    rf.write(s, 0xDEADBEEF)
    assert rf.read(s) == 0xDEADBEEF
    w = rm.addr("JOB.WORLD", 1)
    rf.write(w, 0xFFFFFFFF)  # reserved bits read 0
    assert rf.read(w) == 0xFFFF
    st = rm.addr("JOB.STATUS", 0)
    rf.poke(st, 0b111 | (5 << 8))  # hardware sets enabled, both flags, an error code
    rf.write(st, 0b010 | 1 | (0xFF << 8))  # W1C clears only 'mismatch'; RO bits unchanged
    assert rf.read(st) == 0b101 | (5 << 8)
    rf.write(st, 0)
    assert rf.read(st) == 0b101 | (5 << 8)
    hits = []
    c = rm.addr("GLOBAL.CONTROL")
    rf.on_write(c, lambda inst, v, old: hits.append((inst.name, v)))
    rf.write(c, 1)
    assert rf.read(c) == 0 and hits == [("GLOBAL.CONTROL", 1)]  # WO: pulse, reads 0
    rf.bind(rm.addr("CNT.RX_FRAMES"), lambda: (1 << 32) + 7)
    assert rf.read(rm.addr("CNT.RX_FRAMES")) == 7  # 32-bit wrap
    for bad in (2, rm.size, 0x0380):
        with pytest.raises(BusError):
            rf.read(bad)
    with pytest.raises(BusError, match="not a 32-bit value"):
        rf.write(s, 1 << 32)


def test_field_definitions():
    rm = build_regmap()
    f = rm.field("JOB.STATUS.error")
    assert (f.lsb, f.width, f.access, f.enum) == (8, 8, Access.RO, JobError)
    assert f.put(0, 3) == 3 << 8 and f.get(0x0300) == 3
    with pytest.raises(ValueError, match="does not fit"):
        f.put(0, 256)
    assert rm.reg("JOB.STATUS").access == "mixed"
    assert rm.reg("JOB.CNP_INTERVAL").reset > 0
