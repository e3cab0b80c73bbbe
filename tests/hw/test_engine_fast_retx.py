"""Fast retransmit (JOB.CTRL.fast_retx, model D16) in the engine top, Amaranth simulator, 64 bits.

The ACK rewrite (BTH PSN + 1, AETH syndrome 0x60, ICRC patched by XOR in the forward path), the
ACK request (a duplicate probe with a replaced PSN) and the per-flow hole tracking in AggControl,
frame for frame and counter for counter against the model.
The harness (register programming recorded on the model's bus and replayed over AXI4-Lite, frames
as beats, byte comparison per output flow) is the one of ``tests/hw/test_engine_top.py``.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import zlib
from pathlib import Path

import pytest
from netreduce.hw.agg.control import AggControl
from netreduce.hw.engine import icrc_delta_columns
from netreduce.sim.model.kit import RingJob

from netreduce.wire import parse


def _load(name: str):
    """A sibling test module by path (the suite imports with --import-mode=importlib)."""
    key = f"_fast_retx_harness_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(name))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules[key]


_top = _load("test_engine_top.py")
_agg = _load("test_agg_control.py")
Scenario, check, payload = _top.Scenario, _top.check, _top.payload


def fast_on(sc: Scenario, job: RingJob, on: bool = True) -> None:
    rm = sc.eng.regmap
    a = rm.addr("JOB.CTRL", job.job)
    v = rm.field("JOB.CTRL.fast_retx").put(sc.eng.bus.read(a), int(on))
    sc.ctl.bus.write(a, v)


def naks(frames) -> list:
    """(PSN, MSN) of the NAK-sequence frames among ``frames`` ((port, bytes) pairs)."""
    out = []
    for _, f in frames:
        try:
            p = parse(f)
        except Exception:  # noqa: BLE001 (not RoCE)
            continue
        if p.opcode == 0x11 and p.syndrome == 0x60:
            out.append((p.psn, p.msn))
    return out


def test_icrc_delta_columns_match_a_recompute():
    """The XOR rewrite of the forward path gives the ICRC a full recompute gives."""
    rng = random.Random(3)
    cols = icrc_delta_columns()
    for _ in range(50):
        msg = bytearray(rng.randbytes(52))
        x = rng.getrandbits(32)
        new = bytearray(msg)
        for i in range(4):
            new[8 + 37 + i] ^= x >> (8 * i) & 0xFF
        d = 0
        for i in range(32):
            if x >> i & 1:
                d ^= cols[i]
        assert zlib.crc32(bytes(new)) == zlib.crc32(bytes(msg)) ^ d


def _hole_traffic(sc: Scenario, job: RingJob, rng: random.Random) -> None:
    """Rank 0 loses index 2 and later 6; a go-back-N retransmission fills the first hole. The
    receiver of flow 0 ACKs after the holes are visible (and flow 1's ACKs have no hole)."""
    n = job.world
    for k in range(5):
        for r in range(n):
            if not (r == 0 and k == 2):
                sc.frame(job.data_bytes(r, k, payload(rng, 6)))
    sc.frame(job.ack(0, 0))            # hole at 2 behind ACK 0: NAK-sequence at index 1
    sc.frame(job.ack(1, 1))            # flow 1: no hole, forwarded unchanged
    sc.frame(job.ack(0, 1))            # the same hole again: forwarded unchanged
    for k in (2, 3, 4):                # go-back-N from index 2
        sc.frame(job.data_bytes(0, k, payload(rng, 6)))
    sc.frame(job.ack(0, 4))
    for k in range(5, 8):
        for r in range(n):
            if not (r == 0 and k == 6):
                sc.frame(job.data_bytes(r, k, payload(rng, 6)))
    sc.frame(job.ack(0, 3))            # stale: no rewrite
    sc.frame(job.ack(0, 5))            # hole at 6: NAK-sequence at index 6
    sc.frame(job.ack(1, 7))


@pytest.mark.parametrize("vlan", [None, 0x0123])
def test_fast_retx_matches_model(vlan):
    """Rewrites where the model rewrites (bit on), never with the bit off; byte-exact ICRC."""
    rng = random.Random(11)
    sc = Scenario()
    on = sc.add(RingJob(job=0, world=2, window=8, slot_base=0, pmtu=256, vlan_tci=vlan,
                        start_psns=[0xFFFFFD, 77]))          # flow 0's PSNs wrap
    off = sc.add(RingJob(job=1, world=2, window=8, slot_base=8, pmtu=256))
    fast_on(sc, on)
    _hole_traffic(sc, on, rng)
    _hole_traffic(sc, off, rng)
    got = check(sc, gap=0.2, stall=0.3, seed=1)
    c0, c1 = sc.eng.counters(0), sc.eng.counters(1)
    assert (c0["fast_retx"], c0["fast_retx_probes"]) == (2, 2)
    assert (c1["fast_retx"], c1["fast_retx_probes"]) == (0, 0)
    psn = on.psn
    assert sorted(naks(got)) == sorted([(psn(0, 1), 0), (psn(0, 6), 0)])


def test_fast_retx_two_ports_back_to_back():
    """Two ports, ACKs back to back with data (per-flow state forwarded through the pipeline),
    the bit switched off while the job runs."""
    rng = random.Random(5)
    sc = Scenario(ports=2)
    job = sc.add(RingJob(job=0, world=3, window=8, slot_base=0, pmtu=256))
    fast_on(sc, job)
    for k in range(4):
        for r in range(3):
            if not (r == 1 and k == 1):
                sc.frame(job.data_bytes(r, k, payload(rng, 4)), port=r % 2)
    sc.frame(job.ack(1, 0), port=0)          # hole at 1 right behind ACK 0: NAK at index 1
    sc.frame(job.data_bytes(1, 1, payload(rng, 4)), port=1)
    sc.frame(job.ack(0, 2), port=1)
    for k in range(4, 6):
        for r in range(3):
            if not (r == 2 and k == 4):
                sc.frame(job.data_bytes(r, k, payload(rng, 4)), port=r % 2)
    for _ in range(4):  # a live bit races with frames in flight, like any register write
        sc.frame(bytes(range(60)))
    fast_on(sc, job, False)
    sc.frame(job.ack(2, 3), port=0)          # a hole, but the bit is off
    got = check(sc)
    assert sc.eng.counters(0)["fast_retx"] == 1
    assert naks(got) == [(job.psn(1, 1), 0)]


# ---------------------------------------------------------------------------- AggControl alone
class NoRtxForwardAggControl(AggControl):
    """Without forwarding of the per-flow fast-retransmit word: back-to-back frames of a flow
    read stale state."""

    _no_forwarding = frozenset({"rtx"})


def rtx_back_to_back() -> tuple:
    """Headers one per cycle: the ACK right behind the contribution that opened the hole, a
    second ACK right behind the first NAK, the go-back-N filling the hole, a second hole."""
    sc = _agg.Scenario()
    job = sc.add(RingJob(job=0, world=2, window=8, slot_base=8))
    rm = sc.rm
    sc.bus.write(rm.addr("JOB.CTRL", 0), 0b11)
    rng = random.Random(4)
    nak, sol = [], []
    receive = sc.eng.receive

    def without_requests(port, buf, time):
        """The harness derives result ports from the emits: hide the ACK requests (probes
        sent for a contribution), checked through the decisions' ``solicit`` instead."""
        before = sc.eng.counters(0)["fast_retx_probes"]
        out = receive(port, buf, time)
        if sc.eng.counters(0)["fast_retx_probes"] != before:
            assert out[0].frame[42] == 0x07 and len(out[0].frame) == 60
            out = out[1:]
        return out

    sc.eng.receive = without_requests

    def frame(buf):
        c = sc.eng.counters(0)
        before = c["fast_retx"], c["fast_retx_probes"]
        sc.frame(buf)
        c = sc.eng.counters(0)
        nak.append(c["fast_retx"] - before[0])
        sol.append(c["fast_retx_probes"] - before[1])

    for k in range(4):
        frame(job.data_bytes(1, k, payload(rng, 4)))
    for k in (0, 1, 3):
        frame(job.data_bytes(0, k, payload(rng, 4)))
    frame(job.ack(0, 0))             # fires only if it sees the top written by index 3
    frame(job.ack(0, 1))             # must see the NAKed hole written by the ACK before
    for k in (2, 3, 5):
        frame(job.data_bytes(0, k, payload(rng, 4)))
    frame(job.ack(0, 3))             # hole at 4 behind the contribution of 5
    frame(job.data_bytes(1, 4, payload(rng, 4)))
    return sc, nak, sol


def test_agg_control_fast_retx_back_to_back():
    sc, nak, sol = rtx_back_to_back()
    assert sum(nak) == 2 and sum(sol) == 2
    gw = _agg.check(sc)  # (data right behind an ACK waits for free_j: documented stalls)
    assert [d["nak"] for d in gw.decisions] == nak
    assert [d["solicit"] for d in gw.decisions] == sol
    assert gw.cnt[0]["fast_retx"] == 2


def test_agg_control_fast_retx_needs_forwarding():
    sc, _, _ = rtx_back_to_back()
    with pytest.raises(AssertionError):
        _agg.check(sc, NoRtxForwardAggControl)
