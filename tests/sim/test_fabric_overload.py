"""Issue 22: a 2:1 overloaded engine port in the system simulation (sim/net/overload.py).

Each of 2 ranks sends 256 KiB at 100 Gb/s into its own engine port whose datapath takes 50 Gb/s.
With PFC the engine's input buffer never overflows; without PFC, ECN/CNP (D19) and the RNICs'
DCQCN throttle the senders; without any reaction the buffer overflows, and every drop is counted.
"""

from __future__ import annotations

import pytest
from netreduce.sim.net.dcqcn import Dcqcn, DcqcnConfig
from netreduce.sim.net.overload import BufferConfig
from netreduce.sim.net.overload_run import run_overload

SIZE = 1 << 18


def _accounted(r):
    # every frame the switch put on an engine port's link was taken, dropped (counted) or is
    # still in the buffer: no silent loss
    assert r["frames_into_ports"] == r["engine_in"] + r["drops"] + r["in_buffer_at_end"]


@pytest.fixture(scope="module")
def runs():
    return {m: run_overload(m, SIZE) for m in ("pfc", "ecn_dcqcn", "no_reaction")}


def test_pfc_on_zero_drops(runs):
    r = runs["pfc"]
    assert r["ok"], r["error"]
    assert r["pfc_tx"] > 0 and r["pfc_tx"] % 2 == 0  # XOFF/XON pairs, every XOFF released
    assert r["drops"] == 0 and r["retransmitted"] == 0 and r["timeouts"] == 0
    assert r["max_level"] <= r["buffer"]["buffer_bytes"]
    _accounted(r)


def test_pfc_off_ecn_cnp_throttle_with_bounded_retransmissions(runs):
    r, none = runs["ecn_dcqcn"], runs["no_reaction"]
    assert r["ok"] and none["ok"]
    assert r["pfc_tx"] == 0
    assert r["cnp_sent"] > 0 and r["cnps_received"] == r["cnp_sent"] and r["rate_cuts"] > 0
    assert r["retransmitted"] <= r["packets"]  # bounded: at most one go-back-N's worth
    # the overload is real: without a reaction the buffer overflows, is counted, and costs
    # retransmissions; the throttled run drops and resends less
    assert none["drops"] > 0 and none["rate_cuts"] == 0
    assert r["drops"] < none["drops"] and r["retransmitted"] < none["retransmitted"]
    _accounted(r)
    _accounted(none)


def test_buffer_config_rejects_bad_thresholds():
    with pytest.raises(ValueError, match="xon_bytes"):
        BufferConfig(xon_bytes=20000, xoff_bytes=16384)
    with pytest.raises(ValueError, match="buffer_bytes"):
        BufferConfig(buffer_bytes=4096)
    with pytest.raises(ValueError, match="mode 'x'"):
        run_overload("x")


def test_dcqcn_cut_and_recovery():
    c = DcqcnConfig(line_gbps=100, cut_interval_ns=50_000, recover_ns=55_000, fast_steps=5)
    d = Dcqcn(c)
    assert d.rate(0) == 100
    assert d.on_cnp(1000) and d.rate(1000) == 50  # alpha 1: halve
    assert not d.on_cnp(2000)  # inside the cut interval: counted, no cut
    assert d.rate(1000 + 55_000) == 75  # fast recovery towards the target (100)
    t = 1000 + 55_000 * 60
    assert d.rate(t) == 100  # recovered to the line rate, never above
    assert d.gap_ns(1000, t) == (1000 + 24) * 8 // 100 + 1
    assert d.cuts == 1 and d.min_rate == 50
    with pytest.raises(ValueError, match="min_gbps"):
        DcqcnConfig(line_gbps=10, min_gbps=20)
