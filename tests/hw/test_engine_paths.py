"""Paths between the engine's blocks (issue 16 item 6), on the whole engine top.

For every direct sub-block of :class:`~netreduce.hw.engine.NetReduceEngine` (parsers, adapters,
skid buffers, FIFOs, control, register bank, dispatcher, slot memory, header store, emitter,
deparser, TX arbiters and gates, management path, port counters, link-local filters...), the
hierarchical gate netlist (:func:`netreduce.hw.pathcheck.engine_paths`: Yosys ``proc; opt -fast;
memory -nomap; techmap``, not flattened, walked block by block) gives

* which input ports of the block reach which of its output ports through its own gates
  (combinationally, as the engine instantiates it);
* *chains*: a block's combinational output that reaches, through the engine's glue, an input
  from which a combinational path runs through a second block: a register-to-register path
  that crosses two block boundaries;
* the fanout of every net between blocks: the gate inputs one bit drives in the whole design.

A block with a combinational path is acceptable where the path ends at registers on both sides
(its neighbours are skid buffers, FIFOs with registered flags, or the engine's ports): the tests
pin the blocks that have one (:data:`KNOWN_COMB`), the chains (:data:`KNOWN_CHAINS`) and the
nets wider than :data:`FANOUT_LIMIT` (:data:`KNOWN_WIDE`) to stated lists with reasons, exactly,
so that a new one fails and a fixed one must leave its list. Two builds: one port (``SMALL``)
and two ports with a contribution lane each (``LANES``).

Cost: converting and mapping each build takes about a minute of CPU (cached in
``~/.cache/netreduce/paths`` by the digest of its RTLIL); the walk takes seconds.
"""

from __future__ import annotations

import shutil

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from netreduce.hw.pathcheck import base_name
from netreduce.hw.skid import SkidBuffer
from netreduce.hw.stream import beat_layout, beat_signature
from netreduce.hw.txarb import TxArbiter

NATIVE = shutil.which("yosys")
needs_yosys = pytest.mark.skipif(NATIVE is None, reason="the path checks need the native yosys")
# one worker builds both engines once (the module's fixture), not one per worker
pytestmark = pytest.mark.xdist_group("engine_paths")

SMALL = dict(ports=1, jobs=2, flows=4, slots=8, max_world=4, pmtu_max=256, data_width=64)
LANES = dict(SMALL, ports=2, lanes=2)
BUILDS = {"1p": SMALL, "2p-lanes": LANES}
# the largest number of gate inputs one bit of a net between the engine's blocks may drive
# (small parameters; clock and reset go on global buffers)
FANOUT_LIMIT = 64

# Blocks (instance names without their port / lane number) with a combinational path from an
# input port to an output port, and why the path still ends at registers on both sides.
KNOWN_COMB = {
    "adapter": "the control header's compares, from the record FIFO's output register and the "
               "parser's verdict FIFO into hdr_arb's port registers",
    "bank": "s_axil *ready follow *valid (AXI allows it; the bank's IDLE state picks read or "
            "write); its master is the AxiLiteSlice mgmt_axil_m",
    "deparser": "its advance (hdr.ready, payload.ready) follows o.ready (dep_skid's register) "
                "and payload.valid (pay_skid / the lane's pay_q FIFO); hdr.ready ends at the "
                "emitter's header queue read (a FIFO)",
    "dispatch": "a decision moves the FIFO reads (start, head/frame/payload ready), the forward "
                "FIFO and job FIFO writes, the header-store write and the slot memory's "
                "contribution in one cycle; every neighbour is a FIFO with registered flags, the "
                "header store's write port or the slot memory's registered contribution input",
    "emitter": "a result beat passes the payload reader's empty result FIFO (res -> "
               "dep_payload: the slot memory's output registers into pay_skid / the lanes' "
               "pay_q FIFOs; res.ready is a constant); the port FIFO's ready takes the header "
               "command (port.ready -> hs_en, into the header store's registered read; the "
               "FIFO's w_rdy is a register output)",
    "mgmt_axil_arb": "the AXI4-Lite arbiter forwards the owner's request and the slave's "
                     "ready / response through gates (grant registered); between the engine's "
                     "s_axil port and two AxiLiteSlice register slices",
    "mgmt_txm": "the merge of the engine's TX and the management responses onto o_p<k> passes "
                "valid / payload / ready through; its inputs are tx_skid / tx_gate and the "
                "management path's registered response, its output the engine's port",
    "txarb": "the ready of the source holding the port follows o.ready, o follows the sources; "
             "between the forward FIFO / dep_skid and tx_skid / tx_gate, all registered",
}
# with per-port lanes (hw/lanes.py): the lane split and the lanes' slot memories (the combiner
# ends in an output register)
KNOWN_COMB_LANES = {
    "lane_split": "a decision goes to its lane's FIFO in the cycle it is taken (dec -> lane<k>, "
                  "lane<k>.ready -> dec.ready); between the decision FIFO and the lanes' FIFOs",
    "slotmem": "the result port's ready is the read pipeline's advance (result.ready -> "
               "result_req.ready), driven by lane_combine's advance (from the slot memories' "
               "registered result valid; the round emitter's res.ready is a constant); with "
               "one port result.ready is a constant and the path ends there",
}

# Chains (block A, A's output, block B, B's input): one register-to-register path through two
# blocks, with the reason it is accepted (none now).
KNOWN_CHAINS: dict[str, dict] = {"1p": {}, "2p-lanes": {}}

# Nets between blocks ("block.port", port number dropped) driving more than FANOUT_LIMIT gate
# inputs, and why.
_CLEAR = ("GLOBAL.CONTROL.clear_counters: a one-cycle synchronous clear of every counter bit "
          "(the bank's and the port counters'), a reset-like net the tool replicates")
_ADVANCE = ("the slot memories' read pipeline advance (lane_combine's, from the lanes' "
            "registered result valid), its stage enables")
KNOWN_WIDE = {
    "1p": {
        "bank.global_pulse": _CLEAR, "port_stats.clear": _CLEAR,
        "dispatch.head0__ready": "the header-byte FIFO's read: the enable of its output "
                                 "register, one per bit of the head record",
        "dq.r_en": "the header-byte FIFO's read (dispatch.head0__ready)",
        "dispatch.start": "the decision FIFO's read: the enable of its output register",
        "decq.r_en": "the decision FIFO's read (dispatch.start)",
    },
    "2p-lanes": {
        "bank.global_pulse": _CLEAR, "port_stats.clear": _CLEAR,
        "emitter.req__ready": _ADVANCE, "lane_combine.req__ready": _ADVANCE,
        "slotmem.advance": _ADVANCE,
        "dispatch.head0__ready": "the lane's header-byte FIFO read: the enable of its output "
                                 "register, one per bit of the head record",
        "dq.r_en": "the header-byte FIFO's read (dispatch.head0__ready)",
        "dispatch.start": "the lane's decision FIFO read: the enable of its output register",
        "lane_dq.r_en": "the lane's decision FIFO read (dispatch.start)",
        "slotmem.result__payload": "a bit of the head lane's result (lane_combine.comb_head) that "
                                   "selects, per data bit, between its own and the combined data",
        "lane_combine.comb_head": "the same net (slotmem.result__payload)",
    },
}


def _wide(rep) -> set[str]:
    return {_block_port(k) for k, v in rep["fanout"].items()
            if v > FANOUT_LIMIT and not k.endswith((".clk", ".rst"))}


def _block_port(key: str) -> str:
    inst, port = key.split(".", 1)
    return f"{base_name(inst)}.{port}"


@pytest.fixture(scope="module", params=list(BUILDS))
def engine(request):
    from netreduce.hw.pathcheck import engine_paths

    return request.param, engine_paths(BUILDS[request.param])


@needs_yosys
@pytest.mark.slow
def test_engine_blocks_with_combinational_paths_are_the_known_ones(engine):
    """The set of blocks with a combinational input -> output path is exactly KNOWN_COMB (and,
    with lanes, KNOWN_COMB_LANES); the engine itself has none from its inputs to its outputs."""
    build, rep = engine
    assert rep["loops"] == 0
    assert rep["comb_paths"] == [], rep["comb_paths"]
    got = {base_name(b) for b in rep["block_paths"]}
    want = set(KNOWN_COMB) | (set(KNOWN_COMB_LANES) if build == "2p-lanes" else set())
    assert got == want, (f"new: {sorted(got - want)}, gone: {sorted(want - got)}",
                         {b: p for b, p in rep["block_paths"].items()
                          if base_name(b) in got - want})
    # the blocks that carry the registered boundaries have none
    blocks = {base_name(b) for b in rep["blocks"]}
    registered = {"ctl", "parser", "hdr_arb", "tx_skid" if build == "1p" else "tx_gate",
                  "dep_skid", "mgmt_path", "mgmt_split", "mgmt_axil_m", "mgmt_axil_s1",
                  "hdr_store", "linklocal", "port_stats", "fq", "pq", "dq", "fwd"}
    assert {base_name(b) for b in registered} <= blocks - got


@needs_yosys
@pytest.mark.slow
def test_engine_no_two_combinational_blocks_in_a_row(engine):
    """No register-to-register path crosses two blocks combinationally but KNOWN_CHAINS."""
    build, rep = engine
    got = {(base_name(a), ap, base_name(b), bp) for a, ap, b, bp in rep["chains"]}
    want = set(KNOWN_CHAINS[build])
    assert got == want, f"new: {sorted(got - want)}, gone: {sorted(want - got)}"


@needs_yosys
@pytest.mark.slow
def test_engine_fanout_between_blocks(engine):
    """Every net between the engine's blocks drives at most FANOUT_LIMIT gate inputs, except
    KNOWN_WIDE (clock and reset go on global buffers)."""
    build, rep = engine
    got = _wide(rep)
    want = set(KNOWN_WIDE[build])
    assert got == want, (f"new: {sorted(got - want)}, gone: {sorted(want - got)}",
                         {k: v for k, v in rep["fanout"].items() if _block_port(k) in got - want})


# ---- the check itself, on a design small enough to read


class _TwoArbiters(wiring.Component):
    """Two TX arbiters in a row (a's output is b's forwarded input), optionally with a skid
    buffer between them; b's output is the design's."""

    def __init__(self, skid: bool):
        self.skid = skid
        super().__init__({"a_fwd": In(beat_signature(64)), "a_dep": In(beat_signature(64)),
                          "b_dep": In(beat_signature(64)), "o": Out(beat_signature(64))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.a = a = TxArbiter(64)
        m.submodules.b = b = TxArbiter(64)
        wiring.connect(m, wiring.flipped(self.a_fwd), a.fwd)
        wiring.connect(m, wiring.flipped(self.a_dep), a.dep)
        wiring.connect(m, wiring.flipped(self.b_dep), b.dep)
        if self.skid:
            m.submodules.sk = sk = SkidBuffer(beat_layout(64))
            wiring.connect(m, a.o, sk.i)
            wiring.connect(m, sk.o, b.fwd)
        else:
            wiring.connect(m, a.o, b.fwd)
        wiring.connect(m, b.o, wiring.flipped(self.o))
        return m


@needs_yosys
@pytest.mark.parametrize("skid", [False, True])
def test_check_finds_chains_and_counts_fanout_as_the_flat_netlist(skid):
    """Two combinational blocks in a row are a chain both ways (valid forward, ready back); a
    skid buffer between them ends it. The fanout of the nets between blocks is the flattened
    netlist's (:func:`netreduce.hw.pathcheck.port_fanout`, the same passes, then ``flatten``)."""
    from netreduce.hw.pathcheck import HIER_SCRIPT, gate_netlist, hier_netlist, port_fanout, report

    h = hier_netlist(_TwoArbiters(skid))
    rep = report(h)
    assert set(rep["block_paths"]) == {"a", "b"}
    assert ["o__ready", "fwd__ready"] in [list(p) for p in rep["block_paths"]["a"]]
    chains = {tuple(c) for c in rep["chains"]}
    # the design's own paths from a's side to b's (o__ready -> a_fwd__ready...)
    across = {(i, o) for i, o in map(tuple, rep["comb_paths"])
              if i.startswith("a_") != o.startswith("a_")}
    if skid:
        assert chains == set()
        assert across == set()
    else:
        assert ("a", "o__valid", "b", "fwd__valid") in chains
        assert ("b", "fwd__ready", "a", "o__ready") in chains
        assert ("o__ready", "a_fwd__ready") in across
    flat_script = HIER_SCRIPT.replace("write_json", "flatten; write_json")
    flat = port_fanout(gate_netlist(_TwoArbiters(skid), script=flat_script), list(h.children()))
    assert {k: v for k, v in flat.items() if not k.endswith((".clk", ".rst"))} == \
        {k: v for k, v in h.port_fanout().items() if not k.endswith((".clk", ".rst"))}
