"""Flow table: the engine's latched copy of the registered flows and its parallel key lookup.

Each of the ``flows`` entries holds what docs/design.md section 3 registers per rank: the forward
key (source IPv4, DestQP) of rank r's data, the reverse key (source IPv4 of the successor, DestQP of
r's QP) of its ACK/NAK/CNP traffic, the job, the rank and the start PSN S_r. The register bank's
FLOW table is the live, bus-written configuration; this table holds the copy latched when the
entry's job was enabled (model decision D9), so bus writes to a running job's flows take effect only
at the next enable.

Entry states: *free*, *pending* (latched by the enable sequencer, not yet visible to lookups) and
*live* (bound to a running job: lookups hit it). Pending and live entries both take part in the
key-conflict check.

Ports (all ``sync`` domain):

Lookup (pipelined, one key per cycle)
    ``lk_en`` advances the lookup pipeline (the caller's pipeline enable; the table holds its
    state when it is 0). A key presented (``lk_ip``, ``lk_qpn``, ``lk_rev``: compare against the
    reverse keys instead of the forward keys) in a cycle with ``lk_en`` is looked up among the
    entries live in that cycle; the result appears after ``lk_latency`` further cycles with
    ``lk_en``: ``lk_hit`` and ``lk_entry`` (registered) and ``lk_data`` (job, rank, start PSN,
    reverse DestQP; read from a RAM addressed by the encoded entry). Stages (each a registered
    step, so that no register-to-register path is deeper than two LUT6 levels at any ``flows``):
    the 56-bit compares in :data:`CHUNK`-bit pieces per entry (with a copy of ``live``), their AND
    (the one-hot match), then ``ceil(log16(flows))`` encoder stages that merge 16 (hit, entry)
    candidates each, the last one addressing the RAM. ``lk_latency`` = 3 for up to 16 entries, 4
    for up to 256. Throughput: one key per cycle; no backpressure of its own. Keys are unique
    among live entries (the enable sequencer refuses conflicts), so at most one entry matches.

Second lookup (``lookups=2`` only)
    ``lk2_ip`` / ``lk2_qpn`` -> ``lk2_hit``, ``lk2_entry``, ``lk2_data``: a second key per cycle,
    always compared against the *reverse* keys (the ACK/NAK key of a second header the control
    path decides in the same cycle), advanced by the same ``lk_en``, compared among the entries
    live in the same cycle as the first key, with the same stages and latency ``lk_latency``: its
    own chunk compares on the reverse keys, one-hot match, encoder stages and read port on the
    entry data RAM (a RAM of two read ports: LUT RAM is replicated per read port). Both lookups
    may hit the same entry. Cost: a second set of the compare, match and encoder registers.

Check (pipelined)
    ``chk_fwd`` / ``chk_rev`` (56-bit keys: IPv4 << 24 | QPN) -> ``chk_fwd_hit`` / ``chk_rev_hit``
    ``chk_latency`` cycles later (every cycle, no enable): some entry pending or live in the cycle
    the keys were presented held that forward / reverse key. Stages: chunk compares (with a copy
    of the pending | live flags), per-entry AND, then ``ceil(log16(flows))`` OR stages of fan-in
    16. Used by the enable sequencer, which holds the keys for ``chk_latency`` cycles per entry.

Bind (one entry per cycle)
    ``bind_en`` writes entry ``bind_entry`` with ``bind_job``, ``bind_fwd``, ``bind_rev`` and
    ``bind_data`` and makes it pending. Seen by keys presented to ``chk_*`` from the next cycle.

Commit / drop (one cycle, all entries in parallel)
    ``commit_en``: every pending entry of job ``commit_job`` becomes live. ``drop_en``: every
    pending or live entry of job ``drop_job`` becomes free. The caller must not let a lookup of a
    dropped entry's key be in flight across a drop or commit (the control path quiesces its
    pipeline around these operations).

``live`` (Out, ``flows`` bits) is the bound flag of every entry (``FLOW.STATUS.bound``).

Reset: every entry free.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["FlowTable", "KEY_BITS", "CHUNK", "FAN", "flow_data_layout", "make_key", "tree_stages"]

KEY_BITS = 56  # IPv4 (32) << 24 | QPN (24)
CHUNK = 14  # key bits compared per registered piece (28 inputs: two LUT6 levels)
FAN = 16  # candidates merged per registered encoder / OR stage (16-input ORs: two LUT6 levels)
PSN_BITS = 24


def make_key(ip: int, qpn: int) -> int:
    """The 56-bit key of (IPv4, QPN), as the table compares it."""
    return (ip << 24) | qpn


def flow_data_layout(jobs: int, max_world: int) -> data.StructLayout:
    """What a lookup returns besides hit/entry."""
    return data.StructLayout({
        "job": unsigned(max(1, ceil_log2(jobs))),
        "rank": unsigned(max(1, ceil_log2(max_world))),
        "start": unsigned(PSN_BITS),
        "rev_qpn": unsigned(24),
    })


def tree_stages(n: int, fan: int = FAN) -> int:
    """Registered stages of a reduction tree of fan-in ``fan`` over ``n`` inputs (at least 1)."""
    stages, width = 1, fan
    while width < n:
        stages, width = stages + 1, width * fan
    return stages


class FlowTable(wiring.Component):
    """Latched flow table with a parallel (CAM) lookup; see the module docstring.

    Parameters: ``flows`` (entries, >= 1), ``jobs``, ``max_world`` (for field widths),
    ``lookups`` (1, or 2 for the second, reverse-key lookup port ``lk2_*``).
    """

    def __init__(self, flows: int = 256, *, jobs: int = 8, max_world: int = 64,
                 lookups: int = 1):
        if lookups not in (1, 2):
            self._MustUse__silence = True  # rejected: no "created but never used" warning
            raise ValueError(f"lookups must be 1 or 2, not {lookups!r}")
        for name, v in (("flows", flows), ("jobs", jobs), ("max_world", max_world)):
            if not isinstance(v, int) or v < 1:
                self._MustUse__silence = True  # rejected: no "created but never used" warning
                raise ValueError(f"{name} must be a positive int, not {v!r}")
        self.flows, self.jobs, self.max_world = flows, jobs, max_world
        self.lookups = lookups
        self.entry_bits = max(1, ceil_log2(flows))
        self.job_bits = max(1, ceil_log2(jobs))
        self.data_layout = flow_data_layout(jobs, max_world)
        self.enc_stages = tree_stages(flows)
        self.lk_latency = 2 + self.enc_stages
        self.chk_latency = 2 + self.enc_stages
        second = {}
        if lookups == 2:
            second = {"lk2_ip": In(32), "lk2_qpn": In(24), "lk2_hit": Out(1),
                      "lk2_entry": Out(self.entry_bits), "lk2_data": Out(self.data_layout)}
        super().__init__({
            **second,
            "lk_en": In(1),
            "lk_ip": In(32),
            "lk_qpn": In(24),
            "lk_rev": In(1),
            "lk_hit": Out(1),
            "lk_entry": Out(self.entry_bits),
            "lk_data": Out(self.data_layout),
            "chk_fwd": In(KEY_BITS),
            "chk_rev": In(KEY_BITS),
            "chk_fwd_hit": Out(1),
            "chk_rev_hit": Out(1),
            "bind_en": In(1),
            "bind_entry": In(self.entry_bits),
            "bind_job": In(self.job_bits),
            "bind_fwd": In(KEY_BITS),
            "bind_rev": In(KEY_BITS),
            "bind_data": In(self.data_layout),
            "commit_en": In(1),
            "commit_job": In(self.job_bits),
            "drop_en": In(1),
            "drop_job": In(self.job_bits),
            "live": Out(flows),
        })

    def elaborate(self, platform):
        m = Module()
        F = self.flows
        fwd = [Signal(KEY_BITS, name=f"fwd{e}") for e in range(F)]
        rev = [Signal(KEY_BITS, name=f"rev{e}") for e in range(F)]
        job = [Signal(self.job_bits, name=f"job{e}") for e in range(F)]
        live = Signal(F)
        pending = Signal(F)
        m.d.comb += self.live.eq(live)

        # ---- entry data RAM: read by the lookup pipeline, written by bind
        m.submodules.data = mem = Memory(shape=self.data_layout, depth=F, init=[])
        wr = mem.write_port()
        m.d.comb += [wr.en.eq(self.bind_en), wr.addr.eq(self.bind_entry),
                     wr.data.eq(self.bind_data)]

        # ---- bind / commit / drop
        for e in range(F):
            sel = self.bind_en & (self.bind_entry == e)
            with m.If(sel):
                m.d.sync += [fwd[e].eq(self.bind_fwd), rev[e].eq(self.bind_rev),
                             job[e].eq(self.bind_job), pending[e].eq(1)]
            with m.If(self.commit_en & pending[e] & (job[e] == self.commit_job)):
                m.d.sync += [live[e].eq(1), pending[e].eq(0)]
            # drop wins over a same-cycle commit or bind of the job (the sequencer never does both)
            with m.If(self.drop_en & (live[e] | pending[e]) & (job[e] == self.drop_job)):
                m.d.sync += [live[e].eq(0), pending[e].eq(0)]

        chunks = [(lo, min(lo + CHUNK, KEY_BITS)) for lo in range(0, KEY_BITS, CHUNK)]

        def chunk_eq(keys, key, en, name=None):
            """Registered per-entry, per-chunk equality of ``keys[e]`` and ``key``."""
            name = name or keys[0].name[:3]
            eq = [Signal(len(chunks), name=f"{name}_eq{e}") for e in range(F)]
            for e in range(F):
                with m.If(en):
                    m.d.sync += eq[e].eq(Cat(keys[e][lo:hi] == key[lo:hi] for lo, hi in chunks))
            return eq

        def or_tree(bits, name):
            """Registered OR of ``bits`` (fan-in FAN per stage): (result, stages)."""
            level, n = list(bits), 0
            while len(level) > 1 or n == 0:
                nxt = []
                for g in range(0, len(level), FAN):
                    r = Signal(name=f"{name}_or{n}_{g // FAN}")
                    m.d.sync += r.eq(Cat(*level[g:g + FAN]).any())
                    nxt.append(r)
                level, n = nxt, n + 1
            return level[0], n

        # ---- check port (enable sequencer): pending or live entries holding a key, pipelined
        used = live | pending
        used_d = Signal(F)
        m.d.sync += used_d.eq(used)
        cf_eq = chunk_eq(fwd, self.chk_fwd, 1)
        cr_eq = chunk_eq(rev, self.chk_rev, 1)
        cf_hit, cr_hit = Signal(F), Signal(F)
        m.d.sync += [cf_hit.eq(Cat(used_d[e] & cf_eq[e].all() for e in range(F))),
                     cr_hit.eq(Cat(used_d[e] & cr_eq[e].all() for e in range(F)))]
        f_any, nf = or_tree(cf_hit, "chk_fwd")
        r_any, _ = or_tree(cr_hit, "chk_rev")
        assert 2 + nf == self.chk_latency
        m.d.comb += [self.chk_fwd_hit.eq(f_any), self.chk_rev_hit.eq(r_any)]

        # ---- lookup: chunk compares (with the live flags of the cycle), one-hot match, encoder
        # stages merging FAN candidates (hit, entry) each; the last one addresses the RAM
        en = self.lk_en
        key = Signal(KEY_BITS)
        m.d.comb += key.eq(Cat(self.lk_qpn, self.lk_ip))
        lf_eq = chunk_eq(fwd, key, en)
        lr_eq = chunk_eq(rev, key, en)
        live_d, rev_d = Signal(F), Signal()
        with m.If(en):
            m.d.sync += [live_d.eq(live), rev_d.eq(self.lk_rev)]
        onehot = Signal(F)
        with m.If(en):
            m.d.sync += onehot.eq(Cat(
                live_d[e] & Mux(rev_d, lr_eq[e].all(), lf_eq[e].all()) for e in range(F)))
        self._encode(m, onehot, mem.read_port(), self.lk_hit, self.lk_entry, self.lk_data, "")
        if self.lookups == 2:
            # the second key: reverse keys only, same stages, the same live flags
            key2 = Signal(KEY_BITS)
            m.d.comb += key2.eq(Cat(self.lk2_qpn, self.lk2_ip))
            l2_eq = chunk_eq(rev, key2, en, "lk2")
            onehot2 = Signal(F)
            with m.If(en):
                m.d.sync += onehot2.eq(Cat(live_d[e] & l2_eq[e].all() for e in range(F)))
            self._encode(m, onehot2, mem.read_port(), self.lk2_hit, self.lk2_entry,
                         self.lk2_data, "lk2_")
        return m

    def _encode(self, m, onehot, rd, o_hit, o_entry, o_data, pfx):
        """Encoder stages from the registered one-hot match to the registered (hit, entry) and
        the entry data read (``rd``), all advanced by ``lk_en``."""
        en = self.lk_en
        F = self.flows
        # candidates: (hit, entry bits below the group); keys are unique among live entries, so
        # at most one candidate hits and the entry is the OR of the candidates' entries
        cands = [(onehot[e], Const(0, 0)) for e in range(F)]
        sub = 0  # entry bits resolved inside a candidate
        for stage in range(self.enc_stages):
            last = stage == self.enc_stages - 1
            gbits = max(1, ceil_log2(min(FAN, len(cands)))) if len(cands) > 1 else 0
            nxt = []
            for g in range(0, len(cands), FAN):
                grp = cands[g:g + FAN]
                hit = Cat(*(c[0] for c in grp)).any()
                parts = []  # no zero-width terms: they become `wire [-1:0]` in the Verilog
                if sub:
                    low = grp[0][1]
                    for c in grp[1:]:
                        low = low | c[1]
                    parts.append(low)
                if gbits:
                    parts.append(Cat(*(Cat(*(c[0] for i, c in enumerate(grp) if i >> b & 1)).any()
                                       if len(grp) > 1 << b else Const(0, 1)
                                       for b in range(gbits))))
                ent = Cat(*parts)[:self.entry_bits] if parts else Const(0, 1)
                if last:
                    nxt.append((hit, ent))
                else:
                    r_hit = Signal(name=f"{pfx}enc{stage}_hit{g // FAN}")
                    r_ent = Signal(len(ent), name=f"{pfx}enc{stage}_ent{g // FAN}")
                    with m.If(en):
                        m.d.sync += [r_hit.eq(hit), r_ent.eq(ent)]
                    nxt.append((r_hit, r_ent))
            cands, sub = nxt, sub + gbits
        assert len(cands) == 1
        idx = Signal(self.entry_bits, name=f"{pfx}idx")
        m.d.comb += idx.eq(cands[0][1])
        m.d.comb += [rd.en.eq(en), rd.addr.eq(idx)]
        with m.If(en):
            m.d.sync += [o_hit.eq(cands[0][0]), o_entry.eq(idx)]
        m.d.comb += o_data.eq(rd.data)
