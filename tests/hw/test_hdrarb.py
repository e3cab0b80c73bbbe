"""HeaderArbiter (netreduce.hw.hdrarb): the ports' control headers into the control path.

Checked in simulation against the control's ``side`` contract: every header reaches the output
once and in its port's order; a side record only with a pairable main, from another port, both
RoCE ACK/NAK without error nor reserved syndrome, with different keys (each condition violated
once in a directed case); no port starves; one header per cycle, two with pairs. The arbiter's
paths stay within the clock plan's depth budget (4 ports).
"""

import random
import shutil

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from netreduce.hw.agg.control import AggControl
from netreduce.hw.agg.decide import OP_ACK, OP_CNP
from netreduce.hw.agg.types import FrameError, HdrClass
from netreduce.hw.hdrarb import HeaderArbiter, record_layout

from netreduce.regmap import build_regmap

OP_DATA = 0x0A  # RDMA WRITE only


def hdr_layout(ports, pairs):
    ctl = AggControl(build_regmap(ports=ports, jobs=2, flows=8, slots=8, max_world=4,
                                  pmtu_max=256, data_width=64))
    ctl._MustUse__silence = True  # only its layout is used
    base = ctl.hdr_layout
    if not pairs:
        return base
    # the side record as AggControl(pairs=True) lays it out (the lead's contract)
    side = data.StructLayout({"v": 1, "src_ip": 32, "dqpn": 24, "psn": 24, "syndrome": 8,
                              "plen": 16, "port": ctl.port_bits})
    return data.StructLayout({**{n: f.shape for n, f in base}, "side": side})


def ack(port, psn, key, **kw):
    r = {"cls": HdrClass.ROCE, "err": FrameError.NONE, "src_ip": 0x0A000000 + key[0],
         "dqpn": key[1], "opcode": OP_ACK, "psn": psn, "syndrome": 0, "plen": 0, "port": port}
    r.update(kw)
    return r


def pairable(r):
    return (r["cls"] == HdrClass.ROCE and r["err"] == FrameError.NONE and r["opcode"] == OP_ACK
            and (r["syndrome"] >> 5) & 3 != 2)


def random_record(rng, port, psn):
    key = (rng.randrange(3), rng.randrange(2))
    x = rng.random()
    if x < 0.55:
        return ack(port, psn, key, syndrome=rng.choice([0, 0, 0x20, 0x60, 0x40]))
    if x < 0.75:
        return ack(port, psn, key, opcode=OP_DATA, plen=256)
    if x < 0.83:
        return ack(port, psn, key, opcode=OP_CNP)
    if x < 0.91:
        return ack(port, psn, key, err=rng.choice([FrameError.ICRC, FrameError.LENGTH]))
    return ack(port, psn, key, cls=rng.choice([HdrClass.NOT_ROCE, HdrClass.SHORT]))


def run(ports, pairs, queues, *, cycles, in_rate=1.0, out_rate=1.0, seed=0, hold=0,
        pair_en=None):
    """Drive the queues (per port, records in order) into the arbiter; returns the transfers
    (cycle, main record fields, side fields or None). ``hold``: o.ready low for that many
    cycles first (every head loaded); ``pair_en``: a function of the cycle driving the arbiter's
    ``pair_en`` (undriven: 1)."""
    hl = hdr_layout(ports, pairs)
    dut = HeaderArbiter(hl, ports=ports)
    rl = dut.rec_layout
    rng = random.Random(seed)
    pos = [0] * ports
    out = []

    async def bench(ctx):
        for cyc in range(cycles):
            for k in range(ports):
                i = getattr(dut, f"i{k}")
                have = pos[k] < len(queues[k])
                ctx.set(i.valid, have and rng.random() < in_rate)
                if have:
                    ctx.set(i.payload, rl.const(queues[k][pos[k]]))
            ctx.set(dut.o.ready, cyc >= hold and rng.random() < out_rate)
            if pair_en is not None:
                ctx.set(dut.pair_en, pair_en(cyc))
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                p = ctx.get(dut.o.payload)
                main = {n: getattr(p, n) for n, _ in rl}
                side = None
                if pairs and p.side.v:
                    side = {n: getattr(p.side, n) for n, _ in hl["side"].shape if n != "v"}
                out.append((cyc, main, side))
            for k in range(ports):
                i = getattr(dut, f"i{k}")
                pos[k] += ctx.get(i.valid) and ctx.get(i.ready)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def check_order_and_pairs(queues, out, complete=True):
    """Every header once (``complete``: all of them), in its port's order; every side record
    eligible."""
    served = [[] for _ in queues]
    for _, main, side in out:
        served[main["port"]].append(main)
        if side is not None:
            q = queues[side["port"]][len(served[side["port"]])]
            assert all(q[n] == side[n] for n in side), (side, q)
            served[side["port"]].append(q)
            assert pairable(main) and pairable(q), (main, q)
            assert side["port"] != main["port"]
            assert (q["src_ip"], q["dqpn"]) != (main["src_ip"], main["dqpn"])
    for k, q in enumerate(queues):
        got = [(r["psn"], r["opcode"], r["src_ip"], r["dqpn"], r["syndrome"]) for r in served[k]]
        want = [(r["psn"], r["opcode"], r["src_ip"], r["dqpn"], r["syndrome"]) for r in q]
        assert got == (want if complete else want[:len(got)]), f"port {k}"


@pytest.mark.parametrize("ports,pairs,in_rate,out_rate", [
    (4, True, 1.0, 1.0), (4, True, 0.6, 0.7), (3, True, 0.9, 0.5), (2, True, 1.0, 0.8),
    (4, False, 0.8, 0.9), (1, False, 1.0, 0.7)])
def test_arbiter_random(ports, pairs, in_rate, out_rate):
    rng = random.Random(ports * 10 + pairs)
    queues = [[random_record(rng, k, 1000 * k + n) for n in range(300)] for k in range(ports)]
    out = run(ports, pairs, queues, cycles=2000, in_rate=in_rate, out_rate=out_rate,
              seed=ports + int(10 * in_rate))
    check_order_and_pairs(queues, out)
    n_pairs = sum(s is not None for _, _, s in out)
    if pairs:
        assert n_pairs > 10
    else:
        assert n_pairs == 0


@pytest.mark.parametrize("change,paired", [
    ({}, True),
    ({"opcode": OP_DATA}, False),                 # not an ACK
    ({"opcode": OP_CNP}, False),                  # CNP: looked up by reverse key, not paired
    ({"err": FrameError.ICRC}, False),            # frame error
    ({"syndrome": 0x40}, False),                  # reserved AETH syndrome (0b10)
    ({"cls": HdrClass.SHORT}, False),             # not a whole RoCE header
    ({"cls": HdrClass.NOT_ROCE}, False),
    ({"src_ip": 0x0A000001, "dqpn": 5}, False),   # the main's key
    ({"src_ip": 0x0A000001, "dqpn": 6}, True),    # same source IPv4, another QP
    ({"syndrome": 0x60}, True),                   # a NAK
])
@pytest.mark.parametrize("which", ["main", "side"])
def test_pair_conditions(change, paired, which):
    """Two heads (ports 0 and 1), every register loaded before the first transfer: a pair only
    when both are eligible; the condition broken on either record."""
    a, b = ack(0, 1, (1, 5)), ack(1, 2, (2, 7))
    if change:
        if which == "main":
            a.update(change)
            if "src_ip" in change:
                a["src_ip"], a["dqpn"], b["src_ip"], b["dqpn"] = 0x0A000002, 7, *change.values()
                a["src_ip"], a["dqpn"] = change["src_ip"], change["dqpn"]
                b["src_ip"], b["dqpn"] = 0x0A000001, 5
        else:
            b.update(change)
    out = run(2, True, [[a], [b]], cycles=8, hold=4)
    check_order_and_pairs([[a], [b]], out)
    assert len(out) == (1 if paired else 2)
    assert (out[0][2] is not None) == paired


@pytest.mark.parametrize("pattern,rate", [("a", 1.49), ("da", 1.32), ("daa", 1.32)])
def test_pairs_headers_per_cycle(pattern, rate):
    """Four ports, each a backlog of headers in ``pattern`` (d: data, a: ACK with a key of its
    own port), the control always ready: headers per cycle. A head pairs from its second cycle
    in the register (its pair flags are registered), so a stream of ACKs pairs every other
    cycle (1.5 per cycle); a data header and an ACK per frame pair (1.33, above the 8 headers
    per 7 cycles of four ports of 6-beat frames with an ACK each)."""
    queues = [[ack(k, 1000 * k + n, (k, n % 3),
                   **({"opcode": OP_DATA} if pattern[n % len(pattern)] == "d" else {}))
               for n in range(400)] for k in range(4)]
    out = run(4, True, queues, cycles=400)
    check_order_and_pairs(queues, out, complete=False)
    n = sum(1 + (s is not None) for _, _, s in out)
    assert len(out) == 399 and n / 400 >= rate, n / 400


def test_no_starvation():
    """Ports 1..3 always have pairable ACKs (different keys), port 0 data headers: port 0 still
    gets a turn at least every 4 transfers; a pairable port whose key equals every other head's
    key is served as a main record in its turn."""
    queues = [[ack(0, n, (0, 0), opcode=OP_DATA) for n in range(100)]]
    queues += [[ack(k, 1000 * k + n, (k, 0)) for n in range(400)] for k in (1, 2, 3)]
    out = run(4, True, queues, cycles=300, out_rate=0.9, seed=5)
    check_order_and_pairs(queues, out, complete=False)
    turns = [i for i, (_, main, _) in enumerate(out) if main["port"] == 0]
    assert len(turns) > 50 and max(b - a for a, b in zip(turns[:-1], turns[1:], strict=True)) <= 4
    # one key on every port: no pair ever, plain round robin
    queues = [[ack(k, 1000 * k + n, (1, 1)) for n in range(50)] for k in range(4)]
    out = run(4, True, queues, cycles=220)
    check_order_and_pairs(queues, out)
    assert all(s is None for _, _, s in out) and len(out) == 200
    assert [m["port"] for _, m, _ in out[4:12]] == [0, 1, 2, 3] * 2


def test_rejects_bad_ports():
    with pytest.raises(ValueError, match="ports must be a positive int, not 0"):
        HeaderArbiter(hdr_layout(1, False), ports=0)


class _Glue(wiring.Component):
    """The arbiter as the engine uses it: per port a ParserAdapter from registered record /
    verdict fields (the engine's recq FIFO and the parser's verdict FIFO), the arbiter, and a
    skid buffer standing for the control path's input register."""

    def __init__(self, ports):
        from netreduce.hw.packet.layout import header_record_layout, verdict_layout

        self.ports = ports
        self.hl = hdr_layout(ports, True)
        members = {}
        for k in range(ports):
            members[f"rec{k}"] = In(header_record_layout())
            members[f"roce{k}"] = In(1)
            members[f"verdict{k}"] = In(verdict_layout())
            members[f"valid{k}"] = In(1)
            members[f"ready{k}"] = Out(1)
        members["o"] = Out(stream.Signature(self.hl))
        super().__init__(members)

    def elaborate(self, platform):
        from netreduce.hw.agg.control import ParserAdapter
        from netreduce.hw.skid import SkidBuffer

        m = Module()
        m.submodules.arb = arb = HeaderArbiter(self.hl, ports=self.ports)
        m.submodules.ctl_skid = sk = SkidBuffer(self.hl)
        wiring.connect(m, arb.o, sk.i)
        wiring.connect(m, sk.o, wiring.flipped(self.o))
        for k in range(self.ports):
            ad = ParserAdapter(arb.rec_layout)
            m.submodules[f"adapter{k}"] = ad
            rec = Signal.like(getattr(self, f"rec{k}"))
            roce, ver = Signal(), Signal.like(getattr(self, f"verdict{k}"))
            valid = Signal()
            m.d.sync += [rec.eq(getattr(self, f"rec{k}")), roce.eq(getattr(self, f"roce{k}")),
                         ver.eq(getattr(self, f"verdict{k}")),
                         valid.eq(getattr(self, f"valid{k}"))]
            i = getattr(arb, f"i{k}")
            m.d.comb += [ad.rec.eq(rec), ad.roce.eq(roce), ad.verdict.eq(ver), ad.port.eq(k),
                         i.valid.eq(valid), i.payload.eq(ad.hdr),
                         getattr(self, f"ready{k}").eq(i.ready)]
        return m


@pytest.mark.skipif(shutil.which("yosys") is None, reason="needs the native yosys")
def test_arbiter_meets_the_depth_budget():
    """docs/engine.md "Clock plan": at most 8 LUT-class cells and 8 CARRY8 per path (4 ports,
    pairs): the arbiter alone, and between the records' registers (adapters in front) and the
    control path's input register."""
    from netreduce.hw.pathcheck import levels

    for dut in (HeaderArbiter(hdr_layout(4, True), ports=4), _Glue(4), _Glue(2)):
        lv = levels(dut)
        assert lv["lut_levels"] <= 8, (lv["lut_from"], lv["lut_to"], lv["lut_path"])
        assert lv["carry_max"] <= 8, lv


class _OldRoundRobin(wiring.Component):
    """The engine's header path before the arbiter: a SkidBuffer per port and a round robin
    over their outputs (the first port with a header at or after the pointer, else the first)."""

    def __init__(self, hl, ports):
        self.hl, self.ports = hl, ports
        members = {f"i{k}": In(stream.Signature(hl)) for k in range(ports)}
        members["o"] = Out(stream.Signature(hl))
        super().__init__(members)

    def elaborate(self, platform):
        from amaranth.hdl import Array, Cat, Const, Mux
        from amaranth.utils import ceil_log2
        from netreduce.hw.skid import SkidBuffer

        m = Module()
        P, pb = self.ports, max(1, ceil_log2(self.ports))
        sk = []
        for k in range(P):
            m.submodules[f"skid{k}"] = s = SkidBuffer(self.hl)
            wiring.connect(m, wiring.flipped(getattr(self, f"i{k}")), s.i)
            sk.append(s)
        rr, pick = Signal(pb), Signal(pb)
        cand = [s.o.valid for s in sk]
        chain = Const(0, pb)
        for k in reversed(range(P)):
            chain = Mux(cand[k], k, chain)
        for k in reversed(range(P)):
            chain = Mux(cand[k] & (k >= rr), k, chain)
        m.d.comb += [pick.eq(chain), self.o.valid.eq(Cat(*cand).any()),
                     self.o.payload.eq(Array(s.o.payload for s in sk)[pick])]
        for k, s in enumerate(sk):
            m.d.comb += s.o.ready.eq(self.o.ready & (pick == k))
        with m.If(self.o.ready & self.o.valid):
            m.d.sync += rr.eq(Mux(pick == P - 1, 0, pick + 1))
        return m


@pytest.mark.parametrize("ports", [1, 2, 3, 4])
def test_without_pairs_cycle_for_cycle_the_old_round_robin(ports):
    """Without pairs the arbiter is the engine's former header path, cycle for cycle: the same
    readies, valid and payload under random traffic (so the header latency is unchanged)."""
    hl = hdr_layout(ports, False)

    class Both(wiring.Component):
        def __init__(self):
            self.new = HeaderArbiter(hl, ports=ports)
            self.old = _OldRoundRobin(record_layout(hl), ports)
            super().__init__({"x": In(1)})

        def elaborate(self, platform):
            m = Module()
            m.submodules.new, m.submodules.old = self.new, self.old
            return m

    dut = Both()
    new, old = dut.new, dut.old
    rng = random.Random(ports)
    rl = new.rec_layout
    n_valid = [0]

    async def bench(ctx):
        for cyc in range(1500):
            for k in range(ports):
                v = rng.random() < 0.6
                rec = rl.const(random_record(rng, k, cyc))
                for d in (new, old):
                    ctx.set(getattr(d, f"i{k}").valid, v)
                    ctx.set(getattr(d, f"i{k}").payload, rec)
            r = rng.random() < 0.7
            ctx.set(new.o.ready, r)
            ctx.set(old.o.ready, r)
            for k in range(ports):
                assert ctx.get(getattr(new, f"i{k}").ready) == \
                    ctx.get(getattr(old, f"i{k}").ready)
            assert ctx.get(new.o.valid) == ctx.get(old.o.valid)
            n_valid[0] += ctx.get(new.o.valid)
            if ctx.get(new.o.valid):
                assert ctx.get(new.o.payload) == ctx.get(old.o.payload), cyc
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert n_valid[0] > 700


def test_pair_enable():
    """``pair_en`` low (the engine: some job has fast retransmit on): no pair is formed, from the
    cycle after it falls (the pair flags are registered) until it rises again; order kept."""
    queues = [[ack(k, 1000 * k + n, (k, n % 3)) for n in range(300)] for k in range(4)]

    def en(cyc):
        return not 100 <= cyc < 200

    out = run(4, True, queues, cycles=300, pair_en=en)
    check_order_and_pairs(queues, out, complete=False)
    assert not any(s is not None for cyc, _, s in out if 101 <= cyc < 200)
    assert sum(s is not None for cyc, _, s in out if cyc < 100) > 20
    assert sum(s is not None for cyc, _, s in out if cyc >= 201) > 20
