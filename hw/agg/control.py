"""Aggregation control path: what happens to each frame, given its parsed header.

:class:`AggControl` implements steps 1-6 of the reference model (:mod:`netreduce.sim.model.engine`,
whose docstring and decisions D1-D20 are the specification) for everything except payload
arithmetic and frame bytes: flow lookup, job state and the enable sequencer (D9), slot state, the
per-frame decision, in-order release, ACK/NAK snooping with freeing, and the CNP rate limiter. It
is bit-exact with the model: every frame gets the model's disposition, the model's release
commands, CNP decisions and counter increments (the tests compare them frame by frame).

Sub-blocks (one concern each; the per-job state they share stays in this component, in
flip-flops that the decision stage reads up to date every cycle):

* flow table (:class:`~.flowtable.FlowTable`): latched keys, parallel lookup;
* job state: latched configuration (n, W, slot base, PMTU, op, CNP interval), free / release
  pointers, slots in use, status;
* enable sequencer (:class:`~.sequencer.EnableSequencer`): validates and latches a job on
  ``JOB.CTRL.enable`` 0 -> 1 and discards it on 1 -> 0;
* slot state (``lib.memory.Memory``, one word per slot): valid, index, contribution bitmap,
  opcode / length signature, per-rank arrival port. EMPTY = not valid or holding another index;
  FILLING / COMPLETE = bitmap partial / full; RELEASED = index in [free_j, rel_j) (so releasing
  and freeing never rewrite a slot);
* decision stages: lookup (stages 1-3, here) and the decision function (:class:`~.decide.
  Decide`): checks in the model's priority, window, slot read-modify-write;
* release scheduler (:class:`~.release.ReleaseScheduler`): releases complete slots in index
  order (an in-order completion is released by the decision stage itself; out-of-order
  completions are counted per job and released by the scheduler when the gap closes);
* ACK monitor: acked_f per flow, free_j = min over the job's flows (the free-pointer tree,
  :class:`~.release.FreeMinTree`);
* CNP limiter: per-flow time of the last CNP (a RAM), interval from the job;
* fast retransmit (model D16): per-flow in-order prefix nxt_f, top_f and the hole last handled
  (a RAM read and written like the CNP times), updated by data and ACK decisions; a decision
  with ``nak`` set tells the forward path to rewrite the ACK (``nak_x``: the XOR of its BTH PSN
  and AETH syndrome bytes, wire order; the ICRC is patched by the engine top), one with
  ``solicit`` to also send the contribution's duplicate probe at PSN ``sol_psn``.

:class:`ParserAdapter` builds the header record from the packet parser's header record and
verdict (:mod:`netreduce.hw.packet.layout`).

Interfaces
----------
``hdr`` (In, stream of :attr:`hdr_layout`, ready/valid)
    One record per received frame, in arrival order (one stream for all ports): the parser's
    classification ``cls`` (:class:`HdrClass`), its first failing frame-level check ``err``
    (:class:`FrameError`, in the model's step-3 order: lengths/truncation/PadCnt, IPv4 checksum,
    TVer/unknown opcode, ICRC), source IPv4, BTH DestQP / opcode / PSN, IPv4 ECN, AETH syndrome
    (ACK), payload length without pad ``plen``, arrival ``port`` and arrival ``time`` (cycles of
    a free-running counter, used by the CNP limiter; the model's ``time``). ``hdr`` and ``dec``
    end in skid buffers (:class:`~netreduce.hw.skid.SkidBuffer`): ``hdr.ready``, ``dec.valid``
    and ``dec.payload`` are flip-flop outputs (no combinational path through the block).
``dec`` (Out, stream of :attr:`dec_layout`)
    One decision per header, in the same order: :class:`Action` (FORWARD unchanged, DROP,
    CONTRIBUTE, REEMIT), the disposition counter ``disp`` (:data:`Disp`, named after
    :data:`netreduce.regmap.DISPOSITIONS`), job / rank / flow entry, slot, index k, ``overwrite``
    (first contribution of the slot's generation), op, ``plen`` / ``beats`` (512-bit beats of
    payload), ``cnp`` (send a CNP to the flow's sender; ``rev_qpn`` is its DestQP), ``port``,
    ``release`` (this frame completed its slot and released at least that index), ``nak``
    (FORWARD this ACK as a NAK-sequence at PSN + 1, model D16), ``nak_x`` (the XOR that turns
    its BTH PSN and AETH syndrome bytes, in wire order, into the NAK's), ``solicit`` (with a
    CONTRIBUTE: also send this frame's duplicate probe with BTH PSN ``sol_psn``, D16's ACK
    request).
``rel`` (Out, stream of :attr:`rel_layout`)
    Release commands in release order: "emit the result of slot ``slot`` (job, index, payload
    length, N) to ranks 0..N-1", each rank on ``ports[r]`` (arrival port, D13). The command for
    an index is issued at the decision of the frame that completes it (or later; it may leave
    before that decision, and one more, have left the ``dec`` skid buffer); the consumer
    must not read the slot before that frame's last payload beat has been written (its slot
    memory event). Buffered in a FIFO of ``rel_depth``; when the FIFO is full the decision stage
    stalls.
Register bank side (layouts generated from the register map, as :class:`~netreduce.hw.csr.bank.
RegisterBank` names them): ``job_cfg`` (In: the RW fields), ``flow_rd`` (Out, a
:func:`~netreduce.hw.csr.bank.cfg_read_signature` port: the bank keeps the flow table's RW fields
in a RAM; ``data`` is the entry addressed in the cycle before, read only by the enable
sequencer), ``job_status`` / ``flow_status`` (Out: RO fields), ``job_set`` (Out: W1C set
strobes; ``saturated`` is left 0: it comes from the slot memory's events), ``job_cnt_inc`` (Out:
per-job counter increments, ``cnt_width`` bits each; ``saturations`` is left 0 like
``saturated``) and ``cnt_inc`` (Out: ``rx_frames``, ``fwd_not_roce``, ``fwd_unregistered``).
Build the bank with ``inc_width=ctl.cnt_width`` (``freed`` and ``results_sent`` step by more
than 1).

Timing
------
* Latency: header accepted in cycle t -> decision valid in cycle t + 7 (registers: input
  skid, input + key chunk compares, CAM match, entry RAM data, index/slot + slot RAM data,
  decision, output skid; one more lookup stage, t + 8, with more than 16 flow entries), when
  nothing stalls. Counter increments and status set strobes are registered one clock edge
  later, from the decision's registered strobes: they are valid in the cycle after the decision
  becomes valid (chained releases and free_j results count one cycle after they happen).
* Throughput: one header per cycle (so back-to-back minimum-size frames of one 512-bit beat are
  decided at line rate), including back-to-back headers to the same slot or flow: the slot,
  CNP and fast-retransmit RAM reads (issued one stage before the decision) are forwarded from
  the write of the decision in front, and per-job state is read from flip-flops by the
  decision itself.
  The pipeline stalls as a whole (``hdr.ready`` low) only to stay exact:
  - while the header in the decision stage belongs to a job with a chained release in
    progress (2 cycles per released index; only after out-of-order completions, since an
    in-order completion is released by the decision stage itself);
  - while a *data* header's job has a free_j computation in flight (``free_latency`` cycles
    after each ACK/NAK that advanced some acked_f; ACK/NAK acceptance never reads free_j, so
    back-to-back ACKs/NAKs do not wait);
  - while ``dec`` is not ready, or the release FIFO is full;
  - every other cycle while the enable sequencer clears the slots of a job being enabled (the
    stall does not wait for the decision, so the decision logic stays off the pipeline enable);
  - while the sequencer commits or discards a job (it stops taking headers until the pipeline
    is empty).
* Enable: ``JOB.CTRL.enable`` 0 -> 1 is seen one cycle after the bank's write; the sequencer
  checks the job registers (3 cycles), scans the ``flows`` flow entries (one per cycle, an
  entry of the job 1 + the flow table's ``chk_latency``; the bank's flow RAM is addressed one
  entry ahead, from the check cycle on, so its read latency adds no cycle), clears the job's W
  slots, then commits (enabled). Until then, frames of the job are unregistered. A refused job
  gets ``JOB.STATUS.error`` (model D9; the bank's
  ``JOB.CTRL.enable`` keeps reading 1, the model's reads 0). Bus writes to the job's registers
  during the sequence race with it (the model latches at the write).

Resources (beyond the RAMs: slot state ``slots`` x (41 + max_world [+ max_world x port bits])
bits with two read ports, CNP times ``jobs`` x ``max_world`` x ``time_bits``, fast-retransmit
state ``jobs`` x ``max_world`` x 74, flow entry data
``flows`` x ~60 bits): flip-flops for the flow keys (``flows`` x 112, compared in parallel twice:
lookup and the sequencer's conflict check), acked_f (``jobs`` x ``max_world`` x 24, read in
parallel by the min tree) and a per-entry copy of it for ``FLOW.ACKED`` (``flows`` x 24).

Known differences from the model, all from the model being untimed: release commands of
*different* jobs may leave in another order than the model's (each job's order is exact); a
frame arriving while its job is being enabled or disabled is classified by the state before the
change; an enable refused by the model reads back ``JOB.CTRL.enable`` = 0, the bank keeps 1 (a
retry must write 0 then 1); a flow entry bound to a running job cannot be bound by another job
(refused as KEY_CONFLICT; the model rebinds it if the keys differ). Flow roles (model D17,
spine-leaf; :mod:`.roles`) only with ``roles=True``: otherwise a job with any flow whose
``FLOW.CFG.role`` is not MEMBER is refused (``JobError.ROLES``), where the model runs it. With
them, ``dec`` also says which stage mark to set on the frame's outputs (``remark``, ``mark``) and
whether its payload goes to or comes from the slot's total buffer (``total``; Action TOTAL: a
leaf's DOWN total), and ``rel`` commands carry the ranks to send to (``mask``), the buffer
(``total``) and a mark (a leaf's partial: MARK_PARTIAL to its UP rank).

Error behaviour: bad frames are counted and never change state (D14); a frame of a job being
disabled while in flight is classified unregistered. Only the consumers' backpressure (``dec``,
``rel``) can stall the pipeline indefinitely.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from netreduce.regmap import (
    DISPOSITIONS,
    GLOBAL_COUNTERS,
    JOB_COUNTERS,
    Access,
    JobError,
    RegMap,
    Table,
    build_regmap,
)
from netreduce.wire import ETHERTYPE_IPV4, IP_PROTO_UDP, ROCEV2_UDP_PORT

from ..csr.bank import cfg_read_signature
from ..skid import SkidBuffer
from .decide import OP_ACK, OP_CNP, Decide, pre_layout, precheck
from .flowtable import FlowTable
from .release import FreeMinTree, ReleaseScheduler
from .roles import MARK_PARTIAL, JobRoles
from .sequencer import EnableSequencer
from .types import PSN_BITS, SEQ_BITS, Action, Disp, FrameError, HdrClass

__all__ = ["AggControl", "ParserAdapter", "HdrClass", "FrameError", "Action", "Disp", "role_layout",
           "OP_ACK", "OP_CNP"]


def role_layout(table: Table, access: Access) -> data.StructLayout:
    """Per-entry layout of ``table``'s fields of ``access``, as the register bank names them:
    ``<reg>.<field>`` in lower case."""
    out = {}
    for r in table.registers:
        fs = {f.name.lower(): unsigned(f.width) for f in r.fields if f.access == access}
        if fs:
            out[r.name.lower()] = data.StructLayout(fs)
    return data.StructLayout(out)


class ParserAdapter(wiring.Component):
    """The :class:`AggControl` header record of a frame from the parser's outputs (combinational).

    Inputs: the parser's header record ``rec`` (:func:`netreduce.hw.packet.layout.
    header_record_layout`) and final ``verdict`` of the same frame, its arrival ``port`` and
    ``time``. Output ``hdr``: the record :class:`AggControl` takes. The model classifies by the
    frame's bytes before checking it (step 1, D10): a frame too short to show the UDP destination
    port, or not IPv4/IHL 5/unfragmented/UDP 4791, is NOT_ROCE (whatever the parser's reason);
    one that is but ends before the end of the BTH is SHORT; else ROCE with the verdict's reason
    mapped to :class:`FrameError` (a MAC error counts as ICRC: the frame is corrupt).
    The caller pairs ``rec`` with ``verdict`` (the parser delivers the verdict later).
    """

    def __init__(self, hdr_layout: data.StructLayout):
        from ..packet.layout import header_record_layout, verdict_layout

        super().__init__({
            "rec": In(header_record_layout()), "verdict": In(verdict_layout()),
            "port": In(hdr_layout["port"].shape), "time": In(hdr_layout["time"].shape),
            "hdr": Out(hdr_layout),
        })

    def elaborate(self, platform):
        from ..packet.layout import Reason

        m = Module()
        rec, v, h = self.rec, self.verdict, self.hdr
        l3 = Mux(rec.vlan, 18, 14)
        flen = v.frame_len
        ip = rec.ipv4
        roce = ((rec.eth.ethertype == ETHERTYPE_IPV4) & (ip.version == 4) & (ip.ihl == 5)
                & (ip.protocol == IP_PROTO_UDP) & ((ip.flags_frag & 0x3FFF) == 0)
                & (rec.udp.dport == ROCEV2_UDP_PORT))
        err_of = {Reason.TRUNCATED: FrameError.LENGTH, Reason.IP_LENGTH: FrameError.LENGTH,
                  Reason.UDP_LENGTH: FrameError.LENGTH, Reason.PADCNT: FrameError.LENGTH,
                  Reason.IP_CHECKSUM: FrameError.IP_CHECKSUM, Reason.TVER: FrameError.OPCODE,
                  Reason.OPCODE: FrameError.OPCODE, Reason.ICRC: FrameError.ICRC,
                  Reason.MAC_ERROR: FrameError.ICRC}
        with m.If((flen < l3 + 24) | ~roce):
            m.d.comb += h.cls.eq(HdrClass.NOT_ROCE)
        with m.Elif(flen < l3 + 40):
            m.d.comb += h.cls.eq(HdrClass.SHORT)
        with m.Else():
            m.d.comb += h.cls.eq(HdrClass.ROCE)
        with m.Switch(v.reason):
            for reason, err in err_of.items():
                with m.Case(reason):
                    m.d.comb += h.err.eq(err)
        m.d.comb += [
            h.src_ip.eq(ip.src), h.dqpn.eq(rec.bth.dqpn), h.opcode.eq(rec.bth.opcode),
            h.psn.eq(rec.bth.psn), h.ecn.eq(ip.ecn), h.syndrome.eq(rec.aeth.syndrome),
            h.plen.eq(rec.plen), h.port.eq(self.port), h.time.eq(self.time),
            h.mark.eq(rec.bth.resv6[:2]),
        ]
        return m


class _Port:
    """A registered value presented like a RAM read port's data (for ``_rmw_read``)."""

    def __init__(self, data):
        self.data = data


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


class AggControl(wiring.Component):
    """The aggregation control path (see the module docstring for the contract).

    Parameters
    ----------
    regmap : RegMap
        The register map (build parameters ``ports``, ``jobs``, ``flows``, ``slots``,
        ``pmtu_max``, ``data_width``, ``max_world`` come from it). Default ``build_regmap()``.
    time_bits : int
        Width of the arrival timestamps (default 48: wraps after 10 days at 322 MHz).
    rel_depth : int
        Depth of the release command FIFO (default 16).
    free_levels : int
        Min-tree levels per pipeline stage of the free_j computation (default 2).
    roles : bool
        Flow roles (model D17, spine-leaf; :mod:`.roles`). False: a job with a flow whose role
        is not MEMBER is refused (``JobError.ROLES``).
    """

    def __init__(self, regmap: RegMap | None = None, *, time_bits: int = 48, rel_depth: int = 16,
                 free_levels: int = 2, roles: bool = False):
        self.roles = bool(roles)
        rm = regmap if regmap is not None else build_regmap()
        p = rm.params
        self.map = rm
        self.ports, self.jobs, self.flows = p["ports"], p["jobs"], p["flows"]
        self.slots, self.pmtu_max, self.max_world = p["slots"], p["pmtu_max"], p["max_world"]
        self.data_width = p["data_width"]
        if time_bits < 33 or rel_depth < 2 or free_levels < 1:
            self._MustUse__silence = True  # rejected: no "created but never used" warning
        if time_bits < 33:
            raise ValueError(f"time_bits = {time_bits} must exceed the 32-bit CNP interval")
        if rel_depth < 2 or free_levels < 1:
            raise ValueError(f"rel_depth = {rel_depth} (>= 2), free_levels = {free_levels} (>= 1)")
        self.time_bits, self.rel_depth, self.free_levels = time_bits, rel_depth, free_levels
        self.port_bits = _bits(self.ports)
        self.job_bits = _bits(self.jobs)
        self.rank_bits = _bits(self.max_world)
        self.entry_bits = _bits(self.flows)
        self.slot_bits = _bits(self.slots)
        self.n_bits = ceil_log2(self.max_world + 1)
        self.w_bits = ceil_log2(self.slots + 1)  # W <= slots; also bounds free..rel distances
        self.plen_bits = 16
        self.beat_bytes = self.data_width // 8
        self.beat_shift = exact_log2(self.beat_bytes)
        self.beats_bits = self.plen_bits - self.beat_shift + 1
        self.cnt_width = ceil_log2(max(self.slots, self.max_world) + 1)
        self.disp_bits = _bits(len(Disp))
        # cycles a job's headers wait after an ACK/NAK that advanced acked_f (min tree stages)
        levels = ceil_log2(self.max_world)
        self.free_latency = 3 + max(0, (levels - 1) // free_levels)

        self.hdr_layout = data.StructLayout({
            "cls": HdrClass, "err": FrameError, "src_ip": 32, "dqpn": 24, "opcode": 8,
            "psn": PSN_BITS, "ecn": 2, "syndrome": 8, "plen": self.plen_bits, "mark": 2,
            "port": self.port_bits, "time": time_bits,
        })
        self.dec_layout = data.StructLayout({
            "action": Action, "disp": self.disp_bits, "job": self.job_bits,
            "rank": self.rank_bits, "entry": self.entry_bits, "slot": self.slot_bits,
            "index": PSN_BITS, "overwrite": 1, "op": 2, "plen": self.plen_bits,
            "beats": self.beats_bits, "cnp": 1, "rev_qpn": 24, "port": self.port_bits,
            "release": 1, "nak": 1, "nak_x": 32, "solicit": 1, "sol_psn": PSN_BITS,
            # D17: set the stage mark ``mark`` on the frame's header (forwarded, stored or sent);
            # payload from (REEMIT) or into (TOTAL) the slot's total buffer
            "remark": 1, "mark": 2, "total": 1,
        })
        # per-flow fast-retransmit state (model D16): in-order prefix, highest index present + 1,
        # the hole last handled (probed, and NAKed if ``naked``)
        self.rtx_layout = data.StructLayout({"nxt": PSN_BITS, "top": PSN_BITS, "mark_v": 1,
                                             "naked": 1, "mark": PSN_BITS})
        slot_fields = {"valid": 1, "index": PSN_BITS, "bitmap": self.max_world, "opcode": 4,
                       "plen": self.plen_bits, "total": 1}  # total: a leaf's total is in (D17)
        # D17: results only to the ranks of ``mask``, payload from the total buffer (``total``),
        # stage mark ``mark`` set on the stored header (0: as stored)
        rel_fields = {"job": self.job_bits, "slot": self.slot_bits, "index": PSN_BITS,
                      "n": self.n_bits, "plen": self.plen_bits, "seq": SEQ_BITS,
                      "mask": self.max_world, "total": 1, "mark": 2}
        if self.ports > 1:
            ports_layout = data.ArrayLayout(unsigned(self.port_bits), self.max_world)
            slot_fields["ports"] = ports_layout
            rel_fields["ports"] = ports_layout
        self.slot_layout = data.StructLayout(slot_fields)
        self.rel_layout = data.StructLayout(rel_fields)

        job_t, flow_t = rm.table("JOB"), rm.table("FLOW")
        self.job_cfg_layout = role_layout(job_t, Access.RW)
        self.flow_cfg_layout = role_layout(flow_t, Access.RW)
        self.job_status_layout = role_layout(job_t, Access.RO)
        self.flow_status_layout = role_layout(flow_t, Access.RO)
        self.job_set_layout = role_layout(job_t, Access.W1C)
        self.job_inc_layout = data.StructLayout(
            {c.name: unsigned(self.cnt_width) for c in JOB_COUNTERS})
        self.cnt_inc_layout = data.StructLayout(
            {c.name: unsigned(self.cnt_width) for c in GLOBAL_COUNTERS if c.name != "tx_frames"})
        super().__init__({
            "hdr": In(stream.Signature(self.hdr_layout)),
            "dec": Out(stream.Signature(self.dec_layout)),
            "rel": Out(stream.Signature(self.rel_layout)),
            "job_cfg": In(data.ArrayLayout(self.job_cfg_layout, self.jobs)),
            # the bank keeps the flow table's RW fields in a RAM: only the sequencer reads them
            "flow_rd": Out(cfg_read_signature(self.entry_bits, self.flow_cfg_layout)),
            "job_status": Out(data.ArrayLayout(self.job_status_layout, self.jobs)),
            "flow_status": Out(data.ArrayLayout(self.flow_status_layout, self.flows)),
            "job_set": Out(data.ArrayLayout(self.job_set_layout, self.jobs)),
            "job_cnt_inc": Out(data.ArrayLayout(self.job_inc_layout, self.jobs)),
            "cnt_inc": Out(self.cnt_inc_layout),
            "busy": Out(1),  # the enable sequencer is working (tests wait for it)
        })

    # RAM read forwarding into the decision stage ("slot", "cnp", "acked"); test subclasses turn
    # some off to show that the back-to-back tests notice.
    _no_forwarding: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ helpers
    def _rmw_read(self, m, mem_rd, same, advance, last_wr, name):
        """Resolve a synchronous RAM read for the decision stage: data of the read issued in the
        cycle the header entered the stage, forwarded from the write committed in that same
        cycle (by the decision in front: ``last_wr`` = its registered enable and data; ``same``:
        registered when the header entered, its address is that decision's), and held while the
        stage is stalled. The select is three flip-flops: one LUT per data bit."""
        loaded = Signal(name=f"{name}_loaded")
        m.d.sync += loaded.eq(advance)
        wr_en, wr_data = last_wr
        raw = Mux(wr_en & same, wr_data, mem_rd.data)
        if name in self._no_forwarding:
            raw = mem_rd.data
        hold = Signal.like(mem_rd.data, name=f"{name}_hold")
        eff = Signal.like(mem_rd.data, name=f"{name}_eff")
        m.d.comb += eff.eq(Mux(loaded, raw, hold))
        m.d.sync += hold.eq(eff)
        return eff

    # ------------------------------------------------------------------ elaborate
    def elaborate(self, platform):  # noqa: C901 (the pipeline registers and the job state)
        m = Module()
        J, F, WD = self.jobs, self.flows, self.max_world
        TB = self.time_bits

        m.submodules.ft = ft = FlowTable(F, jobs=J, max_world=WD)

        # ============================================================ job state (flops)
        def per_job(width, name, init=0):
            return Array(Signal(width, name=f"{name}{j}", init=init) for j in range(J))

        enabled = per_job(1, "enabled")
        error = per_job(8, "error")
        j_n = per_job(self.n_bits, "n")
        j_w = per_job(self.w_bits, "w")
        j_base = per_job(self.slot_bits, "base")
        j_pmtu = per_job(13, "pmtu")
        j_op = per_job(2, "op")
        j_cnp = per_job(32, "cnp_interval")
        free = per_job(PSN_BITS, "free")
        rel = per_job(PSN_BITS, "rel")
        npend = per_job(self.w_bits, "npend")  # COMPLETE slots beyond rel (out of order)
        busy_slots = per_job(self.w_bits, "slots_busy")
        chain_busy = per_job(1, "chain_busy")
        free_busy = per_job(4, "free_busy")  # free_j computations in flight
        acked = Array(Array(Signal(PSN_BITS, name=f"acked{j}_{r}") for r in range(WD))
                      for j in range(J))
        cnp_seen = Array(Signal(WD, name=f"cnp_seen{j}") for j in range(J))
        rtx_seen = Array(Signal(WD, name=f"rtx_seen{j}") for j in range(J))  # rtx word valid
        acked_e = [Signal(PSN_BITS, name=f"acked_e{e}") for e in range(F)]  # FLOW.ACKED copy
        jr = JobRoles(J, self.rank_bits, WD, self.w_bits, PSN_BITS)  # D17: flow roles
        j_full = [Cat(*(j_n[j] > i for i in range(WD))) for j in range(J)]
        j_masks = [jr.masks(j_full[j], jr.leaf[j], jr.up[j], jr.down[j]) for j in range(J)]

        # ============================================================ memories
        m.submodules.slotmem = slotmem = Memory(shape=self.slot_layout, depth=self.slots,
                                                init=[])
        s_wr = slotmem.write_port()
        s_rd = slotmem.read_port()  # decision pipeline
        s_rd2 = slotmem.read_port()  # release scheduler
        cnp_depth = (1 << self.job_bits) * (1 << self.rank_bits)
        m.submodules.cnpmem = cnpmem = Memory(shape=unsigned(TB), depth=cnp_depth, init=[])
        c_wr = cnpmem.write_port()
        c_rd = cnpmem.read_port()
        m.submodules.rtxmem = rtxmem = Memory(shape=self.rtx_layout, depth=cnp_depth, init=[])
        x_wr = rtxmem.write_port()
        x_rd = rtxmem.read_port()

        m.submodules.relq = relq = fifo.SyncFIFOBuffered(width=self.rel_layout.size,
                                                         depth=self.rel_depth)
        m.d.comb += [self.rel.valid.eq(relq.r_rdy), self.rel.payload.eq(relq.r_data),
                     relq.r_en.eq(self.rel.ready)]

        # ============================================================ sub-blocks
        m.submodules.decide = dk = Decide(self)
        m.submodules.release = sch = ReleaseScheduler(self)
        m.submodules.freemin = fmin = FreeMinTree(self)
        m.submodules.sequencer = seq = EnableSequencer(self, ft)
        for name in seq.ft.signature.members:
            a, b = getattr(seq.ft, name), getattr(ft, name)
            if name in ("chk_fwd_hit", "chk_rev_hit", "live"):
                m.d.comb += a.eq(b)
            else:
                m.d.comb += b.eq(a)
        wiring.connect(m, wiring.flipped(self.flow_rd), seq.flow_rd)
        sq = seq.job
        quiesce = seq.quiesce
        m.d.comb += self.busy.eq(seq.busy)

        # ============================================================ pipeline registers
        # registered block boundaries: neither stream's ready reaches the other combinationally
        m.submodules.hdr_skid = hdr_skid = SkidBuffer(self.hdr_layout)
        m.submodules.dec_skid = dec_skid = SkidBuffer(self.dec_layout)
        wiring.connect(m, wiring.flipped(self.hdr), hdr_skid.i)
        wiring.connect(m, dec_skid.o, wiring.flipped(self.dec))
        hdr, dec_o = hdr_skid.o, dec_skid.i
        advance = Signal()
        block4 = Signal()
        # stages 1..S: the flow lookup (the key is compared from the input register, stage 0;
        # S = the table's lookup latency); stage S + 1: decide
        S = ft.lk_latency
        vs = [Signal(name=f"v{i}") for i in range(1, S + 2)]
        hs = [Signal(self.hdr_layout, name=f"h{i}") for i in range(1, S + 2)]
        h3, v4, h4 = hs[S - 1], vs[S], hs[S]
        ov = Signal()  # output register valid
        m.d.comb += [
            hdr.ready.eq(advance & ~quiesce),
            dec_o.valid.eq(ov),
            advance.eq((~ov | dec_o.ready) & ~(v4 & block4)),
        ]
        with m.If(advance):
            m.d.sync += [vs[0].eq(hdr.valid & hdr.ready), hs[0].eq(hdr.payload)]
            m.d.sync += [vs[i].eq(vs[i - 1]) for i in range(1, S + 1)]
            m.d.sync += [hs[i].eq(hs[i - 1]) for i in range(1, S + 1)]
        pipe_empty = ~Cat(*vs).any()

        def is_ctrl(h):
            return (h.opcode == OP_ACK) | (h.opcode == OP_CNP)

        # the flow table compares the key of the header being accepted (a flip-flop output of the
        # input skid buffer; a header not taken is compared too, and its result ignored)
        m.d.comb += [ft.lk_en.eq(advance), ft.lk_ip.eq(hdr.payload.src_ip),
                     ft.lk_qpn.eq(hdr.payload.dqpn), ft.lk_rev.eq(is_ctrl(hdr.payload))]

        # ------------------------------------------------------------ stage 3
        fd = ft.lk_data
        k3 = Signal(PSN_BITS)
        slot3 = Signal(self.slot_bits)
        m.d.comb += [
            k3.eq(h3.psn - fd.start),
            slot3.eq(j_base[fd.job] + (k3 & (j_w[fd.job] - 1))),
            s_rd.en.eq(advance), s_rd.addr.eq(slot3),
            c_rd.en.eq(advance), c_rd.addr.eq(Cat(fd.rank, fd.job)),
            x_rd.en.eq(advance), x_rd.addr.eq(Cat(fd.rank, fd.job)),
        ]
        hit4 = Signal()
        e4 = Signal(self.entry_bits)
        j4 = Signal(self.job_bits)
        r4 = Signal(self.rank_bits)
        k4 = Signal(PSN_BITS)
        slot4 = Signal(self.slot_bits)
        rq4 = Signal(24)
        st4 = Signal(PSN_BITS)
        # the decision's header checks, registered with the frame (off the slot word's path)
        pre3, pre4 = Signal(pre_layout(self)), Signal(pre_layout(self))
        precheck(m, self, pre3, h3, ft.lk_hit, Array(enabled)[fd.job], j_pmtu[fd.job],
                 Cat(*(jr.any_roles(j) for j in range(J))).bit_select(fd.job, 1),
                 JobRoles.role(fd.rank, Array(jr.leaf)[fd.job], Array(jr.up)[fd.job],
                               Array(jr.down)[fd.job], Array(jr.rack)[fd.job]),
                 Array(j_full[j] & j_masks[j][0] for j in range(J))[fd.job])
        with m.If(advance):
            m.d.sync += [hit4.eq(ft.lk_hit), e4.eq(ft.lk_entry), j4.eq(fd.job), r4.eq(fd.rank),
                         k4.eq(k3), slot4.eq(slot3), rq4.eq(fd.rev_qpn), st4.eq(fd.start),
                         pre4.eq(pre3)]

        # ------------------------------------------------------------ stage 4: decide
        # the last writes of the decision in front (forwarded into the decision stage: the slot
        # scrub needs none, it clears slots of a job whose frames are unregistered) and whether
        # the header entering the stage has that decision's slot / flow (compared at stage 3)
        same_slot, same_flow = Signal(), Signal()
        with m.If(advance):
            m.d.sync += [same_slot.eq(slot3 == slot4),
                         same_flow.eq(Cat(fd.rank, fd.job) == Cat(r4, j4))]
        sw_en, sw_data = Signal(), Signal(self.slot_layout)
        cw_en, cw_data = Signal(), Signal(TB)
        xw_en, xw_data = Signal(), Signal(self.rtx_layout)
        m.d.sync += [sw_en.eq(s_wr.en & ~seq.scrub_go), sw_data.eq(s_wr.data),
                     cw_en.eq(c_wr.en), cw_data.eq(c_wr.data),
                     xw_en.eq(x_wr.en), xw_data.eq(x_wr.data)]
        slot_cur = data.View(self.slot_layout,
                             self._rmw_read(m, s_rd, same_slot, advance, (sw_en, sw_data),
                                            "slot"))
        cnp_last = self._rmw_read(m, c_rd, same_flow, advance, (cw_en, cw_data), "cnp")
        # the flow's word counts only once written since the enable (rtx_seen, read at stage 3;
        # the decision in front's write sets it and is forwarded with the word)
        rtx_seen3 = Signal()
        with m.If(advance):
            m.d.sync += rtx_seen3.eq(rtx_seen[fd.job].bit_select(fd.rank, 1))
        rtx_cur = self._rmw_read(m, _Port(Mux(rtx_seen3, x_rd.data, 0)), same_flow, advance,
                                 (xw_en, xw_data), "rtx")

        n_cur = j_n[j4]
        # acked_f is read one stage early (a jobs x max_world mux off the decision path) and
        # forwarded like a RAM read
        acked_rd = Signal(PSN_BITS)
        with m.If(advance):
            m.d.sync += acked_rd.eq(acked[fd.job][fd.rank])
        aw_en, aw_data = Signal(), Signal(PSN_BITS)
        acked_cur = self._rmw_read(m, _Port(acked_rd), same_flow, advance, (aw_en, aw_data),
                                   "acked")
        registered = v4 & (h4.cls == HdrClass.ROCE) & hit4 & enabled[j4]
        onehot_r = Signal(WD)
        m.d.comb += onehot_r.eq((Const(1, WD) << r4)[:WD])
        # D16 is not used on leaf and spine jobs (D17)
        fast_en = Cat(*(self.job_cfg[j].ctrl.fast_retx & ~jr.any_roles(j)
                        for j in range(J))).bit_select(j4, 1)
        leaf4 = Array(jr.leaf)[j4]
        role4 = JobRoles.role(r4, leaf4, Array(jr.up)[j4], Array(jr.down)[j4],
                              Array(jr.rack)[j4])
        m.d.comb += [dk.roles.eq(Cat(*(jr.any_roles(j) for j in range(J))).bit_select(j4, 1)),
                     dk.leaf.eq(leaf4), dk.role.eq(role4), dk.upptr.eq(Array(jr.upptr)[j4]),
                     dk.cmask.eq(Array(mk[0] for mk in j_masks)[j4])]
        m.d.comb += [
            dk.h.eq(h4), dk.registered.eq(registered), dk.k.eq(k4), dk.st.eq(st4),
            dk.rank.eq(r4), dk.onehot_r.eq(onehot_r), dk.n.eq(n_cur), dk.w.eq(j_w[j4]),
            dk.free.eq(free[j4]), dk.rel.eq(rel[j4]), dk.pmtu.eq(j_pmtu[j4]),
            dk.cnp_interval.eq(j_cnp[j4]), dk.fast_en.eq(fast_en), dk.slot.eq(slot_cur),
            dk.rtx.eq(rtx_cur),
            dk.acked.eq(acked_cur), dk.cnp_last.eq(cnp_last), dk.pre.eq(pre4),
            dk.cnp_seen.eq(cnp_seen[j4].bit_select(r4, 1)),
        ]
        disp, action, rx_data = dk.disp, dk.action, dk.rx_data
        ack_stale, ack_take, cand = dk.ack_stale, dk.ack_take, dk.cand
        slot_write, slot_new, first = dk.slot_write, dk.slot_new, dk.first
        release_now, pend_inc, mismatch = dk.release_now, dk.pend_inc, dk.mismatch
        cnp_send, cnp_supp = dk.cnp_send, dk.cnp_supp
        nak_fire, solicit, rtx_write = dk.nak_fire, dk.solicit, dk.rtx_write

        # stall conditions of the decision stage
        scrub_turn = Signal()
        scrub_want = seq.scrub_want
        m.d.sync += scrub_turn.eq(~scrub_turn)
        m.d.comb += block4.eq(
            # ACK/NAK acceptance reads rel_j and acked_f (never free_j): only data waits for
            # free_j; everything waits for a chained release (it moves rel_j)
            (registered & (chain_busy[j4] | Array(jr.chain_up)[j4]
                           | ((free_busy[j4] != 0) & ~dk.ctrl)))
            | ~relq.w_rdy
            # (any header, not only one writing a slot: keeps the decision off the stall path)
            | (scrub_want & scrub_turn))
        commit = Signal()
        m.d.comb += commit.eq(v4 & advance)
        m.d.sync += [aw_en.eq(commit & registered & ack_take), aw_data.eq(cand)]
        cj = Signal(J)  # commit for job j, registered frame
        m.d.comb += cj.eq(Mux(commit & registered, 1 << j4, 0))

        # ---- decision output register
        dec = dec_o.payload
        beats = (h4.plen + self.beat_bytes - 1) >> self.beat_shift
        with m.If(advance):
            m.d.sync += [ov.eq(v4), dec.action.eq(action), dec.disp.eq(disp), dec.job.eq(j4),
                         dec.rank.eq(r4), dec.entry.eq(e4), dec.slot.eq(slot4), dec.index.eq(k4),
                         dec.overwrite.eq(first), dec.op.eq(j_op[j4]), dec.plen.eq(h4.plen),
                         dec.beats.eq(beats), dec.cnp.eq(cnp_send), dec.rev_qpn.eq(rq4),
                         dec.port.eq(h4.port), dec.release.eq(release_now | dk.up_now),
                         dec.remark.eq(dk.remark), dec.mark.eq(dk.mark), dec.total.eq(dk.total),
                         dec.nak.eq(registered & nak_fire), dec.nak_x.eq(dk.nak_x),
                         dec.solicit.eq(registered & solicit), dec.sol_psn.eq(dk.sol_psn)]
        with m.Elif(dec_o.ready):
            m.d.sync += ov.eq(0)

        # ---- RAM writes of the decision stage (slot memory shared with the scrub)
        scrub_go = Signal()
        dec_slot_wr = commit & slot_write
        m.d.comb += [scrub_go.eq(scrub_want & ~dec_slot_wr), seq.scrub_go.eq(scrub_go)]
        m.d.comb += [
            s_wr.en.eq(dec_slot_wr | scrub_go),
            s_wr.addr.eq(Mux(dec_slot_wr, slot4, seq.scrub_addr)),
            s_wr.data.eq(Mux(dec_slot_wr, slot_new.as_value(), 0)),
            c_wr.en.eq(commit & cnp_send),
            c_wr.addr.eq(Cat(r4, j4)),
            c_wr.data.eq(h4.time),
            x_wr.en.eq(commit & registered & rtx_write),
            x_wr.addr.eq(Cat(r4, j4)),
            x_wr.data.eq(dk.rtx_new),
        ]

        # ============================================================ release scheduler
        up_now = dk.up_now
        dec_push = commit & (release_now | up_now)
        rel_w = data.View(self.rel_layout, relq.w_data)
        m.d.comb += [sch.chain.eq(Cat(*[chain_busy[j] for j in range(J)])),
                     sch.fifo_ready.eq(relq.w_rdy),
                     sch.dec_push.eq(dec_push), s_rd2.addr.eq(sch.rd_addr),
                     s_rd2.en.eq(sch.rd_en), sch.rd_data.eq(s_rd2.data)]
        for j in range(J):
            m.d.comb += [sch.rel[j].eq(rel[j]), sch.base[j].eq(j_base[j]), sch.w[j].eq(j_w[j]),
                         sch.n[j].eq(j_n[j]), sch.npend[j].eq(npend[j]),
                         sch.chain_up[j].eq(jr.chain_up[j]), sch.upptr[j].eq(jr.upptr[j]),
                         sch.npend_up[j].eq(jr.npend_up[j]), sch.leaf[j].eq(jr.leaf[j]),
                         sch.cmask[j].eq(j_masks[j][0]), sch.mmask[j].eq(j_masks[j][1]),
                         sch.upmask[j].eq(j_masks[j][2])]
        js, sch_rel_job, chain_done = sch.job, sch.rel_job, sch.done
        sch_cmd = Signal(self.rel_layout)
        m.d.comb += sch_cmd.eq(sch.cmd)
        dec_cmd = Signal(self.rel_layout)
        m.d.comb += [dec_cmd.job.eq(j4), dec_cmd.slot.eq(slot4), dec_cmd.index.eq(k4),
                     dec_cmd.n.eq(n_cur), dec_cmd.plen.eq(h4.plen),
                     # D17: a leaf's partial goes to UP, its total to the MEMBER ranks
                     dec_cmd.mask.eq(Mux(up_now, Array(mk[2] for mk in j_masks)[j4],
                                         Mux(leaf4, Array(mk[1] for mk in j_masks)[j4],
                                             Array(j_full)[j4]))),
                     dec_cmd.total.eq(leaf4 & ~up_now),
                     dec_cmd.mark.eq(Mux(up_now, MARK_PARTIAL, 0))]
        # seq = decisions output up to and including the one that caused the release (a chained
        # release counts every decision committed so far): the emitter sends a release only after
        # the payload of every decision before seq is written, and after their own frames
        n_commit = Signal(SEQ_BITS)
        m.d.sync += n_commit.eq(n_commit + commit)
        m.d.comb += [dec_cmd.seq.eq(n_commit + 1), sch_cmd.seq.eq(n_commit + commit)]
        if self.ports > 1:
            m.d.comb += dec_cmd.ports.eq(slot_new.ports)
        m.d.comb += [relq.w_en.eq(dec_push | sch.push),
                     rel_w.eq(Mux(dec_push, dec_cmd.as_value(), sch_cmd.as_value()))]

        # ============================================================ free_j (min tree)
        f_valid = Signal()
        f_job = Signal(self.job_bits)
        m.d.sync += [f_valid.eq(commit & registered & ack_take), f_job.eq(j4)]
        m.d.comb += [fmin.i_valid.eq(f_valid), fmin.i_job.eq(f_job), fmin.free.eq(free[f_job]),
                     fmin.n.eq(j_n[f_job])]
        m.d.comb += [fmin.acked[r].eq(acked[f_job][r]) for r in range(WD)]
        a_free, a_valid, a_job = fmin.o_free, fmin.o_valid, fmin.o_job
        step = Signal(self.w_bits)  # indices freed by the result being applied
        m.d.comb += step.eq(a_free - free[a_job])

        # ============================================================ enable sequencer
        m.d.comb += [seq.job_cfg.eq(self.job_cfg),
                     seq.enabled.eq(Cat(*[enabled[j] for j in range(J)])),
                     seq.pipe_empty.eq(pipe_empty),
                     seq.job_idle.eq(Cat(*[~chain_busy[j] & ~jr.chain_up[j]
                                          & (free_busy[j] == 0) for j in range(J)]))]
        m.d.comb += [seq.base[j].eq(j_base[j]) for j in range(J)]
        m.d.comb += [seq.w[j].eq(j_w[j]) for j in range(J)]
        with m.If(seq.load):
            # a new attempt: an error of an earlier refused one no longer applies
            m.d.sync += error[sq].eq(JobError.NONE)
            m.d.sync += [j_n[sq].eq(seq.cfg_n), j_w[sq].eq(seq.cfg_w),
                         j_base[sq].eq(seq.cfg_base), j_pmtu[sq].eq(seq.cfg_pmtu),
                         j_op[sq].eq(seq.cfg_op), j_cnp[sq].eq(seq.cfg_cnp)]
        seq_enable, seq_disable, seq_reset = seq.enable, seq.disable, seq.reset
        seq_set_err, seq_err = seq.set_err, seq.err

        # ============================================================ per-job state updates
        for j in range(J):
            dj = cj[j]  # the decision stage commits a registered frame of job j
            with m.If(dj & release_now):
                m.d.sync += rel[j].eq(rel[j] + 1)
                with m.If(npend[j] != 0):
                    m.d.sync += chain_busy[j].eq(1)
            with m.If(dj & pend_inc):
                m.d.sync += npend[j].eq(npend[j] + 1)
            with m.If(sch_rel_job[j]):
                m.d.sync += [rel[j].eq(rel[j] + 1), npend[j].eq(npend[j] - 1)]
            with m.If(chain_done & (js == j)):
                m.d.sync += chain_busy[j].eq(0)
            with m.If(dj & ack_take):
                m.d.sync += acked[j][r4].eq(cand)
            applying = a_valid & (a_job == j)
            with m.If(applying):
                m.d.sync += free[j].eq(a_free)
            m.d.sync += free_busy[j].eq(free_busy[j] + (dj & ack_take) - applying)
            m.d.sync += busy_slots[j].eq(busy_slots[j] + (dj & first)
                                         - Mux(applying, step, 0))
            with m.If(dj & cnp_send):
                m.d.sync += cnp_seen[j].eq(cnp_seen[j] | onehot_r)
            with m.If(dj & rtx_write):
                m.d.sync += rtx_seen[j].eq(rtx_seen[j] | onehot_r)
            with m.If((sq == j) & seq_enable):
                m.d.sync += [enabled[j].eq(1), error[j].eq(JobError.NONE),
                             jr.leaf[j].eq(seq.roles_leaf), jr.up[j].eq(seq.roles_up),
                             jr.down[j].eq(seq.roles_down), jr.rack[j].eq(seq.roles_rack)]
            # D17: the partial pointer and its chain, like rel / npend / chain_busy
            with m.If(dj & up_now):
                m.d.sync += jr.upptr[j].eq(jr.upptr[j] + 1)
                with m.If(jr.npend_up[j] != 0):
                    m.d.sync += jr.chain_up[j].eq(1)
            with m.If(dj & dk.up_pend):
                m.d.sync += jr.npend_up[j].eq(jr.npend_up[j] + 1)
            with m.If(sch.up_job[j]):
                m.d.sync += [jr.upptr[j].eq(jr.upptr[j] + 1),
                             jr.npend_up[j].eq(jr.npend_up[j] - 1)]
            with m.If(sch.done_up & (js == j)):
                m.d.sync += jr.chain_up[j].eq(0)
            with m.If((sq == j) & seq_disable):
                m.d.sync += [enabled[j].eq(0), error[j].eq(JobError.NONE)]
            with m.If((sq == j) & seq_set_err):
                m.d.sync += error[j].eq(seq_err)
            with m.If((sq == j) & seq_reset):
                m.d.sync += [free[j].eq(0), rel[j].eq(0), npend[j].eq(0), busy_slots[j].eq(0),
                             chain_busy[j].eq(0), free_busy[j].eq(0), cnp_seen[j].eq(0),
                             rtx_seen[j].eq(0), jr.upptr[j].eq(0), jr.npend_up[j].eq(0),
                             jr.chain_up[j].eq(0)]
                m.d.sync += [acked[j][r].eq(0) for r in range(WD)]
        # per-entry copy of acked_f for FLOW.ACKED
        for e in range(F):
            with m.If(commit & registered & ack_take & (e4 == e)):
                m.d.sync += acked_e[e].eq(cand)
            with m.If(ft.bind_en & (ft.bind_entry == e)):
                m.d.sync += acked_e[e].eq(0)

        # ============================================================ status and counters
        for j in range(J):
            st = self.job_status[j]
            m.d.comb += [
                st.status.enabled.eq(enabled[j]),
                st.status.error.eq(error[j]),
                st.free_ptr.index.eq(Mux(enabled[j], free[j], 0)),
                st.release_ptr.index.eq(Mux(enabled[j], rel[j], 0)),
                st.slots_busy.count.eq(Mux(enabled[j], busy_slots[j], 0)),
                st.partial_ptr.index.eq(Mux(enabled[j] & jr.leaf[j], jr.upptr[j], 0)),
            ]
        for e in range(F):
            bound = ft.live[e]
            m.d.comb += [self.flow_status[e].status.bound.eq(bound),
                         self.flow_status[e].acked.index.eq(Mux(bound, acked_e[e], 0))]
        # counter increments and status set strobes: one cycle after the decision, from its
        # registered strobes (off the decision stage's paths)
        def q(v, name):
            r = Signal.like(v, name=f"{name}_q")
            m.d.sync += r.eq(v)
            return r

        cj_q, disp_q = q(cj, "cj"), q(disp, "disp")
        mismatch_q, rx_data_q, ack_stale_q = q(mismatch, "mismatch"), q(rx_data, "rx_data"), \
            q(ack_stale, "ack_stale")
        cnp_send_q, cnp_supp_q = q(cnp_send, "cnp_send"), q(cnp_supp, "cnp_supp")
        release_q, up_q = q(release_now, "release_now"), q(up_now, "up_now")
        nak_q, solicit_q = q(nak_fire, "nak_fire"), q(solicit, "solicit")
        nres_q = q(JobRoles.results(n_cur, leaf4), "nres")
        commit_q = q(commit, "commit")
        sch_rel_q, sch_up_q = q(sch_rel_job, "sch_rel_job"), q(sch.up_job, "sch_up_job")
        freed_q = [q(Mux(a_valid & (a_job == j), step, 0), f"freed{j}") for j in range(J)]
        for j in range(J):
            m.d.sync += self.job_set[j].status.mismatch.eq(cj_q[j] & mismatch_q)

        disp_names = {d.value: name for d, name in zip(Disp, DISPOSITIONS, strict=True)}
        job_disp = [d for d in Disp if disp_names[d.value] in self.job_inc_layout.members]
        for j in range(J):
            inc = self.job_cnt_inc[j]
            dj = cj_q[j]
            for d in job_disp:
                m.d.sync += inc[disp_names[d.value]].eq(dj & (disp_q == d.value))
            m.d.sync += [
                inc.rx_data.eq(dj & rx_data_q),
                inc.ack_stale.eq(dj & ack_stale_q),
                inc.cnp_sent.eq(dj & cnp_send_q),
                inc.cnp_suppressed.eq(dj & cnp_supp_q),
                inc.released.eq((dj & release_q) + sch_rel_q[j]),
                inc.results_sent.eq(Mux(dj & release_q, nres_q, 0)
                                    + Mux(sch_rel_q[j], JobRoles.results(j_n[j], jr.leaf[j]),
                                          0)),
                inc.partials_up.eq((dj & up_q) + sch_up_q[j]),
                inc.freed.eq(freed_q[j]),
                inc.saturations.eq(0),
                inc.fast_retx.eq(dj & nak_q),
                inc.fast_retx_probes.eq(dj & solicit_q),
            ]
        g = self.cnt_inc
        m.d.sync += [
            g.rx_frames.eq(commit_q),
            g.fwd_not_roce.eq(commit_q & (disp_q == Disp.FWD_NOT_ROCE)),
            g.fwd_unregistered.eq(commit_q & (disp_q == Disp.FWD_UNREGISTERED)),
        ]
        return m
