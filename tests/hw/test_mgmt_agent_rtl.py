"""The gateware management agent (netreduce.hw.mgmt.MgmtAgent) against the reference model agent
(netreduce.sim.model.mgmt.MgmtAgent): the same frames into both, each backed by its own register
file (the gateware's through an AXI4-Lite slave model), must give byte-identical responses, the same
counter events and the same final registers."""

import random
from collections import Counter

import pytest
from amaranth.sim import Simulator
from netreduce.hw.mgmt import MGMT_COUNTERS, MgmtAgent
from netreduce.sim.model.mgmt import MgmtAgent as ModelAgent
from netreduce.sw_driver.mgmt import MgmtClient, MgmtSettings, MgmtSource, provision

from netreduce.regmap import BusError, RegisterFile, build_regmap
from netreduce.wire import ip, ipv4_checksum
from netreduce.wire.mgmt import (
    MGMT_DEFAULT_PORT,
    MGMT_MAX_OPS,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtType,
    pack_mgmt,
)

KEY = bytes(range(7, 23))
E_IP, E_MAC = ip("10.0.0.254"), b"\x02\xee\x00\x00\x00\x01"
C_IP, C_MAC, C_PORT = ip("10.0.0.1"), b"\x02\xcc\x00\x00\x00\x01", 40000
C2_IP, C2_MAC, C2_PORT = ip("10.0.0.2"), b"\x02\xcc\x00\x00\x00\x02", 40002
RM = build_regmap(jobs=2, flows=8)


def _regfile(key):
    rf = RegisterFile(RM)
    provision(rf, MgmtSettings(E_IP, E_MAC, sources=[
        MgmtSource(C_IP), MgmtSource(C2_IP, mac=C2_MAC, port=C2_PORT)], key=key), RM)
    return rf


def _cfg(rf):
    rd = rf.read
    a = RM.addr
    key = sum(rd(a(f"MGMT.KEY{i}")) << (32 * i) for i in range(4))
    src = []
    for e in range(RM.table("MGMT_SRC").count):
        c = rd(a("MGMT_SRC.CFG", e))
        src.append({"valid": c & 1, "match_mac": c >> 1 & 1, "match_port": c >> 2 & 1,
                    "port": c >> 16, "ip": rd(a("MGMT_SRC.IP", e)),
                    "mac": rd(a("MGMT_SRC.MAC_HI", e)) << 32 | rd(a("MGMT_SRC.MAC_LO", e))})
    return dict(auth=rd(a("MGMT.CTRL")) >> 1 & 1, ip=rd(a("MGMT.IP")), port=rd(a("MGMT.PORT")),
                mac=rd(a("MGMT.MAC_HI")) << 32 | rd(a("MGMT.MAC_LO")), key=key, src=src)


def run_rtl(rf, frames, gaps=0, errors=()):
    """Feed ``frames`` to the gateware (those whose index is in ``errors`` with the beat
    ``error`` flag on their last beat); returns (responses, counter events per frame)."""
    dut = MgmtAgent(RM)
    nsrc = RM.table("MGMT_SRC").count
    last = [0] * nsrc
    for e in range(nsrc):
        rf.bind(RM.addr("MGMT_SRC.LAST_SEQ", e), lambda e=e: last[e])
    responses, events = [], []
    bus = dut.bus

    async def bench(ctx):
        st = {"rd": None, "wr": None, "out": [], "done": []}
        cnt = Counter()
        ctx.set(dut.o.ready, 1)

        async def cycle():
            rd, wr = st["rd"], st["wr"]
            ctx.set(bus.rvalid, rd is not None)
            ctx.set(bus.bvalid, wr is not None)
            if rd is not None:
                ctx.set(bus.rdata, rd[0])
                ctx.set(bus.rresp, rd[1])
            if wr is not None:
                ctx.set(bus.bresp, wr)
            take_ar = rd is None and ctx.get(bus.arvalid)
            take_w = wr is None and ctx.get(bus.awvalid) and ctx.get(bus.wvalid)
            ctx.set(bus.arready, take_ar)
            ctx.set(bus.awready, take_w)
            ctx.set(bus.wready, take_w)
            r_done = rd is not None and ctx.get(bus.rready)
            b_done = wr is not None and ctx.get(bus.bready)
            araddr, awaddr, wdata = ctx.get(bus.araddr), ctx.get(bus.awaddr), ctx.get(bus.wdata)
            if ctx.get(dut.o.valid):
                b = ctx.get(dut.o.payload)
                keep = b.keep
                n = bin(keep).count("1")
                assert keep == (1 << n) - 1
                assert b.first == (not st["out"])
                st["out"].append(b.data.to_bytes(8, "little")[:n])
                if b.last:
                    st["done"].append(b"".join(st["out"]))
                    st["out"] = []
            inc = ctx.get(dut.inc)
            for name in MGMT_COUNTERS:
                if getattr(inc, name):
                    cnt[name] += 1
            taken = ctx.get(dut.i.valid) and ctx.get(dut.i.ready)
            await ctx.tick()
            if r_done:
                st["rd"] = None
            if b_done:
                st["wr"] = None
            if take_ar:
                for e in range(nsrc):
                    last[e] = ctx.get(dut.last_seq[e])
                try:
                    st["rd"] = (rf.read(araddr), 0)
                except BusError:
                    st["rd"] = (0, 3)
            if take_w:
                try:
                    rf.write(awaddr, wdata)
                    st["wr"] = 0
                except BusError:
                    st["wr"] = 3
            return taken

        for fi, frame in enumerate(frames):
            c = _cfg(rf)
            for name in ("auth", "ip", "port", "mac", "key"):
                ctx.set(getattr(dut, name), c[name])
            for e, s in enumerate(c["src"]):
                for f, v in s.items():
                    ctx.set(getattr(dut.src[e], f), v)
            cnt.clear()
            beats = [frame[i:i + 8] for i in range(0, len(frame), 8)]
            for j, b in enumerate(beats):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": int.from_bytes(b, "little"),
                                        "keep": (1 << len(b)) - 1, "first": j == 0,
                                        "last": j == len(beats) - 1,
                                        "error": j == len(beats) - 1 and fi in errors})
                while not await cycle():
                    pass
                ctx.set(dut.i.valid, 0)
                for _ in range(gaps):
                    await cycle()
            n = 0
            while ctx.get(dut.busy) or st["rd"] or st["wr"] is not None:
                await cycle()
                n += 1
                assert n < 20000, "agent hangs"
            for e in range(nsrc):
                last[e] = ctx.get(dut.last_seq[e])
            responses.append(st["done"].pop() if st["done"] else None)
            assert not st["done"]
            events.append(dict(cnt))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return responses, events


def run_model(rf, frames):
    agent = ModelAgent(rf, RM)
    responses, events = [], []
    for f in frames:
        before = Counter(agent.counts)
        responses.append(agent.handle(f))
        events.append(dict(Counter(agent.counts) - before))
    return responses, events


def _req(ops, seq, key=KEY, src_ip=C_IP, src_mac=C_MAC, sport=C_PORT, vlan=None):
    fr = MgmtFrame(MgmtMessage(MgmtType.REQUEST, seq, list(ops)), src_mac, E_MAC, src_ip, E_IP,
                   sport, MGMT_DEFAULT_PORT, vlan)
    return pack_mgmt(fr, key)


def _dump(rf):
    return {i.name: rf.read(i.addr) for i in RM.instances()}


def compare(frames, key=KEY, gaps=0):
    rf_m, rf_g = _regfile(key), _regfile(key)
    exp, exp_ev = run_model(rf_m, frames)
    got, got_ev = run_rtl(rf_g, frames, gaps)
    for i, (e, g) in enumerate(zip(exp, got, strict=True)):
        assert g == e, f"frame {i}: response differs\nmodel {e and e.hex()}\nrtl   {g and g.hex()}"
        assert got_ev[i] == exp_ev[i], f"frame {i}: counters {got_ev[i]} != {exp_ev[i]}"
    assert _dump(rf_g) == _dump(rf_m)
    return exp, exp_ev, rf_g


def _fix(b, l3=14):
    b[l3 + 10:l3 + 12] = b"\0\0"
    b[l3 + 10:l3 + 12] = ipv4_checksum(b[l3:l3 + 20]).to_bytes(2, "big")
    b[l3 + 26:l3 + 28] = b"\0\0"  # UDP checksum "none"
    return bytes(b)


def test_rtl_agent_matches_model_on_every_rule():
    s = RM.addr("GLOBAL.SCRATCH")
    first = _req([MgmtOp.write(s, 0xCAFEF00D), MgmtOp.read(s), MgmtOp.read(0)], 5)
    frames = [
        first,
        _req([MgmtOp.read(RM.addr("MGMT_SRC.LAST_SEQ")), MgmtOp.write(s, 1)], 6, vlan=0x123),
        first,  # replay
        _req([MgmtOp.write(s, 7), MgmtOp(3, s, 0)], 7),  # bad opcode
        _req([MgmtOp.write(s, 7), MgmtOp.read(0x0380)], 7),  # unmapped
        _req([MgmtOp.write(s + 1, 7)], 7),  # unaligned
        _req([MgmtOp.read(RM.size)], 7),  # beyond the map
        _req([MgmtOp.read(RM.addr("MGMT.KEY1"))], 7),  # denied
        _req([MgmtOp.write(s, 8)], 7, src_ip=ip("10.9.9.9")),  # unknown source
        _req([MgmtOp.write(s, 8)], 7, src_ip=C2_IP, src_mac=C2_MAC, sport=1),  # wrong port
        _req([MgmtOp.write(s, 8)], 7, key=bytes(16)),  # bad tag
        _req([MgmtOp.write(s, 8)], 7)[:50],  # truncated
        _req([MgmtOp.write(s, 8)], 7, src_ip=C2_IP, src_mac=C2_MAC, sport=C2_PORT),
        _req([MgmtOp.write(RM.addr("FLOW.FWD_IP", 3), 0x0A000003),
              MgmtOp.write(RM.addr("JOB.WINDOW", 1), 64),
              MgmtOp.read(RM.addr("FLOW.FWD_IP", 3)), MgmtOp.read(RM.addr("JOB.WINDOW", 1))], 9),
        _req([MgmtOp.write(RM.addr("CNT.RX_FRAMES"), 5)], 10),  # RO register: OKAY, no effect
    ]
    bad_magic = bytearray(_req([MgmtOp.read(s)], 11))
    bad_magic[42] = 0
    frames.append(_fix(bad_magic))
    bad_ck = bytearray(_req([MgmtOp.read(s)], 11))
    bad_ck[24] ^= 0xFF
    frames.append(bytes(bad_ck))
    resp = _req([MgmtOp(0x02, s, 0)], 11, key=None)  # untagged
    frames.append(resp)
    exp, ev, rf = compare(frames)
    assert [e is not None for e in exp] == [True] * 8 + [False] * 4 + [True] * 3 + [False] * 3
    assert rf.read(s) == 8 and rf.read(RM.addr("JOB.WINDOW", 1)) == 64
    kinds = Counter(k for e in ev for k in e)
    for name in MGMT_COUNTERS:
        assert kinds[name] > 0, name


def test_rtl_agent_full_frame_vlan_and_no_auth():
    s = RM.addr("GLOBAL.SCRATCH")
    ops = [MgmtOp.write(s, i) if i % 2 else MgmtOp.read(s) for i in range(MGMT_MAX_OPS)]
    frames = [_req(ops, 1, key=None, vlan=0xFFF), _req(ops[:3], 2, key=None),
              _req(ops[:1], 2, key=None)]
    exp, ev, rf = compare(frames, key=None, gaps=1)
    assert all(e is not None for e in exp) and rf.read(s) == 1  # frame 2 wrote last
    assert ev[0] == ev[1] == {"mgmt_rx": 1, "mgmt_accepted": 1}
    assert ev[2] == {"mgmt_rx": 1, "mgmt_reject_replay": 1}
    assert len(exp[0]) == 18 + 20 + 8 + 24 + 12 * MGMT_MAX_OPS


def test_rtl_agent_replays_a_driver_session():
    """A driver session (sync, posted writes, reads) recorded against the model, replayed into
    the gateware: the driver would have seen identical answers."""
    rf = _regfile(KEY)
    agent = ModelAgent(rf, RM)
    sent = []

    class Link:
        q = []

        def send(self, frame):
            sent.append(frame)
            out = agent.handle(frame)
            if out is not None:
                self.q.append(out)

        def recv(self, timeout_s):
            return self.q.pop(0) if self.q else None

    cl = MgmtClient(Link(), engine_ip=E_IP, engine_mac=E_MAC, ip=C_IP, mac=C_MAC, port=C_PORT,
                    key=KEY, regmap=RM)
    with cl.posted():
        for e in range(4):
            cl.write(RM.addr("FLOW.FWD_IP", e), 0x0A000100 + e)
            cl.write(RM.addr("FLOW.CFG", e), 1 | e << 16)
        cl.write(RM.addr("JOB.WORLD", 0), 4)
    assert [cl.read(RM.addr("FLOW.FWD_IP", e)) for e in range(4)] == [
        0x0A000100 + e for e in range(4)]
    _, _, rf_g = compare(sent)
    assert rf_g.read(RM.addr("JOB.WORLD", 0)) == 4


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rtl_agent_mutated_frames(seed):
    rng = random.Random(seed)
    s = RM.addr("GLOBAL.SCRATCH")
    frames = []
    for i in range(12):
        b = bytearray(_req([MgmtOp.write(s, i), MgmtOp.read(s)], 100 + i, key=None))
        for _ in range(rng.randint(1, 2)):
            b[rng.randrange(14, len(b))] = rng.randrange(256)
        frames.append(_fix(b) if rng.random() < 0.5 else bytes(b))
    compare(frames, key=None)


def test_rtl_agent_mac_error_flag_is_malformed():
    s = RM.addr("GLOBAL.SCRATCH")
    f = _req([MgmtOp.write(s, 3)], 1)
    rf = _regfile(KEY)
    got, ev = run_rtl(rf, [f, f], errors={0})
    assert got[0] is None and ev[0] == {"mgmt_rx": 1, "mgmt_reject_malformed": 1}
    assert got[1] is not None and ev[1] == {"mgmt_rx": 1, "mgmt_accepted": 1}
    assert rf.read(s) == 3
