"""The engine top in the Amaranth simulator (64-bit datapath), frame for frame against the model.

Registers are programmed through the AXI4-Lite port with the driver's own EngineControl sequence
(recorded on the model's bus and replayed on the RTL); frames go in as beats; every frame out is
compared byte for byte with the model's emits, per output port and flow.
"""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator
from netreduce.hw.csr import AxiLiteSimMaster
from netreduce.hw.engine import NetReduceEngine
from netreduce.sim.model.engine import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import ALL_GLOBAL_COUNTERS, JOB_COUNTERS, PORT_COUNTERS, Op, build_regmap
from netreduce.wire import ECN_CE

PORT_ENGINE_COUNTERS = [n for n, src, _ in PORT_COUNTERS if src == "engine"]
W = 64
NB = W // 8
PARAMS = dict(ports=1, jobs=2, flows=8, slots=16, max_world=4, pmtu_max=256, data_width=W)


class RecordingBus:
    def __init__(self, eng: Engine, ops: list):
        self.eng, self.ops = eng, ops

    def read(self, addr: int) -> int:
        return self.eng.bus.read(addr)

    def write(self, addr: int, value: int) -> None:
        self.eng.bus.write(addr, value)
        self.ops.append(("write", addr, value))


class Scenario:
    def __init__(self, **params):
        self.params = {**PARAMS, **params}
        self.eng = Engine(**{k: v for k, v in self.params.items() if k != "data_width"})
        self.ops: list = []
        self.ctl = EngineControl(RecordingBus(self.eng, self.ops))
        self.expected: list = []  # (port, frame)

    def add(self, job: RingJob) -> RingJob:
        self.ctl.add_job(job.config())
        self.ops.append(("sync", job.job))
        return job

    def frame(self, buf: bytes, port: int = 0):
        self.ops.append(("frame", port, buf))
        self.expected += [(e.port, e.frame) for e in self.eng.receive(port, buf, 0)]


def flow_of(port: int, f: bytes):
    """Output flow key: (port, destination IPv4, DestQP, kind) for RoCE, else (port, 'other')."""
    l2 = 18 if f[12:14] == b"\x81\x00" else 14
    if len(f) >= l2 + 40 and f[l2 + 9] == 17 and f[l2 + 22:l2 + 24] == b"\x12\xb7":
        op = f[l2 + 28]
        kind = "ctrl" if op in (0x11, 0x81) else "data"
        return (port, f[l2 + 16:l2 + 20], f[l2 + 33:l2 + 36], kind)
    return (port, "other")


def by_flow(frames):
    out: dict = {}
    for port, f in frames:
        out.setdefault(flow_of(port, f), []).append(f)
    return out


def run_rtl(sc: Scenario, *, gap=0.0, stall=0.0, seed=0, max_cycles=200_000, read_latency=2,
            held=(), max_frame=512, parallel=False):
    """Run the scenario; ``held``: ports whose TX takes nothing until a ``("release", port,
    cycles)`` op (after ``cycles`` cycles). Frames sent with ``error`` go to ``regs["cut"]``;
    ``regs["in_stalls"]``: cycles a frame beat waited for ``ready``. ``parallel``: every port
    sends its frames (in scenario order) at once, each from its own driver, after the register
    ops."""
    rm = build_regmap(**sc.params)
    dut = NetReduceEngine(rm, max_frame=max_frame, read_latency=read_latency)
    NB = sc.params["data_width"] // 8
    P = sc.params["ports"]
    got: list = []
    regs: dict = {"cut": [], "released": {}, "in_stalls": 0}
    done = {"in": False}
    hold = set(held)
    rng = random.Random(seed)
    axil = AxiLiteSimMaster(dut.s_axil, timeout=256)
    st_addr = rm.addr

    async def send(ctx, port, buf):
        src = getattr(dut, f"i_p{port}")
        nbeats = -(-len(buf) // NB)
        for b in range(nbeats):
            while rng.random() < gap:
                ctx.set(src.valid, 0)
                await ctx.tick()
            chunk = buf[b * NB:(b + 1) * NB]
            ctx.set(src.payload.data, int.from_bytes(chunk.ljust(NB, b"\0"), "little"))
            ctx.set(src.payload.keep, (1 << len(chunk)) - 1)
            ctx.set(src.payload.first, b == 0)
            ctx.set(src.payload.last, b == nbeats - 1)
            ctx.set(src.payload.error, 0)
            ctx.set(src.valid, 1)
            while not ctx.get(src.ready):
                regs["in_stalls"] += 1
                await ctx.tick()
            await ctx.tick()
        ctx.set(src.valid, 0)

    # parallel: the frames of each port, sent by its own driver once the register ops are done
    by_port = {k: [op[2] for op in sc.ops if op[0] == "frame" and op[1] == k]
               for k in range(P)} if parallel else {}
    sent = set()

    def port_driver(k):
        async def drive(ctx):
            while not done.get("setup"):
                await ctx.tick()
            for buf in by_port[k]:
                await send(ctx, k, buf)
            sent.add(k)
        return drive

    async def driver(ctx):
        for op in sc.ops:
            if parallel and op[0] == "frame":
                continue
            if op[0] == "write":
                await axil.write(ctx, op[1], op[2])
            elif op[0] == "sync":
                en = rm.field("JOB.STATUS.enabled")
                for _ in range(2000):
                    v, _ = await axil.read(ctx, st_addr("JOB.STATUS", op[1]))
                    if en.get(v):
                        break
                else:
                    raise AssertionError(f"job {op[1]} never enabled")
            elif op[0] == "release":
                await ctx.tick().repeat(op[2])
                hold.discard(op[1])
                regs["released"][op[1]] = len(got)   # frames out before the release
            else:
                await send(ctx, op[1], op[2])
        done["setup"] = True
        while len(sent) < len(by_port):
            await ctx.tick()
        done["in"] = True
        # end state: counters and slot occupancy through the bus, once the outputs are quiet
        while not done.get("quiet"):
            await ctx.tick()
        base = rm.table("CNT").base
        regs["global"] = {c.name: (await axil.read(ctx, base + 4 * i))[0]
                          for i, c in enumerate(ALL_GLOBAL_COUNTERS)}
        t = rm.table("JOB_CNT")
        for j in range(sc.params["jobs"]):
            regs[j] = {c.name: (await axil.read(ctx, t.base + j * t.stride + 4 * i))[0]
                       for i, c in enumerate(JOB_COUNTERS)}
            regs[j]["slots_busy"] = (await axil.read(ctx, st_addr("JOB.SLOTS_BUSY", j)))[0]
        regs["ports"] = [{n: (await axil.read(ctx, st_addr(f"PORT.{n.upper()}", k)))[0]
                          for n in PORT_ENGINE_COUNTERS} for k in range(P)]
        done["regs"] = True

    async def monitor(ctx):
        bufs = [bytearray() for _ in range(P)]
        idle = 0
        for _ in range(max_cycles):
            for k in range(P):
                ctx.set(getattr(dut, f"o_p{k}").ready,
                        int(k not in hold and rng.random() >= stall))
            await ctx.delay(1e-9)
            any_v = False
            for k in range(P):
                o = getattr(dut, f"o_p{k}")
                if ctx.get(o.valid) and ctx.get(o.ready):
                    any_v = True
                    d = ctx.get(o.payload.data)
                    keep = ctx.get(o.payload.keep)
                    n = bin(keep).count("1")
                    bufs[k] += d.to_bytes(NB, "little")[:n]
                    if ctx.get(o.payload.last):
                        (regs["cut"] if ctx.get(o.payload.error) else got).append(
                            (k, bytes(bufs[k])))
                        bufs[k] = bytearray()
            await ctx.tick()
            idle = 0 if any_v or not done["in"] else idle + 1
            if idle > 400:
                done["quiet"] = True
            if done.get("regs"):
                return
        raise AssertionError(f"no quiet end within {max_cycles} cycles")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(driver)
    for k in by_port:
        sim.add_testbench(port_driver(k))
    sim.add_testbench(monitor)
    sim.run()
    return got, regs


def check_end_state(sc: Scenario, regs: dict):
    """Every counter equals the model's (modulo 2^32); slot occupancy as in the model."""
    m32 = (1 << 32) - 1
    want = sc.eng.counters()
    for name, v in regs["global"].items():
        assert v == want[name] & m32, f"counter {name}: rtl {v}, model {want[name]}"
    for k, got in enumerate(regs["ports"]):
        want = sc.eng.port_stats.as_dict(k)
        assert got == {n: v & m32 for n, v in want.items()}, f"port {k}: rtl {got}, model {want}"
    for j in range(sc.params["jobs"]):
        want = sc.eng.counters(j)
        for name, v in regs[j].items():
            if name == "slots_busy":
                assert v == sc.eng.slots_in_use(j), f"job {j} slots busy: rtl {v}"
            else:
                assert v == want[name] & m32, f"job {j} {name}: rtl {v}, model {want[name]}"


def check(sc: Scenario, **kw):
    got, regs = run_rtl(sc, **kw)
    check_end_state(sc, regs)
    want, have = by_flow(sc.expected), by_flow(got)
    for key in sorted(set(want) | set(have), key=repr):
        w, h = want.get(key, []), have.get(key, [])
        for i, (a, b) in enumerate(zip(w, h, strict=False)):
            assert a == b, f"flow {key} frame {i}:\n model {a.hex()}\n   rtl {b.hex()}"
        assert len(w) == len(h), f"flow {key}: model {len(w)} frames, rtl {len(h)}"
    return got


def payload(rng, n):
    return [rng.randrange(-2**31, 2**31) for _ in range(n)]


def test_one_job_results():
    rng = random.Random(1)
    sc = Scenario()
    job = sc.add(RingJob(job=0, world=3, window=4, slot_base=0, pmtu=256))
    for k in range(3):
        for r in range(3):
            sc.frame(job.data_bytes(r, k, payload(rng, 8 + 4 * k)))
    got = check(sc)
    assert len(got) == 9


@pytest.mark.parametrize("seed,read_latency", [(0, 2), (1, 2), (0, 8)])
def test_mixed_rules(seed, read_latency):
    """Duplicates, re-emit after ACKs, behind-window probe, CE -> CNP, mismatch, unregistered,
    bad ICRC and non-RoCE frames, with input gaps and output stalls."""
    rng = random.Random(seed)
    sc = Scenario()
    a = sc.add(RingJob(job=0, world=2, window=2, slot_base=0, pmtu=256))
    b = sc.add(RingJob(job=1, world=3, window=4, slot_base=4, pmtu=256, op=Op.SUM_SAT))
    other = RingJob(job=5, world=2)
    big = [2**31 - 5] * 6
    for k in range(4):
        for r in range(2):
            sc.frame(a.data_bytes(r, k, payload(rng, 6), ecn=ECN_CE if r == 1 else 0))
        sc.frame(a.data_bytes(0, k, payload(rng, 6)))          # duplicate (or re-emit)
        for r in range(3):
            sc.frame(b.data_bytes(r, k, big if k == 1 else payload(rng, 12)))
        for r in range(2):
            sc.frame(a.ack(r, k))
    sc.frame(a.data_bytes(1, 0, payload(rng, 6)))               # behind the window: probe
    sc.frame(a.data_bytes(0, 3, payload(rng, 6)))               # re-emit of a released index
    sc.frame(b.data_bytes(0, 4, payload(rng, 12)))
    sc.frame(b.data_bytes(1, 4, payload(rng, 10)))              # length mismatch
    sc.frame(other.data_bytes(0, 0, payload(rng, 4)))           # unregistered: forwarded
    bad = bytearray(a.data_bytes(0, 4, payload(rng, 6)))
    bad[-1] ^= 1                                                 # bad ICRC: dropped
    sc.frame(bytes(bad))
    sc.frame(bytes(range(60)))                                   # not RoCE: forwarded
    # read_latency 8: a slot memory pipelined for a cascaded UltraRAM matrix (docs/engine.md,
    # "Memories") stays byte-exact with the model
    check(sc, gap=0.2, stall=0.3, seed=seed, read_latency=read_latency)
    assert sc.eng.counters()["saturations"] > 0


def test_two_ports_psn_wrap_max_and_free():
    """Two ports (each rank's frames on its own port, results back there), PSN wrap, MAX, sizes
    that are not multiples of the beat, reordered arrivals; at the end every slot is free."""
    rng = random.Random(7)
    sc = Scenario(ports=2)
    wrap = [(1 << 24) - 2, (1 << 24) - 1, 5]
    a = sc.add(RingJob(job=0, world=3, window=8, slot_base=0, pmtu=256, op=Op.MAX,
                       start_psns=wrap))
    b = sc.add(RingJob(job=1, world=2, window=2, slot_base=8, pmtu=256))
    frames = []
    for k in range(5):
        frames += [(r % 2, a.data_bytes(r, k, payload(rng, 1 + 3 * k))) for r in range(3)]
        if k < 2:
            frames += [(r % 2, b.data_bytes(r, k, payload(rng, 5))) for r in range(2)]
    tail = frames[3:]
    rng.shuffle(tail)   # out-of-order completions: released in order by the scheduler
    for port, f in frames[:3] + tail:
        sc.frame(f, port)
    for r in range(3):
        sc.frame(a.ack(r, 4), r % 2)
    for r in range(2):
        sc.frame(b.ack(r, 1), r % 2)
    check(sc, gap=0.1, stall=0.2, seed=3)
    assert sc.eng.slots_in_use(0) == 0 and sc.eng.slots_in_use(1) == 0
    assert sc.eng.counters(0)["results_sent"] == 15


@pytest.mark.parametrize("op,ports", [(Op.SUM_SAT, 2), (Op.SUM_WRAP, 2), (Op.SUM_SAT, 4)])
def test_two_ports_lanes_loaded_at_once(op, ports):
    """Per-port lanes (lanes = ports, model D20): two jobs whose ranks are split across the
    ports, frames of all ports interleaved, duplicates and a lost-then-resent contribution on
    two ports, re-emits after release, SUM_SAT values that clip in a lane and in the
    combination (4 ports: the pipelined combination)."""
    rng = random.Random(11)
    P = ports
    sc = Scenario(ports=P, lanes=P)
    a = sc.add(RingJob(job=0, world=4, window=8, slot_base=0, pmtu=256, op=op))
    b = sc.add(RingJob(job=1, world=3, window=8, slot_base=8, pmtu=256, op=op))
    big = (1 << 31) - 7

    def val(k, r):
        n = 2 + (k * 3 + r) % 9
        v = [rng.randrange(-big, big) for _ in range(n)]
        v[0] = big if r % 2 == 0 else -big + 3 * r   # port 0 clips upwards, port 1 downwards
        return v

    frames, hist = [], {}
    for k in range(6):
        xa = [val(k, r) for r in range(4)]
        xa = [x[:len(xa[0])] + [0] * (len(xa[0]) - len(x)) for x in xa]
        hist[k] = xa
        xb = [[rng.randrange(-50, 50) for _ in range(3)] for _ in range(3)]
        fa = [(r % P, a.data_bytes(r, k, xa[r])) for r in range(4)]
        fb = [((r + 1) % P, b.data_bytes(r, k, xb[r])) for r in range(3)]
        if k == 2:
            fa.insert(2, fa[0])   # duplicate on port 0 while filling
            fb.insert(1, fb[1])   # duplicate on port 0 (rank 1 of b)
        if k == 3:
            lost = fa.pop(1)      # rank 1 (port 1) lost: resent after index 4
        mix = fa + fb
        rng.shuffle(mix)
        frames += mix
        if k == 4:
            frames.append(lost)
    for port, f in frames:
        sc.frame(f, port)
    sc.frame(a.data_bytes(3, 1, hist[1][3]), 3 % P)   # resent after release: re-emit
    for r in range(4):
        sc.frame(a.ack(r, 5), r % P)
    for r in range(3):
        sc.frame(b.ack(r, 5), (r + 1) % P)
    check(sc, gap=0.0, stall=0.2, seed=5)
    c = sc.eng.counters()
    assert c["duplicates"] == 2 and c["reemits"] == 1 and c["results_sent"] == 6 * 7
    # the scenario tells D20 from D6 for SUM_SAT (a one-lane RTL would fail the check above)
    one = Scenario(ports=P)
    for k in (0, 1):
        one.add((a, b)[k])
    for op_ in sc.ops:
        if op_[0] == "frame":
            one.frame(op_[2], op_[1])
    assert (one.expected != sc.expected) == (op == Op.SUM_SAT)
    if op == Op.SUM_SAT:
        assert c["saturations"] > 0


@pytest.mark.parametrize("release", [True, False], ids=["held_then_released", "down"])
def test_lanes_held_port_drops_not_stalls(release):
    """Port isolation (model D21): a 2-port lanes build whose port 1 TX takes nothing (held by
    PAUSE/PFC, or down with no shell to discard its frames) while both ports receive. Port 0's
    frames all leave while port 1 is held, equal to the model's; port 1's are dropped and counted
    (PORT.TX_DROP_HELD, as the model counts them while ``tx_held``); after the release the
    workers' RC retransmissions get the dropped results re-emitted on port 1."""
    rng = random.Random(17)
    P = 2
    sc = Scenario(ports=P, lanes=P)
    rm = sc.eng.regmap
    fc = rm.addr("PORT.FC_CTRL", 1)
    value = rm.field("PORT.FC_CTRL.tx_hold").put(sc.eng.bus.read(fc), 5)   # held after 31
    sc.eng.bus.write(fc, value)
    sc.ops.append(("write", fc, value))
    a = sc.add(RingJob(job=0, world=2, window=8, slot_base=0, pmtu=256))   # rank r on port r
    b = sc.add(RingJob(job=1, world=2, window=8, slot_base=8, pmtu=256))   # both on port 0
    sc.eng.tx_held[1] = True
    contrib = {}
    for k in range(5):
        contrib[k] = a.data_bytes(1, k, payload(rng, 10))
        frames = [(0, a.data_bytes(0, k, payload(rng, 10))), (1, contrib[k])]
        frames += [(0, b.data_bytes(r, k, payload(rng, 4 + k))) for r in range(2)]
        rng.shuffle(frames)
        for port, f in frames:
            sc.frame(f, port)
    phase1_p0 = sum(1 for port, _ in sc.expected if port == 0)
    dropped = sc.eng.port_stats.tx_drop_held[1]
    assert dropped == 5 and phase1_p0 == 15
    sc.ops.append(("release", 1, 1500) if release else ("release", 3, 1500))
    if release:
        sc.eng.tx_held[1] = False
        for k in range(5):           # rank 1 never got its results: RC retransmission
            sc.frame(contrib[k], 1)
        for r in range(2):
            sc.frame(a.ack(r, 4), r)
    for r in range(2):
        sc.frame(b.ack(r, 4), 0)
    got, regs = run_rtl(sc, held=(1,))
    # port 0 was not stalled: its phase-1 frames all left while port 1 was held
    assert regs["released"][1 if release else 3] == phase1_p0
    want, have = by_flow(sc.expected), by_flow(got)
    assert want == have
    if release:
        assert sum(1 for port, f in got                          # the re-emits
                   if port == 1 and flow_of(port, f)[-1] == "data") == 5
    # counters: the model's, plus the cut frames that left port 1 with error after the release
    cut = regs["cut"]
    assert all(port == 1 for port, _ in cut) and len(cut) <= 1
    assert len(cut) == (1 if release else 0)
    m32 = (1 << 32) - 1
    g = sc.eng.counters()
    for name, v in regs["global"].items():
        extra = len(cut) if name == "tx_frames" else 0
        assert v == (g[name] + extra) & m32, f"counter {name}: rtl {v}, model {g[name]}"
    for k, got_k in enumerate(regs["ports"]):
        want_k = sc.eng.port_stats.as_dict(k)
        want_k["tx_frames"] += len(cut) if k == 1 else 0
        want_k["tx_bytes"] += sum(len(f) for _, f in cut) if k == 1 else 0
        assert got_k == want_k, f"port {k}: rtl {got_k}, model {want_k}"
    assert regs["ports"][1]["tx_drop_held"] == dropped


@pytest.mark.slow
def test_ack_burst_at_512_bits_does_not_backpressure():
    """At 512 bits an ACK is one beat, so a burst of one ACK per rank (N = 32, all on one port)
    arrives at a frame per cycle while the dispatcher is still a few data frames behind (it
    waits for each frame's verdict and decision): the frames' headers must wait between the
    parser and the dispatcher without stopping the port (``NetReduceEngine.header_frames``).
    Back-to-back PMTU-256 contributions and ACK bursts, the window wrapping: not one cycle of
    backpressure (5 per burst with 4-deep record and 16-deep header FIFOs), outputs equal to
    the model's."""
    rng = random.Random(23)
    sc = Scenario(data_width=512, flows=32, max_world=32, slots=8, pmtu_max=256)
    n, lag = 32, 4
    job = sc.add(RingJob(job=0, world=n, window=8, slot_base=0, pmtu=256))
    for k in range(8):
        for r in range(n):
            sc.frame(job.data_bytes(r, k, rng.randbytes(256)))
        if k >= lag:
            for r in range(n):
                sc.frame(job.ack(r, k - lag))
    got, regs = run_rtl(sc, max_frame=9216)
    check_end_state(sc, regs)
    assert by_flow(got) == by_flow(sc.expected)
    assert regs["in_stalls"] == 0


@pytest.mark.parametrize("seed", [1, 5])
def test_lanes_round_headers_under_output_stalls(seed):
    """Four lanes at 512 bits, one rank per port, every output stalled 90 % of the cycles: the
    round emitter's header queues back up while its rounds go on (a round waits only for
    payload room and header credits), so a credit must come back only for a header a deparser
    took. Returning one whenever a deparser was ready (even facing an empty queue) let the
    credits run past the queue's depth: a header pushed into a full queue was lost and its frame
    went out with the next one's header (62 or 63 frames out of 64 at these seeds). All 64
    results equal the model's."""
    rng = random.Random(4)
    sc = Scenario(ports=4, lanes=4, data_width=512, flows=8, slots=16, max_world=4,
                  pmtu_max=256)
    job = sc.add(RingJob(job=0, world=4, window=16, slot_base=0, pmtu=256))
    for k in range(16):   # within the window: no slot is reused while its results wait
        for r in range(4):
            sc.frame(job.data_bytes(r, k, rng.randbytes(256)), r)
    got = check(sc, stall=0.9, seed=seed, parallel=True)
    assert len(got) == 64
