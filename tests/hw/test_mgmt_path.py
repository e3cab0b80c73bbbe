"""The management path (netreduce.hw.mgmt_path) in the Amaranth simulator.

Each block against its reference: the splitter's routing against the model agent's match rule,
the converters and merges against the frames they were given, the AXI4-Lite arbiter against a
register bank with two masters, MgmtPath (agent + plumbing + bank) against the model agent's
responses and counters. Then the whole engine with management at 64 bits against the reference
Engine with its model agent: the driver's MgmtClient in a closed loop through the RTL, rejected
frames, and RoCE aggregation while management frames arrive."""

from __future__ import annotations

import queue
import random
import threading
from collections import Counter

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator
from netreduce.hw.csr import AxiLiteSimMaster, RegisterBank
from netreduce.hw.mgmt_path import (
    PATH_COUNTERS,
    AxiLiteArbiter,
    Downsizer,
    FrameArbiter,
    MgmtPath,
    MgmtSplitter,
    Upsizer,
    mgmt_cfg_layouts,
)
from netreduce.hw.packet.testing import (
    StreamSink,
    StreamSource,
    _sim,
    beats_to_frames,
    frame_to_beats,
    random_frame,
)
from netreduce.sim.model.engine import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sim.model.mgmt import MgmtAgent as ModelAgent
from netreduce.sim.model.mgmt import attach_mgmt as model_attach
from netreduce.sw_driver.control import EngineControl
from netreduce.sw_driver.mgmt import MgmtClient, MgmtSettings, MgmtSource, provision

from netreduce.regmap import RegisterFile, build_regmap
from netreduce.wire import WireError, ip, ipv4_checksum
from netreduce.wire.mgmt import (
    MGMT_DEFAULT_PORT,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtType,
    pack_mgmt,
    parse_mgmt,
)

KEY = bytes(range(7, 23))
E_IP, E_MAC = ip("10.0.0.254"), b"\x02\xee\x00\x00\x00\x01"
C_IP, C_MAC, C_PORT = ip("10.0.0.1"), b"\x02\xcc\x00\x00\x00\x01", 40000
C2_IP, C2_MAC, C2_PORT = ip("10.0.0.2"), b"\x02\xcc\x00\x00\x00\x02", 40002
PARAMS = dict(jobs=2, flows=8, slots=16, max_world=4, pmtu_max=256)
SETTINGS = MgmtSettings(E_IP, E_MAC, sources=[
    MgmtSource(C_IP), MgmtSource(C2_IP, mac=C2_MAC, port=C2_PORT)], key=KEY)


def _req(ops, seq, key=KEY, src_ip=C_IP, src_mac=C_MAC, sport=C_PORT, vlan=None,
         dport=MGMT_DEFAULT_PORT, dst_ip=E_IP):
    fr = MgmtFrame(MgmtMessage(MgmtType.REQUEST, seq, list(ops)), src_mac, E_MAC, src_ip, dst_ip,
                   sport, dport, vlan)
    return pack_mgmt(fr, key)


def _fix(b, l3=14):
    """Recompute the IPv4 header checksum after an edit; UDP checksum 'none'."""
    b = bytearray(b)
    b[l3 + 10:l3 + 12] = b"\0\0"
    b[l3 + 10:l3 + 12] = ipv4_checksum(b[l3:l3 + 20]).to_bytes(2, "big")
    b[l3 + 26:l3 + 28] = b"\0\0"
    return bytes(b)


def _edit(frame, l3_off, value: bytes, vlan=False):
    l3 = 18 if vlan else 14
    b = bytearray(frame)
    b[l3 + l3_off:l3 + l3_off + len(value)] = value
    return _fix(b, l3)


def _corrupt(frame, i):
    b = bytearray(frame)
    b[i] ^= 0xFF
    return bytes(b)


def _summary(frames):
    """(seq, status) of each response, for failure messages."""
    out = []
    for f in frames:
        try:
            m = parse_mgmt(f, strict=False).msg
            out.append((m.seq, m.status))
        except WireError:
            out.append(("?", len(f)))
    return out


def _model(rm, settings=SETTINGS):
    rf = RegisterFile(rm)
    provision(rf, settings, rm)
    return rf, ModelAgent(rf, rm)


# ============================================================================ splitter
class _Cut(bytes):
    """A frame whose last beat carries ``full``'s bytes after its end (outside ``keep``)."""

    def __new__(cls, frame, full):
        obj = super().__new__(cls, frame)
        obj.full = full
        return obj


def _beats(frame, nb):
    beats = frame_to_beats(frame, nb)
    full = getattr(frame, "full", None)
    if full is not None and len(frame):
        off = (len(frame) - 1) // nb * nb
        beats[-1]["data"] = int.from_bytes(full[off:off + nb], "little")
    return beats


def _splitter_frames(seed):
    rng = random.Random(seed)
    s = 0x30
    base = _req([MgmtOp.write(s, 1), MgmtOp.read(s)], 1)
    vl = _req([MgmtOp.read(s)], 1, vlan=0x123)
    # to another UDP port: management only while the port cannot be read
    other = _req([MgmtOp.write(s, 1)], 1, dport=MGMT_DEFAULT_PORT ^ 0x100)
    vother = _req([MgmtOp.read(s)], 1, vlan=0x123, dport=MGMT_DEFAULT_PORT ^ 1)
    out = [base, vl, other, vother]
    # cuts around the rule's bytes; the beat keeps the cut bytes beyond ``keep`` (AXI-Stream
    # tdata outside tkeep is undefined), so a rule reading past the end would see them
    for f in (base, other):
        out += [_Cut(f[:n], f) for n in range(1, 48, 2)]
    for f in (vl, vother):
        out += [_Cut(f[:n], f) for n in range(30, 46)]
    for f, v in ((other, False), (vother, True)):
        out += [_edit(f, 6, b"\x00\x01", v), _edit(f, 6, b"\x1f\xff", v),   # fragments
                _edit(f, 0, b"\x46", v), _edit(f, 0, b"\x65", v),            # options, v6
                _edit(f, 6, b"\x20\x00", v), _edit(f, 6, b"\x40\x00", v)]  # MF, DF: readable
    out += [
        _req([MgmtOp.read(s)], 2, dport=MGMT_DEFAULT_PORT + 1),     # other UDP port: traffic
        _req([MgmtOp.read(s)], 2, dst_ip=E_IP + 1),                 # other IPv4: traffic
        _req([MgmtOp.read(s)], 2, vlan=7, dport=4791),              # tagged, other port
        _edit(base, 9, b"\x06"),                                    # TCP: traffic
        _edit(base, 0, b"\x46"),                                    # IP options: management
        _edit(base, 6, b"\x00\x01"),                                # fragment: management
        _edit(base, 6, b"\x20\x00"),                                # MF only, offset 0: port read
        _edit(vl, 6, b"\x1f\xff", vlan=True),                        # tagged fragment
        _edit(base, 0, b"\x55"),                                    # version 5
        bytes(base[:12]) + b"\x86\xdd" + bytes(base[14:]),          # IPv6 ethertype
        bytes(vl[:16]) + b"\x08\x06" + bytes(vl[18:]),              # tagged ARP
        bytes(base[:12]) + b"\x88\xa8" + bytes(base[12:]),          # QinQ outer tag: traffic
    ]
    for _ in range(10):
        out.append(random_frame(rng).pack())
        out.append(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 80))))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("width", [64, 128])
@pytest.mark.parametrize("enable", [1, 0])
def test_splitter_routes_like_the_model(width, enable):
    rm = build_regmap(data_width=width, **PARAMS)
    rf, agent = _model(rm, MgmtSettings(E_IP, E_MAC, sources=[MgmtSource(C_IP)],
                                        enable=bool(enable)))
    frames = _splitter_frames(width + enable)
    want = {"o": [], "o_mgmt": []}
    for f in frames:
        want["o_mgmt" if agent.matches(bytes(f)) else "o"].append(bytes(f))
    if enable:
        assert 20 < len(want["o_mgmt"]) < len(frames) - 20   # both sides exercised
    else:
        assert not want["o_mgmt"]
    nb = width // 8
    dut = MgmtSplitter(width)
    beats = [b for f in frames for b in _beats(f, nb)]
    for b in beats:
        b["first"] = 0                          # ignored on input: regenerated
    src = StreamSource(dut.i, beats, idle=0.2, seed=1)
    sinks = {n: StreamSink(getattr(dut, n), stall=0.3, seed=2 + i)
             for i, n in enumerate(("o", "o_mgmt"))}

    async def cfg(ctx):
        ctx.set(dut.enable, enable)
        ctx.set(dut.ip, E_IP)
        ctx.set(dut.port, MGMT_DEFAULT_PORT)

    _sim(dut, [src], list(sinks.values()), watch=cfg)
    for n, sink in sinks.items():
        got = beats_to_frames(sink.items, nb)
        assert [f for f, _ in got] == want[n], n
        start = True
        for b in sink.items:
            assert b["first"] == start
            start = bool(b["last"])


@pytest.mark.parametrize("width", [64, 128])
def test_splitter_line_rate(width):
    """Back to back with always-ready outputs: one beat per cycle, whatever the routing."""
    rng = random.Random(width)
    frames = []
    for i in range(30):
        frames.append(_req([MgmtOp.read(0)] * rng.randrange(1, 4), i) if i % 3 == 0 else
                      random_frame(rng, max_plen=100).pack())
    frames += [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 20))) for _ in range(5)]
    nb = width // 8
    dut = MgmtSplitter(width)
    beats = [b for f in frames for b in frame_to_beats(f, nb)]
    src = StreamSource(dut.i, beats)
    sinks = [StreamSink(dut.o), StreamSink(dut.o_mgmt)]

    async def cfg(ctx):
        ctx.set(dut.enable, 1)
        ctx.set(dut.ip, E_IP)
        ctx.set(dut.port, MGMT_DEFAULT_PORT)

    _sim(dut, [src], sinks, watch=cfg)
    assert src.cycles[-1] - src.cycles[0] + 1 == len(beats)
    assert len(sinks[1].items) > 0
    out = sorted(sinks[0].cycles + sinks[1].cycles)
    assert out[-1] - out[0] + 1 == len(beats)
    assert out[0] - src.cycles[0] <= dut.depth + 1   # (the match is registered)


# ============================================================================ converters
def _frames(rng, n, lo=1, hi=150):
    return [bytes(rng.getrandbits(8) for _ in range(rng.randrange(lo, hi))) for _ in range(n)]


def _clocked(dut):
    """``dut`` with a sync domain even when it has no register (the converters at equal
    widths are wires)."""
    m = Module()
    m.submodules.dut = dut
    tick = Signal()
    m.d.sync += tick.eq(~tick)
    return m


def _check_beats(items, nb):
    start = True
    for b in items:
        n = bin(b["keep"]).count("1")
        assert b["keep"] == (1 << n) - 1, f"keep {b['keep']:#x} not a thermometer"
        assert b["last"] or n == nb, "a beat before the last is not full"
        assert b["first"] == start
        assert not b["error"] or b["last"]
        start = bool(b["last"])


@pytest.mark.parametrize("width", [64, 128, 256])
def test_downsizer_and_upsizer(width):
    rng = random.Random(width)
    frames = _frames(rng, 25) + [bytes([i]) for i in range(3)] + [bytes(range(width // 8))]
    errors = [rng.random() < 0.3 for _ in frames]
    nb = width // 8
    for dut, inb, outb in ((Downsizer(width, 64), nb, 8), (Upsizer(64, width), 8, nb)):
        beats = [b for f, e in zip(frames, errors, strict=True)
                 for b in frame_to_beats(f, inb, e)]
        src = StreamSource(dut.i, beats, idle=0.2, seed=3)
        sink = StreamSink(dut.o, stall=0.3, seed=4)
        _sim(_clocked(dut), [src], [sink])
        got = beats_to_frames(sink.items, outb)
        assert [f for f, _ in got] == frames, type(dut).__name__
        assert [bool(b["error"]) for _, b in got] == errors
        _check_beats(sink.items, outb)
        # throughput without stalls: the narrow side moves one beat per cycle
        src = StreamSource(dut.i, beats)
        sink = StreamSink(dut.o)
        _sim(_clocked(dut), [src], [sink])
        narrow = sink.cycles if outb == 8 else src.cycles
        assert narrow[-1] - narrow[0] + 1 == len(narrow)


def test_downsizer_empty_last_beat():
    dut = Downsizer(128, 64)
    beats = frame_to_beats(bytes(range(16)), 16) + [
        {"data": 0, "keep": 0, "first": 0, "last": 1, "error": 1}]
    beats[0]["last"] = 0
    src, sink = StreamSource(dut.i, beats), StreamSink(dut.o)
    _sim(dut, [src], [sink])
    assert [(b["keep"], b["last"], b["error"]) for b in sink.items] == [
        (0xFF, 0, 0), (0xFF, 0, 0), (0, 1, 1)]


# ============================================================================ frame arbiter
def test_frame_arbiter_round_robin_and_stable():
    rng = random.Random(5)
    n = 3
    dut = FrameArbiter(64, n)
    per = [_frames(rng, 8, 1, 40) for _ in range(n)]
    srcs = [StreamSource(getattr(dut, f"i{k}"),
                         [b for f in per[k] for b in frame_to_beats(f, 8)], idle=0.3, seed=k)
            for k in range(n)]
    sink = StreamSink(dut.o, stall=0.4, seed=9)
    offered = []

    async def watch(ctx):
        held = None
        async for _, _, v, r, p, sel in ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                          dut.o.payload, dut.sel):
            if held is not None:   # a beat offered and not taken must be offered again
                assert v and (p.as_value().value, sel) == held
            held = (p.as_value().value, sel) if v and not r else None
            if v and r and p.first:
                offered.append(sel)

    _sim(dut, srcs, [sink], watch=watch)
    got = [f for f, _ in beats_to_frames(sink.items, 8)]
    assert sorted(got) == sorted(f for fs in per for f in fs)
    for k in range(n):   # per input in order
        mine = [f for f in got if f in per[k]]
        assert mine == per[k]
    _check_beats(sink.items, 8)
    assert len(offered) == len(got)


# ============================================================================ AXI4-Lite arbiter
def test_axil_arbiter_two_masters():
    rm = build_regmap(data_width=64, **PARAMS)
    m = Module()
    bank = RegisterBank(rm)
    arb = AxiLiteArbiter(bank.addr_width)
    m.submodules.bank, m.submodules.arb = bank, arb
    wiring.connect(m, arb.m, bank.s_axil)
    masters = [AxiLiteSimMaster(arb.s0), AxiLiteSimMaster(arb.s1)]
    regs = [[rm.addr("FLOW.FWD_IP", f) for f in range(4)],
            [rm.addr("FLOW.REV_IP", f) for f in range(4)]]
    log = []
    done = [False, False]
    errors = []

    def master(k, seed):
        async def run(ctx):
            rng = random.Random(seed)
            shadow = {}
            for _ in range(40):
                a = rng.choice(regs[k])
                if rng.random() < 0.5:
                    v = rng.getrandbits(32)
                    await masters[k].write(ctx, a, v, w_delay=rng.choice([0, 0, 1, -1]),
                                           ready_delay=rng.choice([0, 2]))
                    shadow[a] = v
                else:
                    got, _ = await masters[k].read(ctx, a, ready_delay=rng.choice([0, 0, 3]))
                    if got != shadow.get(a, 0):
                        errors.append((k, hex(a), got, shadow.get(a, 0)))
                    log.append(k)
            done[k] = True
        return run

    async def monitor(ctx):
        outstanding = 0
        async for _, _, *s in ctx.tick().sample(
                arb.m.arvalid, arb.m.arready, arb.m.awvalid, arb.m.awready, arb.m.wvalid,
                arb.m.wready, arb.m.rvalid, arb.m.rready, arb.m.bvalid, arb.m.bready,
                arb.m.araddr, arb.m.awaddr):
            arv, arr, awv, awr, wv, wr, rv, rr, bv, br, ara, awa = s
            if arv and arr:
                outstanding += 1
                log.append(("m", 0 if ara in regs[0] else 1))
            if awv and awr:
                outstanding += 1
                log.append(("m", 0 if awa in regs[0] else 1))
            assert outstanding <= 1, "two transactions at once on the slave port"
            if (rv and rr) or (bv and br):
                outstanding -= 1

    async def main(ctx):
        while not all(done):
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(master(0, 1), background=True)
    sim.add_testbench(master(1, 2), background=True)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(main)
    sim.run()
    assert not errors, errors
    order = [x[1] for x in log if isinstance(x, tuple)]
    assert len(order) == 80
    # both busy all along: strict alternation while both still have work
    both = order[:2 * min(order.count(0), order.count(1)) - 2]
    assert all(a != b for a, b in zip(both, both[1:], strict=False)), order


# ============================================================================ MgmtPath
class _PathTop(wiring.Component):
    """MgmtPath + AXI4-Lite arbiter + register bank, as attach_mgmt wires them (test top)."""

    def __init__(self, rm, width, ports):
        self.bank = RegisterBank(rm)
        self.path = MgmtPath(rm, width, ports, addr_width=self.bank.addr_width)
        self.arb = AxiLiteArbiter(self.bank.addr_width)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank, m.submodules.path, m.submodules.arb = self.bank, self.path, self.arb
        wiring.connect(m, self.path.bus, self.arb.s1)
        wiring.connect(m, self.arb.m, self.bank.s_axil)
        b, p = self.bank, self.path
        m.d.comb += [p.mgmt_cfg.eq(b.mgmt_cfg), p.mgmt_src_cfg.eq(b.mgmt_src_cfg),
                     b.mgmt_src_status.eq(p.mgmt_src_status)]
        for n in PATH_COUNTERS:
            m.d.comb += b.cnt_inc[n].eq(p.inc[n])
        return m


class _Rec:
    def __init__(self):
        self.ops = []

    def write(self, addr, value):
        self.ops.append((addr, value))

    def read(self, addr):
        raise AssertionError("provisioning does not read")


def test_cfg_layouts_match_the_bank():
    rm = build_regmap(data_width=64, **PARAMS)
    bank = RegisterBank(rm)
    bank._MustUse__silence = True  # only its signature is needed
    mem = bank.signature.members
    got = mgmt_cfg_layouts(rm)
    for name, lay in zip(("mgmt_cfg", "mgmt_src_cfg", "mgmt_src_status"), got, strict=True):
        assert mem[name].shape == lay, name


def _port_frames(rm):
    """Port 0 carries client C (entry 0), port 1 client C2 (entry 1, MAC and port matched):
    every rule of docs/management.md; the two touch disjoint registers."""
    s = 0x30
    c2 = dict(src_ip=C2_IP, src_mac=C2_MAC, sport=C2_PORT)
    f0 = [
        _req([MgmtOp.write(s, 0xCAFEF00D), MgmtOp.read(s), MgmtOp.read(0)], 5),
        _req([MgmtOp.read(s)], 6, vlan=0x123),
        None,                                                      # replay of the first
        _req([MgmtOp.write(s, 7), MgmtOp(3, s, 0)], 7),             # bad opcode
        _req([MgmtOp.write(s, 7), MgmtOp.read(0x0380)], 7),         # unmapped
        _req([MgmtOp.read(0x7020)], 7),                             # key: denied
        _req([MgmtOp.write(s, 8)], 7, src_ip=ip("10.9.9.9")),       # unknown source
        _req([MgmtOp.write(s, 8)], 7, key=bytes(16)),               # bad tag
        _req([MgmtOp.write(s, 8)], 7)[:50],                         # truncated
        _req([MgmtOp.write(s, 9), MgmtOp.read(s)], 8),
    ]
    f0[2] = f0[0]
    fwd = rm.addr("FLOW.FWD_IP", 2)
    f1 = [
        _req([MgmtOp.write(fwd, 0x0A000002), MgmtOp.read(fwd)], 3, **c2),
        _req([MgmtOp.write(fwd, 1)], 4, **{**c2, "sport": 1}),     # port not allowed
        _req([MgmtOp.write(fwd, 1)], 4, **{**c2, "src_mac": C_MAC}),   # MAC not allowed
        _corrupt(_req([MgmtOp.read(fwd)], 4, **c2), 14 + 10),      # bad IPv4 checksum
        _req([MgmtOp.read(fwd)], 3, **c2),                          # replay (seq = LAST_SEQ)
        _req([MgmtOp.write(fwd, 0x0A000022), MgmtOp.read(fwd)], 9, **c2),
    ]
    return f0, f1, fwd


@pytest.mark.parametrize("width", [64, 128])
def test_mgmt_path_against_model(width):
    rm = build_regmap(data_width=width, ports=2, **PARAMS)
    f0, f1, fwd = _port_frames(rm)
    rf, agent = _model(rm)
    want = [[agent.handle(f) for f in fs] for fs in (f0, f1)]
    want = [[r for r in rs if r is not None] for rs in want]
    counts = Counter(agent.counts)
    assert counts["mgmt_accepted"] == 5 and len(want[0]) == 7 and len(want[1]) == 3

    top = _PathTop(rm, width, 2)
    rec = _Rec()
    provision(rec, SETTINGS, rm)
    nb = width // 8
    axil = AxiLiteSimMaster(top.arb.s0, timeout=4096)
    srcs = [StreamSource(getattr(top.path, f"i_p{k}"),
                         [b for f in fs for b in frame_to_beats(f, nb)], idle=0.2, seed=k)
            for k, fs in enumerate((f0, f1))]
    sinks = [StreamSink(getattr(top.path, f"o_p{k}"), stall=0.3, seed=5 + k) for k in range(2)]
    regs = {}
    started = {"go": False}

    async def main(ctx):
        for a, v in rec.ops:
            await axil.write(ctx, a, v)
        started["go"] = True
        while not all(s.done for s in srcs) or sum(
                len(beats_to_frames(k.items, nb)) for k in sinks) < len(want[0]) + len(want[1]):
            await ctx.tick()
        for _ in range(100):
            await ctx.tick()
        for name in ("GLOBAL.SCRATCH", "MGMT_SRC.LAST_SEQ"):
            regs[name] = (await axil.read(ctx, rm.addr(name)))[0]
        regs["fwd"] = (await axil.read(ctx, fwd))[0]
        regs["seq1"] = (await axil.read(ctx, rm.addr("MGMT_SRC.LAST_SEQ", 1)))[0]
        for n in PATH_COUNTERS:
            regs[n] = (await axil.read(ctx, rm.addr(f"CNT.{n.upper()}")))[0]

    def gated(src):
        async def run(ctx):
            while not started["go"]:
                await ctx.tick()
            await src.run(ctx)
        return run

    sim = Simulator(top)
    sim.add_clock(1e-8)
    for s in srcs:
        sim.add_testbench(gated(s), background=True)
    for k in sinks:
        sim.add_testbench(k.run, background=True)
    sim.add_testbench(main)
    sim.run()
    for k in range(2):
        got = [f for f, _ in beats_to_frames(sinks[k].items, nb)]
        assert len(got) == len(want[k]), \
            f"port {k}: rtl {_summary(got)}, model {_summary(want[k])}, counters {regs}"
        for i, (g, e) in enumerate(zip(got, want[k], strict=True)):
            assert g == e, f"port {k} response {i}\nmodel {e.hex()}\nrtl   {g.hex()}"
        _check_beats(sinks[k].items, nb)
    assert regs["GLOBAL.SCRATCH"] == rf.read(0x30) == 9
    assert regs["fwd"] == rf.read(fwd) == 0x0A000022
    assert regs["MGMT_SRC.LAST_SEQ"] == 8 and regs["seq1"] == 9
    for n in PATH_COUNTERS:
        exp = {"rx_frames": counts["mgmt_rx"], "tx_frames": len(want[0]) + len(want[1])}.get(
            n, counts[n])
        assert regs[n] == exp, f"{n}: rtl {regs[n]}, model {exp}"


# ============================================================================ the whole engine
EPARAMS = dict(ports=1, jobs=2, flows=8, slots=16, max_world=4, pmtu_max=256, data_width=64)
ENB = EPARAMS["data_width"] // 8


class _RecordingBus:
    """Writes go to the model engine and are recorded for the RTL's s_axil."""

    def __init__(self, eng, ops):
        self.eng, self.ops = eng, ops

    def read(self, addr):
        return self.eng.bus.read(addr)

    def write(self, addr, value):
        self.eng.bus.write(addr, value)
        self.ops.append(("write", addr, value))


class _SimLink:
    """A FrameLink between the driver's MgmtClient (its own thread) and the simulation."""

    def __init__(self):
        self.tx, self.rx = queue.Queue(), queue.Queue()
        self.sent, self.got = [], []

    def send(self, frame):
        self.sent.append(frame)
        self.tx.put(frame)

    def recv(self, timeout_s):
        try:
            return self.rx.get(timeout=timeout_s)
        except queue.Empty:
            return None


def _is_response(f):
    """A management response (UDP from the management port), or None."""
    l3 = 18 if f[12:14] == b"\x81\x00" else 14
    return len(f) >= l3 + 28 and f[l3 + 9] == 17 and \
        int.from_bytes(f[l3 + 20:l3 + 22], "big") == MGMT_DEFAULT_PORT


def _eflow(port, f):
    if _is_response(f):
        return (port, "mgmt")
    l2 = 18 if f[12:14] == b"\x81\x00" else 14
    if len(f) >= l2 + 40 and f[l2 + 9] == 17 and f[l2 + 22:l2 + 24] == b"\x12\xb7":
        op = f[l2 + 28]
        return (port, f[l2 + 16:l2 + 20], f[l2 + 33:l2 + 36], "ctrl" if op in (0x11, 0x81)
                else "data")
    return (port, "other")


def run_engine(ops, session, frames, rm, *, stall=0.0, max_cycles=400_000):
    """Program the RTL engine with ``ops`` over s_axil, run ``session(client)`` (the driver's
    MgmtClient, closed loop through the RTL), then feed ``frames`` (a callable item is called
    with the link first); the output is not ready with probability ``stall``. Returns
    (outputs as [(port, frame)] without the session's responses, link, client, registers)."""
    from netreduce.hw.engine import NetReduceEngine

    dut = NetReduceEngine(rm, max_frame=512)
    axil = AxiLiteSimMaster(dut.s_axil, timeout=4096)
    link = _SimLink()
    st = {"phase": "setup", "err": None, "quiet": False}
    out = []
    regs = {}
    client = MgmtClient(link, engine_ip=E_IP, engine_mac=E_MAC, ip=C_IP, mac=C_MAC, port=C_PORT,
                        key=KEY, regmap=rm, timeout_s=300, retries=0)

    def run_session():
        try:
            session(client)
        except BaseException as e:  # reported by the test, not lost in the thread
            st["err"] = e

    thread = threading.Thread(target=run_session, daemon=True)

    async def send(ctx, buf):
        src = dut.i_p0
        n = -(-len(buf) // ENB)
        for b in range(n):
            chunk = buf[b * ENB:(b + 1) * ENB]
            ctx.set(src.payload, {"data": int.from_bytes(chunk, "little"),
                                  "keep": (1 << len(chunk)) - 1, "first": b == 0,
                                  "last": b == n - 1, "error": 0})
            ctx.set(src.valid, 1)
            await ctx.tick().until(src.ready)
        ctx.set(src.valid, 0)

    async def driver(ctx):
        for op in ops:
            if op[0] == "write":
                await axil.write(ctx, op[1], op[2])
            else:
                en = rm.field("JOB.STATUS.enabled")
                for _ in range(2000):
                    v, _ = await axil.read(ctx, rm.addr("JOB.STATUS", op[1]))
                    if en.get(v):
                        break
                else:
                    raise AssertionError(f"job {op[1]} never enabled")
        st["phase"] = "session"
        thread.start()
        while thread.is_alive() or not link.tx.empty():
            try:
                f = link.tx.get_nowait()
            except queue.Empty:
                await ctx.tick()
                continue
            await send(ctx, f)
        if st["err"] is not None:
            raise st["err"]
        st["phase"] = "frames"
        for f in frames:
            await send(ctx, f(link) if callable(f) else f)
        st["phase"] = "drain"
        while not st["quiet"]:
            await ctx.tick()
        for inst in rm.instances():
            regs[inst.name] = (await axil.read(ctx, inst.addr))[0]

    async def monitor(ctx):
        buf = bytearray()
        idle = 0
        rng = random.Random(11)
        o = dut.o_p0
        ctx.set(o.ready, 1)
        async for _, _, v, r, p in ctx.tick().sample(o.valid, o.ready, o.payload):
            ctx.set(o.ready, rng.random() >= stall)
            if v and r:
                idle = 0
                buf += p.data.to_bytes(ENB, "little")[:bin(p.keep).count("1")]
                if p.last:
                    f = bytes(buf)
                    buf = bytearray()
                    if st["phase"] == "session" and _is_response(f):
                        link.got.append(f)
                        link.rx.put(f)
                    else:
                        out.append((0, f))
            elif st["phase"] == "drain":
                idle += 1
                # the agent needs up to ~4 cycles per request byte before it answers
                if idle > 3000:
                    st["quiet"] = True
                    return

    async def watchdog(ctx):
        for _ in range(max_cycles):
            await ctx.tick()
        raise AssertionError(f"engine run did not finish in {max_cycles} cycles "
                             f"(phase {st['phase']})")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(driver)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(watchdog, background=True)
    sim.run()
    thread.join(timeout=5)
    return out, link, client, regs


def test_engine_management_with_traffic():
    """Job set up over s_axil; the driver's MgmtClient writes and reads registers through the
    RTL (responses byte-identical to the model agent's); then RoCE traffic for the job
    interleaved with accepted, refused and dropped management frames: outputs per flow and
    every register (counters included) as the model has them."""
    rm = build_regmap(**EPARAMS)
    model = Engine(**{k: v for k, v in EPARAMS.items() if k != "data_width"})
    ops = []
    bus = _RecordingBus(model, ops)
    provision(bus, SETTINGS, rm)
    model_attach(model)
    job = RingJob(job=0, world=3, window=4, slot_base=0, pmtu=256)
    EngineControl(bus).add_job(job.config())
    ops.append(("sync", 0))
    scratch, fwd7 = rm.addr("GLOBAL.SCRATCH"), rm.addr("FLOW.FWD_IP", 7)
    seen = {}

    def session(cl):
        cl.write(scratch, 0x12345678)
        seen["scratch"] = cl.read(scratch)
        with cl.posted():
            cl.write(fwd7, 0x0A0B0C0D)
            cl.write(rm.addr("FLOW.REV_IP", 7), 0x01020304)
        seen["fwd7"] = cl.read(fwd7)
        seen["magic"] = cl.read(rm.addr("GLOBAL.MAGIC"))

    rng = random.Random(3)
    seq = [100]

    def req(ops_, **kw):
        seq[0] += 1
        return _req(ops_, seq[0], **kw)

    bad_ck = bytearray(req([MgmtOp.write(scratch, 0xBAD)]))
    bad_ck[14 + 10] ^= 1
    frames = []
    mgmt = [
        req([MgmtOp.write(scratch, 0xA1), MgmtOp.read(scratch)]),
        req([MgmtOp.write(scratch, 0xBAD)], src_ip=ip("10.9.9.9")),    # unauthorised source
        req([MgmtOp.write(scratch, 0xBAD)], key=bytes(16)),            # bad tag
        req([MgmtOp.write(scratch, 0xBAD)], key=None),                 # no tag at all
        lambda lk: lk.sent[1],                          # replay of the session's first write
        bytes(bad_ck),                                                  # malformed: checksum
        req([MgmtOp.write(scratch, 0xBAD)])[:45],                       # malformed: truncated
        req([MgmtOp.write(scratch, 0xBAD), MgmtOp(7, scratch, 0)]),     # bad opcode
        req([MgmtOp.write(scratch, 0xBAD), MgmtOp.read(0x7024)]),       # key: denied
        req([MgmtOp.write(scratch, 0xBAD), MgmtOp.read(0x0390)]),       # unmapped
        req([MgmtOp.read(scratch)], dport=MGMT_DEFAULT_PORT + 1),       # ordinary traffic
        req([MgmtOp.read(scratch), MgmtOp.write(scratch, 0xA2), MgmtOp.read(scratch)],
            vlan=0x42),                                  # sees 0xA1: no 0xBAD landed
    ]
    for k in range(3):
        for r in range(3):
            frames.append(job.data_bytes(r, k, [rng.randrange(-2**31, 2**31) for _ in range(8)]))
            if mgmt:
                frames.append(mgmt.pop(0))
    frames += mgmt
    got, link, client, regs = run_engine(ops, session, frames, rm, stall=0.25,
                                         max_cycles=300_000)
    # the session: same answers as the model agent gives to the same frames
    assert seen == {"scratch": 0x12345678, "fwd7": 0x0A0B0C0D,
                    "magic": rm.reg("GLOBAL.MAGIC").reset}
    assert client.stats["ok"] == len(link.sent) == len(link.got) == 6  # sync + 5
    for i, f in enumerate(link.sent):
        want = [e.frame for e in model.receive(0, f, 0)]
        assert want == [link.got[i]], f"session frame {i}: model {[w.hex() for w in want]}\n" \
                                      f"rtl {link.got[i].hex()}"
    # the traffic phase, with a replay of the session's first write
    frames = [f(link) if callable(f) else f for f in frames]
    expected = [(e.port, e.frame) for f in frames for e in model.receive(0, f, 0)]
    want, have = {}, {}
    for d, lst in ((want, expected), (have, got)):
        for port, f in lst:
            d.setdefault(_eflow(port, f), []).append(f)
    assert set(want) == set(have), (sorted(want, key=repr), sorted(have, key=repr))
    for key in want:
        assert have[key] == want[key], f"flow {key}: rtl {len(have[key])} frames, model " \
                                       f"{len(want[key])}"
    assert len(want[(0, "mgmt")]) == 6 and len(want[(0, "other")]) == 1
    assert sum(len(v) for k, v in want.items() if k[-1] == "data") == 9   # 3 results x 3 ranks
    c = model.counters()
    for name in PATH_COUNTERS:
        assert c[name] > 0, name
    # every register, counters included, as the model has it: the rejected frames changed none
    mism = {}
    for inst in rm.instances():
        if inst.name == "GLOBAL.DATA_WIDTH":
            continue  # a build constant: the model's map is built at the default width
        mv = model.bus.read(inst.addr)
        if regs[inst.name] != mv:
            mism[inst.name] = (regs[inst.name], mv)
    assert not mism, f"registers differ (rtl, model): {mism}"
    assert regs["GLOBAL.SCRATCH"] == 0xA2
    last = parse_mgmt(have[(0, "mgmt")][-1], strict=False).msg
    assert [o.value for o in last.ops] == [0xA1, 0xA2, 0xA2]
    assert [parse_mgmt(f, strict=False).msg.status for f in have[(0, "mgmt")]] == [
        0, 4, 1, 3, 2, 0]   # OK, REPLAY, BAD_OPCODE, DENIED, BAD_ADDR, OK
