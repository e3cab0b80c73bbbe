"""The VM lab end to end: Linux soft-RoCE guests all-reduce through the reference engine.

Needs root on Debian with qemu-system-x86, qemu-utils, debootstrap, e2fsprogs (``.ci/run``
installs them); elsewhere every test here skips with the reason. The guest image is built on first
use (about 2-3 min from Debian mirrors) and cached in ~/.cache/netreduce/vmlab. Each scenario
boots its VMs once (module fixtures) and the tests assert invariants on the report: results
bit-exact, every ICRC valid, NAKs under loss, never packet counts (TCG timing varies). All
tests share one xdist group so the VMs of two scenarios never compete for the two cores.
"""

import os

import pytest
from netreduce.sim.vmlab.lab import LabConfig, lab_problems, run_lab

# Opt-in until the lab has had a clean full run on an idle CI machine (one TCG boot panic and one
# ARP loss were fixed in the last runs, not yet re-proven together): NETREDUCE_VMLAB=1 runs it.
PROBLEMS = (lab_problems() if os.environ.get("NETREDUCE_VMLAB") == "1"
            else ["opt-in: set NETREDUCE_VMLAB=1 (boots QEMU VMs, several minutes)"])
pytestmark = [
    pytest.mark.skipif(bool(PROBLEMS), reason="VM lab unavailable: " + "; ".join(PROBLEMS)),
    pytest.mark.xdist_group("vmlab"),
]

# small vectors: boot dominates; 16 Ki int32 = 64 KiB = 64 packets per rank at PMTU 1024
ELEMS = 16 * 1024


def _run(tmp_path_factory, name, **kw):
    kw.setdefault("elems", ELEMS)
    cfg = LabConfig(timeout_s=1200, run_dir=str(tmp_path_factory.mktemp(name)), **kw)
    return run_lab(cfg)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _run(tmp_path_factory, "two", workers=2)


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    # 4x the data: enough losses that some are followed by more packets (a NAK, not a timeout)
    return _run(tmp_path_factory, "lossy", workers=2, loss=0.01, seed=3, elems=4 * ELEMS)


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    # also: a second all-reduce with a corrupted remote key must fail with a clear QP error
    return _run(tmp_path_factory, "control", workers=2, icrc_control=True, qp_error_check=True,
                seed=4)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _run(tmp_path_factory, "four", workers=4, seed=5)


def _bit_exact(res, workers):
    assert res.ok, str(res)
    ranks = res.report["ranks"]
    assert len(ranks) == workers
    for r in ranks:
        assert r["ok"], r
        assert r["mismatches"] == 0, r
    assert res.report["image"]["kernel_version"]  # recorded


def _all_icrc_valid(res):
    cap = res.report["capture"]
    for side in ("in", "out"):
        assert cap[side].get("roce", 0) > 0, cap
        assert cap[side].get("icrc_bad", 0) == 0, cap[side]["icrc_bad_frames"]
        assert cap[side]["icrc_ok"] == cap[side]["roce"]


def test_two_vms_bit_exact(two):
    _bit_exact(two, 2)
    _all_icrc_valid(two)
    # the int ring's job saw every rank's data and released every index
    eng = two.report["ranks"][0]["engine"]["int"]
    assert eng["released"] > 0 and eng["results_sent"] == 2 * eng["released"]
    assert eng["drop_ahead"] == 0


def test_spurious_retransmissions_never_change_a_result(two):
    # rxe 6.1 resends in-flight packets about one timeout after arming, even without loss: the
    # engine must answer duplicates idempotently (drop while filling, re-emit once released)
    _bit_exact(two, 2)
    eng = two.report["ranks"][0]["engine"]["int"]
    assert eng["contributions"] == 2 * eng["released"]  # duplicates never count twice


def test_loss_still_bit_exact_with_naks(lossy):
    _bit_exact(lossy, 2)
    _all_icrc_valid(lossy)
    f = lossy.report["figures"]
    assert f["lost_up"] + f["lost_down"] > 0
    assert f["naks"] > 0  # NAK-seq from the receivers, seen on their way into the engine
    assert f["retransmitted_in"] > 0


def test_icrc_checking_is_live(control):
    # the tampered result must have been dropped by rxe and recovered by retransmission: the
    # result is bit-exact, exactly one frame left the engine with a bad ICRC, and the same
    # (QP, PSN) left the engine again later with a valid one
    _bit_exact(control, 2)
    t = control.report["icrc_control"]
    assert t is not None
    out = control.report["capture"]["out"]
    assert out["icrc_bad"] == 1
    assert out["icrc_bad_frames"][0]["psn"] == t["psn"]
    assert control.report["capture"]["in"].get("icrc_bad", 0) == 0
    assert control.report["capture"]["in"]["retransmitted"] > 0
    # it is the transfer's first packet, so the next ones expose the gap: NAK-seq from rxe
    assert control.report["capture"]["in"].get("nak_0x60", 0) >= 1


def test_four_vms_bit_exact(four):
    _bit_exact(four, 4)
    _all_icrc_valid(four)


def test_qp_failure_names_the_qp_and_the_work_request(control):
    chk = control.report["qp_error_check"]
    assert all(c["raised"] for c in chk), chk
    err = chk[0]["error"]  # rank 0 wrote with the bad key: the receiver answered NAK 0x62
    assert "remote access error" in err
    assert "send QP" in err and "RDMA WRITE WITH_IMM WR of message 0" in err


def test_watchdog_retries_dead_boots_and_fails_fast(tmp_path, monkeypatch):
    # fake VMs (no QEMU): rank 0 "crashes" after its init started, rank 1 would wait forever;
    # the run must stop rank 1 at once instead of waiting for the watchdog
    import time

    from netreduce.sim.vmlab import lab

    def fake(img, cfg, rank, port, share, console):
        if rank == 0:
            return ["sh", "-c", f"echo started > {share}/out/rank0.init.log; exit 3"]
        return ["sleep", "600"]

    monkeypatch.setattr(lab, "_qemu_cmd", fake)
    t0 = time.monotonic()
    res = run_lab(LabConfig(workers=2, elems=64, timeout_s=300, run_dir=str(tmp_path / "a")))
    assert time.monotonic() - t0 < 60
    assert not res.ok
    assert any("rank 0: VM exited (status 3) without a result" in p for p in res.problems)

    # VMs that die before their init runs are booted again, BOOT_RETRIES times each
    monkeypatch.setattr(lab, "_qemu_cmd", lambda *a: ["sh", "-c", "exit 1"])
    res = run_lab(LabConfig(workers=2, elems=64, timeout_s=300, run_dir=str(tmp_path / "b")))
    assert not res.ok
    assert res.report["boot_retries"] == [lab.BOOT_RETRIES] * 2
    assert all("no report" in p for p in res.problems[:2])
