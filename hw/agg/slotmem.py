"""Slot memory: the aggregation buffer, read-modify-write at one beat per cycle.

``slots`` slots of ``pmtu_max // (width // 8)`` beats each (default 1024 x 64 beats x 512 bits =
4 MiB). Beat ``b`` of slot ``s`` lives at address ``s * beats_per_slot + b``.

Three accesses happen every cycle (contribution read, contribution write, result read) and block
RAM / UltraRAM have two ports, so the memory is kept as two identical copies, each one simple
dual-port (one write port, one synchronous read port): every write goes to both; copy ``rmw``
serves the read of the read-modify-write, copy ``res`` the result reads. Physical size is
therefore ``2 * slots * pmtu_max`` bytes: 8 MiB by default, which Yosys maps to 228 of the 960
URAM288 of an xcvu9p, or 1824 RAMB36E2 (the xcvu095 has 1728: use 512 slots there); figures in
bench/results/slotmem.json.

Contribution port (``contrib``, always ready)
    One beat per cycle, sustained; it never stalls: ``contrib.ready`` is constantly 1 (the
    signature says ``always_ready``). A beat is ``slot``, ``beat``, ``op``, ``overwrite``,
    ``tag``, and ``data``, ``keep``, ``last`` as in :func:`netreduce.hw.stream.beat_layout`. The
    old beat is read, combined in the :class:`~netreduce.hw.agg.lanes.LaneALU` and written back.
    ``overwrite`` marks the first contribution of the slot's generation (FIRST: the beat replaces
    the stored one; the field is not called ``first`` because in the stream layout ``first`` means
    the first beat of a frame). ``keep`` only masks saturation flags (all lanes are written: the
    padding lanes of a short last beat hold don't-care values that are never sent). ``last`` and
    ``tag`` are only passed on to the event. Contributions to the same address in consecutive
    cycles (from different flows) are correct at every distance: the read is stale for the
    ``read_latency`` writes still in flight, so their results are forwarded from a write history
    (the youngest matching write wins).

Pipeline latency
    A beat accepted in cycle ``t`` is written at the clock edge that ends cycle
    ``t + read_latency``; its event is valid in cycle ``t + read_latency + 1``. ``read_latency``
    (>= 1, default 2) is the number of register stages between address and read data: the memory's
    own synchronous read plus ``read_latency - 1`` output registers, which Vivado can absorb into
    the BRAM/URAM output registers (more of them help UltraRAM cascades close timing; Yosys 0.23
    leaves them in fabric flip-flops).

Event port (``events``, always ready)
    One event per accepted contribution beat, in order, with the beat's ``slot``, ``beat``,
    ``overwrite``, ``last``, ``tag``; the per-lane saturation flags ``sat`` (``SUM_SAT`` clamped
    that lane; only lanes whose 4 bytes are all kept count), ``saturated`` (any lane), and the
    error bits. The consumer cannot stall it. When the event of a beat is valid, its write is
    already visible to the result port.

Result port (``result_req`` -> ``result``, ready/valid)
    Reads a beat (``slot``, ``beat``, ``tag``) at one beat per cycle, concurrently with
    contributions. A request accepted in cycle ``t`` is answered in cycle ``t + read_latency``
    when ``result.ready`` stays high. Backpressure: the read pipeline advances when
    ``~result.valid | result.ready``; ``result_req.ready`` is that same condition (it depends
    combinationally on ``result.ready``, never on ``result_req.valid``). A read returns the
    memory as of the cycle the request was accepted, including every write whose event was
    valid in that cycle or earlier; a write still in flight is not seen (the slot state
    machine only releases a slot after its last event).

Error behaviour (no memory change, reported, never a hang)
    ``bad_slot``: ``slot >= slots`` (possible only when ``slots`` is not a power of two): the
    contribution is dropped, the result reads back zero. ``bad_op``: undefined operation code:
    the contribution is dropped. Either way the beat still produces its event, with the error
    bit set and no saturation flags, so the aggregator can count it.

Memory contents are not reset and have no initial value (the two copies are large RAMs of
:mod:`netreduce.hw.rams`: ``ram_style`` attribute, no ``initial`` block, so they map to
UltraRAM): a slot's next generation starts with an ``overwrite`` contribution.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from ..rams import large_ram_attrs
from ..stream import beat_layout, check_data_width
from .lanes import LANE_BITS, LaneALU, Op

__all__ = ["SlotMemory"]


class SlotMemory(wiring.Component):
    """Slot memory with read-modify-write contributions and a concurrent result read port.

    Parameters
    ----------
    width : int
        Beat width in bits, as every stream (hw/stream.py; default 512: 16 int32 lanes).
    slots : int
        Number of slots (default 1024).
    pmtu_max : int
        Largest payload in bytes; ``pmtu_max // (width // 8)`` beats per slot, a power of two.
    read_latency : int
        Cycles from read address to read data, >= 1 (default 2); see the module docstring.
    tag_width : int
        Width of an opaque ``tag`` carried from a contribution to its event and from a result
        request to its result (e.g. job and flow numbers), default 0.

    Attributes
    ----------
    contrib : In(stream.Signature(contrib_layout, always_ready=True))
    events : Out(stream.Signature(event_layout, always_ready=True))
    result_req : In(stream.Signature(result_req_layout))
    result : Out(stream.Signature(result_layout))
    """

    # Hazard forwarding; a subclass in the tests turns it off to show the tests would notice.
    _forwarding = True

    def __init__(self, width: int = 512, *, slots: int = 1024, pmtu_max: int = 4096,
                 read_latency: int = 2, tag_width: int = 0):
        try:
            self._configure(width, slots, pmtu_max, read_latency, tag_width)
        except ValueError:
            self._MustUse__silence = True  # rejected, so no "created but never used" warning
            raise
        super().__init__({
            "contrib": In(stream.Signature(self.contrib_layout, always_ready=True)),
            "events": Out(stream.Signature(self.event_layout, always_ready=True)),
            "result_req": In(stream.Signature(self.result_req_layout)),
            "result": Out(stream.Signature(self.result_layout)),
        })

    def _configure(self, width, slots, pmtu_max, read_latency, tag_width):
        check_data_width(width)  # the stream width rule of hw/stream.py
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive integer, not {slots!r}")
        beat_bytes = width // 8
        if not isinstance(pmtu_max, int) or pmtu_max < beat_bytes or pmtu_max % beat_bytes:
            raise ValueError(
                f"pmtu_max must be a positive multiple of the beat size {beat_bytes} B, "
                f"not {pmtu_max!r}")
        beats = pmtu_max // beat_bytes
        if beats & (beats - 1):
            raise ValueError(
                f"pmtu_max / beat size must be a power of two, not {pmtu_max}/{beat_bytes}"
                f" = {beats}")
        if not isinstance(read_latency, int) or read_latency < 1:
            raise ValueError(f"read_latency must be an integer >= 1, not {read_latency!r}")
        if not isinstance(tag_width, int) or tag_width < 0:
            raise ValueError(f"tag_width must be an integer >= 0, not {tag_width!r}")

        self.width = width
        self.lanes = width // LANE_BITS
        self.slots = slots
        self.pmtu_max = pmtu_max
        self.beats_per_slot = beats
        self.depth = slots * beats
        self.read_latency = read_latency
        self.tag_width = tag_width
        self.slot_bits = max(1, ceil_log2(slots))
        self.beat_bits = exact_log2(beats)

        # data, keep and last as in the one stream beat layout (hw/stream.py).
        beat_fields = beat_layout(width)
        self.contrib_layout = data.StructLayout({
            "slot": unsigned(self.slot_bits),
            "beat": unsigned(self.beat_bits),
            "op": Op,
            "overwrite": 1,
            "tag": unsigned(tag_width),
            "data": beat_fields["data"].shape,
            "keep": beat_fields["keep"].shape,
            "last": beat_fields["last"].shape,
        })
        self.event_layout = data.StructLayout({
            "slot": unsigned(self.slot_bits),
            "beat": unsigned(self.beat_bits),
            "overwrite": 1,
            "last": 1,
            "tag": unsigned(tag_width),
            "sat": unsigned(self.lanes),
            "saturated": 1,
            "bad_slot": 1,
            "bad_op": 1,
        })
        self.result_req_layout = data.StructLayout({
            "slot": unsigned(self.slot_bits),
            "beat": unsigned(self.beat_bits),
            "tag": unsigned(tag_width),
        })
        self.result_layout = data.StructLayout({
            "slot": unsigned(self.slot_bits),
            "beat": unsigned(self.beat_bits),
            "tag": unsigned(tag_width),
            "bad_slot": 1,
            "data": unsigned(width),
        })

    def _address(self, slot, beat):
        # beats_per_slot is a power of two, so slot * beats_per_slot + beat is a concatenation.
        return Cat(beat, slot) if self.beat_bits else slot

    def _in_range(self, slot):
        if self.slots == 2 ** self.slot_bits:
            return Const(1)
        return slot < self.slots

    def elaborate(self, platform):
        m = Module()
        L = self.read_latency
        addr_bits = self.slot_bits + self.beat_bits

        # large RAMs: ram_style attribute, no initial content (hw/rams.py)
        m.submodules.mem_rmw = mem_rmw = Memory(shape=self.width, depth=self.depth, init=[],
                                                attrs=large_ram_attrs())
        m.submodules.mem_res = mem_res = Memory(shape=self.width, depth=self.depth, init=[],
                                                attrs=large_ram_attrs())
        wr_rmw = mem_rmw.write_port()
        wr_res = mem_res.write_port()
        rd_rmw = mem_rmw.read_port()
        rd_res = mem_res.read_port()

        # ---- contribution pipeline: stage 0 = input, stage L = combine + write -------------
        # Only valid bits are reset; payload registers are reset-less (no reset fan-out on
        # ~600 bits per stage, and read-data registers stay mergeable into RAM output registers).
        stage_layout = data.StructLayout({
            "addr": unsigned(addr_bits),
            "bad_slot": 1,
            "beat_in": self.contrib_layout,
        })
        c_in = self.contrib.payload
        stage0 = Signal(stage_layout)
        m.d.comb += [
            stage0.addr.eq(self._address(c_in.slot, c_in.beat)),
            stage0.bad_slot.eq(~self._in_range(c_in.slot)),
            stage0.beat_in.eq(c_in),
            rd_rmw.addr.eq(stage0.addr),
        ]
        stages, valids = [stage0], [self.contrib.valid]
        for k in range(1, L + 1):
            st = Signal(stage_layout, name=f"c_stage{k}", reset_less=True)
            valid = Signal(name=f"c_valid{k}")
            m.d.sync += [st.eq(stages[-1]), valid.eq(valids[-1])]
            stages.append(st)
            valids.append(valid)
        # Read data aligned with stage k: the memory output is stage 1, registers follow.
        rdata = rd_rmw.data
        for k in range(2, L + 1):
            reg = Signal(self.width, name=f"c_rdata{k}", reset_less=True)
            m.d.sync += reg.eq(rdata)
            rdata = reg

        last, last_valid = stages[L], valids[L]
        m.submodules.alu = alu = LaneALU(self.width)
        wr_en = Signal()
        m.d.comb += wr_en.eq(last_valid & ~last.bad_slot & ~alu.op_error)

        # Write history: hist[k] is the write committed k+1 cycles ago. The read of the beat in
        # stage L was sampled L cycles ago, before the writes of hist[0..L-1] were committed.
        hist_layout = data.StructLayout({"addr": unsigned(addr_bits), "data": unsigned(self.width)})
        hist = [Signal(hist_layout, name=f"hist{k}", reset_less=True) for k in range(L)]
        hist_valid = [Signal(name=f"hist_valid{k}") for k in range(L)]
        m.d.sync += [hist_valid[0].eq(wr_en), hist[0].addr.eq(last.addr),
                     hist[0].data.eq(alu.result)]
        for k in range(1, L):
            m.d.sync += [hist[k].eq(hist[k - 1]), hist_valid[k].eq(hist_valid[k - 1])]

        # Forwarding select, decided one stage early (off the critical path) for the values the
        # history will hold next cycle: next hist[0] = the write now in stage L, next hist[k] =
        # hist[k-1]. One-hot with priority to the youngest write.
        prev = stages[L - 1]
        next_hist = [(wr_en, last.addr)] + [(hist_valid[k], hist[k].addr) for k in range(L - 1)]
        match_next = Signal(L)
        for k, (valid, addr) in enumerate(next_hist):
            m.d.comb += match_next[k].eq(valid & (addr == prev.addr))
        select = Signal(L)
        younger = Const(0)
        for k in range(L):
            m.d.sync += select[k].eq(match_next[k] & ~younger)
            younger = younger | match_next[k]

        # select is one-hot or zero, so the forwarding mux is an AND-OR tree.
        forwarded = Const(0, self.width)
        for k in range(L):
            forwarded = forwarded | (hist[k].data & select[k].replicate(self.width))
        old = Signal(self.width)
        if self._forwarding:
            m.d.comb += old.eq(Mux(select.any(), forwarded, rdata))
        else:  # tests only: proves that the hazard tests catch stale reads
            m.d.comb += old.eq(rdata)

        beat_in = last.beat_in
        m.d.comb += [
            alu.op.eq(beat_in.op),
            alu.first.eq(beat_in.overwrite),
            alu.acc.eq(old),
            alu.contrib.eq(beat_in.data),
        ]
        for wr in (wr_rmw, wr_res):
            m.d.comb += [wr.en.eq(wr_en), wr.addr.eq(last.addr), wr.data.eq(alu.result)]

        # Event, registered: valid the cycle after the write, so any read it triggers sees it.
        ev = self.events.payload
        ok = ~last.bad_slot & ~alu.op_error
        # A lane is payload when its 4 bytes are kept (keep is a thermometer code, so its top
        # byte decides); padding lanes of a short last beat never count as saturated.
        kept = Cat(beat_in.keep[4 * i + 3] for i in range(self.lanes))
        sat = Signal(self.lanes)
        m.d.comb += sat.eq(alu.sat & kept & ok.replicate(self.lanes))
        m.d.sync += [
            self.events.valid.eq(last_valid),
            ev.slot.eq(beat_in.slot),
            ev.beat.eq(beat_in.beat),
            ev.overwrite.eq(beat_in.overwrite),
            ev.last.eq(beat_in.last),
            ev.tag.eq(beat_in.tag),
            ev.sat.eq(sat),
            ev.bad_slot.eq(last.bad_slot),
            ev.bad_op.eq(alu.op_error),
        ]

        # From the registered flags: keeps the 16-input OR off the ALU's path.
        m.d.comb += ev.saturated.eq(ev.sat.any())

        # ---- result read pipeline, stalls as a whole on backpressure ------------------------
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.result.valid | self.result.ready),
            self.result_req.ready.eq(advance),
        ]
        req = self.result_req.payload
        r_layout = data.StructLayout({"bad_slot": 1, "req": self.result_req_layout})
        r0 = Signal(r_layout)
        m.d.comb += [
            r0.bad_slot.eq(~self._in_range(req.slot)),
            r0.req.eq(req),
            rd_res.en.eq(advance),
            rd_res.addr.eq(self._address(req.slot, req.beat)),
        ]
        r_stage, r_valid, r_data = r0, self.result_req.valid, rd_res.data  # rd_res: stage 1
        for k in range(1, L + 1):
            nxt = Signal(r_layout, name=f"r_stage{k}", reset_less=True)
            nxt_valid = Signal(name=f"r_valid{k}")
            with m.If(advance):
                m.d.sync += [nxt.eq(r_stage), nxt_valid.eq(r_valid)]
            r_stage, r_valid = nxt, nxt_valid
            if k >= 2:
                reg = Signal(self.width, name=f"r_rdata{k}", reset_less=True)
                with m.If(advance):
                    m.d.sync += reg.eq(r_data)
                r_data = reg
        res = self.result.payload
        m.d.comb += [
            self.result.valid.eq(r_valid),
            res.slot.eq(r_stage.req.slot),
            res.beat.eq(r_stage.req.beat),
            res.tag.eq(r_stage.req.tag),
            res.bad_slot.eq(r_stage.bad_slot),
            res.data.eq(r_data & (~r_stage.bad_slot).replicate(self.width)),
        ]
        return m

