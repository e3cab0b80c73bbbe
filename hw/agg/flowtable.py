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
    reverse keys instead of the forward keys) in a cycle with ``lk_en`` is compared against every
    live entry in parallel; the result appears after two further cycles with ``lk_en``: ``lk_hit``
    and ``lk_entry`` (registered one-hot match, encoded) and ``lk_data`` (job, rank, start PSN,
    reverse DestQP; read from a RAM addressed by the encoded entry). Latency: 2 enabled cycles;
    throughput: one key per cycle; no backpressure of its own. Keys are unique among live entries
    (the enable sequencer refuses conflicts), so at most one entry matches.

Check (combinational)
    ``chk_fwd`` / ``chk_rev`` (56-bit keys: IPv4 << 24 | QPN) -> ``chk_fwd_hit`` / ``chk_rev_hit``:
    some pending or live entry already holds that forward / reverse key. Used by the enable
    sequencer, one entry per cycle.

Bind (one entry per cycle)
    ``bind_en`` writes entry ``bind_entry`` with ``bind_job``, ``bind_fwd``, ``bind_rev`` and
    ``bind_data`` and makes it pending. Visible to ``chk_*`` in the next cycle.

Commit / drop (one cycle, all entries in parallel)
    ``commit_en``: every pending entry of job ``commit_job`` becomes live. ``drop_en``: every
    pending or live entry of job ``drop_job`` becomes free. The caller must not let a lookup of a
    dropped entry's key be in flight across a drop or commit (the control path quiesces its
    pipeline around these operations).

``live`` (Out, ``flows`` bits) is the bound flag of every entry (``FLOW.STATUS.bound``).

Reset: every entry free.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["FlowTable", "KEY_BITS", "flow_data_layout", "make_key"]

KEY_BITS = 56  # IPv4 (32) << 24 | QPN (24)
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


class FlowTable(wiring.Component):
    """Latched flow table with a parallel (CAM) lookup; see the module docstring.

    Parameters: ``flows`` (entries, >= 1), ``jobs``, ``max_world`` (for field widths).
    """

    def __init__(self, flows: int = 256, *, jobs: int = 8, max_world: int = 64):
        for name, v in (("flows", flows), ("jobs", jobs), ("max_world", max_world)):
            if not isinstance(v, int) or v < 1:
                self._MustUse__silence = True  # rejected: no "created but never used" warning
                raise ValueError(f"{name} must be a positive int, not {v!r}")
        self.flows, self.jobs, self.max_world = flows, jobs, max_world
        self.entry_bits = max(1, ceil_log2(flows))
        self.job_bits = max(1, ceil_log2(jobs))
        self.data_layout = flow_data_layout(jobs, max_world)
        super().__init__({
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
        rd = mem.read_port()
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

        # ---- check port (enable sequencer): pending or live entries holding a key
        used = live | pending
        m.d.comb += [
            self.chk_fwd_hit.eq(Cat(used[e] & (fwd[e] == self.chk_fwd) for e in range(F)).any()),
            self.chk_rev_hit.eq(Cat(used[e] & (rev[e] == self.chk_rev) for e in range(F)).any()),
        ]

        # ---- lookup: stage A compares (registered one-hot), stage B encodes + reads the RAM
        key = Signal(KEY_BITS)
        m.d.comb += key.eq(Cat(self.lk_qpn, self.lk_ip))
        onehot = Signal(F)
        with m.If(self.lk_en):
            m.d.sync += onehot.eq(Cat(
                live[e] & (((rev[e] == key) & self.lk_rev) | ((fwd[e] == key) & ~self.lk_rev))
                for e in range(F)))
        # encode: keys are unique among live entries, so bit b of the index is the OR of the
        # match bits of the entries whose number has bit b set (flat OR trees, no chains)
        idx = Signal(self.entry_bits)
        m.d.comb += idx.eq(Cat(*(Cat(*(onehot[e] for e in range(F) if e >> b & 1)).any()
                                 if F > 1 << b else Const(0, 1)
                                 for b in range(self.entry_bits))))
        m.d.comb += [rd.en.eq(self.lk_en), rd.addr.eq(idx)]
        with m.If(self.lk_en):
            m.d.sync += [self.lk_hit.eq(onehot.any()), self.lk_entry.eq(idx)]
        m.d.comb += self.lk_data.eq(rd.data)
        return m
