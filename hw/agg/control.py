"""Aggregation control path: what happens to each frame, given its parsed header.

:class:`AggControl` implements steps 1-6 of the reference model (:mod:`netreduce.sim.model.engine`,
whose docstring and decisions D1-D16 are the specification) for everything except payload
arithmetic and frame bytes: flow lookup, job state and the enable sequencer (D9), slot state, the
per-frame decision, in-order release, ACK/NAK snooping with freeing, and the CNP rate limiter. It
is bit-exact with the model: every frame gets the model's disposition, the model's release
commands, CNP decisions and counter increments (the tests compare them frame by frame).

Sub-blocks (one concern each, all inside this component because they share the per-job state
that the decision stage must see up to date every cycle):

* flow table (:class:`~.flowtable.FlowTable`): latched keys, parallel lookup;
* job state: latched configuration (n, W, slot base, PMTU, op, CNP interval), free / release
  pointers, slots in use, status; the *enable sequencer* validates and latches a job on
  ``JOB.CTRL.enable`` 0 -> 1 and discards it on 1 -> 0;
* slot state (``lib.memory.Memory``, one word per slot): valid, index, contribution bitmap,
  opcode / length signature, per-rank arrival port. EMPTY = not valid or holding another index;
  FILLING / COMPLETE = bitmap partial / full; RELEASED = index in [free_j, rel_j) (so releasing
  and freeing never rewrite a slot);
* decision stage: checks in the model's priority, window, slot read-modify-write;
* release scheduler: releases complete slots in index order (an in-order completion is released
  by the decision stage itself; out-of-order completions are counted per job and released by
  the scheduler when the gap closes);
* ACK monitor: acked_f per flow, free_j = min over the job's flows (a pipelined min tree);
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
    a free-running counter, used by the CNP limiter; the model's ``time``). ``hdr.ready``
    depends combinationally on ``dec.ready`` and registered state, never on ``hdr.valid``.
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
    an index is issued at the decision of the frame that completes it (or later); the consumer
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
* Latency: header accepted in cycle t -> decision valid in cycle t + 5 (registers: input,
  CAM match, entry RAM data, index/slot + slot RAM data, decision output), when
  nothing stalls. Counter increments and status set strobes are registered from the same
  clock edge: they are valid in the cycle the decision becomes valid (chained releases and
  free_j results count when they happen).
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
  - every other cycle while the enable sequencer clears the slots of a job being enabled, if
    the decision stage wants to write a slot in that cycle;
  - while the sequencer commits or discards a job (it stops taking headers until the pipeline
    is empty).
* Enable: ``JOB.CTRL.enable`` 0 -> 1 is seen one cycle after the bank's write; the sequencer
  checks the job registers (1 cycle), scans the ``flows`` flow entries (one per cycle; the
  bank's flow RAM is addressed one entry ahead, from the check cycle on, so its read latency
  adds no cycle), clears the job's W slots, then commits (enabled). Until then, frames of the
  job are unregistered. A refused job gets ``JOB.STATUS.error`` (model D9; the bank's
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
(refused as KEY_CONFLICT; the model rebinds it if the keys differ). Not implemented: flow roles
(model D17, spine-leaf): a job with any flow whose ``FLOW.CFG.role`` is not MEMBER is refused
(``JobError.ROLES``), where the model runs it.

Error behaviour: bad frames are counted and never change state (D14); a frame of a job being
disabled while in flight is classified unregistered. Only the consumers' backpressure (``dec``,
``rel``) can stall the pipeline indefinitely.
"""

from __future__ import annotations

from enum import IntEnum

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from netreduce.regmap import (
    DISPOSITIONS,
    GLOBAL_COUNTERS,
    JOB_COUNTERS,
    PMTU_VALUES,
    Access,
    JobError,
    RegMap,
    Table,
    build_regmap,
)

from ..csr.bank import cfg_read_signature
from .flowtable import FlowTable

__all__ = ["AggControl", "ParserAdapter", "HdrClass", "FrameError", "Action", "Disp", "role_layout",
           "OP_ACK", "OP_CNP"]

PSN_BITS = 24
SEQ_BITS = 16  # decision sequence numbers (modulo): orders release commands among decisions
OP_ACK, OP_CNP = 0x11, 0x81


class HdrClass(enum.Enum, shape=2):
    """The parser's classification of a frame (model step 1 / D10)."""

    NOT_ROCE = 0  # not IPv4/IHL 5/unfragmented/UDP 4791, or too short to tell: fwd_not_roce
    SHORT = 1  # RoCEv2 but shorter than the end of the BTH: fwd_unregistered
    ROCE = 2  # a whole BTH: looked up by forward or reverse key


class FrameError(enum.Enum, shape=3):
    """The first failing frame-level check of the parser, in the model's order (step 3)."""

    NONE = 0
    LENGTH = 1  # IPv4/UDP length, truncated extension headers, PadCnt -> drop_length
    IP_CHECKSUM = 2  # -> drop_ip_checksum
    OPCODE = 3  # TVer != 0 or an opcode outside the RC/UC/CNP table -> drop_opcode
    ICRC = 4  # -> drop_icrc


class Action(enum.Enum, shape=3):
    FORWARD = 0  # send the frame unchanged, on its arrival port
    DROP = 1
    CONTRIBUTE = 2  # add the payload into ``slot`` (``overwrite``: the first contribution)
    REEMIT = 3  # send the frame's own header with the slot's aggregate (retransmission)
    PROBE = 4  # behind the window: send the frame's payload-free duplicate probe (model D15)


Disp = IntEnum("Disp", {name.upper(): i for i, name in enumerate(DISPOSITIONS)})
Disp.__doc__ = "The disposition counter of a decision (netreduce.regmap.DISPOSITIONS order)."

_ERR_DISP = {FrameError.LENGTH: Disp.DROP_LENGTH, FrameError.IP_CHECKSUM: Disp.DROP_IP_CHECKSUM,
             FrameError.OPCODE: Disp.DROP_OPCODE, FrameError.ICRC: Disp.DROP_ICRC}


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
        roce = ((rec.eth.ethertype == 0x0800) & (ip.version == 4) & (ip.ihl == 5)
                & (ip.protocol == 17) & ((ip.flags_frag & 0x3FFF) == 0)
                & (rec.udp.dport == 4791))
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
    """

    def __init__(self, regmap: RegMap | None = None, *, time_bits: int = 48, rel_depth: int = 16,
                 free_levels: int = 2):
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
        self.free_latency = 2 + max(0, (levels - 1) // free_levels)

        self.hdr_layout = data.StructLayout({
            "cls": HdrClass, "err": FrameError, "src_ip": 32, "dqpn": 24, "opcode": 8,
            "psn": PSN_BITS, "ecn": 2, "syndrome": 8, "plen": self.plen_bits,
            "port": self.port_bits, "time": time_bits,
        })
        self.dec_layout = data.StructLayout({
            "action": Action, "disp": self.disp_bits, "job": self.job_bits,
            "rank": self.rank_bits, "entry": self.entry_bits, "slot": self.slot_bits,
            "index": PSN_BITS, "overwrite": 1, "op": 2, "plen": self.plen_bits,
            "beats": self.beats_bits, "cnp": 1, "rev_qpn": 24, "port": self.port_bits,
            "release": 1, "nak": 1, "nak_x": 32, "solicit": 1, "sol_psn": PSN_BITS,
        })
        # per-flow fast-retransmit state (model D16): in-order prefix, highest index present + 1,
        # the hole last handled (probed, and NAKed if ``naked``)
        self.rtx_layout = data.StructLayout({"nxt": PSN_BITS, "top": PSN_BITS, "mark_v": 1,
                                             "naked": 1, "mark": PSN_BITS})
        slot_fields = {"valid": 1, "index": PSN_BITS, "bitmap": self.max_world, "opcode": 4,
                       "plen": self.plen_bits}
        rel_fields = {"job": self.job_bits, "slot": self.slot_bits, "index": PSN_BITS,
                      "n": self.n_bits, "plen": self.plen_bits, "seq": SEQ_BITS}
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
    def _rmw_read(self, m, mem_rd, addr_now, advance, last_wr, name):
        """Resolve a synchronous RAM read for the decision stage: data of the read issued in the
        cycle the header entered the stage, forwarded from the write committed in that same
        cycle, and held while the stage is stalled."""
        loaded = Signal(name=f"{name}_loaded")
        m.d.sync += loaded.eq(advance)
        wr_en, wr_addr, wr_data = last_wr
        raw = Mux(wr_en & (wr_addr == addr_now), wr_data, mem_rd.data)
        if name in self._no_forwarding:
            raw = mem_rd.data
        hold = Signal.like(mem_rd.data, name=f"{name}_hold")
        eff = Signal.like(mem_rd.data, name=f"{name}_eff")
        m.d.comb += eff.eq(Mux(loaded, raw, hold))
        m.d.sync += hold.eq(eff)
        return eff

    # ------------------------------------------------------------------ elaborate
    def elaborate(self, platform):  # noqa: C901 (one pipeline, read top to bottom)
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

        def fullmask(n):
            return Cat(*(n > i for i in range(WD)))

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

        # ============================================================ pipeline registers
        advance = Signal()
        block4 = Signal()
        quiesce = Signal()
        v1, v2, v3, v4 = (Signal(name=f"v{i}") for i in range(1, 5))
        h1, h2, h3, h4 = (Signal(self.hdr_layout, name=f"h{i}") for i in range(1, 5))
        ov = Signal()  # output register valid
        m.d.comb += [
            self.hdr.ready.eq(advance & ~quiesce),
            self.dec.valid.eq(ov),
            advance.eq((~ov | self.dec.ready) & ~(v4 & block4)),
        ]
        with m.If(advance):
            m.d.sync += [v1.eq(self.hdr.valid & self.hdr.ready), h1.eq(self.hdr.payload),
                         v2.eq(v1), h2.eq(h1), v3.eq(v2), h3.eq(h2), v4.eq(v3), h4.eq(h3)]
        pipe_empty = ~(v1 | v2 | v3 | v4)

        def is_ctrl(h):
            return (h.opcode == OP_ACK) | (h.opcode == OP_CNP)

        # stage 1: CAM compare; stage 2: encode + entry RAM; stage 3: results
        m.d.comb += [ft.lk_en.eq(advance), ft.lk_ip.eq(h1.src_ip), ft.lk_qpn.eq(h1.dqpn),
                     ft.lk_rev.eq(is_ctrl(h1))]

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
        with m.If(advance):
            m.d.sync += [hit4.eq(ft.lk_hit), e4.eq(ft.lk_entry), j4.eq(fd.job), r4.eq(fd.rank),
                         k4.eq(k3), slot4.eq(slot3), rq4.eq(fd.rev_qpn), st4.eq(fd.start)]

        # ------------------------------------------------------------ stage 4: decide
        # last writes of the slot and CNP RAMs (for forwarding into the decision stage)
        sw_en, sw_addr = Signal(), Signal(self.slot_bits)
        sw_data = Signal(self.slot_layout)
        cw_en, cw_addr, cw_data = Signal(), Signal(len(c_wr.addr)), Signal(TB)
        m.d.sync += [sw_en.eq(s_wr.en), sw_addr.eq(s_wr.addr), sw_data.eq(s_wr.data),
                     cw_en.eq(c_wr.en), cw_addr.eq(c_wr.addr), cw_data.eq(c_wr.data)]
        slot_cur = data.View(self.slot_layout,
                             self._rmw_read(m, s_rd, slot4, advance, (sw_en, sw_addr, sw_data),
                                            "slot"))
        cnp_last = self._rmw_read(m, c_rd, Cat(r4, j4), advance, (cw_en, cw_addr, cw_data),
                                  "cnp")
        xw_en, xw_addr = Signal(), Signal(len(x_wr.addr))
        xw_data = Signal(self.rtx_layout)
        m.d.sync += [xw_en.eq(x_wr.en), xw_addr.eq(x_wr.addr), xw_data.eq(x_wr.data)]
        rtx_raw = self._rmw_read(m, x_rd, Cat(r4, j4), advance, (xw_en, xw_addr, xw_data), "rtx")
        rtx_cur = data.View(self.rtx_layout,
                            Mux(rtx_seen[j4].bit_select(r4, 1), rtx_raw, 0))

        n_cur, w_cur = j_n[j4], j_w[j4]
        free_cur, rel_cur = free[j4], rel[j4]
        # acked_f is read one stage early (a jobs x max_world mux off the decision path) and
        # forwarded like a RAM read
        acked_rd = Signal(PSN_BITS)
        with m.If(advance):
            m.d.sync += acked_rd.eq(acked[fd.job][fd.rank])
        aw_en, aw_addr, aw_data = Signal(), Signal(len(Cat(r4, j4))), Signal(PSN_BITS)
        acked_cur = self._rmw_read(m, _Port(acked_rd), Cat(r4, j4), advance,
                                   (aw_en, aw_addr, aw_data), "acked")
        registered = v4 & (h4.cls == HdrClass.ROCE) & hit4 & enabled[j4]
        onehot_r = Signal(WD)
        m.d.comb += onehot_r.eq((Const(1, WD) << r4)[:WD])
        full_cur = Signal(WD)
        m.d.comb += full_cur.eq(fullmask(n_cur))

        disp = Signal(self.disp_bits)
        action = Signal(Action)
        rx_data = Signal()
        ack_stale = Signal()
        ack_take = Signal()
        cand = Signal(PSN_BITS)
        slot_write = Signal()
        slot_new = Signal(self.slot_layout)
        first = Signal()
        release_now = Signal()
        pend_inc = Signal()
        mismatch = Signal()
        cnp_check = Signal()  # CE-marked data frame that passed the checks, not forwarded
        present = Signal()  # f's contribution of k4 is now in its slot (D16 tracking)
        ack_cur = Signal()  # a valid ACK (syndrome class ACK) not behind acked_f
        is_data_ok = Signal()

        d_win = Signal(PSN_BITS)
        rel_d = Signal(PSN_BITS)
        m.d.comb += [d_win.eq(k4 - free_cur), rel_d.eq(rel_cur - free_cur)]
        op_rc_data = (h4.opcode < 0x0C)  # RC SEND/WRITE opcodes 0x00..0x0B

        m.d.comb += [action.eq(Action.FORWARD), disp.eq(Disp.FWD_UNREGISTERED)]
        with m.If(h4.cls == HdrClass.NOT_ROCE):
            m.d.comb += disp.eq(Disp.FWD_NOT_ROCE)
        with m.Elif(~registered):
            m.d.comb += disp.eq(Disp.FWD_UNREGISTERED)
        with m.Elif(is_ctrl(h4)):
            # ---- ACK monitor (model step 2 / 6, D7)
            kind = h4.syndrome[5:7]
            with m.If(h4.err != FrameError.NONE):
                m.d.comb += disp.eq(Disp.FWD_CTRL_INVALID)
            with m.Elif(h4.opcode == OP_CNP):
                m.d.comb += disp.eq(Disp.FWD_CNP)
            with m.Elif(kind == 0b10):
                m.d.comb += disp.eq(Disp.FWD_CTRL_INVALID)
            with m.Else():
                m.d.comb += [disp.eq(Mux(kind == 0, Disp.FWD_ACK, Disp.FWD_NAK)),
                             cand.eq(k4 + (kind == 0))]
                adv_ = (cand - acked_cur)[:PSN_BITS]
                lim = (rel_cur - acked_cur)[:PSN_BITS]
                m.d.comb += ack_cur.eq((kind == 0) & (adv_ <= lim))
                with m.If((adv_ != 0) & (adv_ <= lim)):
                    m.d.comb += ack_take.eq(1)
                with m.Else():
                    m.d.comb += ack_stale.eq(1)
        with m.Else():
            # ---- data frame on a forward key (model steps 3-5)
            m.d.comb += [rx_data.eq(1), action.eq(Action.DROP)]
            with m.If(h4.err != FrameError.NONE):
                with m.Switch(h4.err):
                    for err, dsp in _ERR_DISP.items():
                        with m.Case(err):
                            m.d.comb += disp.eq(dsp)
            with m.Elif(~op_rc_data):
                m.d.comb += disp.eq(Disp.DROP_OPCODE)
            with m.Elif(h4.plen > j_pmtu[j4]):
                m.d.comb += disp.eq(Disp.DROP_PMTU)
            with m.Elif(h4.plen[:2] != 0):
                m.d.comb += disp.eq(Disp.DROP_ALIGN)
            with m.Elif(d_win[PSN_BITS - 1]):
                m.d.comb += [disp.eq(Disp.BEHIND_WINDOW), action.eq(Action.PROBE)]
            with m.Else():
                m.d.comb += is_data_ok.eq(1)
                with m.If(d_win >= w_cur):
                    m.d.comb += disp.eq(Disp.DROP_AHEAD)
                with m.Elif(~slot_cur.valid | (slot_cur.index != k4)):
                    # EMPTY: the first contribution of this generation overwrites
                    m.d.comb += [disp.eq(Disp.CONTRIBUTIONS), action.eq(Action.CONTRIBUTE),
                                 first.eq(1), slot_write.eq(1), present.eq(1),
                                 slot_new.valid.eq(1), slot_new.index.eq(k4),
                                 slot_new.bitmap.eq(onehot_r), slot_new.opcode.eq(h4.opcode),
                                 slot_new.plen.eq(h4.plen)]
                    if self.ports > 1:
                        m.d.comb += slot_new.ports[r4].eq(h4.port)
                with m.Elif((slot_cur.opcode != h4.opcode[:4]) | (slot_cur.plen != h4.plen)):
                    m.d.comb += [disp.eq(Disp.DROP_MISMATCH), mismatch.eq(1)]
                with m.Elif((slot_cur.bitmap & onehot_r).any()):
                    m.d.comb += present.eq(1)
                    with m.If(d_win < rel_d):  # RELEASED: index in [free, rel)
                        m.d.comb += [disp.eq(Disp.REEMITS), action.eq(Action.REEMIT)]
                    with m.Else():
                        m.d.comb += disp.eq(Disp.DUPLICATES)
                with m.Else():
                    m.d.comb += [disp.eq(Disp.CONTRIBUTIONS), action.eq(Action.CONTRIBUTE),
                                 slot_write.eq(1), present.eq(1), slot_new.eq(slot_cur),
                                 slot_new.bitmap.eq(slot_cur.bitmap | onehot_r)]
                    if self.ports > 1:
                        m.d.comb += slot_new.ports[r4].eq(h4.port)
        complete = slot_write & (slot_new.bitmap == full_cur)
        m.d.comb += [
            release_now.eq(complete & (k4 == rel_cur)),
            pend_inc.eq(complete & (k4 != rel_cur)),
            cnp_check.eq(is_data_ok & (h4.ecn == 0b11)),
        ]
        # CNP limiter (D8): suppressed if a CNP went to this flow less than the interval ago
        # (a negative time difference counts as inside)
        cnp_seen_cur = cnp_seen[j4].bit_select(r4, 1)
        tdiff = Signal(TB)
        m.d.comb += tdiff.eq(h4.time - cnp_last)
        suppressed = cnp_seen_cur & (tdiff[TB - 1] | (tdiff < j_cnp[j4]))
        cnp_send = cnp_check & ~suppressed
        cnp_supp = cnp_check & suppressed

        # fast retransmit (model D16): per-flow tracking on data, the ACK request (a probe to the
        # receiver) and the ACK rewrite decisions
        k4p1 = Signal(PSN_BITS)
        m.d.comb += k4p1.eq(k4 + 1)
        rtx_new = Signal(self.rtx_layout)
        m.d.comb += rtx_new.eq(rtx_cur)
        nxt_d = Signal(PSN_BITS)
        nxt_eff = Signal(PSN_BITS)  # nxt_f, or rel_j if that is ahead
        m.d.comb += [nxt_d.eq(rtx_cur.nxt - rel_cur),
                     nxt_eff.eq(Mux(nxt_d[PSN_BITS - 1], rel_cur, rtx_cur.nxt))]
        top_d = Signal(PSN_BITS)
        ahead_d = Signal(PSN_BITS)
        up = Signal(PSN_BITS)
        m.d.comb += [top_d.eq(rtx_cur.top - nxt_eff), ahead_d.eq(k4 - nxt_eff),
                     up.eq(k4p1 - rtx_cur.top)]
        hole = (top_d != 0) & ~top_d[PSN_BITS - 1]
        at_mark = rtx_cur.mark_v & (rtx_cur.mark == nxt_eff)
        fast_en = Cat(*(self.job_cfg[j].ctrl.fast_retx for j in range(J))).bit_select(j4, 1)
        nak_fire = Signal()
        solicit = Signal()
        top_new = Mux((up != 0) & ~up[PSN_BITS - 1], k4p1, rtx_cur.top)
        with m.If(present):
            # the contribution at nxt_f moves it to top_f (model _present)
            m.d.comb += [rtx_new.top.eq(top_new),
                         rtx_new.nxt.eq(Mux(k4 == nxt_eff, top_new, nxt_eff))]
            with m.If(fast_en & (action == Action.CONTRIBUTE) & (ahead_d != 0)
                      & ~ahead_d[PSN_BITS - 1] & ~at_mark):
                m.d.comb += [solicit.eq(1), rtx_new.mark_v.eq(1), rtx_new.naked.eq(0),
                             rtx_new.mark.eq(nxt_eff)]
        with m.Elif(ack_cur):
            m.d.comb += rtx_new.nxt.eq(nxt_eff)
            with m.If(fast_en & hole & ~(at_mark & rtx_cur.naked)):
                m.d.comb += [nak_fire.eq(1), rtx_new.mark_v.eq(1), rtx_new.naked.eq(1),
                             rtx_new.mark.eq(nxt_eff)]
        rtx_write = Signal()
        m.d.comb += rtx_write.eq(present | ack_cur)
        # the forwarded ACK's rewrite as XOR bytes in wire order: PSN p -> p + 1, syndrome -> 0x60
        psn_x = Signal(PSN_BITS)
        m.d.comb += psn_x.eq(h4.psn ^ (h4.psn + 1)[:PSN_BITS])
        # the ACK request's PSN: one acknowledged by f's receiver (a duplicate for it)
        sol_psn = Signal(PSN_BITS)
        m.d.comb += sol_psn.eq(st4 + acked_cur - 1)
        nak_x = Cat(psn_x[16:24], psn_x[8:16], psn_x[0:8], h4.syndrome ^ 0x60)

        # stall conditions of the decision stage
        scrub_turn = Signal()
        scrub_want = Signal()
        m.d.sync += scrub_turn.eq(~scrub_turn)
        m.d.comb += block4.eq(
            # ACK/NAK acceptance reads rel_j and acked_f (never free_j): only data waits for
            # free_j; everything waits for a chained release (it moves rel_j)
            (registered & (chain_busy[j4] | ((free_busy[j4] != 0) & ~is_ctrl(h4))))
            | ~relq.w_rdy
            | (scrub_want & scrub_turn & slot_write))
        commit = Signal()
        m.d.comb += commit.eq(v4 & advance)
        m.d.sync += [aw_en.eq(commit & registered & ack_take), aw_addr.eq(Cat(r4, j4)),
                     aw_data.eq(cand)]
        cj = Signal(J)  # commit for job j, registered frame
        m.d.comb += cj.eq(Mux(commit & registered, 1 << j4, 0))

        # ---- decision output register
        dec = self.dec.payload
        beats = (h4.plen + self.beat_bytes - 1) >> self.beat_shift
        with m.If(advance):
            m.d.sync += [ov.eq(v4), dec.action.eq(action), dec.disp.eq(disp), dec.job.eq(j4),
                         dec.rank.eq(r4), dec.entry.eq(e4), dec.slot.eq(slot4), dec.index.eq(k4),
                         dec.overwrite.eq(first), dec.op.eq(j_op[j4]), dec.plen.eq(h4.plen),
                         dec.beats.eq(beats), dec.cnp.eq(cnp_send), dec.rev_qpn.eq(rq4),
                         dec.port.eq(h4.port), dec.release.eq(release_now),
                         dec.nak.eq(registered & nak_fire), dec.nak_x.eq(nak_x),
                         dec.solicit.eq(registered & solicit), dec.sol_psn.eq(sol_psn)]
        with m.Elif(self.dec.ready):
            m.d.sync += ov.eq(0)

        # ---- RAM writes of the decision stage (slot memory shared with the scrub)
        scrub_addr = Signal(self.slot_bits)
        scrub_go = Signal()
        dec_slot_wr = commit & slot_write
        m.d.comb += scrub_go.eq(scrub_want & ~dec_slot_wr)
        m.d.comb += [
            s_wr.en.eq(dec_slot_wr | scrub_go),
            s_wr.addr.eq(Mux(dec_slot_wr, slot4, scrub_addr)),
            s_wr.data.eq(Mux(dec_slot_wr, slot_new.as_value(), 0)),
            c_wr.en.eq(commit & cnp_send),
            c_wr.addr.eq(Cat(r4, j4)),
            c_wr.data.eq(h4.time),
            x_wr.en.eq(commit & registered & rtx_write),
            x_wr.addr.eq(Cat(r4, j4)),
            x_wr.data.eq(rtx_new),
        ]

        # ============================================================ release scheduler
        dec_push = commit & release_now
        sch_push = Signal()
        rel_w = data.View(self.rel_layout, relq.w_data)
        js = Signal(self.job_bits)
        sch_rel_job = Signal(J)
        sch_data = data.View(self.slot_layout, s_rd2.data)
        sch_cmd = Signal(self.rel_layout)
        m.d.comb += [
            sch_cmd.job.eq(js), sch_cmd.slot.eq(j_base[js] + (rel[js] & (j_w[js] - 1))),
            sch_cmd.index.eq(rel[js]), sch_cmd.n.eq(j_n[js]), sch_cmd.plen.eq(sch_data.plen),
        ]
        dec_cmd = Signal(self.rel_layout)
        m.d.comb += [dec_cmd.job.eq(j4), dec_cmd.slot.eq(slot4), dec_cmd.index.eq(k4),
                     dec_cmd.n.eq(n_cur), dec_cmd.plen.eq(h4.plen)]
        # seq = decisions output up to and including the one that caused the release (a chained
        # release counts every decision committed so far): the emitter sends a release only after
        # the payload of every decision before seq is written, and after their own frames
        n_commit = Signal(SEQ_BITS)
        m.d.sync += n_commit.eq(n_commit + commit)
        m.d.comb += [dec_cmd.seq.eq(n_commit + 1), sch_cmd.seq.eq(n_commit + commit)]
        if self.ports > 1:
            m.d.comb += [sch_cmd.ports.eq(sch_data.ports), dec_cmd.ports.eq(slot_new.ports)]
        m.d.comb += [relq.w_en.eq(dec_push | sch_push),
                     rel_w.eq(Mux(dec_push, dec_cmd.as_value(), sch_cmd.as_value()))]
        any_chain = Cat(*(chain_busy[j] for j in range(J))).any()
        pick = Const(0, self.job_bits)
        for j in reversed(range(J)):
            pick = Mux(chain_busy[j], j, pick)
        m.d.comb += s_rd2.addr.eq(j_base[js] + (rel[js] & (j_w[js] - 1)))
        chain_done = Signal()
        with m.FSM(name="release"):
            with m.State("IDLE"):
                with m.If(any_chain):
                    m.d.sync += js.eq(pick)
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += s_rd2.en.eq(1)
                m.next = "CHECK"
            with m.State("CHECK"):
                ok = (sch_data.valid & (sch_data.index == rel[js])
                      & (sch_data.bitmap == fullmask(j_n[js])))
                with m.If(~ok):
                    m.d.comb += chain_done.eq(1)
                    m.next = "IDLE"
                with m.Elif(relq.w_rdy & ~dec_push):
                    m.d.comb += [sch_push.eq(1), sch_rel_job.eq(1 << js)]
                    with m.If(npend[js] == 1):
                        m.d.comb += chain_done.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"

        # ============================================================ free_j (min tree)
        f_valid = Signal()
        f_job = Signal(self.job_bits)
        m.d.sync += [f_valid.eq(commit & registered & ack_take), f_job.eq(j4)]
        vals = []
        for r in range(WD):
            dist = (acked[f_job][r] - free[f_job])[:self.w_bits]
            vals.append(Mux(j_n[f_job] > r, dist, (1 << self.w_bits) - 1))
        # absolute result: snapshot of free_j (consistent with the acked values read) + min;
        # later computations of the same job start from newer acked values, so results only grow
        tv, tj, tf, level = f_valid, f_job, Signal(PSN_BITS), 0
        m.d.comb += tf.eq(free[f_job])
        while len(vals) > 1:
            nxt = [Mux(vals[i] < vals[i + 1], vals[i], vals[i + 1])
                   for i in range(0, len(vals) - 1, 2)]
            if len(vals) % 2:
                nxt.append(vals[-1])
            vals, level = nxt, level + 1
            if level % self.free_levels == 0 and len(vals) > 1:
                regs = [Signal(self.w_bits, name=f"fmin{level}_{i}") for i in range(len(vals))]
                nv, nj = Signal(name=f"fv{level}"), Signal(self.job_bits, name=f"fj{level}")
                nf = Signal(PSN_BITS, name=f"ff{level}")
                m.d.sync += [r_.eq(v) for r_, v in zip(regs, vals, strict=True)]
                m.d.sync += [nv.eq(tv), nj.eq(tj), nf.eq(tf)]
                vals, tv, tj, tf = regs, nv, nj, nf
        a_free = Signal(PSN_BITS)
        a_valid, a_job = Signal(), Signal(self.job_bits)
        m.d.sync += [a_free.eq(tf + vals[0]), a_valid.eq(tv), a_job.eq(tj)]
        step = Signal(self.w_bits)  # indices freed by the result being applied
        m.d.comb += step.eq(a_free - free[a_job])

        # ============================================================ enable sequencer
        cfg = self.job_cfg
        level_en = Cat(*(cfg[j].ctrl.enable for j in range(J)))
        prev_en = Signal(J)
        req_en, req_dis = Signal(J), Signal(J)
        m.d.sync += prev_en.eq(level_en)
        rise, fall = level_en & ~prev_en, ~level_en & prev_en
        clr_en, clr_dis = Signal(J), Signal(J)
        m.d.sync += [req_en.eq((req_en & ~clr_en) | rise), req_dis.eq((req_dis & ~clr_dis) | fall)]

        sq = Signal(self.job_bits)  # job being processed
        qcfg = cfg[sq]
        seq_reset = Signal()  # reset the dynamic state of job sq (at commit)
        seq_enable = Signal()
        seq_disable = Signal()
        seq_err = Signal(8)
        seq_set_err = Signal()
        # job-level checks, in the model's order
        c_n, c_w, c_base = qcfg.world.n, qcfg.window.w, qcfg.slot_base.base
        c_pmtu, c_op = qcfg.pmtu.pmtu, qcfg.op.op
        overlap = Cat(*(enabled[o] & (c_base < j_base[o] + j_w[o])
                        & (j_base[o] < c_base + c_w) for o in range(J))).any()
        pmtu_ok = Cat(*((c_pmtu == v) for v in PMTU_VALUES if v <= self.pmtu_max)).any()
        job_err = Signal(8)
        with m.If((c_n < 1) | (c_n > WD)):
            m.d.comb += job_err.eq(JobError.WORLD)
        with m.Elif((c_w == 0) | ((c_w & (c_w - 1)) != 0)):
            m.d.comb += job_err.eq(JobError.WINDOW)
        with m.Elif(c_base + c_w > self.slots):
            m.d.comb += job_err.eq(JobError.SLOT_RANGE)
        with m.Elif(overlap):
            m.d.comb += job_err.eq(JobError.SLOT_OVERLAP)
        with m.Elif(~pmtu_ok):
            m.d.comb += job_err.eq(JobError.PMTU)
        with m.Elif(c_op > 2):
            m.d.comb += job_err.eq(JobError.OP)

        # flow scan: stage A reads entry e of the bank, stage B checks and binds it. The bank's
        # flow RAM answers one cycle after the address, so the address runs one entry ahead
        # (entry 0 is addressed in CHECK): stage A sees entry scan_e as before.
        scan_e = Signal(range(F + 1))
        sa_valid = Signal()
        sa_e = Signal(self.entry_bits)
        sa_cfg = Signal(self.flow_cfg_layout)
        rank_seen = Signal(WD)
        flows_bad = Signal()
        roles_bad = Signal()  # a flow role other than MEMBER: D17 is not implemented here
        conflict = Signal()
        ecfg = self.flow_rd.data
        m.d.comb += self.flow_rd.addr.eq((scan_e + 1)[:self.entry_bits])
        fwd_key = Cat(sa_cfg.fwd_qpn.qpn, sa_cfg.fwd_ip.ip)
        rev_key = Cat(sa_cfg.rev_qpn.qpn, sa_cfg.rev_ip.ip)
        sa_rank = sa_cfg.cfg.rank
        m.d.comb += [ft.chk_fwd.eq(fwd_key), ft.chk_rev.eq(rev_key),
                     ft.bind_entry.eq(sa_e), ft.bind_job.eq(sq),
                     ft.bind_fwd.eq(fwd_key), ft.bind_rev.eq(rev_key),
                     ft.bind_data.job.eq(sq), ft.bind_data.rank.eq(sa_rank),
                     ft.bind_data.start.eq(sa_cfg.start_psn.psn),
                     ft.bind_data.rev_qpn.eq(sa_cfg.rev_qpn.qpn),
                     ft.commit_job.eq(sq), ft.drop_job.eq(sq)]
        mine = ecfg.cfg.valid & (ecfg.cfg.job == sq)
        scrub_cnt = Signal(self.w_bits)

        with m.FSM(name="sequencer"):
            with m.State("IDLE"):
                # disables first (a 1 -> 0 -> 1 bounce discards and restarts the job)
                dis_pick = Const(0, self.job_bits)
                en_pick = Const(0, self.job_bits)
                for j in reversed(range(J)):
                    dis_pick = Mux(req_dis[j], j, dis_pick)
                    en_pick = Mux(req_en[j], j, en_pick)
                with m.If(req_dis.any()):
                    m.d.sync += sq.eq(dis_pick)
                    m.next = "DISABLE"
                with m.Elif(req_en.any()):
                    m.d.sync += sq.eq(en_pick)
                    m.next = "CHECK"
            with m.State("DISABLE"):
                m.d.comb += self.busy.eq(1)
                with m.If(~enabled[sq]):
                    m.d.comb += clr_dis.eq(1 << sq)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += quiesce.eq(1)
                    with m.If(pipe_empty & ~chain_busy[sq] & (free_busy[sq] == 0)):
                        m.d.comb += [clr_dis.eq(1 << sq), ft.drop_en.eq(1), seq_disable.eq(1)]
                        m.next = "IDLE"
            with m.State("CHECK"):
                m.d.comb += [self.busy.eq(1), self.flow_rd.addr.eq(0)]
                with m.If(~level_en.bit_select(sq, 1) | enabled[sq]):
                    m.d.comb += clr_en.eq(1 << sq)
                    m.next = "IDLE"
                with m.Elif(job_err != 0):
                    m.d.comb += [clr_en.eq(1 << sq), seq_set_err.eq(1), seq_err.eq(job_err)]
                    m.next = "IDLE"
                with m.Else():
                    # a new attempt: an error of an earlier refused one no longer applies
                    m.d.sync += error[sq].eq(JobError.NONE)
                    m.d.sync += [j_n[sq].eq(c_n), j_w[sq].eq(c_w), j_base[sq].eq(c_base),
                                 j_pmtu[sq].eq(c_pmtu), j_op[sq].eq(c_op),
                                 j_cnp[sq].eq(qcfg.cnp_interval.cycles),
                                 scan_e.eq(0), sa_valid.eq(0), rank_seen.eq(0),
                                 flows_bad.eq(0), roles_bad.eq(0), conflict.eq(0)]
                    m.next = "SCAN"
            with m.State("SCAN"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [sa_valid.eq((scan_e < F) & mine), sa_e.eq(scan_e), sa_cfg.eq(ecfg)]
                with m.If(scan_e < F):
                    m.d.sync += scan_e.eq(scan_e + 1)
                with m.Elif(~sa_valid):
                    m.next = "VERDICT"
                with m.If(sa_valid):
                    # ranks >= max_world are >= n as well: no bit to set, flows_bad anyway
                    rbit = Mux(sa_rank < WD, (Const(1, WD) << sa_rank[:self.rank_bits])[:WD], 0)
                    with m.If((sa_rank >= j_n[sq]) | (rank_seen & rbit).any()):
                        m.d.sync += flows_bad.eq(1)
                    m.d.sync += rank_seen.eq(rank_seen | rbit)
                    with m.If(sa_cfg.cfg.role != 0):
                        m.d.sync += roles_bad.eq(1)
                    is_live = ft.live.bit_select(sa_e, 1)
                    with m.If(ft.chk_fwd_hit | ft.chk_rev_hit | is_live):
                        m.d.sync += conflict.eq(1)
                    with m.If(~is_live):
                        m.d.comb += ft.bind_en.eq(1)
            with m.State("VERDICT"):
                m.d.comb += self.busy.eq(1)
                with m.If(flows_bad | (rank_seen != fullmask(j_n[sq]))):
                    m.d.comb += [clr_en.eq(1 << sq), seq_set_err.eq(1),
                                 seq_err.eq(JobError.FLOWS), ft.drop_en.eq(1)]
                    m.next = "IDLE"
                with m.Elif(roles_bad):
                    m.d.comb += [clr_en.eq(1 << sq), seq_set_err.eq(1),
                                 seq_err.eq(JobError.ROLES), ft.drop_en.eq(1)]
                    m.next = "IDLE"
                with m.Elif(conflict):
                    m.d.comb += [clr_en.eq(1 << sq), seq_set_err.eq(1),
                                 seq_err.eq(JobError.KEY_CONFLICT), ft.drop_en.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [scrub_addr.eq(j_base[sq]), scrub_cnt.eq(j_w[sq])]
                    m.next = "SCRUB"
            with m.State("SCRUB"):
                m.d.comb += [self.busy.eq(1), scrub_want.eq(1)]
                with m.If(scrub_go):
                    m.d.sync += [scrub_addr.eq(scrub_addr + 1), scrub_cnt.eq(scrub_cnt - 1)]
                    with m.If(scrub_cnt == 1):
                        m.next = "COMMIT"
            with m.State("COMMIT"):
                m.d.comb += [self.busy.eq(1), quiesce.eq(1)]
                with m.If(pipe_empty):
                    m.d.comb += [clr_en.eq(1 << sq), ft.commit_en.eq(1), seq_enable.eq(1),
                                 seq_reset.eq(1)]
                    m.next = "IDLE"

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
                m.d.sync += [enabled[j].eq(1), error[j].eq(JobError.NONE)]
            with m.If((sq == j) & seq_disable):
                m.d.sync += [enabled[j].eq(0), error[j].eq(JobError.NONE)]
            with m.If((sq == j) & seq_set_err):
                m.d.sync += error[j].eq(seq_err)
            with m.If((sq == j) & seq_reset):
                m.d.sync += [free[j].eq(0), rel[j].eq(0), npend[j].eq(0), busy_slots[j].eq(0),
                             chain_busy[j].eq(0), free_busy[j].eq(0), cnp_seen[j].eq(0),
                             rtx_seen[j].eq(0)]
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
            ]
        for e in range(F):
            bound = ft.live[e]
            m.d.comb += [self.flow_status[e].status.bound.eq(bound),
                         self.flow_status[e].acked.index.eq(Mux(bound, acked_e[e], 0))]
        for j in range(J):
            m.d.sync += self.job_set[j].status.mismatch.eq(cj[j] & mismatch)

        disp_names = {d.value: name for d, name in zip(Disp, DISPOSITIONS, strict=True)}
        job_disp = [d for d in Disp if disp_names[d.value] in self.job_inc_layout.members]
        for j in range(J):
            inc = self.job_cnt_inc[j]
            dj = cj[j]
            for d in job_disp:
                m.d.sync += inc[disp_names[d.value]].eq(dj & (disp == d.value))
            m.d.sync += [
                inc.rx_data.eq(dj & rx_data),
                inc.ack_stale.eq(dj & ack_stale),
                inc.cnp_sent.eq(dj & cnp_send),
                inc.cnp_suppressed.eq(dj & cnp_supp),
                inc.released.eq((dj & release_now) + sch_rel_job[j]),
                inc.results_sent.eq(Mux(dj & release_now, n_cur, 0)
                                    + Mux(sch_rel_job[j], j_n[j], 0)),
                inc.freed.eq(Mux(a_valid & (a_job == j), step, 0)),
                inc.saturations.eq(0),
                inc.fast_retx.eq(dj & nak_fire),
                inc.fast_retx_probes.eq(dj & solicit),
            ]
        g = self.cnt_inc
        m.d.sync += [
            g.rx_frames.eq(commit),
            g.fwd_not_roce.eq(commit & (disp == Disp.FWD_NOT_ROCE)),
            g.fwd_unregistered.eq(commit & (disp == Disp.FWD_UNREGISTERED)),
        ]
        return m
