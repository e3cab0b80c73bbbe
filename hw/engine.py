"""The NetReduce engine top: P Ethernet ports and one AXI4-Lite register port, board-agnostic.

Data flow (``w`` = data width, one beat per cycle)::

    i_p ─► guard ─► Parser ─┬─ hdr ─┬► recq ─► (+ verdict) ─► ParserAdapter ─► skid ─► arbiter ─┐
      (per port)            │       └► dq (header bytes) ──┐                                    │
                            ├─ frame ─► fq ────────────────┤  AggControl (flow table, slots,◄───┘
                            └─ payload ─► pq ──────────────┤  window, release, ACK monitor, CNPs)
                                                           │      │ dec ─► decq    │ rel (+seq)
                                                           ▼      ▼                │
                  dispatcher: FORWARD -> fwd_p; CONTRIBUTE -> SlotMemory + header store;
                  REEMIT / PROBE / CNP -> frame jobs ─► emitter ◄──────────────┘
                                                          │ header cmds  │ payload cmds
                              header store / job bytes ──►│  SlotMemory result port / zeros
                                                          ▼
                                                       Deparser ─► port FIFO ─► TX arbiter_p ─► o_p

Blocks: :class:`~netreduce.hw.dispatch.Dispatcher` (decisions applied to frames),
:class:`~netreduce.hw.hstore.HeaderStore`, :class:`~netreduce.hw.emitter.Emitter` (frame jobs and
release commands into the deparser), :class:`~netreduce.hw.txarb.TxArbiter` (one per port); each
states its contract. The top keeps the ingress guards, the buffers and the wiring.

Contract (the reference model :class:`netreduce.sim.model.Engine` is the specification):

* Every input frame gets the model's disposition and counters; the frames sent are the model's,
  byte for byte: forwarded frames unchanged on their arrival port, result frames (each rank's
  stored header with the slot's aggregate, CE -> ECT(0), lengths, checksums and ICRC rebuilt),
  re-emitted results, duplicate probes (D15) and CNPs (D8), padded to 60 bytes.
* Order: per output port, the frames of one flow leave in the model's order. Release commands
  carry the number of decisions made before them (``seq``), so the emitter sends a frame job
  (re-emit, probe, CNP) of an earlier decision before a release, and a release only after the
  payload of every decision before it is in the slot memory. Different flows may interleave
  differently from the model (forwarded frames take their own path to the TX arbiter).
* Backpressure: ``i_p.ready`` drops when the port's buffers are full (nothing is dropped by the
  core; a board shell puts a dropping frame FIFO in front of a MAC that cannot wait). Outputs may
  stall at any time; with two or more ports, an output that takes no beat for
  ``2**PORT.FC_CTRL.tx_hold`` cycles is *held*, and while it is its frames are dropped and counted
  (:class:`~netreduce.hw.txhold.TxHoldGate`, model D21) so that it does not stall the others.
* Frames longer than ``max_frame`` bytes are cut there and flagged ``error`` (the parser then
  treats them as MAC errors): a frame must fit the per-port buffer of ``max_frame`` bytes, which
  is what lets the control path wait for a frame's verdict (ICRC) before deciding.
* Throughput: the dispatcher takes one beat per cycle from the frame and payload buffers in
  parallel, back to back across frames; with several ports and ``lanes`` = 1 it serves them one
  frame at a time (1 beat per cycle in total) and the emitter sends one result beat per cycle;
  header reads take 2 cycles per frame. With ``lanes`` = ports (:mod:`netreduce.hw.lanes`,
  model D20) every port has its own dispatcher and slot memory (1 beat per cycle each) and its
  own deparser, fed in rounds by :class:`~netreduce.hw.egress.RoundEmitter`.
* Latency: see bench/engine.py (cycles from the last contribution beat in to the first result
  beat out). A frame's control header (record and verdict through the
  :class:`~netreduce.hw.agg.control.ParserAdapter`) waits in a per-port register of the
  :class:`~netreduce.hw.hdrarb.HeaderArbiter` (one header per cycle) before the round robin over
  the ports, so neither the adapter's compares nor the control path's ``hdr.ready`` run
  through the port arbitration; its arrival time is the cycle the control path takes it. With
  per-port lanes and a control path that decides pairs (``AggControl(pairs=True)``), a transfer
  may carry a second ACK/NAK header of another port and flow, decided right after the first.
  The guard's beats reach the parser through a skid buffer (one cycle), so the parser's
  ``i.ready`` (its room count) and the link-local filter's valid logic share no path.

Registers: :class:`~netreduce.hw.csr.RegisterBank` of the build's register map on ``s_axil``;
counters, job and flow state from :class:`~netreduce.hw.agg.control.AggControl`, ``tx_frames``
and ``saturations`` / ``JOB.STATUS.saturated`` from here.
"""

from __future__ import annotations

import inspect

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from netreduce.regmap import RegMap, build_regmap

from .agg.control import AggControl, ParserAdapter, rocev2_record
from .agg.slotmem import SlotMemory
from .csr import AXI4LiteSignature, RegisterBank
from .dispatch import Dispatcher, head_layout, icrc_delta_columns
from .egress import RoundEmitter
from .emitter import SEQ_BITS as _SEQ_BITS
from .emitter import Emitter
from .hdrarb import HeaderArbiter
from .hstore import READ_LATENCY as HS_LATENCY
from .hstore import HeaderStore
from .lanes import attach_lanes
from .mgmt_path import PATH_COUNTERS, attach_mgmt
from .packet.deparser import Deparser
from .packet.layout import HDR_CAP, Kind, header_record_layout
from .packet.linklocal import attach_linklocal
from .packet.parser import Parser
from .ports import SHELL_LAYOUT, attach_ports, fc_layout
from .skid import SkidBuffer
from .stream import beat_layout, beat_signature
from .txarb import TxArbiter
from .txhold import TxHoldGate
from .verilog import AxisTop, generate

__all__ = ["NetReduceEngine", "engine_for", "engine_verilog", "DEFAULT_MAX_FRAME",
           "icrc_delta_columns"]

DEFAULT_MAX_FRAME = 9216  # jumbo frames; the CMAC's maximum packet length is set to match


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def _fifo(m, name, layout, depth):
    q = fifo.SyncFIFOBuffered(width=Signal(layout).as_value().shape().width, depth=depth)
    m.submodules[name] = q
    return q, data.View(layout, q.w_data), data.View(layout, q.r_data)


class NetReduceEngine(wiring.Component):
    """The engine (see the module docstring for the contract).

    Parameters
    ----------
    regmap : RegMap
        Register map; its build parameters (``ports``, ``jobs``, ``flows``, ``slots``,
        ``pmtu_max``, ``data_width``, ``max_world``) size the engine. Default ``build_regmap()``.
    max_frame : int
        Largest frame (bytes, without FCS) kept whole; longer ones are cut and flagged.
    mgmt : bool
        In-band management (docs/management.md; :func:`~netreduce.hw.mgmt_path.attach_mgmt`):
        per port a splitter in front of the parser steers frames to ``MGMT.IP`` / ``MGMT.PORT``
        (while ``MGMT.CTRL.enable``) to the management agent, whose responses leave on the
        request's port; the agent and ``s_axil`` share the register bank through an AXI4-Lite
        arbiter. False: none of it (the engine as without management).
    read_latency : int
        Slot memory read latency (see :class:`~netreduce.hw.agg.slotmem.SlotMemory`).
    roles : bool
        Flow roles (model D17, spine-leaf: leaf and spine engines; docs/spine-leaf.md). They
        need a second payload buffer per slot (a leaf keeps its partial and the total): the slot
        memory doubles. False: a job with a role other than MEMBER is refused (ROLES).

    Members: ``i_p<k>`` (In, :func:`~netreduce.hw.stream.beat_signature`), ``o_p<k>`` (Out),
    ``s_axil`` (In, :class:`~netreduce.hw.csr.AXI4LiteSignature`).
    """

    def __init__(self, regmap: RegMap | None = None, *, max_frame: int = DEFAULT_MAX_FRAME,
                 read_latency: int = 2, mgmt: bool = True, roles: bool = False):
        rm = regmap if regmap is not None else build_regmap()
        self.roles = bool(roles)
        if self.roles and rm.params["lanes"] > 1:
            raise ValueError(f"lanes = {rm.params['lanes']} with flow roles: per-port lanes do not "
                             "carry the roles' totals yet; build with lanes = 1")
        p = rm.params
        self.map = rm
        self.ports, self.width = p["ports"], p["data_width"]
        self.slots, self.max_world, self.pmtu_max = p["slots"], p["max_world"], p["pmtu_max"]
        self.lanes = p["lanes"]  # 1: one contribution path; ports: one per port (hw/lanes.py)
        nb = self.width // 8
        if not isinstance(max_frame, int) or max_frame < max(64, nb) or \
                max_frame < p["pmtu_max"] + HDR_CAP + 8:
            raise ValueError(f"max_frame = {max_frame!r}: must hold a PMTU-sized RoCE frame "
                             f"({p['pmtu_max'] + HDR_CAP + 8} bytes)")
        self.max_frame, self.read_latency = max_frame, read_latency
        self.mgmt = bool(mgmt)
        # per-port lanes: the control path decides ACK/NAK headers in pairs (a second decision
        # per cycle) when it can (AggControl ``pairs``); with one lane the dispatcher takes one
        # beat per cycle in total and pairs would gain nothing
        ctl_kw = {}
        if self.lanes > 1 and "pairs" in inspect.signature(AggControl).parameters:
            ctl_kw["pairs"] = True
        self.ctl = AggControl(rm, roles=self.roles, **ctl_kw)
        self.bank = RegisterBank(rm, inc_width=self.ctl.cnt_width)
        members = {}
        for k in range(self.ports):
            members[f"i_p{k}"] = In(beat_signature(self.width))
        for k in range(self.ports):
            members[f"o_p{k}"] = Out(beat_signature(self.width))
        members["s_axil"] = In(AXI4LiteSignature(self.bank.addr_width))
        # link status and drop strobes from the board shell (netreduce.hw.ports; 0: no shell)
        members["shell"] = In(data.ArrayLayout(SHELL_LAYOUT, self.ports))
        # the PORT.FC_* registers (PFC watermarks, ECN threshold) for the board shell
        members["fc"] = Out(data.ArrayLayout(fc_layout(self.bank), self.ports))
        super().__init__(members)

    @property
    def axis_names(self) -> dict[str, str]:
        """AXI-Stream prefixes of the Verilog top (used by :func:`netreduce.hw.verilog.generate`):
        ``s_axis_p<k>`` / ``m_axis_p<k>`` for every port count."""
        names = {}
        for k in range(self.ports):
            names[f"i_p{k}"], names[f"o_p{k}"] = f"s_axis_p{k}", f"m_axis_p{k}"
        return names

    @property
    def frame_beats(self) -> int:
        """Beats of the largest frame kept whole (the per-port buffer depth)."""
        return -(-self.max_frame // (self.width // 8))

    @property
    def header_frames(self) -> int:
        """Frames per port whose header may wait between the parser and the dispatcher (the
        parser's verdict FIFO, the record and header-byte FIFOs): a burst of one ACK per rank
        of a job (``max_world`` one-beat frames) arriving while the dispatcher finishes the data
        frames ahead of it, plus the control path's pipeline."""
        return self.max_world + 32

    def elaborate(self, platform):  # noqa: C901 (one dataflow, read top to bottom)
        m = Module()
        P, w = self.ports, self.width
        nb = w // 8
        ctl, bank = self.ctl, self.bank
        m.submodules.ctl = ctl
        m.submodules.bank = bank
        # in-band management: takes i_p<k>, o_p<k> and s_axil, hands back rx/tx streams (mg)
        mg = attach_mgmt(m, self, bank) if self.mgmt else None
        if mg is None:
            wiring.connect(m, wiring.flipped(self.s_axil), bank.s_axil)
        # link-local frames (PAUSE, PFC, LLDP, STP, ...) are consumed here (model D18)
        ll = attach_linklocal(m, [getattr(self, f"i_p{k}") if mg is None else mg.rx[k]
                                  for k in range(P)], w)
        # PORT table: per-port counters
        self._pstats = attach_ports(m, self, bank, ll.pause_valid)
        rl = self.read_latency
        job_bits = ctl.job_bits
        nb_bits = ceil_log2(nb + 1)

        # ------------------------------------------------------------ registers <-> control
        m.d.comb += ctl.job_cfg.eq(bank.job_cfg)
        wiring.connect(m, ctl.flow_rd, bank.flow_rd)  # the sequencer's port on the flow RAM
        for name in ("job_status", "flow_status"):
            m.d.comb += getattr(bank, name).eq(getattr(ctl, name))
        # contributions (and, with lanes, combining additions) that clipped, per job
        sat_inc = Signal(data.ArrayLayout(ctl.cnt_width, ctl.jobs), name="sat_inc")
        for j in range(ctl.jobs):
            for f, _ in ctl.job_inc_layout:
                src = sat_inc[j] if f == "saturations" else ctl.job_cnt_inc[j][f]
                m.d.comb += bank.job_cnt_inc[j][f].eq(src)
            m.d.comb += [bank.job_set[j].status.mismatch.eq(ctl.job_set[j].status.mismatch),
                         bank.job_set[j].status.saturated.eq(sat_inc[j] != 0)]
        for f, _ in ctl.cnt_inc_layout:
            m.d.comb += bank.cnt_inc[f].eq(
                (ctl.cnt_inc[f] + mg.inc[f] if mg is not None and f in PATH_COUNTERS
                 else ctl.cnt_inc[f]) + ll.inc.get(f, 0))
        now = Signal(ctl.time_bits)
        m.d.sync += now.eq(now + 1)

        # ------------------------------------------------------------ ingress, per port
        fq, pq, dq = self._ingress(m, ll.rx, now)
        beat_l = beat_layout(w)

        # ------------------------------------------------------------ storage
        # registered read (READ_LATENCY 2): the emitters' header queues cover it
        m.submodules.hdr_store = hstore = HeaderStore(
            self.slots, self.max_world, read_latency=HS_LATENCY)
        fwd = []
        # a port's TX carries its results at up to a beat per cycle: its forward queue holds 8
        # ACK-sized frames (128 bytes each) so that ACKs waiting for the TX do not stall the
        # contributions behind them (with one lane, every port's)
        fwd_depth = max(4, 8 * -(-128 // nb))
        for k in range(P):
            q, q_w, _ = _fifo(m, f"fwd{k}", beat_l, fwd_depth)
            fwd.append((q, q_w))
        if self.lanes > 1:   # one contribution path per port (hw/lanes.py)
            lp = attach_lanes(m, width=w, slots=self.slots, pmtu_max=self.pmtu_max,
                              max_world=self.max_world, rl=rl, ctl=ctl, fq=fq, pq=pq, dq=dq,
                              fwd=fwd, hstore=hstore, nb_bits=nb_bits)
            for j in range(ctl.jobs):
                m.d.sync += sat_inc[j].eq(lp.sat_inc[j])
            return self._emit(m, mg, bank, hstore, fwd, lp, lp.done_seen)
        tag_width = max(job_bits, nb_bits + 1)
        # D17: with flow roles, slot s's total buffer is slot s + slots
        m.submodules.slotmem = slotmem = SlotMemory(w, slots=self.slots << self.roles,
                                                    pmtu_max=self.pmtu_max,
                                                    read_latency=rl, tag_width=tag_width)

        # ------------------------------------------------------------ dispatcher
        m.submodules.dispatch = dsp = Dispatcher(w, ports=P, slots=self.slots,
                                                 max_world=self.max_world,
                                                 dec_layout=ctl.dec_layout,
                                                 contrib_layout=slotmem.contrib_layout,
                                                 roles=self.roles)
        m.submodules.jq = jq = fifo.SyncFIFOBuffered(width=dsp.job_layout.size, depth=4)
        # decisions wait in a queue of 16 (as a lane's do): while the dispatcher is busy with a
        # long data frame the control path goes on deciding the frames behind it (a burst of
        # ACKs, then the next contribution) instead of stopping whole with bubbles in its
        # stages, which the dispatcher would wait out once it drains them
        m.submodules.decq = dcq = fifo.SyncFIFO(width=Signal(ctl.dec_layout).as_value().shape()
                                                .width, depth=16)
        m.d.comb += [dcq.w_en.eq(ctl.dec.valid), dcq.w_data.eq(ctl.dec.payload),
                     ctl.dec.ready.eq(dcq.w_rdy),
                     dsp.dec.valid.eq(dcq.r_rdy), dsp.dec.payload.eq(dcq.r_data),
                     dcq.r_en.eq(dsp.dec.ready)]
        wiring.connect(m, dsp.contrib, slotmem.contrib)
        for k in range(P):
            for port, (q, r) in ((getattr(dsp, f"frame{k}"), fq[k]),
                                 (getattr(dsp, f"payload{k}"), pq[k]),
                                 (getattr(dsp, f"head{k}"), dq[k])):
                m.d.comb += [port.valid.eq(q.r_rdy), port.payload.eq(r), q.r_en.eq(port.ready)]
            o = getattr(dsp, f"fwd{k}")
            m.d.comb += [fwd[k][0].w_en.eq(o.valid), fwd[k][1].eq(o.payload),
                         o.ready.eq(fwd[k][0].w_rdy)]
        m.d.comb += [jq.w_en.eq(dsp.jobs.valid), jq.w_data.eq(dsp.jobs.payload),
                     dsp.jobs.ready.eq(jq.w_rdy),
                     hstore.w_en.eq(dsp.hs_en), hstore.w_addr.eq(dsp.hs_addr),
                     hstore.w_data.eq(dsp.hs_data)]
        # a decision counts as done once its last payload write is visible to the result port
        delay = [Signal(_SEQ_BITS, name=f"done_d{i}") for i in range(rl + 2)]
        m.d.sync += delay[0].eq(dsp.done)
        for i in range(1, len(delay)):
            m.d.sync += delay[i].eq(delay[i - 1])
        done_seen = delay[-1]

        # saturation: a contribution clipped if any of its beats did
        ev = slotmem.events.payload
        sat_acc = Signal()
        with m.If(slotmem.events.valid):
            m.d.sync += sat_acc.eq(Mux(ev.last, 0, sat_acc | ev.saturated))
        for j in range(ctl.jobs):
            m.d.sync += sat_inc[j].eq(slotmem.events.valid & ev.last & (ev.tag[:job_bits] == j)
                                      & (sat_acc | ev.saturated))
        return self._emit(m, mg, bank, hstore, fwd, None, done_seen, jq=jq, slotmem=slotmem)

    def _ingress(self, m, rx, now):
        """Per port: the length guard, the parser, its frame / payload / record / header-byte
        buffers and the frame's control header; the ports' headers into the control path through
        the :class:`~netreduce.hw.hdrarb.HeaderArbiter` (a register per port, round robin, pairs
        of ACK/NAK headers with a pairing control path). Returns the frame, payload and
        header-byte FIFOs (``(fifo, read view)`` per port)."""
        P, w, ctl = self.ports, self.width, self.ctl
        FB = self.frame_beats
        dq_layout = head_layout()
        beat_l = beat_layout(w)
        # the record's fields but its header bytes (those go to dq): what the adapter reads
        rec_fields = data.StructLayout({n: f.shape for n, f in header_record_layout()
                                        if n != "raw"})
        # ... and the record's RoCEv2 classification, computed as it is stored
        recq_layout = data.StructLayout({**{n: f.shape for n, f in rec_fields}, "roce": 1})
        HQ = self.header_frames
        # the ports' header registers and the arbitration into the control path
        m.submodules.hdr_arb = arb = HeaderArbiter(ctl.hdr_layout, ports=P)
        if arb.pairs:
            # no pairs while a job has fast retransmit on (the control's side lane has no D16
            # state); registered: off the bank's paths
            fast_any = Signal(name="fast_retx_any")
            m.d.sync += fast_any.eq(Cat(*(ctl.job_cfg[j].ctrl.fast_retx
                                          for j in range(ctl.jobs))).any())
            m.d.comb += arb.pair_en.eq(~fast_any)
        fq, pq, dq = [], [], []
        for k in range(P):
            src = rx[k]
            # guard: cut frames longer than the buffers (flagged as a MAC error)
            cnt = Signal(range(FB + 1), name=f"guard_cnt{k}")
            skip = Signal(name=f"guard_skip{k}")
            parser = Parser(w, verdicts=HQ)
            m.submodules[f"parser{k}"] = parser
            # the parser's input registered: its ready (the room count) and the filter's valid
            # logic meet in no path (10 LUT levels into the parser's room register, flattened)
            m.submodules[f"parser_skid{k}"] = p_skid = SkidBuffer(beat_l)
            wiring.connect(m, p_skid.o, parser.i)
            cut = ~src.payload.last & (cnt == FB - 1)
            m.d.comb += [
                p_skid.i.payload.eq(src.payload),
                p_skid.i.valid.eq(src.valid & ~skip),
                src.ready.eq(p_skid.i.ready | skip),
            ]
            with m.If(cut):
                m.d.comb += [p_skid.i.payload.last.eq(1), p_skid.i.payload.error.eq(1)]
            with m.If(src.valid & src.ready):
                with m.If(skip):
                    m.d.sync += skip.eq(~src.payload.last)
                with m.Elif(src.payload.last | cut):
                    m.d.sync += [cnt.eq(0), skip.eq(~src.payload.last)]
                with m.Else():
                    m.d.sync += cnt.eq(cnt + 1)

            q_f, qf_w, qf_r = _fifo(m, f"fq{k}", beat_l, FB + 4 + self.max_world)
            q_p, qp_w, qp_r = _fifo(m, f"pq{k}", beat_l, FB + 4 + self.max_world)
            m.d.comb += [q_f.w_en.eq(parser.frame.valid), qf_w.eq(parser.frame.payload),
                         parser.frame.ready.eq(q_f.w_rdy),
                         q_p.w_en.eq(parser.payload.valid), qp_w.eq(parser.payload.payload),
                         parser.payload.ready.eq(q_p.w_rdy)]
            # a record goes into two FIFOs at once: its header bytes for the dispatcher (dq, read
            # when the frame's decision starts) and its fields for the control header (recq,
            # read with the frame's verdict); both, and the parser's verdict FIFO, hold HQ
            # frames, so a burst of one-beat frames (a rank's ACKs) waits here for the control
            # path and the dispatcher, which are a few data frames behind, instead of
            # backpressuring the port
            q_r, qr_w, qr_r = _fifo(m, f"recq{k}", recq_layout, HQ)
            q_d, qd_w, qd_r = _fifo(m, f"dq{k}", dq_layout, HQ)
            rec = parser.hdr.payload
            m.d.comb += [q_r.w_en.eq(parser.hdr.valid & q_d.w_rdy),
                         q_d.w_en.eq(parser.hdr.valid & q_r.w_rdy),
                         parser.hdr.ready.eq(q_r.w_rdy & q_d.w_rdy),
                         *[qr_w[n].eq(rec[n]) for n in rec_fields.members],
                         qr_w.roce.eq(rocev2_record(rec)),
                         qd_w.raw.eq(rec.raw), qd_w.hdr_len.eq(rec.hdr_len),
                         qd_w.has_pay.eq(rec.kind == Kind.DATA)]
            ad = ParserAdapter(arb.rec_layout)
            m.submodules[f"adapter{k}"] = ad
            m.d.comb += [*[ad.rec[n].eq(qr_r[n]) for n in rec_fields.members],
                         ad.roce.eq(qr_r.roce), ad.verdict.eq(parser.verdict.payload),
                         ad.port.eq(k), ad.time.eq(0)]
            # the frame's control header goes into the port's register in the header arbiter
            # (the adapter's compares end there, not in the arbitration and the control path)
            hin = getattr(arb, f"i{k}")
            take = hin.valid & hin.ready
            m.d.comb += [hin.valid.eq(q_r.r_rdy & parser.verdict.valid),
                         hin.payload.eq(ad.hdr),
                         q_r.r_en.eq(take), parser.verdict.ready.eq(take)]
            fq.append((q_f, qf_r))
            pq.append((q_p, qp_r))
            dq.append((q_d, qd_r))

        # submit headers to the control path (round robin over ports with a header waiting,
        # with pairs a second, ACK/NAK header of another port); the arrival time is the cycle
        # the control path takes the header
        wiring.connect(m, arb.o, ctl.hdr)
        m.d.comb += ctl.hdr.payload.time.eq(now)
        return fq, pq, dq

    def _emit(self, m, mg, bank, hstore, fwd, lp, done_seen, *, jq=None, slotmem=None):
        """Emitter, deparser(s) and the per-port TX arbiters. One contribution path (``jq``,
        ``slotmem``): one :class:`Emitter` and deparser whose frames go to the port at the head
        of the port FIFO. Per-port lanes (``lp`` from :func:`~netreduce.hw.lanes.attach_lanes`):
        a :class:`~netreduce.hw.egress.RoundEmitter` and one deparser per port."""
        P, w, ctl, rl = self.ports, self.width, self.ctl, self.read_latency
        pb = _bits(P)
        beat_l = beat_layout(w)
        # ------------------------------------------------------------ emitter
        if lp is None:
            m.submodules.emitter = em = Emitter(
                w, ports=P, slots=self.slots, max_world=self.max_world,
                rel_layout=ctl.rel_layout, hs_layout=hstore.layout,
                req_layout=slotmem.result_req_layout, res_layout=slotmem.result_layout,
                read_latency=rl, roles=self.roles, hs_latency=hstore.read_latency)
            m.d.comb += [em.jobs.valid.eq(jq.r_rdy), em.jobs.payload.eq(jq.r_data),
                         jq.r_en.eq(em.jobs.ready)]
            wiring.connect(m, em.req, slotmem.result_req)
            wiring.connect(m, slotmem.result, em.res)
        else:
            m.submodules.emitter = em = RoundEmitter(
                w, ports=P, slots=self.slots, max_world=self.max_world,
                rel_layout=ctl.rel_layout, hs_layout=hstore.layout, req_layout=lp.req_layout,
                res_layout=lp.res_layout, read_latency=rl, xtag_width=lp.xtag_width,
                hs_latency=hstore.read_latency)
            m.d.comb += [em.jobs.valid.eq(lp.jobs_valid), em.jobs.payload.eq(lp.jobs_payload),
                         lp.jobs_ready.eq(em.jobs.ready)]
            # the release's combine tag: lanes of its ranks' arrival ports (the emitter's
            # rel_lanes), the job's op; registered (the round emitter uses it from the second
            # cycle after it took the release: one cycle to plan)
            erel, xt = em.rel_cur, Signal(lp.xtag, name="rel_xtag")
            m.d.sync += [xt.lmask.eq(em.rel_lanes), xt.op.eq(lp.split.ops[erel.job]),
                         xt.job.eq(erel.job)]
            m.d.comb += em.rel_xtag.eq(xt)
            wiring.connect(m, em.req, lp.comb.req)
            wiring.connect(m, lp.comb.res, em.res)
        m.d.comb += [em.done_seen.eq(done_seen),
                     hstore.r_en.eq(em.hs_en), hstore.r_addr.eq(em.hs_addr),
                     em.hs_data.eq(hstore.r_data)]
        wiring.connect(m, ctl.rel, em.rel)
        # registered boundaries on the TX chain (port -> TX arbiter -> deparser -> emitter ->
        # slot memory read enable): a skid buffer at each hop
        dep_outs = []
        for k in range(P if lp is not None else 1):
            sfx = str(k) if lp is not None else ""
            dep = Deparser(w)
            m.submodules[f"deparser{sfx}"] = dep
            m.submodules[f"dep_skid{sfx}"] = dep_skid = SkidBuffer(beat_l)
            wiring.connect(m, getattr(em, f"dep_hdr{sfx}"), dep.hdr)
            if lp is None:
                m.submodules.pay_skid = pay_skid = SkidBuffer(beat_l)
                wiring.connect(m, em.dep_payload, pay_skid.i)
                wiring.connect(m, pay_skid.o, dep.payload)
            else:
                # the round's beats reach every port at once: a FIFO of two frame headers'
                # worth of beats per port absorbs the cycles its deparser spends on header
                # beats, so the ports' stalls do not add up (w_rdy is a register output)
                depth = max(8, 2 * -(-(HDR_CAP + 8) // (w // 8)) + 4)
                pay_q, pq_w, pq_r = _fifo(m, f"pay_q{k}", beat_l, depth)
                src = getattr(em, f"dep_payload{k}")
                m.d.comb += [pay_q.w_en.eq(src.valid), pq_w.eq(src.payload),
                             src.ready.eq(pay_q.w_rdy),
                             dep.payload.valid.eq(pay_q.r_rdy), dep.payload.payload.eq(pq_r),
                             pay_q.r_en.eq(dep.payload.ready)]
            wiring.connect(m, dep.o, dep_skid.i)
            dep_outs.append(dep_skid.o)
        if lp is None:
            # an entry per frame from its header command (emitter's header queue and reads) to
            # its last beat out of dep_skid: room for the deparser's frames behind the queue
            m.submodules.portq = portq = fifo.SyncFIFOBuffered(width=pb, depth=16)
            m.d.comb += [portq.w_en.eq(em.port.valid), portq.w_data.eq(em.port.payload),
                         em.port.ready.eq(portq.w_rdy)]
            head = portq.r_data

        # ------------------------------------------------------------ TX arbiters
        # per port, frame by frame, alternating between forwarded frames and deparser frames;
        # with one deparser its output belongs to the port at the head of the port FIFO
        tx_last, dep_ready = [], []
        for k in range(P):
            o = getattr(self, f"o_p{k}") if mg is None else mg.tx[k]
            m.submodules[f"txarb{k}"] = arb = TxArbiter(w)
            if P > 1:
                # a held port drops its frames instead of stalling the others (model D21)
                m.submodules[f"tx_gate{k}"] = tx_skid = TxHoldGate(w)
                cfg = bank.port_cfg[k]
                m.d.comb += [tx_skid.hold.eq(cfg.fc_ctrl.tx_hold),
                             self._pstats[k].hold_drop.eq(tx_skid.drop)]
            else:
                m.submodules[f"tx_skid{k}"] = tx_skid = SkidBuffer(beat_l)
            fq_k = fwd[k][0]
            m.d.comb += [arb.fwd.valid.eq(fq_k.r_rdy), arb.fwd.payload.eq(fq_k.r_data),
                         fq_k.r_en.eq(arb.fwd.ready)]
            if lp is None:
                dep_o = dep_outs[0]
                m.d.comb += [arb.dep.valid.eq(dep_o.valid & portq.r_rdy & (head == k)),
                             arb.dep.payload.eq(dep_o.payload)]
            else:
                wiring.connect(m, dep_outs[k], arb.dep)
            wiring.connect(m, arb.o, tx_skid.i)
            m.d.comb += [o.valid.eq(tx_skid.o.valid), o.payload.eq(tx_skid.o.payload),
                         tx_skid.o.ready.eq(o.ready)]
            tx_last.append(tx_skid.o.valid & o.ready & tx_skid.o.payload.last)
            dep_ready.append(arb.dep.ready)
        if lp is None:
            m.d.comb += dep_o.ready.eq(Array(dep_ready)[head] & portq.r_rdy)
            m.d.comb += portq.r_en.eq(dep_o.valid & dep_o.ready & dep_o.payload.last)
        tx_count = sum(tx_last)
        if mg is not None:
            tx_count = tx_count + mg.inc.tx_frames
        m.d.comb += bank.cnt_inc.tx_frames.eq(tx_count)
        return m


def engine_for(*, max_frame: int = DEFAULT_MAX_FRAME, read_latency: int = 2,
               mgmt: bool = True, roles: bool = False, **params) -> NetReduceEngine:
    """:class:`NetReduceEngine` for build parameters given as keywords (``ports=2, slots=64``...;
    the rest from :data:`netreduce.regmap.DEFAULT_PARAMS`): a factory with plain arguments, for
    build caches keyed by them."""
    return NetReduceEngine(build_regmap(**params), max_frame=max_frame,
                           read_latency=read_latency, mgmt=mgmt, roles=roles)


def engine_verilog(regmap: RegMap | None = None, path=None, *, name: str = "netreduce_engine",
                   progress=None, yosys: str = "auto", timings: dict | None = None,
                   **kwargs) -> AxisTop:
    """Verilog of :class:`NetReduceEngine` behind AXI names (``s_axis_p<k>``, ``m_axis_p<k>``,
    ``s_axil_*``); written to ``path`` when given. ``progress``, ``yosys``, ``timings``: see
    :func:`netreduce.hw.verilog.to_verilog`."""
    top = generate(NetReduceEngine(regmap, **kwargs), name, progress=progress, yosys=yosys,
                   timings=timings)
    if path is not None:
        from pathlib import Path

        Path(path).write_text(top.verilog)
    return top

