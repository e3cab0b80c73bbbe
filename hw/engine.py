"""The NetReduce engine top: P Ethernet ports and one AXI4-Lite register port, board-agnostic.

Data flow (``w`` = data width, one beat per cycle)::

    i_p ─► guard ─► Parser ─┬─ hdr ─► recq ──┐  (+ verdict) ─► ParserAdapter ─► arbiter ─┐
      (per port)            ├─ frame ─► fq ──┤                                            │
                            └─ payload ─► pq ┤      AggControl (flow table, slots, window, ◄┘
                                             │      release, ACK monitor, CNP limiter)
                         dq (header bytes) ◄─┘          │ dec                │ rel (+seq)
                                                         ▼                    │
                  dispatcher: FORWARD -> fwd_p; CONTRIBUTE -> SlotMemory + header store;
                  REEMIT / PROBE / CNP -> frame jobs ─► emitter ◄──────────────┘
                                                          │ header cmds  │ payload cmds
                              header store / job bytes ──►│  SlotMemory result port / zeros
                                                          ▼
                                                       Deparser ─► port FIFO ─► TX arbiter_p ─► o_p

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
  stall at any time.
* Frames longer than ``max_frame`` bytes are cut there and flagged ``error`` (the parser then
  treats them as MAC errors): a frame must fit the per-port buffer of ``max_frame`` bytes, which
  is what lets the control path wait for a frame's verdict (ICRC) before deciding.
* Throughput: the dispatcher takes one beat per cycle from the frame and payload buffers in
  parallel, back to back across frames; with several ports it serves them one frame at a time
  (1 beat per cycle in total). The emitter sends one result beat per cycle; header reads take
  2 cycles per frame.
* Latency: see bench/engine.py (cycles from the last contribution beat in to the first result
  beat out).

Registers: :class:`~netreduce.hw.csr.RegisterBank` of the build's register map on ``s_axil``;
counters, job and flow state from :class:`~netreduce.hw.agg.control.AggControl`, ``tx_frames``
and ``saturations`` / ``JOB.STATUS.saturated`` from here.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from netreduce.regmap import RegMap, build_regmap
from netreduce.wire import fields as wf

from .agg.control import Action, AggControl, ParserAdapter
from .agg.slotmem import SlotMemory
from .csr import AXI4LiteSignature, RegisterBank
from .mgmt_path import PATH_COUNTERS, attach_mgmt
from .packet.deparser import Deparser
from .packet.layout import HDR_CAP, L2_TAGGED, L2_UNTAGGED, Kind
from .packet.linklocal import attach_linklocal
from .packet.parser import Parser
from .ports import SHELL_LAYOUT, attach_ports
from .rams import large_ram_attrs
from .stream import beat_layout, beat_signature
from .verilog import AxisTop, generate

__all__ = ["NetReduceEngine", "engine_for", "engine_verilog", "DEFAULT_MAX_FRAME"]

DEFAULT_MAX_FRAME = 9216  # jumbo frames; the CMAC's maximum packet length is set to match
_OP_CNP, _OP_WRITE_MIDDLE = 0x81, 0x07
_SEQ_BITS = 16


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def _fifo(m, name, layout, depth):
    q = fifo.SyncFIFOBuffered(width=Signal(layout).as_value().shape().width, depth=depth)
    m.submodules[name] = q
    return q, data.View(layout, q.w_data), data.View(layout, q.r_data)


def _seq_before(a, b):
    """a < b for sequence numbers modulo 2**_SEQ_BITS (distances below 2**15)."""
    d = (b - a)[:_SEQ_BITS]
    return (d != 0) & ~d[_SEQ_BITS - 1]


def icrc_delta_columns() -> list[int]:
    """Column i (i = 0..31) of the linear map from the XOR applied to an ACK's bytes BTH PSN
    (3 bytes) + AETH syndrome (1 byte), bit i = bit i % 8 of byte i // 8 in wire order, to the
    XOR of its ICRC bytes (wire order: bit 8j + b = bit b of ICRC byte j).

    The ICRC is a CRC-32 over a fixed-length message (an ACK's IPv4 .. AETH are 44 bytes), so
    it is affine in the message bits: ``icrc(m ^ x) = icrc(m) ^ L(x)`` with L linear and
    independent of m. A fast-retransmit rewrite (model D16) therefore needs no CRC engine: the
    forward path XORs the new PSN / syndrome bits and L(x) into the passing frame.
    """
    import zlib

    n = 8 + wf.IPV4.size + wf.UDP.size + wf.BTH.size + 4  # ICRC input of an ACK
    psn = 8 + wf.IPV4.size + wf.UDP.size + 9  # BTH PSN (the AETH syndrome follows it)
    zero = zlib.crc32(bytes(n))
    cols = []
    for i in range(32):
        msg = bytearray(n)
        msg[psn + i // 8] = 1 << (i % 8)
        cols.append(zlib.crc32(bytes(msg)) ^ zero)  # little-endian int = ICRC wire bytes
    return cols


def _icrc_delta(x) -> list:
    """The 32 XOR bits of an ACK's ICRC for the rewrite ``x`` (:func:`icrc_delta_columns`)."""
    cols = icrc_delta_columns()
    out = []
    for b in range(32):
        t = Const(0, 1)
        for i in range(32):
            if cols[i] >> b & 1:
                t = t ^ x[i]
        out.append(t)
    return out


def _probe_bytes(raw, l2: int, ov=None, psn=None) -> list:
    """Header bytes of the duplicate probe of a data frame (model ``_probe``, D15): opcode
    WRITE MIDDLE, PadCnt 0 (the deparser rewrites lengths, checksum, PadCnt and ICRC); with
    ``ov`` set, BTH PSN ``psn`` (D16's ACK request)."""
    b = l2 + wf.IPV4.size + wf.UDP.size
    out = [raw[i] for i in range(HDR_CAP)]
    out[b] = Const(_OP_WRITE_MIDDLE, 8)
    out[b + 1] = raw[b + 1] & 0xCF
    if ov is not None:
        for i in range(3):
            out[b + 9 + i] = Mux(ov, psn[8 * (2 - i):8 * (3 - i)], raw[b + 9 + i])
    return out


def _cnp_bytes(raw, l2: int, dqpn) -> list:
    """Header bytes (Ethernet .. BTH) of the CNP answering a CE-marked data frame (model
    ``_cnp_frame``, D8); the 16 zero bytes after the BTH are the deparser's payload."""
    out = [Const(0, 8)] * HDR_CAP
    for i in range(6):
        out[i], out[6 + i] = raw[6 + i], raw[i]
    for i in range(12, l2):
        out[i] = raw[i]
    ip = l2
    for i in range(wf.IPV4.size):
        out[ip + i] = raw[ip + i]
    out[ip + 1] = raw[ip + 1] & 0xFC            # DSCP kept, not-ECT
    out[ip + 4], out[ip + 5] = Const(0, 8), Const(0, 8)         # id 0
    out[ip + 6], out[ip + 7] = Const(0x40, 8), Const(0, 8)      # DF
    out[ip + 8] = Const(64, 8)                                  # TTL
    for i in range(4):                                          # receiver -> sender
        out[ip + 12 + i], out[ip + 16 + i] = raw[ip + 16 + i], raw[ip + 12 + i]
    u = ip + wf.IPV4.size
    out[u], out[u + 1] = raw[u], raw[u + 1]                     # UDP source port kept
    out[u + 2], out[u + 3] = Const(4791 >> 8, 8), Const(4791 & 0xFF, 8)
    out[u + 6], out[u + 7] = Const(0, 8), Const(0, 8)           # UDP checksum 0
    b = u + wf.UDP.size
    out[b], out[b + 1] = Const(_OP_CNP, 8), Const(0, 8)
    out[b + 2], out[b + 3] = raw[b + 2], raw[b + 3]             # P_Key
    out[b + 4] = Const(0x40, 8)                                 # BECN
    out[b + 5], out[b + 6], out[b + 7] = dqpn[16:24], dqpn[8:16], dqpn[0:8]
    return out


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

    Members: ``i_p<k>`` (In, :func:`~netreduce.hw.stream.beat_signature`), ``o_p<k>`` (Out),
    ``s_axil`` (In, :class:`~netreduce.hw.csr.AXI4LiteSignature`).
    """

    def __init__(self, regmap: RegMap | None = None, *, max_frame: int = DEFAULT_MAX_FRAME,
                 read_latency: int = 2, mgmt: bool = True):
        rm = regmap if regmap is not None else build_regmap()
        p = rm.params
        self.map = rm
        self.ports, self.width = p["ports"], p["data_width"]
        self.slots, self.max_world, self.pmtu_max = p["slots"], p["max_world"], p["pmtu_max"]
        nb = self.width // 8
        if not isinstance(max_frame, int) or max_frame < max(64, nb) or \
                max_frame < p["pmtu_max"] + HDR_CAP + 8:
            raise ValueError(f"max_frame = {max_frame!r}: must hold a PMTU-sized RoCE frame "
                             f"({p['pmtu_max'] + HDR_CAP + 8} bytes)")
        self.max_frame, self.read_latency = max_frame, read_latency
        self.mgmt = bool(mgmt)
        self.ctl = AggControl(rm)
        self.bank = RegisterBank(rm, inc_width=self.ctl.cnt_width)
        members = {}
        for k in range(self.ports):
            members[f"i_p{k}"] = In(beat_signature(self.width))
        for k in range(self.ports):
            members[f"o_p{k}"] = Out(beat_signature(self.width))
        members["s_axil"] = In(AXI4LiteSignature(self.bank.addr_width))
        # link status and drop strobes from the board shell (netreduce.hw.ports; 0: no shell)
        members["shell"] = In(data.ArrayLayout(SHELL_LAYOUT, self.ports))
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
        attach_ports(m, self, bank, ll.pause_valid)   # PORT table: per-port counters
        rl = self.read_latency
        pb = _bits(P)
        rank_bits = _bits(self.max_world)
        slot_bits = _bits(self.slots)
        job_bits = ctl.job_bits
        nb_bits = ceil_log2(nb + 1)
        beat_shift = exact_log2(nb)
        FB = self.frame_beats

        # ------------------------------------------------------------ registers <-> control
        m.d.comb += ctl.job_cfg.eq(bank.job_cfg)
        wiring.connect(m, ctl.flow_rd, bank.flow_rd)  # the sequencer's port on the flow RAM
        for name in ("job_status", "flow_status"):
            m.d.comb += getattr(bank, name).eq(getattr(ctl, name))
        sat_inc = Signal(ctl.jobs, name="sat_inc")   # a contribution clipped (per job)
        for j in range(ctl.jobs):
            for f, _ in ctl.job_inc_layout:
                src = sat_inc[j] if f == "saturations" else ctl.job_cnt_inc[j][f]
                m.d.comb += bank.job_cnt_inc[j][f].eq(src)
            m.d.comb += [bank.job_set[j].status.mismatch.eq(ctl.job_set[j].status.mismatch),
                         bank.job_set[j].status.saturated.eq(sat_inc[j])]
        for f, _ in ctl.cnt_inc_layout:
            m.d.comb += bank.cnt_inc[f].eq(
                (ctl.cnt_inc[f] + mg.inc[f] if mg is not None and f in PATH_COUNTERS
                 else ctl.cnt_inc[f]) + ll.inc.get(f, 0))
        now = Signal(ctl.time_bits)
        m.d.sync += now.eq(now + 1)

        # ------------------------------------------------------------ ingress, per port
        raw_layout = data.ArrayLayout(8, HDR_CAP)
        dq_layout = data.StructLayout({"raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
                                       "has_pay": 1})
        beat_l = beat_layout(w)
        fq, pq, dq, dq_w, adapters, recs = [], [], [], [], [], []
        for k in range(P):
            src = ll.rx[k]
            # guard: cut frames longer than the buffers (flagged as a MAC error)
            cnt = Signal(range(FB + 1), name=f"guard_cnt{k}")
            skip = Signal(name=f"guard_skip{k}")
            parser = Parser(w)
            m.submodules[f"parser{k}"] = parser
            cut = ~src.payload.last & (cnt == FB - 1)
            m.d.comb += [
                parser.i.payload.eq(src.payload),
                parser.i.valid.eq(src.valid & ~skip),
                src.ready.eq(parser.i.ready | skip),
            ]
            with m.If(cut):
                m.d.comb += [parser.i.payload.last.eq(1), parser.i.payload.error.eq(1)]
            with m.If(src.valid & src.ready):
                with m.If(skip):
                    m.d.sync += skip.eq(~src.payload.last)
                with m.Elif(src.payload.last | cut):
                    m.d.sync += [cnt.eq(0), skip.eq(~src.payload.last)]
                with m.Else():
                    m.d.sync += cnt.eq(cnt + 1)

            q_f, qf_w, qf_r = _fifo(m, f"fq{k}", beat_l, FB + 4)
            q_p, qp_w, qp_r = _fifo(m, f"pq{k}", beat_l, FB + 4)
            m.d.comb += [q_f.w_en.eq(parser.frame.valid), qf_w.eq(parser.frame.payload),
                         parser.frame.ready.eq(q_f.w_rdy),
                         q_p.w_en.eq(parser.payload.valid), qp_w.eq(parser.payload.payload),
                         parser.payload.ready.eq(q_p.w_rdy)]
            rec_l = parser.hdr.payload.shape()
            q_r, qr_w, qr_r = _fifo(m, f"recq{k}", rec_l, 4)
            m.d.comb += [q_r.w_en.eq(parser.hdr.valid), qr_w.eq(parser.hdr.payload),
                         parser.hdr.ready.eq(q_r.w_rdy)]
            q_d, qd_w, qd_r = _fifo(m, f"dq{k}", dq_layout, 16)
            ad = ParserAdapter(ctl.hdr_layout)
            m.submodules[f"adapter{k}"] = ad
            m.d.comb += [ad.rec.eq(qr_r), ad.verdict.eq(parser.verdict.payload),
                         ad.port.eq(k), ad.time.eq(now)]
            fq.append((q_f, qf_r))
            pq.append((q_p, qp_r))
            dq.append((q_d, qd_r))
            dq_w.append(qd_w)
            adapters.append(ad)
            recs.append((q_r, qr_r, parser.verdict))

        # submit headers to the control path (round robin over ports with a complete frame)
        rr = Signal(pb)
        cand = [Signal(name=f"cand{k}") for k in range(P)]
        for k, (q_r, _, ver) in enumerate(recs):
            m.d.comb += cand[k].eq(q_r.r_rdy & ver.valid & dq[k][0].w_rdy)
        pick = Signal(pb)
        # lowest candidate at or after rr, else the lowest candidate
        chain = Const(0, pb)
        for k in reversed(range(P)):
            chain = Mux(cand[k], k, chain)
        chain_rr = chain
        for k in reversed(range(P)):
            chain_rr = Mux(cand[k] & (k >= rr), k, chain_rr)
        m.d.comb += pick.eq(chain_rr)
        any_cand = Cat(*cand).any()
        m.d.comb += [ctl.hdr.valid.eq(any_cand),
                     ctl.hdr.payload.eq(Array(a.hdr for a in adapters)[pick])]
        for k, (q_r, qr_r, ver) in enumerate(recs):
            go = ctl.hdr.ready & any_cand & (pick == k)
            m.d.comb += [q_r.r_en.eq(go), ver.ready.eq(go), dq[k][0].w_en.eq(go),
                         dq_w[k].raw.eq(qr_r.raw), dq_w[k].hdr_len.eq(qr_r.hdr_len),
                         dq_w[k].has_pay.eq(qr_r.kind == Kind.DATA)]
        with m.If(ctl.hdr.ready & any_cand):
            m.d.sync += rr.eq(Mux(pick == P - 1, 0, pick + 1))

        # ------------------------------------------------------------ storage
        mwp = 1 << rank_bits
        tag_width = max(job_bits, nb_bits + 1)
        m.submodules.slotmem = slotmem = SlotMemory(w, slots=self.slots, pmtu_max=self.pmtu_max,
                                                    read_latency=rl, tag_width=tag_width)
        hs_layout = data.StructLayout({"raw": raw_layout, "hdr_len": range(HDR_CAP + 1)})
        m.submodules.hstore = hstore = Memory(shape=hs_layout, depth=self.slots * mwp, init=[],
                                              attrs=large_ram_attrs())
        hs_wr = hstore.write_port()
        hs_rd = hstore.read_port()

        # ------------------------------------------------------------ dispatcher
        job_layout = data.StructLayout({
            "kind": 2, "cnp": 1, "raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
            "rev_qpn": 24, "slot": slot_bits, "plen": 16, "port": pb, "seq": _SEQ_BITS,
            "ov": 1, "psn": 24})
        JOB_NONE, JOB_REEMIT, JOB_PROBE = 0, 1, 2
        m.submodules.jq = jq = fifo.SyncFIFOBuffered(width=job_layout.size, depth=4)
        jq_w, jq_r = data.View(job_layout, jq.w_data), data.View(job_layout, jq.r_data)
        fwd = []
        for k in range(P):
            q, q_w, _ = _fifo(m, f"fwd{k}", beat_l, 4)
            fwd.append((q, q_w))

        dec = ctl.dec.payload
        cur = Signal(ctl.dec_layout, name="cur")
        active, f_done, p_done = Signal(), Signal(), Signal()
        cbeat = Signal(16)
        n_start = Signal(_SEQ_BITS)   # decisions started (the ordinal of the next one)
        n_done = Signal(_SEQ_BITS)    # decisions whose frame and payload are fully handled

        f_r = Array(r for _, r in fq)
        p_r = Array(r for _, r in pq)
        cport = cur.port if P > 1 else Const(0, 1)
        f_valid = Array(q.r_rdy for q, _ in fq)[cport]
        f_beat = f_r[cport]
        p_valid = Array(q.r_rdy for q, _ in pq)[cport]
        p_beat = p_r[cport]
        fwd_rdy = Array(q.w_rdy for q, _ in fwd)[cport]
        is_fwd = cur.action == Action.FORWARD
        is_con = cur.action == Action.CONTRIBUTE
        f_take = Signal()
        p_take = Signal()
        m.d.comb += [
            f_take.eq(active & ~f_done & f_valid & (fwd_rdy | ~is_fwd)),
            p_take.eq(active & ~p_done & p_valid),
        ]
        # fast retransmit (model D16): the forwarded ACK of a ``nak`` decision leaves with its
        # BTH PSN and AETH syndrome bytes XORed with cur.nak_x and its ICRC bytes with the
        # matching ICRC delta (:func:`icrc_delta_columns`); every other byte as it came
        fb_max = HDR_CAP // nb + 1
        fbeat = Signal(range(fb_max + 1))   # beat of the frame being taken (saturates)
        cur_vlan = Signal()
        with m.If(f_take & (fbeat != fb_max)):
            m.d.sync += fbeat.eq(fbeat + 1)
        x_bytes = [cur.nak_x[8 * i:8 * i + 8] for i in range(4)]
        d_bits = _icrc_delta(cur.nak_x)
        x_bytes += [Cat(*d_bits[8 * i:8 * i + 8]) for i in range(4)]
        patch = Signal(w)
        for l2, vl in ((L2_UNTAGGED, 0), (L2_TAGGED, 1)):
            at = {l2 + wf.IPV4.size + wf.UDP.size + 9 + i: x_bytes[i] for i in range(4)}
            at.update({l2 + wf.IPV4.size + wf.UDP.size + wf.BTH.size + 4 + i: x_bytes[4 + i]
                       for i in range(4)})
            for b in sorted({o // nb for o in at}):
                with m.If((cur_vlan == vl) & (fbeat == b)):
                    m.d.comb += [patch[8 * i:8 * i + 8].eq(at[b * nb + i])
                                 for i in range(nb) if b * nb + i in at]
        f_out = Signal(beat_l)
        m.d.comb += [f_out.eq(f_beat),
                     f_out.data.eq(f_beat.data ^ Mux(cur.nak, patch, 0))]
        for k in range(P):
            sel = cport == k
            m.d.comb += [fq[k][0].r_en.eq(f_take & sel), pq[k][0].r_en.eq(p_take & sel),
                         fwd[k][0].w_en.eq(f_take & sel & is_fwd), fwd[k][1].eq(f_out)]
        con = slotmem.contrib.payload
        m.d.comb += [
            slotmem.contrib.valid.eq(p_take & is_con),
            con.slot.eq(cur.slot), con.beat.eq(cbeat), con.op.eq(cur.op),
            con.overwrite.eq(cur.overwrite), con.tag.eq(cur.job),
            con.data.eq(p_beat.data), con.keep.eq(p_beat.keep), con.last.eq(p_beat.last),
        ]
        finishing = Signal()
        m.d.comb += finishing.eq(active & (f_done | (f_take & f_beat.last))
                                 & (p_done | (p_take & p_beat.last)))
        with m.If(f_take & f_beat.last):
            m.d.sync += f_done.eq(1)
        with m.If(p_take):
            m.d.sync += cbeat.eq(cbeat + 1)
            with m.If(p_beat.last):
                m.d.sync += p_done.eq(1)

        dport = dec.port if P > 1 else Const(0, 1)
        d_head = Array(r for _, r in dq)[dport]
        d_rdy = Array(q.r_rdy for q, _ in dq)[dport]
        kind = Signal(2)
        with m.Switch(dec.action):
            with m.Case(Action.REEMIT):
                m.d.comb += kind.eq(JOB_REEMIT)
            with m.Case(Action.PROBE):
                m.d.comb += kind.eq(JOB_PROBE)
            with m.Case(Action.CONTRIBUTE):
                # D16: a contribution past a hole also sends f's receiver an ACK request
                m.d.comb += kind.eq(Mux(dec.solicit, JOB_PROBE, JOB_NONE))
        needs_job = (kind != JOB_NONE) | dec.cnp
        start = Signal()
        m.d.comb += start.eq(ctl.dec.valid & (~active | finishing) & d_rdy
                             & (~needs_job | jq.w_rdy))
        m.d.comb += ctl.dec.ready.eq(start)
        for k in range(P):
            m.d.comb += dq[k][0].r_en.eq(start & (dport == k))
        m.d.comb += [
            jq.w_en.eq(start & needs_job),
            jq_w.kind.eq(kind), jq_w.cnp.eq(dec.cnp), jq_w.raw.eq(d_head.raw),
            jq_w.hdr_len.eq(d_head.hdr_len), jq_w.rev_qpn.eq(dec.rev_qpn),
            jq_w.slot.eq(dec.slot), jq_w.plen.eq(dec.plen), jq_w.port.eq(dport),
            jq_w.seq.eq(n_start), jq_w.ov.eq(dec.solicit), jq_w.psn.eq(dec.sol_psn),
            hs_wr.en.eq(start & (dec.action == Action.CONTRIBUTE)),
            hs_wr.addr.eq(Cat(dec.rank[:rank_bits], dec.slot[:slot_bits])),
            hs_wr.data.raw.eq(d_head.raw), hs_wr.data.hdr_len.eq(d_head.hdr_len),
        ]
        with m.If(start):
            m.d.sync += [cur.eq(dec), active.eq(1), f_done.eq(0), p_done.eq(~d_head.has_pay),
                         cbeat.eq(0), n_start.eq(n_start + 1), fbeat.eq(0),
                         cur_vlan.eq((d_head.raw[12] == 0x81) & (d_head.raw[13] == 0x00))]
        with m.Elif(finishing):
            m.d.sync += active.eq(0)
        # a decision counts as done once its last payload write is visible to the result port
        delay = [Signal(_SEQ_BITS, name=f"done_d{i}") for i in range(rl + 2)]
        m.d.sync += n_done.eq(n_done + finishing)
        m.d.sync += delay[0].eq(n_done)
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

        # ------------------------------------------------------------ emitter
        hcmd_layout = data.StructLayout({"store": 1, "addr": slot_bits + rank_bits,
                                         "raw": raw_layout, "hdr_len": range(HDR_CAP + 1),
                                         "plen": 16, "ce": 1, "port": pb})
        pcmd_layout = data.StructLayout({"from_slot": 1, "slot": slot_bits, "plen": 16})
        hq, hq_w, hq_r = _fifo(m, "hcmdq", hcmd_layout, 4)
        pcq, pc_w, pc_r = _fifo(m, "pcmdq", pcmd_layout, 4)
        rel = ctl.rel.payload
        ejob = Signal(job_layout, name="ejob")
        erel = Signal(ctl.rel_layout, name="erel")
        rank = Signal(rank_bits + 1)
        can_push = hq.w_rdy & pcq.w_rdy
        push = Signal()
        m.d.comb += [hq.w_en.eq(push), pcq.w_en.eq(push)]
        job_first = jq.r_rdy & (~ctl.rel.valid | _seq_before(jq_r.seq, rel.seq))
        rel_ok = ctl.rel.valid & ~job_first & ~_seq_before(done_seen, rel.seq)

        def vlan_of(raw):
            return (raw[12] == 0x81) & (raw[13] == 0x00)

        def put_raw(dst, byte_list_u, byte_list_t, vlan):
            return [dst[i].eq(Mux(vlan, byte_list_t[i], byte_list_u[i])) for i in range(HDR_CAP)]

        bth_len = {l2: l2 + wf.IPV4.size + wf.UDP.size + wf.BTH.size
                   for l2 in (L2_UNTAGGED, L2_TAGGED)}
        with m.FSM(name="emit"):
            with m.State("IDLE"):
                with m.If(job_first):
                    m.d.comb += jq.r_en.eq(1)
                    m.d.sync += ejob.eq(jq_r)
                    with m.If(jq_r.kind != JOB_NONE):
                        m.next = "JOB_FRAME"
                    with m.Else():
                        m.next = "JOB_CNP"
                with m.Elif(rel_ok):
                    m.d.comb += ctl.rel.ready.eq(1)
                    m.d.sync += [erel.eq(rel), rank.eq(0)]
                    m.next = "RESULTS"
            with m.State("JOB_FRAME"):
                vl = vlan_of(ejob.raw)
                probe = ejob.kind == JOB_PROBE
                m.d.comb += [
                    hq_w.store.eq(0), hq_w.port.eq(ejob.port), pc_w.slot.eq(ejob.slot),
                    hq_w.plen.eq(Mux(probe, 0, ejob.plen)), hq_w.ce.eq(~probe),
                    hq_w.hdr_len.eq(Mux(probe, Mux(vl, bth_len[L2_TAGGED],
                                                   bth_len[L2_UNTAGGED]), ejob.hdr_len)),
                    pc_w.from_slot.eq(~probe), pc_w.plen.eq(Mux(probe, 0, ejob.plen)),
                ]
                pu = _probe_bytes(ejob.raw, L2_UNTAGGED, ejob.ov, ejob.psn)
                pt = _probe_bytes(ejob.raw, L2_TAGGED, ejob.ov, ejob.psn)
                with m.If(probe):
                    m.d.comb += put_raw(hq_w.raw, pu, pt, vl)
                with m.Else():
                    m.d.comb += hq_w.raw.eq(ejob.raw)
                with m.If(can_push):
                    m.d.comb += push.eq(1)
                    m.next = "JOB_CNP"
                    with m.If(~ejob.cnp):
                        m.next = "IDLE"
            with m.State("JOB_CNP"):
                vl = vlan_of(ejob.raw)
                cu = _cnp_bytes(ejob.raw, L2_UNTAGGED, ejob.rev_qpn)
                ct = _cnp_bytes(ejob.raw, L2_TAGGED, ejob.rev_qpn)
                m.d.comb += [
                    hq_w.store.eq(0), hq_w.port.eq(ejob.port), hq_w.plen.eq(16), hq_w.ce.eq(0),
                    hq_w.hdr_len.eq(Mux(vl, bth_len[L2_TAGGED], bth_len[L2_UNTAGGED])),
                    pc_w.from_slot.eq(0), pc_w.plen.eq(16),
                    *put_raw(hq_w.raw, cu, ct, vl),
                ]
                with m.If(can_push):
                    m.d.comb += push.eq(1)
                    m.next = "IDLE"
            with m.State("RESULTS"):
                ports_r = (erel.ports[rank[:rank_bits]] if P > 1 else Const(0, 1))
                m.d.comb += [
                    hq_w.store.eq(1), hq_w.addr.eq(Cat(rank[:rank_bits], erel.slot[:slot_bits])),
                    hq_w.plen.eq(erel.plen), hq_w.ce.eq(1), hq_w.port.eq(ports_r),
                    pc_w.from_slot.eq(1), pc_w.slot.eq(erel.slot), pc_w.plen.eq(erel.plen),
                ]
                with m.If(can_push):
                    m.d.comb += push.eq(1)
                    m.d.sync += rank.eq(rank + 1)
                    with m.If(rank + 1 >= erel.n):
                        m.next = "IDLE"

        # header path: header store read (1 cycle) -> deparser header + output port
        dep = Deparser(w)
        m.submodules.deparser = dep
        m.submodules.portq = portq = fifo.SyncFIFOBuffered(width=pb, depth=8)
        hcur = Signal(hcmd_layout, name="hcur")
        hs_data = data.View(hs_layout, hs_rd.data)
        dh = dep.hdr.payload
        m.d.comb += hs_rd.en.eq(0)   # (a read port's enable defaults to 1) data held in OUT
        with m.FSM(name="hdr"):
            with m.State("IDLE"):
                with m.If(hq.r_rdy):
                    m.d.comb += [hq.r_en.eq(1), hs_rd.en.eq(1), hs_rd.addr.eq(hq_r.addr)]
                    m.d.sync += hcur.eq(hq_r)
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [
                    dep.hdr.valid.eq(portq.w_rdy),
                    dh.raw.eq(Mux(hcur.store, hs_data.raw.as_value(), hcur.raw.as_value())),
                    dh.hdr_len.eq(Mux(hcur.store, hs_data.hdr_len, hcur.hdr_len)),
                    dh.plen.eq(hcur.plen), dh.ce_to_ect0.eq(hcur.ce),
                    portq.w_data.eq(hcur.port),
                ]
                with m.If(dep.hdr.ready & portq.w_rdy):
                    m.d.comb += portq.w_en.eq(1)
                    m.next = "IDLE"

        # payload path: slot beats through the result port, or zero beats (probe, CNP)
        pcur = Signal(pcmd_layout, name="pcur")
        pbeat = Signal(16)
        nbeats = Signal(16)
        plen_beats = (pc_r.plen + nb - 1) >> beat_shift
        p_last = pbeat + 1 >= nbeats
        p_bytes = Mux(p_last, pcur.plen - (pbeat << beat_shift), nb)
        pending = Signal(range(rl + 8))
        req, res = slotmem.result_req, slotmem.result
        m.d.comb += [req.payload.slot.eq(pcur.slot), req.payload.beat.eq(pbeat),
                     req.payload.tag.eq(Cat(p_bytes[:nb_bits], p_last))]
        zero_drive = Signal()
        with m.FSM(name="payload"):
            with m.State("IDLE"):
                with m.If(pcq.r_rdy):
                    m.d.comb += pcq.r_en.eq(1)
                    m.d.sync += [pcur.eq(pc_r), pbeat.eq(0),
                                 nbeats.eq(Mux(pc_r.plen == 0, 1, plen_beats))]
                    with m.If(pc_r.from_slot):
                        m.next = "SLOT"
                    with m.Else():
                        m.next = "ZERO"
            with m.State("SLOT"):
                m.d.comb += req.valid.eq(1)
                with m.If(req.ready):
                    m.d.sync += pbeat.eq(pbeat + 1)
                    with m.If(p_last):
                        m.next = "IDLE"
            with m.State("ZERO"):
                m.d.comb += zero_drive.eq((pending == 0) & ~res.valid)
                with m.If(zero_drive & dep.payload.ready):
                    m.d.sync += pbeat.eq(pbeat + 1)
                    with m.If(p_last):
                        m.next = "IDLE"
        m.d.sync += pending.eq(pending + (req.valid & req.ready) - (res.valid & res.ready))
        rtag_bytes = res.payload.tag[:nb_bits]
        rtag_last = res.payload.tag[nb_bits]

        def therm(n):
            return Cat(*[n > i for i in range(nb)])

        dp = dep.payload.payload
        with m.If(zero_drive):
            m.d.comb += [dep.payload.valid.eq(1), dp.data.eq(0), dp.keep.eq(therm(p_bytes)),
                         dp.last.eq(p_last), dp.first.eq(pbeat == 0)]
        with m.Else():
            m.d.comb += [dep.payload.valid.eq(res.valid), dp.data.eq(res.payload.data),
                         dp.keep.eq(therm(rtag_bytes)), dp.last.eq(rtag_last),
                         dp.first.eq(res.payload.beat == 0),
                         res.ready.eq(dep.payload.ready)]

        # ------------------------------------------------------------ TX arbiters
        # per port, frame by frame, alternating between forwarded frames and deparser frames;
        # the deparser's output belongs to the port at the head of the port FIFO
        head = portq.r_data
        tx_last, dep_ready = [], []
        for k in range(P):
            o = getattr(self, f"o_p{k}") if mg is None else mg.tx[k]
            fq_k = fwd[k][0]
            f_bt = data.View(beat_l, fq_k.r_data)
            d_valid = dep.o.valid & portq.r_rdy & (head == k)
            lock = Signal(2, name=f"tx_lock{k}")        # 0 free, 1 forward, 2 deparser
            prefer_dep = Signal(name=f"tx_rr{k}")
            in_frame = Signal(name=f"tx_in{k}")
            use_dep = Signal(name=f"tx_dep{k}")
            with m.Switch(lock):
                with m.Case(1):
                    m.d.comb += use_dep.eq(0)
                with m.Case(2):
                    m.d.comb += use_dep.eq(1)
                with m.Default():
                    m.d.comb += use_dep.eq(d_valid & (prefer_dep | ~fq_k.r_rdy))
            with m.If(use_dep):
                m.d.comb += [o.valid.eq(d_valid), o.payload.eq(dep.o.payload)]
            with m.Else():
                m.d.comb += [o.valid.eq(fq_k.r_rdy), o.payload.eq(f_bt)]
            m.d.comb += o.payload.first.eq(~in_frame)
            hs = o.valid & o.ready
            m.d.comb += fq_k.r_en.eq(o.ready & ~use_dep)
            with m.If(hs):
                m.d.sync += in_frame.eq(~o.payload.last)
                with m.If(o.payload.last):
                    m.d.sync += [lock.eq(0), prefer_dep.eq(~use_dep)]
                with m.Else():
                    m.d.sync += lock.eq(Mux(use_dep, 2, 1))
            with m.Elif(o.valid):
                # a beat on offer stays on offer (AXI-Stream): keep its source until taken
                m.d.sync += lock.eq(Mux(use_dep, 2, 1))
            tx_last.append(hs & o.payload.last)
            dep_ready.append(use_dep & o.ready)
        m.d.comb += dep.o.ready.eq(Array(dep_ready)[head] & portq.r_rdy)
        m.d.comb += portq.r_en.eq(dep.o.valid & dep.o.ready & dep.o.payload.last)
        tx_count = sum(tx_last)
        if mg is not None:
            tx_count = tx_count + mg.inc.tx_frames
        m.d.comb += bank.cnt_inc.tx_frames.eq(tx_count)
        return m


def engine_for(*, max_frame: int = DEFAULT_MAX_FRAME, read_latency: int = 2,
               mgmt: bool = True, **params) -> NetReduceEngine:
    """:class:`NetReduceEngine` for build parameters given as keywords (``ports=2, slots=64``...;
    the rest from :data:`netreduce.regmap.DEFAULT_PARAMS`): a factory with plain arguments, for
    build caches keyed by them."""
    return NetReduceEngine(build_regmap(**params), max_frame=max_frame,
                           read_latency=read_latency, mgmt=mgmt)


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

