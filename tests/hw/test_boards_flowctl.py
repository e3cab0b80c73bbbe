"""The shell's per-port flow control wiring (hw/boards/flowctl.py): the PORT.FC_* registers reach
the PFC generator and the CE marker, and the RX FIFO's level drives both (one clock for both
domains here; the crossings are Amaranth's synchronisers)."""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator
from netreduce.hw.boards.flowctl import attach_flow_control
from netreduce.hw.boards.framefifo import FrameFifo
from netreduce.hw.csr.bank import RegisterBank
from netreduce.hw.ports import SHELL_LAYOUT, fc_layout
from netreduce.hw.stream import beat_signature

from netreduce.regmap import build_regmap
from netreduce.wire import ECN_CE, ECN_ECT0, Opcode, RoceFrame
from netreduce.wire.linklocal import LinkLocal, classify

W = 64
NB = W // 8


def test_registers_reach_pfc_and_marking():
    bank = RegisterBank(build_regmap(ports=1, data_width=W, jobs=1, flows=4, slots=8))
    bank._MustUse__silence = True  # for its layout only
    fc = Signal(fc_layout(bank))
    st = Signal(SHELL_LAYOUT)
    m = Module()
    m.submodules.rx_fifo = rx_fifo = FrameFifo(W, 64, drop_when_full=True)
    src = wiring.Signature({"tx": wiring.Out(beat_signature(W)),
                            "rx": wiring.Out(beat_signature(W))}).create()
    m.d.comb += rx_fifo.o.ready.eq(0)   # the core never drains: the FIFO fills
    tx, rx = attach_flow_control(m, k=0, width=W, dom="sync", core_dom="sync", rx_fifo=rx_fifo,
                                 tx_out=src.tx, rx_in=src.rx, fc=fc, st=st)
    frame = RoceFrame(opcode=Opcode.ACK, dqpn=5, psn=1, tos=ECN_ECT0).pack()
    got_tx, got_rx, congested, xoff = [], [], [], []

    async def config_and_fill(ctx):
        ctx.set(fc.fc_ctrl.pfc_enable, 1)
        ctx.set(fc.fc_ctrl.ecn_enable, 1)
        ctx.set(fc.fc_ctrl.priority, 6)
        ctx.set(fc.fc_ctrl.quanta, 0x0040)
        ctx.set(fc.fc_xoff.bytes, 256)   # 32 beats
        ctx.set(fc.fc_xon.bytes, 128)
        ctx.set(fc.fc_ecn.bytes, 192)    # 24 beats
        for _ in range(10):
            await ctx.tick()
        ctx.set(rx_fifo.i.valid, 1)      # 40 beats of one long frame: past ECN and XOFF
        for _ in range(40):
            await ctx.tick()
        ctx.set(rx_fifo.i.valid, 0)

    async def core_side(ctx):
        beats = [frame[k:k + NB] for k in range(0, len(frame), NB)]
        for _ in range(8):               # an ECT frame every 12 cycles on the core side
            for k, b in enumerate(beats):
                ctx.set(src.rx.payload.data, int.from_bytes(b.ljust(NB, b"\0"), "little"))
                ctx.set(src.rx.payload.keep, (1 << len(b)) - 1)
                ctx.set(src.rx.payload.last, k == len(beats) - 1)
                ctx.set(src.rx.valid, 1)
                await ctx.tick()
            ctx.set(src.rx.valid, 0)
            congested.append(ctx.get(st.congested))
            for _ in range(12 - len(beats)):
                await ctx.tick()
        xoff.append(ctx.get(st.xoff))

    async def sink(ctx):
        ctx.set(tx.ready, 1)
        ctx.set(rx.ready, 1)
        cur = {"tx": b"", "rx": b""}
        for _ in range(300):
            await ctx.delay(1e-9)
            for name, s, out in (("tx", tx, got_tx), ("rx", rx, got_rx)):
                if ctx.get(s.valid):
                    p = ctx.get(s.payload)
                    cur[name] += p.data.to_bytes(NB, "little")[:bin(p.keep).count("1")]
                    if p.last:
                        out.append(cur[name])
                        cur[name] = b""
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(config_and_fill, background=True)
    sim.add_testbench(core_side, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert got_tx and all(classify(f)[0] == LinkLocal.PFC for f in got_tx)
    p = classify(got_tx[0])[1]
    assert p.enable == 1 << 6 and p.quanta[6] == 0x0040  # priority and quanta from FC_CTRL
    assert len(got_tx) >= 2  # refreshed every 0x40 cycles while the FIFO stays full
    # the first frames pass unmarked (FIFO below FC_ECN), the later ones come out CE-marked
    tos = [f[15] & 3 for f in got_rx]
    assert len(got_rx) == 8 and tos[0] == ECN_ECT0 and tos[-1] == ECN_CE
    assert congested[0] == 0 and congested[-1] == 1  # PORT.STATUS.congested
    assert xoff == [1]  # PORT.STATUS.xoff
