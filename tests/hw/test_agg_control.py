"""AggControl (netreduce.hw.agg.control) against the reference model, frame by frame.

Every scenario is a list of operations (register writes through the driver's EngineControl, and
frames with their arrival port and time) run on the reference model (sim/model/engine.py) and on
the gateware in the Amaranth simulator. The header records the gateware gets are computed in
Python from the frames (what the parser would deliver; its frame-level verdict uses the model's
own checker). Compared: every decision (disposition counter, action, CNP, first contribution,
slot, index, release flag), the release commands per job, every counter increment summed per job
and engine-wide, and the job / flow status registers at the end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from amaranth.hdl import Module, Value
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator
from netreduce.hw.agg.control import Action, AggControl, FrameError, HdrClass
from netreduce.sim.model.engine import Engine
from netreduce.sim.model.kit import RingJob
from netreduce.sw_driver.control import EngineControl

from netreduce.regmap import DISPOSITIONS, JOB_COUNTERS, Access, Op, build_regmap
from netreduce.wire import ECN_CE, NAK_PSN_SEQ, Opcode, RoceFrame
from netreduce.wire.view import check as _parse

PSN_MASK = (1 << 24) - 1
_ERR = {"icrc": FrameError.ICRC, "ip_checksum": FrameError.IP_CHECKSUM,
        "tver": FrameError.OPCODE, "opcode": FrameError.OPCODE, "truncated": FrameError.LENGTH,
        "ip_length": FrameError.LENGTH, "udp_length": FrameError.LENGTH,
        "padcnt": FrameError.LENGTH}
_ACTION_OF = {"contributions": Action.CONTRIBUTE, "reemits": Action.REEMIT,
              "behind_window": Action.PROBE}


def expected_action(disp: str) -> Action:
    if disp in _ACTION_OF:
        return _ACTION_OF[disp]
    return Action.FORWARD if disp.startswith("fwd_") else Action.DROP


# ---------------------------------------------------------------------------- header records
def header_of(buf: bytes, port: int, time: int) -> dict:
    """The parser's header record of ``buf`` (model step 1 classification, step 3 verdict)."""
    h = dict(cls=HdrClass.NOT_ROCE.value, err=0, src_ip=0, dqpn=0, opcode=0, psn=0, ecn=0,
             syndrome=0, plen=0, port=port, time=time, mark=0)
    n = len(buf)
    if n < 14:
        return h
    l3, et = 14, (buf[12] << 8) | buf[13]
    if et == 0x8100:
        if n < 18:
            return h
        l3, et = 18, (buf[16] << 8) | buf[17]
    u = l3 + 20
    if (et != 0x0800 or n < u + 4 or buf[l3] != 0x45 or buf[l3 + 9] != 17
            or (((buf[l3 + 6] << 8) | buf[l3 + 7]) & 0x3FFF)
            or ((buf[u + 2] << 8) | buf[u + 3]) != 4791):
        return h
    b = u + 8
    if n < b + 12:
        h["cls"] = HdrClass.SHORT.value
        return h
    h.update(cls=HdrClass.ROCE.value, opcode=buf[b], src_ip=int.from_bytes(buf[l3 + 12:l3 + 16]),
             dqpn=int.from_bytes(buf[b + 5:b + 8]), psn=int.from_bytes(buf[b + 9:b + 12]),
             ecn=buf[l3 + 1] & 3, mark=buf[b + 4] & 3)
    p = _parse(buf, l3)
    if isinstance(p, str):
        h["err"] = _ERR[p].value
    else:
        h["plen"] = p.end - p.x if p.info.rc_data else 0  # only read for RC data
        if buf[b] == Opcode.ACK:
            h["syndrome"] = buf[p.x]
    return h


def pack(layout, fields: dict) -> int:
    return sum(int(v) << layout[k].offset for k, v in fields.items())


def unpack(layout, value: int) -> dict:
    return {name: (value >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


# ---------------------------------------------------------------------------- scenario
class RecordingBus:
    """The model's bus; every write is also recorded as an operation for the gateware."""

    def __init__(self, eng: Engine, ops: list):
        self.eng, self.ops = eng, ops

    def read(self, addr: int) -> int:
        return self.eng.bus.read(addr)

    def write(self, addr: int, value: int) -> None:
        self.eng.bus.write(addr, value)
        self.ops.append(("write", addr, value))


@dataclass
class Expect:
    disp: str
    cnp: bool
    first: bool
    released: list  # indices released by this frame
    job: int | None
    index: int | None
    slot: int | None
    result_ports: list  # per released index: the port of each rank's result


@dataclass
class Scenario:
    """Build parameters, a model and the operations run on both."""

    params: dict = field(default_factory=lambda: dict(ports=1, jobs=2, flows=16, slots=64,
                                                      max_world=8))
    ops: list = field(default_factory=list)
    expects: list = field(default_factory=list)

    def __post_init__(self):
        self.eng = Engine(**self.params)
        self.rm = self.eng.regmap
        self.bus = RecordingBus(self.eng, self.ops)
        self.ctl = EngineControl(self.bus)

    def add(self, job: RingJob) -> RingJob:
        self.ctl.add_job(job.config())
        return job

    def _rel(self, j: int) -> int:
        return self.eng.bus.read(self.rm.addr("JOB.RELEASE_PTR", j))

    def frame(self, buf: bytes, port: int = 0, time: int = 0) -> Expect:
        """Run ``buf`` through the model and record what the gateware must decide."""
        eng = self.eng
        before = eng.counters()
        rels = [self._rel(j) for j in range(eng.njobs)]
        busy = [eng.slots_in_use(j) for j in range(eng.njobs)]
        out = eng.receive(port, buf, time)
        after = eng.counters()
        disp = [d for d in DISPOSITIONS if after[d] != before[d]]
        assert len(disp) == 1, disp
        cnp = after["cnp_sent"] != before["cnp_sent"]
        # emits: the frame itself or the re-emit, then N results per released index, then a CNP
        lead = disp[0].startswith("fwd_") or disp[0] in ("behind_window", "reemits")
        result_ports = [e.port for e in out[int(lead):len(out) - int(cnp)]]
        job = index = slot = None
        released = []
        for j in range(eng.njobs):
            r0, r1 = rels[j], self._rel(j)
            if r1 != r0:
                job = j
                released = [(j, (r0 + i) & PSN_MASK) for i in range((r1 - r0) & PSN_MASK)]
        first = any(eng.slots_in_use(j) > busy[j] for j in range(eng.njobs))
        h = header_of(buf, port, time)
        if disp[0] in ("contributions", "duplicates", "reemits", "drop_mismatch"):
            # index and slot of the frame's flow
            for f in eng._fwd.values():
                if (f.fwd == h["src_ip"].to_bytes(4, "big") + h["dqpn"].to_bytes(3, "big")):
                    jb = eng._jobs[f.job]
                    job, index = f.job, (h["psn"] - f.start) & PSN_MASK
                    slot = jb.base + (index & jb.wmask)
        if released:
            n = len(result_ports) // len(released)
            result_ports = [result_ports[i * n:(i + 1) * n] for i in range(len(released))]
        e = Expect(disp[0], cnp, first, released, job, index, slot, result_ports)
        self.ops.append(("frame", h, e))
        return e


# ---------------------------------------------------------------------------- gateware run
class NoSlotForwardAggControl(AggControl):
    """Without slot RAM forwarding: back-to-back headers to a slot read stale state."""

    _no_forwarding = frozenset({"slot"})


class NoCnpForwardAggControl(AggControl):
    """Without CNP time forwarding: back-to-back CE frames of a flow see a stale time."""

    _no_forwarding = frozenset({"cnp"})


class NoAckedForwardAggControl(AggControl):
    """Without acked_f forwarding: back-to-back ACKs of a flow read a stale acked_f."""

    _no_forwarding = frozenset({"acked"})


def flow_entry_value(layout, rw, shadow, rm, e) -> int:
    """Flow entry ``e``'s RW fields, packed in ``layout``, from the register ``shadow``."""
    v = 0
    for r in rm.table("FLOW").registers:
        for inst, f in rw.get(rm.addr(f"FLOW.{r.name}", e), ()):
            reg = layout[inst.reg.name.lower()]
            v |= f.get(shadow[inst.addr]) << (reg.offset + reg.shape[f.name.lower()].offset)
    return v


def pairable(a: dict, b: dict) -> bool:
    """Whether the engine's header arbiter may pair records ``a`` (main) and ``b`` (side): both
    valid ACK/NAKs, from different ports, with different keys (AggControl ``pairs``)."""
    def ack(h):
        return (h["cls"] == HdrClass.ROCE.value and h["err"] == 0 and h["opcode"] == Opcode.ACK
                and (h["syndrome"] >> 5) & 3 != 0b10)
    return (ack(a) and ack(b) and a["port"] != b["port"]
            and (a["src_ip"], a["dqpn"]) != (b["src_ip"], b["dqpn"]))


class Gateware:
    def __init__(self, sc: Scenario, cls=AggControl, **ctl_kw):
        self.sc = sc
        self.dut = cls(build_regmap(**sc.params), **ctl_kw)
        self.pairs = 0  # side records sent
        rm = self.dut.map
        # the register bank's flow RAM (its RW fields), behind the sequencer's read port
        self.flow_ram = Memory(shape=self.dut.flow_cfg_layout, depth=self.dut.flows, init=[])
        # RW shadow of the register bank (what its cfg outputs show)
        self.shadow: dict[int, int] = {}
        self.rw: dict[int, tuple] = {}
        for inst in rm.instances():
            if inst.table.name not in ("JOB", "FLOW"):
                continue
            for f in inst.reg.fields:
                if f.access == Access.RW:
                    self.rw.setdefault(inst.addr, []).append((inst, f))
                    self.shadow[inst.addr] = self.shadow.get(inst.addr, 0) | (f.reset << f.lsb)

    def _apply(self, ctx, addr: int, value: int):
        self.shadow[addr] = value
        for inst, f in self.rw.get(addr, ()):
            if inst.table.name == "JOB":
                ctx.set(self.dut.job_cfg[inst.index][inst.reg.name.lower()][f.name.lower()],
                        f.get(value))
            else:
                ctx.set(Value.cast(self.flow_ram.data[inst.index]),
                        flow_entry_value(self.dut.flow_cfg_layout, self.rw, self.shadow,
                                         self.dut.map, inst.index))

    def run(self, gap=0.0, stall=0.0, seed=0, overlap=False, pair=0.0):
        """Run every operation; ``gap``/``stall``: probability of an idle input cycle / of
        ``dec.ready`` low; ``overlap``: do not wait for the enable sequencer after a JOB.CTRL
        write (frames keep flowing; the scenario waits with a ``("sync",)`` operation);
        ``pair``: probability that a frame and the next one, if :func:`pairable`, go in the
        same cycle as main and side record (``pairs`` builds)."""
        dut, sc = self.dut, self.sc
        rng = random.Random(seed)
        jobs = sc.params["jobs"]
        dec_lay, hdr_lay, rel_lay = dut.dec_layout, dut.hdr_layout, dut.rel_layout
        inc_lay = dut.job_inc_layout
        ginc_lay = dut.cnt_inc_layout
        self.decisions, self.releases = [], []
        self.stalls = 0  # cycles a header waited for hdr.ready
        self.mismatch = [0] * jobs  # JOB.STATUS.mismatch set strobes seen
        self.cnt = [dict.fromkeys(inc_lay.members, 0) for _ in range(jobs)]
        self.gcnt = dict.fromkeys(ginc_lay.members, 0)
        frames = [op for op in sc.ops if op[0] == "frame"]
        inc_vals = [Value.cast(dut.job_cnt_inc[j]) for j in range(jobs)]
        ginc_val = Value.cast(dut.cnt_inc)
        paired = getattr(dut, "pairs", False)

        async def bench(ctx):
            ctx.set(dut.rel.ready, 1)
            ctx.set(dut.dec.ready, 1)

            async def cycle():
                """Sample the outputs of this cycle, then clock."""
                if ctx.get(dut.dec.valid) and ctx.get(dut.dec.ready):
                    self.decisions.append(unpack(dec_lay, ctx.get(Value.cast(dut.dec.payload))))
                    if paired and ctx.get(dut.dec2.v):
                        self.decisions.append(unpack(dec_lay, ctx.get(Value.cast(dut.dec2.d))))
                if ctx.get(dut.rel.valid):
                    r = unpack(rel_lay, ctx.get(Value.cast(dut.rel.payload)))
                    # decisions output so far (one or two may wait in the output register)
                    r["_seen"] = len(self.decisions) + ctx.get(dut.dec.valid) * (
                        1 + (paired and ctx.get(dut.dec2.v)))
                    self.releases.append(r)
                for j in range(jobs):
                    self.mismatch[j] |= ctx.get(dut.job_set[j].status.mismatch)
                    v = ctx.get(inc_vals[j])
                    if v:
                        for k, x in unpack(inc_lay, v).items():
                            self.cnt[j][k] += x
                v = ctx.get(ginc_val)
                if v:
                    for k, x in unpack(ginc_lay, v).items():
                        self.gcnt[k] += x
                await ctx.tick()
                # inputs of the next cycle (hdr.ready depends on dec.ready combinationally)
                ctx.set(dut.dec.ready, int(rng.random() >= stall))

            async def drain(n_dec):
                ctx.set(dut.hdr.valid, 0)
                for _ in range(4):  # a register write reaches the sequencer after 2 cycles
                    await cycle()
                for _ in range(10_000):
                    if len(self.decisions) >= n_dec and not ctx.get(dut.busy):
                        break
                    await cycle()
                else:
                    raise AssertionError("gateware did not drain")
                for _ in range(12):  # background operations (chains, free_j) settle
                    await cycle()

            sent = drained = 0
            ops = list(sc.ops)
            ctrl = {sc.rm.addr("JOB.CTRL", j) for j in range(jobs)}
            status_addr = [sc.rm.addr("JOB.STATUS", j) for j in range(jobs)]
            mismatch_mask = sc.rm.field("JOB.STATUS.mismatch").mask
            i = 0
            while i < len(ops):
                op = ops[i]
                i += 1
                if op[0] == "write":
                    # the model applies a write between two frames: let earlier frames finish
                    if sent != drained:
                        await drain(sent)
                        drained = sent
                    _, addr, value = op
                    self._apply(ctx, addr, value)
                    for j in range(jobs):  # the bank's W1C flag: a write of 1 clears it
                        if addr == status_addr[j] and value & mismatch_mask:
                            self.mismatch[j] = 0
                    await cycle()
                    if addr in ctrl and not overlap:  # wait for the enable sequencer
                        await drain(sent)
                    continue
                if op[0] == "sync":
                    await drain(sent)
                    drained = sent
                    continue
                h = op[1]
                while rng.random() < gap:
                    ctx.set(dut.hdr.valid, 0)
                    await cycle()
                ctx.set(dut.hdr.valid, 1)
                rec = pack(hdr_lay, h)
                side = None
                if (paired and i < len(ops) and ops[i][0] == "frame"
                        and pairable(h, ops[i][1]) and rng.random() < pair):
                    side = ops[i][1]
                    i += 1
                    self.pairs += 1
                    sl = dut.side_layout
                    rec |= pack(sl, {"v": 1, **{k: side[k] for k, _ in sl if k != "v"}}) \
                        << hdr_lay["side"].offset
                ctx.set(Value.cast(dut.hdr.payload), rec)
                while not ctx.get(dut.hdr.ready):
                    self.stalls += 1
                    await cycle()
                await cycle()
                sent += 1 + (side is not None)
            await drain(sent)
            self.status = {
                "job": [unpack(dut.job_status_layout, ctx.get(Value.cast(dut.job_status[j])))
                        for j in range(jobs)],
                "flow": [unpack(dut.flow_status_layout,
                                ctx.get(Value.cast(dut.flow_status[e])))
                         for e in range(sc.params["flows"])],
            }

        top = Module()
        top.submodules.dut = dut
        top.submodules.flow_ram = self.flow_ram
        rp = self.flow_ram.read_port()
        top.d.comb += [rp.addr.eq(dut.flow_rd.addr), dut.flow_rd.data.eq(rp.data)]
        sim = Simulator(top)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        assert len(self.decisions) == len(frames)
        return self


# decisions made but not yet on ``dec``: two in the fast-retransmit stages after the decision
# stage, two in AggControl's dec skid buffer
DEC_SKID = 4


def check(sc: Scenario, cls=AggControl, ctl_kw=None, **run_kw) -> Gateware:
    """Run ``sc`` on the gateware (built with ``ctl_kw``) and compare everything with the
    model."""
    gw = Gateware(sc, cls, **(ctl_kw or {})).run(**run_kw)
    skid = DEC_SKID * (2 if gw.dut.pairs else 1)
    frames = [op for op in sc.ops if op[0] == "frame"]
    disp_names = list(DISPOSITIONS)
    want_rel: dict[int, list] = {}
    released_by: dict[tuple[int, int], list] = {}  # (job, index) -> frames that released it
    for i, ((_, h, e), d) in enumerate(zip(frames, gw.decisions, strict=True)):
        got = disp_names[d["disp"]]
        ctx = f"frame {i}: header {h}"
        assert got == e.disp, f"{ctx}: disposition {got}, model {e.disp}"
        assert Action(d["action"]) == expected_action(e.disp), ctx
        assert d["cnp"] == e.cnp, f"{ctx}: cnp {d['cnp']}, model {e.cnp}"
        if e.disp == "contributions":
            assert d["overwrite"] == e.first, f"{ctx}: overwrite {d['overwrite']}"
        if e.index is not None:
            assert (d["job"], d["index"], d["slot"]) == (e.job, e.index, e.slot), ctx
        assert d["release"] == bool(e.released), f"{ctx}: release {d['release']} {e.released}"
        for (j, k), ports in zip(e.released, e.result_ports, strict=True):
            want_rel.setdefault(j, []).append((k, ports))
            released_by.setdefault((j, k), []).append(i)
    got_rel: dict[int, list] = {}
    pb = max(1, (sc.params["ports"] - 1).bit_length())
    for r in gw.releases:
        ports = [(r.get("ports", 0) >> (pb * i)) & ((1 << pb) - 1) for i in range(r["n"])]
        got_rel.setdefault(r["job"], []).append((r["index"], ports))
        # seq orders the release among the decisions: after the one that released it, and no
        # later than the decisions output when the command appeared, plus the ones between the
        # decision stage and ``dec`` (DEC_SKID) while the command is already out
        i = released_by[r["job"], r["index"]].pop(0)
        assert i + 1 <= r["seq"] <= r["_seen"] + skid, (r, i)
    assert got_rel == want_rel
    # counters
    for j in range(sc.params["jobs"]):
        want = sc.eng.counters(j)
        got = {c.name: gw.cnt[j][c.name] for c in JOB_COUNTERS if c.name != "saturations"}
        assert got == {k: want[k] for k in got}, f"job {j} counters"
    want = sc.eng.counters()
    for k, v in gw.gcnt.items():
        assert v == want[k], f"global counter {k}: {v}, model {want[k]}"
    # status registers
    rm = sc.rm
    for j in range(sc.params["jobs"]):
        st = gw.status["job"][j]
        v = sc.eng.bus.read(rm.addr("JOB.STATUS", j))
        assert st["status"] & 1 == rm.field("JOB.STATUS.enabled").get(v), f"job {j} enabled"
        assert st["status"] >> 1 == rm.field("JOB.STATUS.error").get(v), f"job {j} error"
        assert gw.mismatch[j] == rm.field("JOB.STATUS.mismatch").get(v), f"job {j} mismatch"
        for reg in ("free_ptr", "release_ptr", "slots_busy"):
            assert st[reg] == sc.eng.bus.read(rm.addr(f"JOB.{reg.upper()}", j)), f"job {j} {reg}"
    for e in range(sc.params["flows"]):
        st = gw.status["flow"][e]
        assert st["acked"] == sc.eng.bus.read(rm.addr("FLOW.ACKED", e)), f"flow {e} acked"
        assert st["status"] == sc.eng.bus.read(rm.addr("FLOW.STATUS", e)), f"flow {e} bound"
    return gw


def payload(rng, n=16):
    return [rng.randrange(-1000, 1000) for _ in range(n)]


# ---------------------------------------------------------------------------- tests
def back_to_back_scenario() -> Scenario:
    sc = Scenario()
    rng = random.Random(1)
    job = sc.add(RingJob(job=0, world=3, window=8, slot_base=0))
    for k in range(10):
        for r in (2, 0, 1):
            sc.frame(job.data_bytes(r, k, payload(rng)))
        for r in range(3):
            sc.frame(job.ack(r, k))
    return sc


def test_contributions_release_in_order():
    gw = check(back_to_back_scenario())
    assert len(gw.releases) == 10


def test_one_header_per_cycle():
    """Back-to-back headers (every rank's contribution to one slot in consecutive cycles, then
    all the ACKs) are taken one per cycle, and decided as the model does."""
    sc = Scenario()
    rng = random.Random(9)
    job = sc.add(RingJob(job=0, world=4, window=16, slot_base=16))
    for k in range(12):
        for r in (3, 1, 0, 2):
            sc.frame(job.data_bytes(r, k, payload(rng)))
    for k in range(12):
        for r in range(4):
            sc.frame(job.ack(r, k))
    gw = check(sc)
    assert gw.stalls == 0
    assert len(gw.releases) == 12 and gw.cnt[0]["freed"] == 12


def test_data_after_acks_does_not_wait():
    """The all-reduce's steady state: each index's contributions, then the ACKs of the index a
    half window back, all back to back. A contribution right behind ACKs that move free_j is
    within the window either way, so it is decided without waiting for free_j (one header per
    cycle), as the model decides it; a wrapped window's first contributions do wait (the
    ``ahead`` check needs the new free_j: ``test_ack_nak_freeing_and_stale``)."""
    sc = Scenario()
    rng = random.Random(17)
    job = sc.add(RingJob(job=0, world=4, window=8, slot_base=8))
    for k in range(24):
        for r in range(4):
            sc.frame(job.data_bytes(r, k, payload(rng)))
        if k >= 4:
            for r in (2, 0, 3, 1):
                sc.frame(job.ack(r, k - 4))
    gw = check(sc)
    assert gw.stalls == 0
    assert len(gw.releases) == 24 and gw.cnt[0]["freed"] == 20


@pytest.mark.parametrize("scenario", ["slots", "acks", "cnp"])
def test_without_forwarding_back_to_back_fails(scenario):
    """Back-to-back contributions to one slot / ACKs or CE frames of one flow need the
    forwarding: without it the comparison with the model fails."""
    sc, cls = {"slots": (back_to_back_scenario, NoSlotForwardAggControl),
               "acks": (ack_scenario, NoAckedForwardAggControl),
               "cnp": (cnp_scenario, NoCnpForwardAggControl)}[scenario]
    with pytest.raises(AssertionError):
        check(sc(), cls)



# ---------------------------------------------------------------------------- frame mutations
def _l3(buf: bytes) -> int:
    return 18 if buf[12:14] == b"\x81\x00" else 14


def bad_icrc(buf: bytes) -> bytes:
    b = bytearray(buf)
    b[-1] ^= 0xFF
    return bytes(b)


def bad_ip_checksum(buf: bytes) -> bytes:
    b = bytearray(buf)
    b[_l3(buf) + 10] ^= 0x01
    return bytes(b)


def truncated(buf: bytes) -> bytes:
    return buf[:-4]


def bad_tver(buf: bytes) -> bytes:
    b = bytearray(buf)
    b[_l3(buf) + 28 + 1] |= 0x01
    return bytes(b)


def unknown_opcode(buf: bytes) -> bytes:
    b = bytearray(buf)
    b[_l3(buf) + 28] = 0x15
    return bytes(b)


MUTATIONS = (bad_icrc, bad_ip_checksum, truncated, bad_tver, unknown_opcode)

NOT_ROCE = bytes(12) + b"\x08\x06" + bytes(46)  # ARP


def unregistered(job: RingJob, rng) -> bytes:
    return RoceFrame(opcode=Opcode.WRITE_ONLY, dqpn=0x777, psn=5, payload=bytes(16),
                     src_ip=0x0B000001 + rng.randrange(100)).pack()


def short_roce(job: RingJob) -> bytes:
    b = job.data_bytes(0, 0, bytes(16))
    l3 = _l3(b)
    return b[:l3 + 28 + 8]  # ends inside the BTH: the IPv4 length check is the parser's job


# ---------------------------------------------------------------------------- directed tests
def test_duplicates_reemits_and_back_to_back():
    """Duplicates of FILLING and COMPLETE slots, re-emits of RELEASED ones, back to back."""
    sc = Scenario()
    rng = random.Random(2)
    job = sc.add(RingJob(job=1, world=2, window=4, slot_base=8))
    p = [payload(rng) for _ in range(4)]
    sc.frame(job.data_bytes(0, 0, p[0]))
    sc.frame(job.data_bytes(0, 0, p[0]))  # duplicate while FILLING
    sc.frame(job.data_bytes(1, 1, p[1]))
    sc.frame(job.data_bytes(0, 1, p[1]))  # index 1 COMPLETE, not released (0 is open)
    sc.frame(job.data_bytes(1, 1, p[1]))  # duplicate while COMPLETE
    sc.frame(job.data_bytes(1, 0, p[0]))  # completes 0: releases 0 and 1 (chain)
    sc.frame(job.data_bytes(1, 1, p[1]))  # re-emit right behind the chained release
    sc.frame(job.data_bytes(0, 0, p[0]))  # re-emit
    for k in (2, 3):
        sc.frame(job.data_bytes(0, k, p[k]))
        sc.frame(job.data_bytes(1, k, p[k]))
        sc.frame(job.data_bytes(1, k, p[k]))
    check(sc)


def test_window_ahead_behind_with_psn_wrap():
    sc = Scenario()
    rng = random.Random(3)
    job = sc.add(RingJob(job=0, world=2, window=4, slot_base=0,
                         start_psns=[PSN_MASK - 2, PSN_MASK - 5]))
    for k in range(6):
        sc.frame(job.data_bytes(0, k, payload(rng)))  # 4 and 5 are ahead of the window
    for k in range(3):
        sc.frame(job.data_bytes(1, k, payload(rng)))
    for r in range(2):
        sc.frame(job.ack(r, 1))  # frees 0 and 1
    sc.frame(job.data_bytes(0, 0, payload(rng)))  # behind the window
    sc.frame(job.data_bytes(1, 1, payload(rng)))  # behind the window
    sc.frame(job.data_bytes(0, 4, payload(rng)))  # now inside
    sc.frame(job.data_bytes(0, 6, payload(rng)))  # ahead
    sc.frame(job.data_bytes(0, (1 << 23) + 3, payload(rng)))  # far ahead: behind (signed)
    check(sc)


def test_checks_priority_mismatch_and_isolation():
    """Every drop reason, the mismatch flag, and two jobs that never touch each other."""
    sc = Scenario(params=dict(ports=1, jobs=2, flows=16, slots=64, max_world=8))
    rng = random.Random(4)
    a = sc.add(RingJob(job=0, world=3, window=8, slot_base=0, pmtu=256))
    b = sc.add(RingJob(job=1, world=2, window=8, slot_base=8, pmtu=512))
    for mut in MUTATIONS:
        sc.frame(mut(a.data_bytes(0, 0, payload(rng))))
    sc.frame(a.data_bytes(0, 0, bytes(512)))  # above PMTU 256
    sc.frame(b.data_bytes(0, 0, bytes(512)))  # fine for job 1
    sc.frame(a.data_bytes(0, 0, bytes(6)))  # not a multiple of 4
    sc.frame(a.data(0, 0, bytes(16), opcode=Opcode.UC_WRITE_ONLY).pack())  # UC on a fwd key
    sc.frame(a.data_bytes(1, 0, payload(rng)))
    sc.frame(a.data_bytes(2, 0, payload(rng, 8)))  # length mismatch
    sc.frame(a.data(2, 0, payload(rng), opcode=Opcode.SEND_ONLY).pack())  # opcode mismatch
    sc.frame(a.data_bytes(2, 0, payload(rng)))
    sc.frame(a.data_bytes(0, 0, payload(rng)))
    sc.frame(b.data_bytes(1, 0, bytes(512)))
    sc.frame(NOT_ROCE)
    sc.frame(unregistered(a, rng))
    sc.frame(short_roce(a))
    sc.frame(a.receiver_cnp(1))
    sc.frame(bad_icrc(a.ack(0, 0)))
    sc.frame(a.ack(0, 0, syndrome=0x40))  # reserved syndrome class
    gw = check(sc)
    assert gw.cnt[0]["drop_mismatch"] == 2 and gw.cnt[1]["contributions"] == 2


def test_ack_nak_freeing_and_stale():
    check(ack_scenario())


def ack_scenario() -> Scenario:
    sc = Scenario()
    rng = random.Random(5)
    job = sc.add(RingJob(job=0, world=3, window=4, slot_base=4))
    for k in range(4):
        for r in range(3):
            sc.frame(job.data_bytes(r, k, payload(rng)))
    sc.frame(job.ack(0, 5))  # beyond rel: stale
    sc.frame(job.ack(0, 1))
    sc.frame(job.ack(0, 0))  # not ahead: stale
    sc.frame(job.ack(1, 2, nak=True))  # acks 0, 1
    sc.frame(job.ack(2, 3))
    sc.frame(job.ack(2, 2, syndrome=NAK_PSN_SEQ))  # stale
    sc.frame(job.ack(0, 3))
    sc.frame(job.ack(1, 3))  # free_j jumps to 4
    for r in range(3):
        sc.frame(job.data_bytes(r, 4, payload(rng)))  # reuses slot 4 (new generation)
    sc.frame(job.data_bytes(0, 3, payload(rng)))  # behind
    return sc


def test_cnp_rate_limit():
    gw = check(cnp_scenario())
    assert gw.cnt[0]["cnp_sent"] > 2 and gw.cnt[0]["cnp_suppressed"] > 2


def cnp_scenario() -> Scenario:
    sc = Scenario()
    rng = random.Random(6)
    job = sc.add(RingJob(job=0, world=2, window=8, slot_base=0, cnp_interval=100))
    t = 1000
    for k, dt in enumerate((0, 50, 99, 100, 30, 500, 0)):
        t += dt
        sc.frame(job.data_bytes(0, k, payload(rng), ecn=ECN_CE), time=t)
        sc.frame(job.data_bytes(1, k, payload(rng), ecn=ECN_CE), time=t + 1)
    sc.frame(job.data_bytes(0, 1, payload(rng), ecn=ECN_CE), time=t + 1000)  # duplicate: CNP
    sc.frame(job.data_bytes(0, 0, payload(rng), ecn=ECN_CE), time=t - 5000)  # earlier: inside
    sc.frame(job.data_bytes(1, 0, payload(rng), ecn=ECN_CE), time=t + 5000)  # back to back:
    sc.frame(job.data_bytes(1, 1, payload(rng), ecn=ECN_CE), time=t + 5001)  # suppressed
    return sc


def test_enable_refusals_and_disable():
    """Config errors (model D9) and a disable discarding in-flight state."""
    sc = Scenario(params=dict(ports=1, jobs=3, flows=16, slots=64, max_world=8))
    rng = random.Random(7)
    rm = sc.rm
    a = sc.add(RingJob(job=0, world=2, window=8, slot_base=0))
    sc.frame(a.data_bytes(0, 0, payload(rng)))

    def enable(j, **regs):
        for name, v in regs.items():
            sc.bus.write(rm.addr(f"JOB.{name.upper()}", j), v)
        sc.bus.write(rm.addr("JOB.CTRL", j), 0)
        sc.bus.write(rm.addr("JOB.CTRL", j), 1)

    good = dict(world=2, window=8, slot_base=16, pmtu=1024, op=int(Op.MAX))
    # flow entries for job 2 (ranks 0, 1) in entries 8, 9
    b = RingJob(job=2, world=2, window=8, slot_base=16, op=Op.MAX)
    for e, r in ((8, 0), (9, 1)):
        f = b.config().flows[r]
        for reg, v in (("FWD_IP", f.fwd_ip), ("FWD_QPN", f.fwd_qpn), ("REV_IP", f.rev_ip),
                       ("REV_QPN", f.rev_qpn), ("START_PSN", f.start_psn)):
            sc.bus.write(rm.addr(f"FLOW.{reg}", e), v)
        sc.bus.write(rm.addr("FLOW.CFG", e), 1 | (2 << 8) | (r << 16))
    for bad in (dict(world=0), dict(world=9), dict(window=6), dict(slot_base=60),
                dict(slot_base=4), dict(pmtu=1000), dict(op=3), dict(world=3)):
        enable(2, **{**good, **bad})
    sc.bus.write(rm.addr("FLOW.FWD_IP", 9), a.ip(0))  # key conflict with job 0 rank 0
    sc.bus.write(rm.addr("FLOW.FWD_QPN", 9), a.rq(1))
    enable(2, **good)
    sc.bus.write(rm.addr("FLOW.FWD_IP", 9), b.ip(1))
    sc.bus.write(rm.addr("FLOW.FWD_QPN", 9), b.rq(0))
    enable(2, **good)
    sc.frame(b.data_bytes(0, 0, payload(rng)))
    sc.frame(b.data_bytes(1, 0, payload(rng)))
    sc.frame(a.data_bytes(1, 0, payload(rng)))
    sc.frame(a.data_bytes(0, 1, payload(rng)))
    sc.ctl.remove_job(0)  # discards index 1 in flight
    sc.frame(a.data_bytes(1, 1, payload(rng)))  # unregistered now
    sc.add(a)
    sc.frame(a.data_bytes(1, 0, payload(rng)))  # index 0 again, empty slot
    sc.frame(a.data_bytes(0, 0, payload(rng)))
    check(sc)


# ---------------------------------------------------------------------------- randomised
def random_traffic(sc: Scenario, jobs: list[RingJob], rng: random.Random, n_frames: int,
                   ports: int = 1):
    nxt = {(j.job, r): 0 for j in jobs for r in range(j.world)}
    t = 0
    for _ in range(n_frames):
        t += rng.choice((0, 1, 3, 40, 200))
        job = rng.choice(jobs)
        st = sc.eng.job_state(job.job)
        free, rel = st["free"], st["rel"]
        r = rng.randrange(job.world)
        port = rng.randrange(ports)
        x = rng.random()
        if x < 0.55:
            k = nxt[(job.job, r)]
            if (k - free) & PSN_MASK < job.window or rng.random() < 0.05:
                nxt[(job.job, r)] = (k + 1) & PSN_MASK
            else:
                k = (free + rng.randrange(job.window)) & PSN_MASK
        elif x < 0.7:
            k = (free + rng.randrange(-3, job.window + 3)) & PSN_MASK
        else:
            k = None
        if k is not None:
            n = rng.choice((16, 16, 16, 8)) if rng.random() < 0.05 else 16
            kw = {}
            if rng.random() < 0.05:
                kw["opcode"] = rng.choice((Opcode.SEND_ONLY, Opcode.WRITE_LAST))
            buf = job.data(r, k, [(k * 7 + r + i) & 0xFF for i in range(n)],
                           ecn=ECN_CE if rng.random() < 0.3 else 0, **kw).pack()
            if rng.random() < 0.05:
                buf = rng.choice(MUTATIONS)(buf)
            sc.frame(buf, port, t)
            continue
        y = rng.random()
        if y < 0.8:
            k = (rel - rng.randrange(0, 4) + (rng.random() < 0.1)) & PSN_MASK
            kind = rng.random()
            if kind < 0.7:
                buf = job.ack(r, (k - 1) & PSN_MASK)
            elif kind < 0.95:
                buf = job.ack(r, k, nak=True)
            else:
                buf = job.ack(r, k, syndrome=0x40)
        elif y < 0.87:
            buf = job.receiver_cnp(r)
        elif y < 0.94:
            buf = NOT_ROCE
        else:
            buf = unregistered(job, rng)
        sc.frame(buf, port, t)


@pytest.mark.parametrize("world", range(2, 9))
def test_random_against_model(world):
    rng = random.Random(100 + world)
    ports = 2 if world in (3, 8) else 1
    sc = Scenario(params=dict(ports=ports, jobs=2, flows=16, slots=64, max_world=8))
    wrap = PSN_MASK - 20
    a = sc.add(RingJob(job=0, world=world, window=8, slot_base=0, cnp_interval=300,
                       start_psns=[(wrap + 7 * r) & PSN_MASK for r in range(world)]))
    b = sc.add(RingJob(job=1, world=2, window=4, slot_base=32, cnp_interval=50))
    random_traffic(sc, [a, b], rng, 300, ports)
    check(sc, gap=0.2 if world % 2 else 0.0, stall=0.2 if world > 4 else 0.0, seed=world)


def test_brief_minimum_parameters():
    """flows = 256, slots = 1024, max_world = 32, jobs = 8: a short mixed run of a 32-rank and
    a 4-rank job."""
    sc = Scenario(params=dict(ports=1, jobs=8, flows=256, slots=1024, max_world=32))
    a = sc.add(RingJob(job=3, world=32, window=16, slot_base=512))
    b = sc.add(RingJob(job=7, world=4, window=8, slot_base=8))
    random_traffic(sc, [a, b], random.Random(11), 80)
    gw = check(sc)
    assert gw.cnt[3]["contributions"] > 10


def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match="time_bits"):
        AggControl(time_bits=32)


def test_parser_adapter_matches_model_classification():
    """The real parser's record + verdict, through ParserAdapter, give the header records the
    model's classification implies (header_of), for good, corrupt, truncated and tagged frames."""
    from netreduce.hw.agg.control import ParserAdapter, rocev2_record
    from netreduce.hw.packet.testing import run_parser

    rng = random.Random(12)
    frames = []
    for vlan in (None, 5):
        job = RingJob(job=0, world=2, vlan_tci=vlan)
        full = job.data_bytes(0, 3, payload(rng))
        frames += [full[:n] for n in (10, 13, 16, 20, 37, 38, 41, 42, 45, 54, 60, 70)]
        frames += [job.data_bytes(1, 2, bytes(6)), job.data(1, 4, payload(rng), ecn=ECN_CE).pack(),
                   job.ack(0, 1), job.ack(1, 7, nak=True), job.receiver_cnp(0), NOT_ROCE,
                   job.data(0, 1, bytes(16), opcode=Opcode.UC_SEND_ONLY).pack()]
        frames += [mut(job.data_bytes(1, 9, payload(rng))) for mut in MUTATIONS]
        frames += [bad_icrc(job.ack(0, 2))]
    res = run_parser(512, frames)
    dut = AggControl(build_regmap(jobs=1, flows=2, slots=8, max_world=2))
    dut._MustUse__silence = True  # built for its header layout only
    ad = ParserAdapter(dut.hdr_layout)
    top = Module()  # the classification computed from the record, as the engine stores it
    top.submodules.ad = ad
    top.d.comb += ad.roce.eq(rocev2_record(ad.rec))
    got = []

    async def bench(ctx):
        for rec, verdict in zip(res["hdr"], res["verdict"], strict=True):
            ctx.set(ad.rec, rec)
            ctx.set(ad.verdict, verdict)
            ctx.set(ad.port, 1)
            ctx.set(ad.time, 77)
            got.append(unpack(dut.hdr_layout, ctx.get(Value.cast(ad.hdr))))

    sim = Simulator(top)
    sim.add_testbench(bench)
    sim.run()
    checked = 0
    for f, g in zip(frames, got, strict=True):
        want = header_of(f, 1, 77)
        if want["cls"] != HdrClass.ROCE.value:  # only the class matters (D10)
            assert g["cls"] == want["cls"], (f.hex(), g, want)
            continue
        if want["err"]:  # a dropped frame: only the verdict and the lookup key matter
            keep = ("cls", "err", "src_ip", "dqpn", "opcode")
            want, g = {k: want[k] for k in keep}, {k: g[k] for k in keep}
        elif want["opcode"] != Opcode.ACK:
            g["syndrome"] = want["syndrome"]  # only read for ACKs
        assert g == want, f.hex()
        checked += 1
    assert checked > 10


def test_register_bank_layouts_match():
    """job_cfg / job_status / flow_status / job_set / job_cnt_inc have the register bank's
    shapes, so the core connects them with ``.eq`` (the bank built with cnt_width); flow_rd is
    the bank's flow RAM read port, connected with ``wiring.connect``."""
    from netreduce.hw.csr import RegisterBank

    rm = build_regmap(jobs=2, flows=4, slots=64, max_world=8)
    ctl = AggControl(rm)
    bank = RegisterBank(rm, inc_width=ctl.cnt_width)
    for name in ("job_cfg", "job_status", "flow_status", "job_set", "job_cnt_inc"):
        assert (ctl.signature.members[name].shape == bank.signature.members[name].shape), name
    assert ctl.flow_rd.signature == bank.flow_rd.signature.flip()
    bank_g = bank.signature.members["cnt_inc"].shape
    for name, f in ctl.cnt_inc_layout:
        assert bank_g[name].shape == f.shape, name
    ctl._MustUse__silence = bank._MustUse__silence = True  # built for their signatures only


def test_enable_overlaps_traffic():
    """Job 1 is enabled (flow scan, slot clearing) while job 0's contributions stream back to
    back: the clearing shares the slot RAM write port without changing any decision."""
    sc = Scenario(params=dict(ports=1, jobs=2, flows=16, slots=64, max_world=8))
    rng = random.Random(13)
    a = sc.add(RingJob(job=0, world=4, window=16, slot_base=0))
    sc.ops.append(("sync",))
    for k in range(4):
        for r in range(4):
            sc.frame(a.data_bytes(r, k, payload(rng)))
    b = RingJob(job=1, world=2, window=32, slot_base=32)
    sc.add(b)
    for k in range(4, 16):
        for r in range(4):
            sc.frame(a.data_bytes(r, k, payload(rng)))
    sc.ops.append(("sync",))
    for k in range(3):
        for r in range(2):
            sc.frame(b.data_bytes(r, k, payload(rng)))
    gw = check(sc, overlap=True)
    assert gw.stalls > 0  # the clearing took some of job 0's write cycles


def test_flow_roles_are_refused():
    """A build without flow roles (model D17, spine-leaf; the default) refuses a leaf job with
    ROLES instead of aggregating it as if its roles were MEMBER; a plain job next to it runs
    (builds with roles: tests/hw/test_agg_roles.py)."""
    from netreduce.regmap import JobError, Role

    sc = Scenario()
    job = RingJob(job=0, world=3, window=8)
    cfg = job.config()
    cfg.flows[1].role, cfg.flows[2].role = Role.UP, Role.DOWN
    sc.ctl.add_job(cfg)  # the model runs it
    sc.add(RingJob(job=1, world=2, window=8, slot_base=8))
    gw = Gateware(sc).run()
    st = [j["status"] for j in gw.status["job"]]  # the RO fields packed: enabled, error
    assert st[0] == JobError.ROLES << 1, st
    assert st[1] == 1, st
    assert sc.eng.job_state(0) is not None  # where the model runs the leaf job
