"""Aggregation control path: what happens to each frame, given its parsed header.

:class:`AggControl` implements steps 1-6 of the reference model (:mod:`netreduce.sim.model.engine`,
whose docstring and decisions D1-D20 are the specification) for everything except payload
arithmetic and frame bytes: flow lookup, job state and the enable sequencer (D9), slot state, the
per-frame decision, in-order release, ACK/NAK snooping with freeing, and the CNP rate limiter. It
is bit-exact with the model: every frame gets the model's disposition, the model's release
commands, CNP decisions and counter increments (the tests compare them frame by frame).

Sub-blocks (one concern each; :class:`AggControl` wires them):

* flow table (:class:`~.flowtable.FlowTable`): latched keys, parallel lookup;
* job state (:class:`~.jobstate.JobState`): latched configuration (n, W, slot base, PMTU, op,
  CNP interval), free / release pointers, slots in use, status, acked_f, in flip-flops that the
  decision stages read up to date every cycle, and their updates;
* enable sequencer (:class:`~.sequencer.EnableSequencer`, its flow scan
  :class:`~.sequencer.FlowScan`): validates and latches a job on ``JOB.CTRL.enable`` 0 -> 1 and
  discards it on 1 -> 0;
* slot state (``lib.memory.Memory``, one word per slot): valid, index, contribution bitmap,
  opcode / length signature, per-rank arrival port. EMPTY = not valid or holding another index;
  FILLING / COMPLETE = bitmap partial / full; RELEASED = index in [free_j, rel_j) (so releasing
  and freeing never rewrite a slot);
* decision stages (:mod:`.stages`): lookup (:class:`~.stages.LookupStage`: index, slot, RAM
  reads, header checks), check (:class:`~.stages.CheckStage`: every check, in variants for the
  decision in front), decide (:class:`~.stages.DecideStage`: the variant that applies, the
  decision function :class:`~.decide.Decide`, stall and commit);
* release scheduler (:class:`~.release.ReleaseScheduler`): releases complete slots in index
  order (an in-order completion is released by the decision stage itself; out-of-order
  completions are counted per job and released by the scheduler when the gap closes), into the
  release queue (:class:`~.release.ReleaseQueue`);
* ACK monitor: acked_f per flow, free_j = min over the job's flows (the free-pointer tree,
  :class:`~.release.FreeMinTree`);
* CNP limiter: per-flow time of the last CNP (a RAM), interval from the job;
* fast retransmit (model D16, :class:`~.retxstage.RetxStages`): per-flow in-order prefix nxt_f,
  top_f and the hole last handled (a RAM read and written like the CNP times), updated by data
  and ACK decisions; a decision with ``nak`` set tells the forward path to rewrite the ACK
  (``nak_x``: the XOR of its BTH PSN and AETH syndrome bytes, wire order; the ICRC is patched by
  the engine top), one with ``solicit`` to also send the contribution's duplicate probe at PSN
  ``sol_psn``;
* status and counters (:class:`~.counters.CtlCounters`);
* with ``pairs``, the side lane (:class:`~.sideack.SideAck`): a second ACK/NAK, carried by the
  same header record, decided in the same cycle right after the main one (its own reverse-key
  lookup on the flow table's second port, acked_f forwarded between the lanes, its own free_j
  tree; the engine pairs two ACK/NAKs of different ports and keys only while no job has
  ``fast_retx`` set, so the pair shares no flow and the side lane has no D16 state).

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
``hdr.side`` (with ``pairs``, :func:`~.sideack.side_layout`)
    ``v`` set: a second ACK/NAK header taken with the main one (its key, PSN, syndrome, payload
    length and arrival port; the same ``time``), decided right after it. The caller pairs only
    valid ACK/NAKs (class ROCE, no frame error, opcode ACK, syndrome not reserved) of different
    ports and keys, while no job has ``JOB.CTRL.fast_retx`` set.
``dec2`` (Out, with ``pairs``: ``v`` and ``d`` of :attr:`dec_layout`)
    The side header's decision (FORWARD: FWD_ACK, FWD_NAK or FWD_UNREGISTERED), valid and taken
    with ``dec`` (``dec2.v`` says whether there is one); it follows ``dec``'s in decision order.
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
    before that decision and up to three more are on ``dec``); the consumer
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
* Latency: header accepted in cycle t -> decision valid in cycle t + 10 (registers: input
  skid, input + key chunk compares, CAM match, entry RAM data, index/slot + slot RAM data,
  checks, decision, D16 compares, D16 decisions / output register, output skid; one more lookup
  stage, t + 11, with more than 16 flow entries), when nothing stalls. A release command of the
  decision stage reaches the FIFO through a register. Counter increments and status set strobes
  are registered one clock edge later, from the decision's registered strobes (chained releases
  and free_j results count one cycle after they happen; D16's counters after its stage).
* Throughput: one header per cycle, two with ``pairs`` when the second is a side ACK/NAK (so
  back-to-back minimum-size frames of one 512-bit beat are decided at line rate), including
  back-to-back headers to the same slot, job or flow: the check stage makes each check that the
  decision in front can change both as read and as that decision leaves it, and the decision
  selects by that decision's registered strobes (see :mod:`.decide`); the slot, CNP and acked_f
  reads are forwarded from the write committed two frames ahead.
  The pipeline stalls as a whole (``hdr.ready`` low) only to stay exact, on registers only:
  - while the header in the decision stage belongs to a job with a chained release in
    progress (one cycle to load, then 3 per released index; only after out-of-order
    completions, since an in-order completion is released by the decision stage itself), and
    one cycle after each chain step or free_j result of its job (its job checks are made
    again);
  - while a *data* header's job has a free_j computation in flight (``free_latency`` cycles
    after each ACK/NAK that advanced some acked_f; ACK/NAK acceptance never reads free_j, so
    back-to-back ACKs/NAKs do not wait);
  - one cycle when the frame directly ahead, in the first D16 stage, writes the D16 word of the
    header's flow (a contribution or an in-range ACK right behind one of its own flow);
  - while ``dec`` is not ready, the release FIFO has fewer than three free entries a cycle
    before, or the release scheduler is in its push (CHECK) state;
  - every other cycle while the enable sequencer clears the slots of a job being enabled (the
    stall does not wait for the decision, so the decision logic stays off the pipeline enable;
    the scrub writes in those cycles and in any with no frame in the decision stage);
  - while the sequencer commits or discards a job (it stops taking headers until the pipeline
    is empty).
* Enable: ``JOB.CTRL.enable`` 0 -> 1 is seen one cycle after the bank's write; the sequencer
  checks the job registers (4 cycles), scans the ``flows`` flow entries (one per cycle, an
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

from amaranth.hdl import Array, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from netreduce.regmap import (
    GLOBAL_COUNTERS,
    JOB_COUNTERS,
    Access,
    RegMap,
    Table,
    build_regmap,
)
from netreduce.wire import ETHERTYPE_IPV4, IP_PROTO_UDP, ROCEV2_UDP_PORT

from ..csr.bank import cfg_read_signature
from ..skid import SkidBuffer
from .counters import CtlCounters
from .decide import (
    OP_ACK,
    OP_CNP,
    is_ctrl,
    nak_xor,
)
from .flowtable import FlowTable
from .jobstate import JobState
from .release import FreeMinTree, ReleaseQueue, ReleaseScheduler
from .retxstage import RetxStages
from .roles import MARK_PARTIAL
from .sequencer import EnableSequencer
from .sideack import SideAck, side_layout
from .stages import CheckStage, DecideStage, LookupStage
from .types import PSN_BITS, SEQ_BITS, Action, Disp, FrameError, HdrClass
from .wide import or_chain

__all__ = ["AggControl", "ParserAdapter", "rocev2_record", "HdrClass", "FrameError", "Action",
           "Disp", "role_layout", "OP_ACK", "OP_CNP"]


def role_layout(table: Table, access: Access) -> data.StructLayout:
    """Per-entry layout of ``table``'s fields of ``access``, as the register bank names them:
    ``<reg>.<field>`` in lower case."""
    out = {}
    for r in table.registers:
        fs = {f.name.lower(): unsigned(f.width) for f in r.fields if f.access == access}
        if fs:
            out[r.name.lower()] = data.StructLayout(fs)
    return data.StructLayout(out)


def rocev2_record(rec):
    """Whether a parser header record ``rec`` is Ethernet / IPv4 (version 4, IHL 5, not a
    fragment) / UDP to the RoCEv2 port (model step 1, D10): the record alone decides it, so the
    engine computes it as the record is stored and hands it to :class:`ParserAdapter` as
    ``roce`` (the wide compares end in a register, not in front of the adapter's class)."""
    ip = rec.ipv4
    return ((rec.eth.ethertype == ETHERTYPE_IPV4) & (ip.version == 4) & (ip.ihl == 5)
            & (ip.protocol == IP_PROTO_UDP) & ((ip.flags_frag & 0x3FFF) == 0)
            & (rec.udp.dport == ROCEV2_UDP_PORT))


class ParserAdapter(wiring.Component):
    """The :class:`AggControl` header record of a frame from the parser's outputs (combinational).

    Inputs: the parser's header record ``rec`` (:func:`netreduce.hw.packet.layout.
    header_record_layout`), ``roce`` (:func:`rocev2_record` of that record, computed by the
    caller where the record is stored) and final ``verdict`` of the same frame, its arrival
    ``port`` and ``time``. Output ``hdr``: the record :class:`AggControl` takes (its ``side``
    record, with pairs, left empty). The model classifies by the frame's bytes before checking
    it (step 1, D10): a frame too short to show the UDP destination port, or not IPv4/IHL
    5/unfragmented/UDP 4791, is NOT_ROCE (whatever the parser's reason); one that is but ends
    before the end of the BTH is SHORT; else ROCE with the verdict's reason mapped to
    :class:`FrameError` (a MAC error counts as ICRC: the frame is corrupt). The caller pairs
    ``rec`` with ``verdict`` (the parser delivers the verdict later).
    """

    def __init__(self, hdr_layout: data.StructLayout):
        from ..packet.layout import header_record_layout, verdict_layout

        super().__init__({
            "rec": In(header_record_layout()), "roce": In(1), "verdict": In(verdict_layout()),
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
        roce = self.roce
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


def _bits(n: int) -> int:
    return max(1, ceil_log2(n))


def _feed(m, dst, src, names):
    """Drive the inputs ``names`` of ``dst`` from the outputs of the same names of ``src``."""
    m.d.comb += [getattr(dst, n).eq(getattr(src, n)) for n in names]


class _Roles:
    """The flow-role registers of :class:`~.jobstate.JobState` as :class:`~.roles.JobRoles`
    names them (per-job lists of its output fields)."""

    def __init__(self, st, jobs: int):
        def pj(port):
            return [port[j] for j in range(jobs)]

        self.leaf, self.up, self.down = pj(st.leaf), pj(st.up_rank), pj(st.down_rank)
        self.rack, self.upptr = pj(st.rack), pj(st.upptr)
        self.npend_up, self.chain_up = pj(st.npend_up), pj(st.chain_up)

    def any_roles(self, j):
        """Job ``j`` is a leaf or a spine (its data frames go through the stage mark check)."""
        return self.leaf[j] | self.rack[j].any()


class AggControl(wiring.Component):
    """The aggregation control path (see the module docstring for the contract).

    Parameters
    ----------
    regmap : RegMap
        The register map (build parameters ``ports``, ``jobs``, ``flows``, ``slots``,
        ``pmtu_max``, ``data_width``, ``max_world`` come from it). Default ``build_regmap()``.
    time_bits : int
        Width of the arrival timestamps (default 48: wraps after about 13 days at the 250 MHz
        core clock, 2**48 cycles).
    rel_depth : int
        Depth of the release command FIFO (default 16, at least 4).
    free_levels : int
        Min-tree levels per pipeline stage of the free_j computation (default 2).
    roles : bool
        Flow roles (model D17, spine-leaf; :mod:`.roles`). False: a job with a flow whose role
        is not MEMBER is refused (``JobError.ROLES``).
    """

    def __init__(self, regmap: RegMap | None = None, *, time_bits: int = 48, rel_depth: int = 16,
                 free_levels: int = 2, roles: bool = False, pairs: bool = False):
        self.roles = bool(roles)
        self.pairs = bool(pairs)
        rm = regmap if regmap is not None else build_regmap()
        p = rm.params
        self.map = rm
        self.ports, self.jobs, self.flows = p["ports"], p["jobs"], p["flows"]
        self.slots, self.pmtu_max, self.max_world = p["slots"], p["pmtu_max"], p["max_world"]
        self.data_width = p["data_width"]
        if time_bits < 33 or rel_depth < 4 or free_levels < 1 or (pairs and roles):
            self._MustUse__silence = True  # rejected: no "created but never used" warning
        if time_bits < 33:
            raise ValueError(f"time_bits = {time_bits} must exceed the 32-bit CNP interval")
        if pairs and roles:
            raise ValueError("pairs = True with roles = True: the side lane has no flow roles")
        if rel_depth < 4 or free_levels < 1:
            raise ValueError(f"rel_depth = {rel_depth} (>= 4), free_levels = {free_levels} (>= 1)")
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

        hdr_fields = {
            "cls": HdrClass, "err": FrameError, "src_ip": 32, "dqpn": 24, "opcode": 8,
            "psn": PSN_BITS, "ecn": 2, "syndrome": 8, "plen": self.plen_bits, "mark": 2,
            "port": self.port_bits, "time": time_bits,
        }
        if self.pairs:  # a second ACK/NAK decided in the same cycle (.sideack)
            self.side_layout = side_layout(self)
            hdr_fields["side"] = self.side_layout
        self.hdr_layout = data.StructLayout(hdr_fields)
        # the header as the pipeline carries it after the key compare (from the input register)
        self.hdr_pipe_layout = data.StructLayout(
            {f: sh.shape for f, sh in self.hdr_layout if f not in ("src_ip", "dqpn", "side")})
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
            # the side record's decision, with ``dec`` (valid and taken with it)
            **({"dec2": Out(data.StructLayout({"v": 1, "d": self.dec_layout}))}
               if self.pairs else {}),
        })

    # RAM read forwarding into the decision stage ("slot", "cnp", "acked"); test subclasses turn
    # some off to show that the back-to-back tests notice.
    _no_forwarding: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ elaborate
    def elaborate(self, platform):  # noqa: C901 (the pipeline registers and the job state)
        m = Module()
        J, F, WD = self.jobs, self.flows, self.max_world
        TB = self.time_bits

        m.submodules.ft = ft = FlowTable(F, jobs=J, max_world=WD,
                                         lookups=2 if self.pairs else 1)

        # ============================================================ job state (flops)
        m.submodules.jobs = st = JobState(self)

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

        m.submodules.relq = relq = ReleaseQueue(self)
        wiring.connect(m, relq.o, wiring.flipped(self.rel))

        # ============================================================ sub-blocks
        m.submodules.retx = rx = RetxStages(self, forward="rtx" not in self._no_forwarding)
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
        quiesce = seq.quiesce
        m.d.comb += self.busy.eq(seq.busy)

        # ============================================================ pipeline registers
        # registered block boundaries: neither stream's ready reaches the other combinationally
        m.submodules.hdr_skid = hdr_skid = SkidBuffer(self.hdr_layout)
        wiring.connect(m, wiring.flipped(self.hdr), hdr_skid.i)
        hdr = hdr_skid.o
        if self.pairs:
            # the side decision leaves with the main one: one skid buffer for both
            out_l = data.StructLayout({"d": self.dec_layout, "d2": self.dec2.shape()})
            m.submodules.dec_skid = dec_skid = SkidBuffer(out_l)
            m.d.comb += [self.dec.valid.eq(dec_skid.o.valid),
                         self.dec.payload.eq(dec_skid.o.payload.d),
                         self.dec2.eq(dec_skid.o.payload.d2),
                         dec_skid.o.ready.eq(self.dec.ready),
                         dec_skid.i.valid.eq(rx.o.valid), dec_skid.i.payload.d.eq(rx.o.payload),
                         rx.o.ready.eq(dec_skid.i.ready)]
        else:
            m.submodules.dec_skid = dec_skid = SkidBuffer(self.dec_layout)
            wiring.connect(m, dec_skid.o, wiring.flipped(self.dec))
            wiring.connect(m, rx.o, dec_skid.i)
        advance = Signal()
        block5 = Signal()
        # stages 1..S: the flow lookup (the key is compared from the input register, stage 0;
        # S = the table's lookup latency); S + 1: check ("stage 4"); S + 2: decide ("stage 5");
        # S + 3: fast retransmit ("stage 6"), then the decision output register
        S = ft.lk_latency
        vs = [Signal(name=f"v{i}") for i in range(1, S + 3)]
        hs = [Signal(self.hdr_pipe_layout, name=f"h{i}") for i in range(1, S + 3)]
        h3, h4, v5, h5 = hs[S - 1], hs[S], vs[S + 1], hs[S + 1]
        adv_out = rx.adv  # the fast-retransmit stages and the output register move
        m.d.comb += [
            hdr.ready.eq(advance & ~quiesce),
            advance.eq(adv_out & ~(v5 & block5)),
        ]
        with m.If(advance):
            m.d.sync += [vs[0].eq(hdr.valid & hdr.ready)]
            m.d.sync += [hs[0][f].eq(hdr.payload[f]) for f, _ in self.hdr_pipe_layout]
            m.d.sync += [vs[i].eq(vs[i - 1]) for i in range(1, S + 2)]
            m.d.sync += [hs[i].eq(hs[i - 1]) for i in range(1, S + 2)]
        pipe_empty = ~(Cat(*vs).any() | rx.busy)
        if self.pairs:
            # the side records through the lookup stages (valid only with a main record)
            vss = [Signal(name=f"v{i}s") for i in range(1, S + 1)]
            hss = [Signal(self.side_layout, name=f"h{i}s") for i in range(1, S + 1)]
            with m.If(advance):
                m.d.sync += [vss[0].eq(hdr.valid & hdr.ready & hdr.payload.side.v),
                             hss[0].eq(hdr.payload.side)]
                m.d.sync += [vss[i].eq(vss[i - 1]) for i in range(1, S)]
                m.d.sync += [hss[i].eq(hss[i - 1]) for i in range(1, S)]
            m.d.comb += [ft.lk2_ip.eq(hdr.payload.side.src_ip),
                         ft.lk2_qpn.eq(hdr.payload.side.dqpn)]

        # the flow table compares the key of the header being accepted (a flip-flop output of the
        # input skid buffer; a header not taken is compared too, and its result ignored)
        m.d.comb += [ft.lk_en.eq(advance), ft.lk_ip.eq(hdr.payload.src_ip),
                     ft.lk_qpn.eq(hdr.payload.dqpn), ft.lk_rev.eq(is_ctrl(hdr.payload))]

        # ------------------------------------------------------------ stage 3: lookup
        m.submodules.lookup = lk = LookupStage(self, ft.data_layout)
        m.submodules.check = ck = CheckStage(self)
        m.submodules.decide = dst = DecideStage(self)
        if self.pairs:
            m.submodules.side = sd = SideAck(self, ft.data_layout)
        p5 = ck.o
        e5, j5, r5, k5, slot5, rq5, st5, pre5 = (p5[n] for n in ("e", "j", "r", "k", "slot",
                                                                 "rq", "st", "pre"))
        m.d.comb += [lk.advance.eq(advance), lk.h.eq(h3), lk.hit.eq(ft.lk_hit),
                     lk.entry.eq(ft.lk_entry), lk.fd.eq(ft.lk_data), lk.slot5.eq(slot5),
                     lk.r5.eq(r5), lk.j5.eq(j5),
                     s_rd.en.eq(advance), s_rd.addr.eq(lk.slot_addr),
                     c_rd.en.eq(advance), c_rd.addr.eq(lk.cnp_addr)]
        _feed(m, lk, st, ("enabled", "pmtu", "base", "w", "leaf", "up_rank", "down_rank", "rack",
                          "full", "cmask", "acked", "cnp_seen", "free", "f_valid", "f_job",
                          "f_free"))

        # ------------------------------------------------------------ stage 4: check
        m.d.comb += [ck.advance.eq(advance), ck.v4.eq(vs[S]), ck.h4.eq(h4), ck.h5.eq(h5),
                     ck.i.eq(lk.o),
                     ck.sa_slot.eq(lk.sa_slot), ck.sa_flow.eq(lk.sa_flow),
                     ck.sa_job.eq(lk.sa_job), ck.sz_slot.eq(lk.sz_slot),
                     ck.sz_flow.eq(lk.sz_flow), ck.onehot4.eq(lk.onehot),
                     ck.onehot45.eq(lk.onehot45),
                     ck.acked_rk.eq(lk.acked_rk), ck.seen_rk.eq(lk.seen_rk),
                     ck.slot_rd.eq(s_rd.data),
                     ck.cnp_rd.eq(c_rd.data)]
        # the writes committed by the decision stage in the cycle before (the frame two ahead,
        # when this one's RAM reads were issued), forwarded into the words read
        _feed(m, ck, dst, ("sw_en", "sw_data", "cw_en", "cw_data", "aw_en", "aw_data"))
        _feed(m, ck, st, ("enabled", "cnp", "rel", "upptr", "leaf", "up_rank", "down_rank",
                          "rack"))
        m.d.comb += [ck.free4.eq(lk.free4), ck.w4.eq(lk.w4), ck.km1.eq(lk.km1)]

        # ------------------------------------------------------------ stage 5: decide
        _feed(m, dst, ck, DecideStage._CHECKS)
        _feed(m, dst, st, ("free", "rel", "upptr", "w", "chain_busy", "chain_up", "moved",
                           "free_wait"))
        scrub_turn = Signal()
        scrub_want = seq.scrub_want
        m.d.sync += scrub_turn.eq(~scrub_turn)
        rel_room = relq.room
        m.d.comb += [dst.sa_slot4.eq(lk.sa_slot), dst.sa_flow4.eq(lk.sa_flow),
                     dst.sa_job4.eq(lk.sa_job)]
        m.d.comb += [dst.advance.eq(advance), dst.v.eq(v5), dst.h.eq(h5), dst.i.eq(p5),
                     block5.eq(dst.block), dst.haz.eq(rx.haz),
                     # the release FIFO takes one more command (with its input register's),
                     # from the level a cycle ago: the level grows by at most one a cycle; the
                     # release scheduler may push this cycle: it has the FIFO; the scrub's turn
                     # (any header, not only one writing a slot: keeps the decision off the
                     # stall path)
                     dst.hold.eq(~rel_room | sch.checking | (scrub_want & scrub_turn))]

        # ---- RAM writes of the decision stage (slot memory shared with the scrub)
        scrub_go = Signal()
        dec_slot_wr = dst.slot_wr
        # the scrub writes on its turn (the decision stage waits) or while no frame is in the
        # decision stage (from registers: off the decision's paths)
        m.d.comb += [scrub_go.eq(scrub_want & (scrub_turn | ~v5)), seq.scrub_go.eq(scrub_go),
                     dst.scrub_go.eq(scrub_go)]
        # the write port's address and data: the decision's unless the scrub may write (no frame
        # in the decision stage, or the scrub's turn: it holds the frame); from registers, no
        # commit on their paths
        dec_port = Signal()
        m.d.comb += dec_port.eq(v5 & ~(scrub_want & scrub_turn))
        m.d.comb += [
            s_wr.en.eq(dec_slot_wr | scrub_go),
            s_wr.addr.eq(Mux(dec_port, slot5, seq.scrub_addr)),
            s_wr.data.eq(Mux(dec_port, dst.slot_new.as_value(), 0)),
            c_wr.en.eq(dst.cnp_wr),
            c_wr.addr.eq(Cat(r5, j5)),
            c_wr.data.eq(h5.time),
        ]

        self._to_retx(m, st, dst, ck, rx, h5, v5)
        self._release(m, st, sch, relq, dst, ck, s_rd2, h5)
        self._free_tree(m, st, fmin, dst, j5)
        # ============================================================ enable sequencer
        m.d.comb += [seq.job_cfg.eq(self.job_cfg), seq.enabled.eq(st.enabled),
                     seq.pipe_empty.eq(pipe_empty), seq.job_idle.eq(st.idle), seq.base.eq(st.base),
                     seq.w.eq(st.w)]
        self._state_updates(m, st, dst, ck, sch, rx, seq)
        self._counters(m, st, dst, ck, sch, rx, ft)
        if self.pairs:
            self._side(m, st, sd, lk, ck, dst, rx, ft, vss[S - 1], hss[S - 1], advance, relq,
                       dec_skid)
        return m

    # ------------------------------------------------------------------ wiring
    def _side(self, m, st, sd, lk, ck, dst, rx, ft, v3s, h3s, advance, relq, dec_skid):
        """The side lane (:class:`~.sideack.SideAck`, pairs): its inputs, the main lane's
        relations to it, its commit into the job state, counters, release sequence numbers
        and its own free_j tree, its decision into the output skid buffer."""
        J = self.jobs
        p5 = ck.o
        m.d.comb += [sd.advance.eq(advance), sd.adv_out.eq(rx.adv), sd.v3.eq(v3s),
                     sd.h3.eq(h3s), sd.hit.eq(ft.lk2_hit), sd.entry.eq(ft.lk2_entry),
                     sd.fd.eq(ft.lk2_data),
                     sd.j4m.eq(lk.o.j), sd.r4m.eq(lk.o.r), sd.j5m.eq(p5.j), sd.r5m.eq(p5.r),
                     sd.m_take.eq(dst.advance & dst.registered & dst.ack_take),
                     sd.m_rel.eq(dst.advance & dst.registered & dst.release_now),
                     sd.cand5m.eq(ck.cand), sd.maw_en.eq(dst.aw_en),
                     sd.maw_data.eq(dst.aw_data)]
        _feed(m, sd, st, ("enabled", "acked", "rel", "op"))
        # the main lane's relations to the side frames ahead
        m.d.comb += [lk.j4s.eq(sd.j4), lk.r4s.eq(sd.r4), lk.j5s.eq(sd.j5), lk.r5s.eq(sd.r5),
                     ck.sz_flow_s.eq(lk.sz_flow_s), ck.aw2_en.eq(sd.aw_en),
                     ck.aw2_data.eq(sd.aw_data), ck.cand5s.eq(sd.cand5),
                     dst.sa_flow4s.eq(lk.sa_flow_s), dst.s_take.eq(sd.take),
                     dst.aw2_en.eq(sd.aw_en), dst.aw2_data.eq(sd.aw_data),
                     dst.xblock.eq(sd.reg_oh)]
        # its commit
        m.d.comb += [st.cj2.eq(sd.cj), st.take2.eq(sd.take), st.oh2.eq(sd.reg_oh),
                     st.rank2.eq(sd.r), st.cand2.eq(sd.cand), relq.commit2.eq(sd.commit),
                     dec_skid.i.payload.d2.v.eq(sd.o_valid), dec_skid.i.payload.d2.d.eq(sd.o)]
        cnt = m.submodules.counters
        m.d.comb += [cnt.commit2.eq(sd.commit), cnt.cj2.eq(sd.cj), cnt.disp2.eq(sd.disp),
                     cnt.stale2.eq(sd.stale), cnt.ack_e2.eq(sd.take), cnt.entry2.eq(sd.e),
                     cnt.cand2.eq(sd.cand), cnt.reg2.eq(sd.reg)]
        # free_j after a side ACK/NAK that moved acked_f: a second tree, unless the main frame
        # of the pair started one for the same job (its snapshot, a cycle later, has both)
        m.submodules.freemin2 = fm2 = FreeMinTree(self)
        f_valid, f_job = Signal(name="f2_in_valid"), Signal(self.job_bits, name="f2_in_job")
        main_take = dst.advance & dst.registered & dst.ack_take
        m.d.sync += [f_valid.eq(sd.take & ~(main_take & (p5.j == sd.j5))), f_job.eq(sd.j5)]
        m.d.comb += [fm2.i_valid.eq(f_valid), fm2.i_job.eq(f_job),
                     fm2.free.eq(Array(st.free[j] for j in range(J))[f_job]),
                     fm2.n.eq(Array(st.n[j] for j in range(J))[f_job])]
        m.d.comb += [fm2.acked[r].eq(Array(st.acked[j][r] for j in range(J))[f_job])
                     for r in range(self.max_world)]
        m.d.comb += [st.f2_valid.eq(fm2.o_valid), st.f2_job.eq(fm2.o_job),
                     st.f2_free.eq(fm2.o_free), lk.f2_valid.eq(fm2.o_valid),
                     lk.f2_job.eq(fm2.o_job), lk.f2_free.eq(fm2.o_free)]

    def _release(self, m, st, sch, relq, dst, ck, s_rd2, h5):
        """The release scheduler's inputs and the release commands into the release queue."""
        p5, up_now = ck.o, dst.up_now
        J = self.jobs
        m.d.comb += [sch.chain.eq(st.chain_busy), sch.fifo_ready.eq(relq.room),
                     sch.dec_push.eq(0), s_rd2.addr.eq(sch.rd_addr),
                     s_rd2.en.eq(sch.rd_en), sch.rd_data.eq(s_rd2.data)]
        _feed(m, sch, st, ("rel", "base", "wm", "n", "npend", "chain_up", "upptr", "npend_up",
                           "leaf", "full", "cmask", "mmask", "upmask"))
        j5, leaf5 = p5.j, ck.leaf5
        dec_cmd = Signal(self.rel_layout)
        m.d.comb += [dec_cmd.job.eq(j5), dec_cmd.slot.eq(p5.slot), dec_cmd.index.eq(p5.k),
                     dec_cmd.n.eq(Array(st.n[j] for j in range(J))[j5]),
                     dec_cmd.plen.eq(h5.plen),
                     # D17: a leaf's partial goes to UP, its total to the MEMBER ranks
                     dec_cmd.mask.eq(Mux(up_now, Array(st.upmask[j] for j in range(J))[j5],
                                         Mux(leaf5, Array(st.mmask[j] for j in range(J))[j5],
                                             Array(st.full[j] for j in range(J))[j5]))),
                     dec_cmd.total.eq(leaf5 & ~up_now),
                     dec_cmd.mark.eq(Mux(up_now, MARK_PARTIAL, 0))]
        if self.ports > 1:
            m.d.comb += dec_cmd.ports.eq(dst.slot_new.ports)
        m.d.comb += [relq.commit.eq(dst.commit),
                     relq.dec_push.eq(dst.commit & (dst.release_now | up_now)),
                     relq.dec_cmd.eq(dec_cmd), relq.sch_push.eq(sch.push),
                     relq.sch_cmd.eq(sch.cmd), relq.sch_sel.eq(sch.checking)]

    def _free_tree(self, m, st, fmin, dst, j5):
        """free_j: a snapshot of the job's acked_f after each ACK/NAK that moved one (registered)
        into the min tree; its result into the job state."""
        J = self.jobs
        f_valid = Signal()
        f_job = Signal(self.job_bits)
        m.d.sync += [f_valid.eq(dst.advance & dst.registered & dst.ack_take), f_job.eq(j5)]
        m.d.comb += [fmin.i_valid.eq(f_valid), fmin.i_job.eq(f_job),
                     fmin.free.eq(Array(st.free[j] for j in range(J))[f_job]),
                     fmin.n.eq(Array(st.n[j] for j in range(J))[f_job])]
        m.d.comb += [fmin.acked[r].eq(Array(st.acked[j][r] for j in range(J))[f_job])
                     for r in range(self.max_world)]
        m.d.comb += [st.f_valid.eq(fmin.o_valid), st.f_job.eq(fmin.o_job),
                     st.f_free.eq(fmin.o_free)]

    def _state_updates(self, m, st, dst, ck, sch, rx, seq):
        """The job state's updates: the decision stage's commit, the release scheduler, the
        fast-retransmit stage's word write, the sequencer."""
        _feed(m, st, dst, ("cj", "release_now", "pend_inc", "ack_take", "first", "cnp_send",
                           "up_now", "up_pend"))
        m.d.comb += [st.rank.eq(ck.o.r), st.cand.eq(ck.cand), st.onehot.eq(ck.onehot),
                     st.sch_rel_job.eq(sch.rel_job), st.sch_up_job.eq(sch.up_job),
                     st.sch_done.eq(sch.done), st.sch_done_up.eq(sch.done_up),
                     st.sch_job.eq(sch.job), st.rtx_wr.eq(rx.wr_en), st.rtx_job.eq(rx.wr_job),
                     st.rtx_rank.eq(rx.wr_rank), st.seq_job.eq(seq.job)]
        _feed(m, st, seq, ("load", "enable", "disable", "set_err", "err", "reset", "cfg_n",
                           "cfg_w", "cfg_base", "cfg_pmtu", "cfg_op", "cfg_cnp", "roles_leaf",
                           "roles_up", "roles_down", "roles_rack"))

    def _counters(self, m, st, dst, ck, sch, rx, ft):
        """Status and counters (:class:`~.counters.CtlCounters`)."""
        J = self.jobs
        m.submodules.counters = cnt = CtlCounters(self)
        _feed(m, cnt, dst, ("cj", "commit", "disp", "mismatch", "rx_data", "ack_stale",
                            "cnp_send", "cnp_supp", "release_now", "up_now"))
        _feed(m, cnt, st, ("freed", "error", "free", "rel", "busy", "n", "upptr", "enabled",
                           "leaf"))
        m.d.comb += [
            cnt.n_cur.eq(Array(st.n[j] for j in range(J))[ck.o.j]), cnt.leaf_cur.eq(ck.leaf5),
            cnt.ack_e.eq(dst.advance & dst.registered & dst.ack_take), cnt.entry.eq(ck.o.e),
            cnt.cand.eq(ck.cand),
            cnt.cj7.eq(rx.cj7), cnt.nak_fire.eq(rx.nak_fire), cnt.solicit.eq(rx.solicit),
            cnt.sch_rel_job.eq(sch.rel_job), cnt.sch_up_job.eq(sch.up_job),
            cnt.bind_en.eq(ft.bind_en), cnt.bind_entry.eq(ft.bind_entry), cnt.live.eq(ft.live),
            self.job_status.eq(cnt.job_status), self.flow_status.eq(cnt.flow_status),
            self.job_set.eq(cnt.job_set), self.job_cnt_inc.eq(cnt.job_cnt_inc),
            self.cnt_inc.eq(cnt.cnt_inc),
        ]

    def _to_retx(self, m, st, dst, ck, rx, h5, v5):
        """The decision record and D16's inputs, to the fast-retransmit stages and the output
        register (:class:`~.retxstage.RetxStages`)."""
        J = self.jobs
        p5, advance, registered = ck.o, dst.advance, dst.registered
        j5, r5 = p5.j, p5.r
        jr = _Roles(st, J)

        def per_job(port):
            return Array(port[j] for j in range(J))

        rxi = rx.i
        d6 = rxi.dec
        # D16 is not used on leaf and spine jobs (D17)
        fast_en = Cat(*(self.job_cfg[j].ctrl.fast_retx & ~jr.any_roles(j)
                        for j in range(J))).bit_select(j5, 1)
        beats = (h5.plen + self.beat_bytes - 1) >> self.beat_shift
        # the flow's fast-retransmit word counts only once written since the enable (rtx_seen);
        # the decision stage holds a frame while the frame in stage 6 will write its flow's word
        # (one bubble), so the word is read after that write or forwarded from it (stage 7)
        m.d.comb += [rx.rd_en.eq(advance), rx.i_valid.eq(v5 & advance), rx.sa_flow.eq(ck.sa_flow5)]
        m.d.comb += [d6.action.eq(dst.action), d6.disp.eq(dst.disp), d6.job.eq(j5),
                     d6.rank.eq(r5), d6.entry.eq(p5.e), d6.slot.eq(p5.slot), d6.index.eq(p5.k),
                     d6.overwrite.eq(dst.first), d6.op.eq(per_job(st.op)[j5]), d6.plen.eq(h5.plen),
                     d6.beats.eq(beats), d6.cnp.eq(dst.cnp_send), d6.rev_qpn.eq(p5.rq),
                     d6.port.eq(h5.port), d6.release.eq(dst.release_now | dst.up_now),
                     d6.remark.eq(dst.remark), d6.mark.eq(dst.mark), d6.total.eq(dst.total),
                     d6.nak_x.eq(nak_xor(h5)),
                     # the ACK request's PSN: one acknowledged by f's receiver (a duplicate)
                     d6.sol_psn.eq(p5.st + dst.acked_cur - 1),
                     rxi.reg.eq(registered), rxi.pres.eq(dst.present),
                     rxi.contrib.eq(dst.action == Action.CONTRIBUTE), rxi.ackc.eq(dst.ack_cur),
                     rxi.fast.eq(fast_en), rxi.rel.eq(per_job(st.rel)[j5]),
                     # (the OR over the ranks on a carry chain, see .wide)
                     rxi.seen.eq(or_chain(m, per_job(st.rtx_seen)[j5] & ck.onehot,
                                          "rtx_seen_rk")),
                     rxi.w.eq(registered & (dst.present | dst.ack_cur))]

