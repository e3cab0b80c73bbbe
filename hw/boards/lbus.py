"""Segmented LBUS <-> beat stream converters for the UltraScale ``cmac`` IP (PG165).

The LBUS of the integrated 100G MAC is four 128-bit segments per cycle. Per segment ``s``:
``data`` (the segment's first byte in bits 127..120: big-endian, the reverse of the beat layout),
``ena`` (segment valid), ``sop`` / ``eop`` (start / end of packet in this segment), ``err`` (with
``eop``: the packet is bad) and ``mty`` (with ``eop``: number of unused bytes at the end of the
segment, 0..15). Packets may start in any segment on RX, and a packet may end and the next start
in the same cycle; segments of one cycle are in order, segment 0 first.

:class:`BeatsToLbus` (TX): one beat becomes one LBUS cycle, segment 0 first, so a packet always
starts in segment 0 (allowed by the LBUS rules; unused segments after ``eop`` have ``ena`` 0).
``i.ready`` is ``rdy`` (the MAC's ``tx_rdyout``, an almost-full flag: the MAC still accepts the
cycles already in flight, and the conversion adds one register stage). Latency 1 cycle. A last
beat with ``keep == 0`` (not a legal frame end) is sent as a 1-byte segment with ``err`` set, so
the MAC ends the packet and marks it bad instead of running it into the next one.

:class:`LbusToBeats` (RX): valid segments go into a 16-segment queue; a beat leaves the queue
when it holds 4 segments or an ``eop`` among its first 4, carrying up to 4 segments and never
segments of two packets, through a 2-entry output buffer (so the queue's pop decision does not
read ``o.ready``; ``o`` is the buffer's head, a 2:1 select and the keep mask after its
registers). One beat per cycle; latency 3 cycles (an input register, the queue, the buffer).
Throughput: at 100 Gb/s the 322.265625 MHz LBUS brings at most 38.8 bytes of wire time per
cycle, and a packet of L bytes (FCS stripped) occupies L + 24 bytes of wire time (FCS, preamble,
minimum IPG) but needs only ceil(L / 64) beats, which is never more cycles (L >= 60): the queue
drains at least as fast as the line fills it and only absorbs the 4-segments-in / 1-beat-out
bursts. A cycle's segments are admitted while at most 12 are queued; if the input overruns that,
the cycle's segments are dropped and ``overflow`` pulses (the damaged frame then fails the
core's length / ICRC checks and is counted there). ``first`` is regenerated (1 after reset and
after ``last``); ``sop`` is not needed for that. ``o.ready`` low holds the output register (and
then the queue), but the LBUS itself cannot wait: keep ``o.ready`` high.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..stream import beat_signature

__all__ = ["SEGMENT", "BeatsToLbus", "LbusToBeats", "swap_bytes", "unused_bytes"]

SEG_BITS = 128
SEG_BYTES = 16
NSEG = 4

SEGMENT = data.StructLayout({"data": SEG_BITS, "ena": 1, "sop": 1, "eop": 1, "err": 1, "mty": 4})


def swap_bytes(v, nbytes=SEG_BYTES):
    """Reverse the byte order of an ``nbytes``-byte value (LBUS segment <-> beat byte order)."""
    return Cat(*[v[8 * (nbytes - 1 - j): 8 * (nbytes - j)] for j in range(nbytes)])


def unused_bytes(keep_s):
    """16 - (bytes kept) of a segment's thermometer ``keep`` with at least its first byte
    kept (0..15): bit b of the count of zeros z = 16 - n, n = kept bytes, is set for the n
    whose z has it, read from pairs of neighbouring keep bits (n >= j + 1 is ``keep_s[j]``)."""
    def at_least(n):   # n bytes or more kept
        return keep_s[n - 1] if n >= 1 else Const(1, 1)
    bits = []
    for b in range(4):
        terms = [at_least(n) & ~at_least(n + 1) for n in range(1, SEG_BYTES + 1)
                 if (SEG_BYTES - n) >> b & 1]
        bits.append(Cat(*terms).any())
    return Cat(*bits)


class BeatsToLbus(wiring.Component):
    """Beat stream (512-bit) to TX LBUS. Ports: ``i`` (In beats), ``seg`` (Out, 4 x
    :data:`SEGMENT`, registered), ``rdy`` (In, the MAC's ``tx_rdyout``)."""

    def __init__(self):
        super().__init__({
            "i": In(beat_signature(SEG_BITS * NSEG)),
            "seg": Out(SEGMENT).array(NSEG),
            "rdy": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.i.payload
        in_frame = Signal()
        m.d.comb += self.i.ready.eq(self.rdy)
        # keep is a thermometer code (netreduce.hw.stream): a segment holds data if its first
        # byte does, the frame ends in segment s if s holds data and s + 1 does not, and the
        # unused bytes of that segment are the zeros of its keep, decoded from the thermometer
        # (no priority chain or popcount in front of the registers: 322 MHz, logic depth)
        seg_ena = [p.keep[SEG_BYTES * s] for s in range(NSEG)]
        empty_last = p.last & ~p.keep[0]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += in_frame.eq(~p.last)
            for s in range(NSEG):
                keep_s = p.keep[SEG_BYTES * s: SEG_BYTES * (s + 1)]
                ends_here = seg_ena[s] & (~seg_ena[s + 1] if s + 1 < NSEG else 1)
                is_eop = p.last & ends_here
                seg = self.seg[s]
                m.d.sync += [
                    seg.data.eq(swap_bytes(p.data[SEG_BITS * s: SEG_BITS * (s + 1)])),
                    seg.ena.eq(Mux(empty_last, s == 0, Mux(p.last, seg_ena[s], 1))),
                    seg.sop.eq((s == 0) & ~in_frame),
                    seg.eop.eq(is_eop | (empty_last & (s == 0))),
                    seg.err.eq((is_eop & p.error) | (empty_last & (s == 0))),
                    seg.mty.eq(Mux(is_eop, unused_bytes(keep_s),
                                   Mux(empty_last & (s == 0), SEG_BYTES - 1, 0))),
                ]
        with m.Else():
            for s in range(NSEG):
                m.d.sync += [self.seg[s].ena.eq(0), self.seg[s].sop.eq(0),
                             self.seg[s].eop.eq(0), self.seg[s].err.eq(0)]
        return m


class LbusToBeats(wiring.Component):
    """RX LBUS to beat stream (512-bit). Ports: ``seg`` (In, 4 x :data:`SEGMENT`), ``o`` (Out
    beats; the converter holds a beat while ``o.ready`` is low, but the LBUS itself cannot wait:
    keep ``o.ready`` high), ``overflow`` (Out, 1-cycle pulse when a cycle's segments were lost).
    """

    DEPTH = 16

    def __init__(self):
        super().__init__({
            "seg": In(SEGMENT).array(NSEG),
            "o": Out(beat_signature(SEG_BITS * NSEG)),
            "overflow": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.DEPTH
        aw = (D - 1).bit_length()
        # Timing at 322 MHz (at most 6 LUT levels per path) shapes this. The segments' data sit
        # in a circular buffer read through a registered pointer; the loop that decides how many
        # segments leave (pop) and moves the head on reads no wide select: the eop flags are
        # also kept in a vector relative to the head (`rel_eop[i]`: the segment at rp + i),
        # shifted by pop each cycle after this cycle's arrivals are merged in at the tail (at
        # the registered count), so the decision reads flags at fixed positions. The fill count
        # is a registered thermometer (and its low 2 bits), keep is precomputed from mty when a
        # segment enters, admission only looks at the registered count, and the beat leaves
        # through an output buffer; the err flags stay in the entries (read with the data).
        # The input stage computes from tables of the 4 valid bits and mty (no adder chain).
        entry = data.StructLayout({"data": SEG_BITS, "keep": SEG_BYTES, "eop": 1, "err": 1})
        q = Array(Signal(entry, name=f"q{j}") for j in range(D))
        wp = Signal(aw)
        rp = Signal(aw)
        cnt4 = Signal(2)                 # the count mod 4 (where the arrivals' flags go in)
        rel_eop = Signal(D)              # 0 beyond the queued segments (masked when merged)

        # ---- head of the queue -> next output beat: up to 4 segments, cut after the first eop
        # the count also as a registered thermometer (cnt_th[j] = cnt > j): the comparisons
        # of the count with constants (present, room, the flags' merge position) read a flag
        cnt_th = Signal(D)
        present = cnt_th[:NSEG]
        ends = [rel_eop[k] for k in range(NSEG)]   # (rel_eop is 0 where nothing is queued)
        has_eop = Cat(*ends).any()
        # takes[k]: the beat has segment k (segments up to the first eop; all 4 without one)
        full_or_eop = has_eop | present[NSEG - 1]
        takes = [full_or_eop & present[0]] + [full_or_eop & present[k] & ~Cat(*ends[:k]).any()
                                              for k in range(1, NSEG)]
        take = Signal()
        n_out = Signal(range(3))   # beats in the 2-entry output buffer
        room = Signal(init=1)      # n_out != 2, registered
        # (full_or_eop implies present[0]; `o.ready` is not an input: the output buffer has
        # room for the beat taken now whatever leaves, so the pop decision reads registers)
        m.d.comb += take.eq(full_or_eop & room)
        # pop one-hot: popk[p] = p segments leave (p = 0..4); given take, segment p - 1 is in
        # the beat and segment p is not (a few inputs each: take, two present bits, the eops)
        popk = [~take] + [take & present[p - 1] & ~Cat(*ends[:p - 1]).any()
                          & (~(present[p] & ~Cat(*ends[:p]).any()) if p < NSEG else 1)
                          for p in range(1, NSEG + 1)]

        def by_pop(cands):               # the candidate of the pop count (one-hot AND-OR)
            cands = [Value.cast(c) for c in cands]
            return Cat(*[Cat(*[s & c[b] for s, c in zip(popk, cands, strict=True)]).any()
                         for b in range(len(cands[0]))])

        head = [Array(q[(j + k) % D] for j in range(D))[rp] for k in range(NSEG)]

        # the beat's error: the err flag of its first eop segment, read from the head entries
        # (outside the pop loop; `error` is a buffer register, as the shell's RX FIFO reads it)
        end_err = Cat(*[ends[k] & ~Cat(*ends[:k]).any() & head[k].err
                        for k in range(NSEG)]).any()

        # ---- a 2-entry output buffer: a taken beat is written unmasked with the segments it
        # takes; the entry shown on `o` is selected and its keep masked after the registers
        first = Signal(init=1)
        ent = data.StructLayout({"beat": self.o.payload.shape(), "tk": NSEG})
        e = [Signal(ent, name=f"out{i}") for i in range(2)]
        wsel, rsel = Signal(), Signal()
        new = Signal(ent)
        m.d.comb += [new.beat.data.eq(Cat(*[swap_bytes(h.data) for h in head])),
                     new.beat.keep.eq(Cat(*[h.keep for h in head])),
                     new.beat.last.eq(has_eop), new.beat.error.eq(end_err),
                     new.beat.first.eq(first), new.tk.eq(Cat(*takes))]
        with m.If(take):
            m.d.sync += [first.eq(has_eop), wsel.eq(~wsel)]
            with m.If(wsel):
                m.d.sync += e[1].eq(new)
            with m.Else():
                m.d.sync += e[0].eq(new)
        cur = Signal(ent)
        m.d.comb += cur.eq(Mux(rsel, e[1], e[0]))
        leave = self.o.valid & self.o.ready
        m.d.comb += [self.o.valid.eq(n_out != 0), self.o.payload.eq(cur.beat),
                     self.o.payload.keep.eq(Cat(*[Mux(cur.tk[k], cur.beat.keep[SEG_BYTES * k:
                                                                           SEG_BYTES * (k + 1)],
                                                      0) for k in range(NSEG)]))]
        with m.If(leave):
            m.d.sync += rsel.eq(~rsel)
        n_next = Signal(range(3))
        m.d.comb += n_next.eq(n_out + take - leave)
        m.d.sync += [n_out.eq(n_next), room.eq(n_next != 2)]
        m.d.sync += rp.eq(by_pop([(rp + p)[:aw] for p in range(NSEG + 1)]))

        # ---- input stage: the cycle's valid segments compacted (the r-th valid one in slot r),
        # their number and keep (from mty) registered, so the queue write is a 4:1 select per
        # entry by its distance from the tail, with no adder or decoder chain in front of it
        ins = [Signal(entry, name=f"in{r}") for r in range(NSEG)]
        incnt = Signal(3)
        inge = Signal(NSEG)   # the same as a thermometer: inge[v] = incnt > v (slot v filled)
        ena = [self.seg[s].ena for s in range(NSEG)]
        # (the count of 4 valid bits from a table: one 4-input LUT per bit, no adder chain)
        nvalid = Array(Const(bin(v).count("1"), 3) for v in range(1 << NSEG))[Cat(*ena)]
        m.d.sync += [incnt.eq(nvalid), inge.eq(Cat(*[nvalid > v for v in range(NSEG)]))]
        segs = []
        for s in range(NSEG):
            seg = self.seg[s]
            # keep from mty by a table (bit b: mty < 16 - b; a 4-input LUT, no subtraction)
            keep_of_mty = Array(Const((1 << (SEG_BYTES - v)) - 1, SEG_BYTES)
                                for v in range(SEG_BYTES))[seg.mty]
            keep = Mux(seg.eop, keep_of_mty, (1 << SEG_BYTES) - 1)
            segs.append(Cat(seg.data, keep, seg.eop, seg.err))
        for r in range(NSEG):
            # slot r takes segment r + d, the valid one with exactly r valid ones before it: d
            # from a table of the 4 valid bits (a slot beyond the count is never read)
            def skip(v, r=r):
                idx = [s for s in range(NSEG) if v >> s & 1]
                return idx[r] - r if r < len(idx) else 0
            d = Array(Const(skip(v), 2) for v in range(1 << NSEG))[Cat(*ena)]
            m.d.sync += ins[r].eq(Array(segs[min(r + k, NSEG - 1)] for k in range(NSEG))[d])

        # ---- the registered segments at the tail: entry j takes slot (j - wp) mod D when that
        # is below their number
        fits = ~cnt_th[D - NSEG]   # cnt <= D - 4: room for a full cycle whatever leaves
        m.d.sync += self.overflow.eq(0)
        with m.If(fits):
            for j in range(D):
                rel = Signal(aw, name=f"rel{j}")
                m.d.comb += rel.eq(j - wp)
                with m.If(rel < incnt):
                    m.d.sync += q[j].eq(Array(ins)[rel[:2]])
            m.d.sync += wp.eq(wp + incnt)
        with m.Elif(incnt != 0):
            m.d.sync += self.overflow.eq(1)
        # the count's low 2 bits (all that is read of it in binary) and its thermometer, for
        # each pop count from registers, then selected by it; "cnt + added > j" from the
        # thermometer and the arrivals' count (no adder)
        cnt4_add = Signal(2)
        m.d.comb += cnt4_add.eq(cnt4 + Mux(fits, incnt, 0))
        m.d.sync += cnt4.eq(by_pop([(cnt4_add - p)[:2] for p in range(NSEG + 1)]))

        def th(i):   # cnt > i
            return Const(1, 1) if i < 0 else cnt_th[i] if i < D else Const(0, 1)

        def gt(j):   # cnt + added > j
            return Mux(fits, Cat(*[(incnt == v) & th(j - v) for v in range(NSEG + 1)]).any(),
                       th(j))

        m.d.sync += cnt_th.eq(Cat(*[by_pop([gt(j + p) for p in range(NSEG + 1)])
                                    for j in range(D)]))
        # the relative eop flags: the registered arrivals' flags merged in from position cnt on
        # (0 beyond cnt + added), shifted by pop. Masked to the queued segments (`ends` need
        # no `present`): an arrival's flag only from a filled slot, within 4 of the count,
        # admitted; slot (j - cnt) mod 4 of the arrivals as an AND-OR on the decoded cnt4
        in_v = Cat(*[s.eop & inge[r] for r, s in enumerate(ins)])
        merged = [Mux(th(j), rel_eop[j],
                      Cat(*[(cnt4 == (j - r) % 4) & in_v[r] for r in range(NSEG)]).any()
                      & fits & th(j - NSEG))
                  if j < D else Const(0, 1) for j in range(D + NSEG)]
        m.d.sync += rel_eop.eq(Cat(*[by_pop([merged[i + p] for p in range(NSEG + 1)])
                                     for i in range(D)]))
        return m
