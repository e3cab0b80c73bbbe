"""The fast-retransmit stages of the aggregation control path (model D16) and its decision
output register."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .decide import FastRetx, retx_checks, retx_checks_layout
from .types import PSN_BITS

__all__ = ["RetxStages", "retx_in_layout"]


def retx_in_layout(ctl) -> data.StructLayout:
    """What the decision stage hands to :class:`RetxStages`: the decision record ``dec``
    (``nak`` / ``solicit`` left 0) and D16's inputs: ``reg`` (registered frame), ``pres`` /
    ``contrib`` / ``ackc`` (:class:`~.decide.FastRetx`'s ``present`` / ``contrib`` /
    ``ack_cur``), ``fast`` (the job's D16 bit), ``rel`` (rel_j as the decision saw it),
    ``seen`` (the flow's word was written since the enable), ``w`` (the frame writes its
    flow's word)."""
    return data.StructLayout({"dec": ctl.dec_layout, "reg": 1, "pres": 1, "contrib": 1,
                              "ackc": 1, "fast": 1, "rel": PSN_BITS, "seen": 1, "w": 1})


class RetxStages(wiring.Component):
    """Stages 6 and 7 of :class:`~.control.AggControl` (D16: the per-flow fast-retransmit word
    RAM, its compares and decisions) and the decision output register.

    Inputs: ``i`` (:func:`retx_in_layout`) with ``i_valid`` (the decision stage commits a frame
    this cycle); ``rd_en`` (the decision stage takes a new frame: the word of ``i.dec``'s flow
    is read for it, from the RAM read issued then); ``sa_flow`` (the frame in the decision stage
    has the flow of the frame directly ahead). Outputs: ``o`` (the decision stream), ``adv``
    (the stages move this cycle: the output register is empty or taken), ``haz`` (the frame in
    stage 6 will write the word of the decision stage's flow: the decision stage must hold its
    frame a cycle), ``busy`` (a frame in stage 6 or 7), ``cj7`` (one-hot job of a registered
    frame leaving stage 7), ``nak_fire`` / ``solicit`` (its D16 verdicts), ``wr_en`` with
    ``wr_job`` / ``wr_rank`` (it writes its flow's word).

    Contract: latency 3 cycles from ``i_valid`` to ``o.valid`` when ``o`` is ready (stage 6:
    compares on the word read, forwarded from stage 7's write of the same cycle; stage 7:
    decisions and the word's write; output register); throughput one frame per cycle; the
    stages move together, only when the output register can (``adv``: ``o.ready`` low holds
    them; the caller stalls its pipeline on ``~adv``); the caller commits a frame only with
    ``adv`` high, so ``i_valid`` implies ``adv``. ``o.payload`` and ``o.valid`` are flip-flop
    outputs. Errors: none (a frame that is not registered writes nothing).
    """

    def __init__(self, ctl, *, forward: bool = True):
        c = self._ctl = ctl
        self._forward = forward
        super().__init__({
            "i": In(retx_in_layout(c)), "i_valid": In(1), "rd_en": In(1), "sa_flow": In(1),
            "o": Out(stream.Signature(c.dec_layout)), "adv": Out(1), "haz": Out(1),
            "busy": Out(1), "cj7": Out(c.jobs), "nak_fire": Out(1), "solicit": Out(1),
            "wr_en": Out(1), "wr_job": Out(c.job_bits), "wr_rank": Out(c.rank_bits),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._ctl
        i = self.i
        depth = (1 << c.job_bits) * (1 << c.rank_bits)
        m.submodules.rtxmem = rtxmem = Memory(shape=c.rtx_layout, depth=depth, init=[])
        x_wr, x_rd = rtxmem.write_port(), rtxmem.read_port()
        m.submodules.retx = fx = FastRetx(c)
        adv, ov = self.adv, Signal()
        m.d.comb += [adv.eq(~ov | self.o.ready), self.o.valid.eq(ov),
                     x_rd.en.eq(self.rd_en), x_rd.addr.eq(Cat(i.dec.rank, i.dec.job))]
        v6, v7, fwd6 = Signal(), Signal(), Signal()
        s6, s7 = Signal.like(i, name="s6"), Signal.like(i, name="s7")
        m.d.comb += self.busy.eq(v6 | v7)
        # (the data registers load whenever the output moves: with a bubble they are unused)
        with m.If(adv):
            m.d.sync += [v6.eq(self.i_valid), s6.eq(i),
                         fwd6.eq(Cat(i.dec.rank, i.dec.job) == Cat(s7.dec.rank, s7.dec.job))]

        # ---- stage 6: D16 compares on the word read, forwarded from the write committed by
        # stage 7 in the cycle of the read (``xw_*``, taken when the output moves, like the read
        # port's data); the word counts only once written since the enable (``seen``)
        xw_en, xw_data = Signal(), Signal(c.rtx_layout)
        with m.If(adv):
            m.d.sync += [xw_en.eq(x_wr.en), xw_data.eq(x_wr.data)]
        rtx6 = Signal(c.rtx_layout)
        fwd = xw_en & fwd6 if self._forward else 0
        m.d.comb += rtx6.eq(Mux(fwd, xw_data, Mux(s6.seen, x_rd.data, 0)))
        chk6 = retx_checks(m, rtx6, s6.dec.index, s6.rel)
        rtx7, chk7 = Signal(c.rtx_layout), Signal(retx_checks_layout())
        with m.If(adv):
            m.d.sync += [v7.eq(v6), s7.eq(s6), rtx7.eq(rtx6), chk7.eq(chk6)]
        # the frame in stage 6, if any, is the one directly ahead of the decision stage's
        # (all registers)
        if self._forward:
            m.d.comb += self.haz.eq(v6 & s6.w & self.sa_flow)

        # ---- stage 7: D16 decisions, the word's write
        m.d.comb += [fx.k.eq(s7.dec.index), fx.rel.eq(s7.rel), fx.present.eq(s7.pres),
                     fx.contrib.eq(s7.contrib), fx.ack_cur.eq(s7.ackc), fx.fast_en.eq(s7.fast),
                     fx.rtx.eq(rtx7), fx.chk.eq(chk7)]
        commit7 = Signal()
        m.d.comb += commit7.eq(v7 & adv & s7.reg)
        m.d.comb += [x_wr.en.eq(commit7 & fx.rtx_write), x_wr.addr.eq(Cat(s7.dec.rank,
                                                                          s7.dec.job)),
                     x_wr.data.eq(fx.rtx_new),
                     self.wr_en.eq(x_wr.en), self.wr_job.eq(s7.dec.job),
                     self.wr_rank.eq(s7.dec.rank),
                     self.cj7.eq(Mux(commit7, 1 << s7.dec.job, 0)),
                     self.nak_fire.eq(fx.nak_fire), self.solicit.eq(fx.solicit)]

        # ---- decision output register
        dec = self.o.payload
        with m.If(adv):
            m.d.sync += [ov.eq(v7), dec.eq(s7.dec), dec.nak.eq(s7.reg & fx.nak_fire),
                         dec.solicit.eq(s7.reg & fx.solicit)]
        with m.Elif(self.o.ready):
            m.d.sync += ov.eq(0)
        return m
