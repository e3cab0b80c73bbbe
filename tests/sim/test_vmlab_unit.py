"""VM lab pieces that run without VMs: capture analysis, the ICRC control hook, the expected sum,
the verbs backend's host-side parts (lazy pyverbs import, config checks, file rendezvous) and
the CLI's refusals."""

import threading

import numpy as np
import pytest
from click.testing import CliRunner
from netreduce.sim.model.engine import Emit
from netreduce.sim.vmlab.lab import LabConfig, _IcrcTamper, analyze_captures, expected_sum
from netreduce.sw_driver import verbs

from netreduce.cli import main
from netreduce.wire import RoceFrame, parse
from netreduce.wire.pcap import write_pcap


def _data(psn, payload=bytes(range(64)), dqpn=17, opcode=0x0A):
    return RoceFrame(opcode=opcode, dqpn=dqpn, psn=psn, payload=payload, va=0x1000, rkey=5,
                     dmalen=len(payload)).pack()


def test_analyze_counts_icrc_naks_and_retransmissions(tmp_path):
    good = [_data(10), _data(11), _data(10)]  # PSN 10 twice: one retransmission
    bad = bytearray(_data(12))
    bad[-10] ^= 1  # payload byte flipped, ICRC stale
    naks = [RoceFrame.nak_seq(11).pack()]
    acks = [RoceFrame.ack(12).pack()]
    write_pcap(tmp_path / "c.in.pcap", good + [bytes(bad)] + naks + acks + [b"\xff" * 60])
    write_pcap(tmp_path / "c.out.pcap", good[:2])
    cap = analyze_captures(str(tmp_path / "c"))
    i = cap["in"]
    assert i["frames"] == 7 and i["roce"] == 6
    assert i["icrc_bad"] == 1 and i["icrc_bad_frames"][0]["psn"] == 12
    assert i["icrc_ok"] == 5
    assert i["naks"] == 1 and i["nak_0x60"] == 1 and i["acks"] == 1
    assert i["data"] == 3 and i["retransmitted"] == 1
    assert cap["out"]["icrc_ok"] == 2 and cap["out"].get("icrc_bad", 0) == 0


def test_analyze_missing_capture(tmp_path):
    cap = analyze_captures(str(tmp_path / "none"))
    assert cap["in"] == {"missing": True} and cap["out"] == {"missing": True}


class _FakeEngine:
    def __init__(self, frames):
        self.frames = frames

    def receive(self, port, frame, time):
        return [Emit(port, f, time) for f in self.frames]


def test_icrc_tamper_flips_one_payload_byte_once():
    ack = RoceFrame.ack(3).pack()
    data = _data(7)
    eng = _FakeEngine([ack, data])
    t = _IcrcTamper(eng)
    out = eng.receive(0, b"", 0)
    assert out[0].frame == ack  # ACKs are never touched
    assert out[1].frame != data and len(out[1].frame) == len(data)
    assert sum(a != b for a, b in zip(out[1].frame, data, strict=True)) == 1
    with pytest.raises(Exception, match="ICRC"):
        parse(out[1].frame)
    assert parse(out[1].frame, check=False).payload != parse(data).payload
    assert t.done["psn"] == 7 and t.done["dqpn"] == 17
    again = eng.receive(0, b"", 0)  # only the first one
    assert again[1].frame == data


def test_expected_sum_wraps_like_int32():
    cfg = LabConfig(workers=3, elems=1000, seed=5)
    xs = [np.random.default_rng([5, r]).integers(-2**31, 2**31, 1000, dtype=np.int64)
          .astype(np.int32) for r in range(3)]
    with np.errstate(over="ignore"):
        want = xs[0] + xs[1] + xs[2]
    assert np.array_equal(expected_sum(cfg), want)


@pytest.mark.parametrize("kw", [{"workers": 1}, {"backend": "fpga"}, {"pmtu": 2048},
                                {"loss": 0.7}, {"elems": 0}, {"boot_timeout_s": 0},
                                {"timeout_s": 100, "boot_timeout_s": 101}])
def test_lab_config_rejects(kw):
    with pytest.raises(ValueError):
        LabConfig(**kw)


def test_verbs_imports_without_pyverbs_and_says_so():
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pyverbs is installed here")
    with pytest.raises(verbs.VerbsUnavailable, match="python3-pyverbs"):
        verbs.VerbsDevice()


@pytest.mark.parametrize("kw", [{"pmtu": 2048}, {"window": 100}, {"margin": 256},
                                {"msg_packets": 0}, {"timeout": 32}, {"max_bytes": 6},
                                {"int32": False, "float32": False}])
def test_verbs_config_rejects(kw):
    with pytest.raises(ValueError):
        verbs.VerbsConfig(**kw)


def test_wc_status_words_for_qp_failures():
    assert verbs.WC_STATUS[12] == "transport retry counter exceeded"
    assert verbs.WC_STATUS[10] == "remote access error"


def test_file_exchange_all_gather(tmp_path):
    world = 3
    out = [None] * world

    def rank(r):
        ex = verbs.FileExchange(tmp_path, r, world, timeout_s=30)
        a = ex({"r": r, "gid": bytes([r]) * 16})
        b = ex(r * 10)
        out[r] = (a, b)

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for r in range(world):
        a, b = out[r]
        assert [x["r"] for x in a] == [0, 1, 2]
        assert a[2]["gid"] == b"\x02" * 16
        assert b == [0, 10, 20]


def test_file_exchange_timeout_names_missing_ranks(tmp_path):
    ex = verbs.FileExchange(tmp_path, 0, 3, timeout_s=0.2)
    with pytest.raises(TimeoutError, match=r"\[1, 2\]"):
        ex("hello")


def test_cli_verilator_backend_without_verilator_is_one_line(monkeypatch):
    # (the lab on the RTL itself: tests/sim/test_vmlab_lab.py)
    monkeypatch.setattr("netreduce.sim.rtl.fastsim.verilator_missing",
                        lambda: "verilator not found (test)")
    r = CliRunner().invoke(main, ["vmlab", "run", "--backend", "verilator"])
    assert r.exit_code == 2
    assert "verilator not found (test)" in r.output and "Traceback" not in r.output


def test_cli_help_lists_vmlab():
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "vmlab" in r.output


# ============================================================ orchestration with fake VMs
@pytest.fixture
def fake_lab(tmp_path, monkeypatch):
    """run_lab with no QEMU and no image: each test sets lab._qemu_cmd to a shell command."""
    from netreduce.sim.vmlab import image as image_mod
    from netreduce.sim.vmlab import lab

    d = tmp_path / "img"
    d.mkdir()
    for f in ("vmlinuz", "initrd.img", "rootfs.img"):
        (d / f).write_bytes(b"")
    img = image_mod.Image(d, {"recipe": image_mod.RECIPE_VERSION, "kernel_version": "fake"})
    monkeypatch.setattr(lab, "ensure_image", lambda *a, **k: img)
    monkeypatch.setattr(lab, "host_problems", lambda build=True: [])
    return lab


def test_watchdog_fails_fast_when_a_vm_dies_after_its_init(fake_lab, tmp_path, monkeypatch):
    # rank 0 "crashes" after its init started, rank 1 would wait forever: the run must stop rank
    # 1 at once instead of waiting for the watchdog
    import time

    def fake(img, cfg, rank, port, share, console):
        if rank == 0:
            return ["sh", "-c", f"echo started > {share}/out/rank0.init.log; exit 3"]
        return ["sleep", "600"]

    monkeypatch.setattr(fake_lab, "_qemu_cmd", fake)
    t0 = time.monotonic()
    res = fake_lab.run_lab(LabConfig(workers=2, elems=64, timeout_s=300,
                                     run_dir=str(tmp_path / "a")), log=lambda *a: None)
    assert time.monotonic() - t0 < 60
    assert not res.ok
    assert any("rank 0: VM exited (status 3) without a result" in p for p in res.problems)


def test_watchdog_boots_dead_vms_again(fake_lab, tmp_path, monkeypatch):
    # VMs that die before their init runs are booted again, BOOT_RETRIES times; the first VM
    # out of retries stops the run (which one depends on timing)
    monkeypatch.setattr(fake_lab, "_qemu_cmd", lambda *a: ["sh", "-c", "exit 1"])
    res = fake_lab.run_lab(LabConfig(workers=2, elems=64, timeout_s=300,
                                     run_dir=str(tmp_path / "b")), log=lambda *a: None)
    assert not res.ok
    assert max(res.report["boot_retries"]) == fake_lab.BOOT_RETRIES
    assert any(f"VM died while booting (exit 1), {fake_lab.BOOT_RETRIES + 1} boots failed" in p
               for p in res.problems), res.problems


def test_watchdog_kills_hung_boots_and_boots_them_again(fake_lab, tmp_path, monkeypatch):
    # rank 1 hangs before its init script (no init log) on its first boot only; rank 0 hangs on
    # every boot and fails the run once its retries are used up, naming the boot timeout
    import time

    def fake(img, cfg, rank, port, share, console):
        first = not (share / f"boot{rank}").exists()
        mark = f"touch {share}/boot{rank}; "
        if rank == 1 and not first:
            return ["sh", "-c", mark + f"echo started > {share}/out/rank1.init.log; sleep 600"]
        return ["sh", "-c", mark + "exec sleep 600"]

    monkeypatch.setattr(fake_lab, "_qemu_cmd", fake)
    t0 = time.monotonic()
    res = fake_lab.run_lab(LabConfig(workers=2, elems=64, timeout_s=120, boot_timeout_s=3,
                                     run_dir=str(tmp_path / "c")), log=lambda *a: None)
    assert time.monotonic() - t0 < 60  # not the 120 s watchdog
    assert not res.ok
    assert res.report["boot_retries"] == [fake_lab.BOOT_RETRIES, 1]
    assert any(f"rank 0: VM did not reach its init script within 3 s, "
               f"{fake_lab.BOOT_RETRIES + 1} boots failed" in p for p in res.problems), \
        res.problems


def test_watchdog_message_says_where_each_vm_stopped(fake_lab, tmp_path, monkeypatch):
    def fake(img, cfg, rank, port, share, console):
        if rank == 0:
            return ["sh", "-c", f"printf 'rank 0: init\\njob: all-reduce started at 9 s\\n' > "
                                f"{share}/out/rank0.init.log; sleep 600"]
        return ["sh", "-c", f"echo 'Loading, please wait...' > {console}; sleep 600"]

    monkeypatch.setattr(fake_lab, "_qemu_cmd", fake)
    # boot timeout = run timeout: the run's watchdog always fires first, nothing is rebooted
    res = fake_lab.run_lab(LabConfig(workers=2, elems=64, timeout_s=3, boot_timeout_s=3,
                                     run_dir=str(tmp_path / "d")), log=lambda *a: None)
    assert res.report["boot_retries"] == [0, 0]
    assert not res.ok
    msg = [p for p in res.problems if p.startswith("watchdog:")]
    assert msg, res.problems
    assert "rank 0: at: job: all-reduce started at 9 s" in msg[0]
    assert "rank 1: still booting (init not started), console: Loading, please wait" in msg[0]
    assert res.report["qemu_exit"][0] is not None  # killed


def test_lab_problems_name_the_missing_tools(monkeypatch, tmp_path):
    from netreduce.sim.vmlab import image as image_mod
    from netreduce.sim.vmlab import lab

    monkeypatch.setattr(image_mod.shutil, "which", lambda tool: None)
    probs = lab.lab_problems(tmp_path)  # empty cache: the build's tools are needed too
    assert any("qemu-system-x86_64 not found (Debian package qemu-system-x86)" in p
               for p in probs)
    assert any("debootstrap not found" in p for p in probs)
    # with a cached image only QEMU matters
    d = tmp_path / f"image-v{image_mod.RECIPE_VERSION}-{image_mod.SUITE}"
    d.mkdir()
    for f in ("vmlinuz", "initrd.img", "rootfs.img"):
        (d / f).write_bytes(b"x")
    (d / "manifest.json").write_text(f'{{"recipe": {image_mod.RECIPE_VERSION}}}')
    probs = lab.lab_problems(tmp_path)
    assert probs == ["qemu-system-x86_64 not found (Debian package qemu-system-x86)"]


def test_lab_problems_without_a_mirror(monkeypatch, tmp_path):
    from netreduce.sim.vmlab import image as image_mod
    from netreduce.sim.vmlab import lab

    monkeypatch.setattr(lab, "host_problems", lambda build=True: [])
    monkeypatch.setattr(image_mod, "MIRROR", "http://127.0.0.1:9/debian")
    probs = lab.lab_problems(tmp_path)
    assert len(probs) == 1 and "Debian mirror unreachable" in probs[0]


def _fake_bzimage(elf: bytes) -> bytes:
    import lzma

    return b"MZ" + bytes(500) + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"\0" * 64


def test_extract_vmlinux_keeps_only_pvh_elf_kernels(tmp_path):
    from netreduce.sim.vmlab.image import Image, extract_vmlinux

    elf = b"\x7fELF" + bytes(100) + b"\x04\0\0\0\x04\0\0\0\x12\0\0\0Xen\0" + bytes(100)
    (tmp_path / "vmlinuz").write_bytes(_fake_bzimage(elf))
    assert extract_vmlinux(tmp_path / "vmlinuz", tmp_path / "vmlinux", log=lambda *a: None)
    assert (tmp_path / "vmlinux").read_bytes() == elf
    assert Image(tmp_path, {}).boot_kernel == tmp_path / "vmlinux"
    (tmp_path / "vmlinux").unlink()
    assert Image(tmp_path, {}).boot_kernel == tmp_path / "vmlinuz"  # fallback
    msgs = []
    # no PVH note, no xz stream, a corrupt stream: no file, the bzImage is booted
    (tmp_path / "a").write_bytes(_fake_bzimage(b"\x7fELF" + bytes(100)))
    (tmp_path / "b").write_bytes(b"MZ" + bytes(1000))
    (tmp_path / "c").write_bytes(_fake_bzimage(elf)[:300] + b"\xfd7zXZ\0" + bytes(50))
    whole = _fake_bzimage(elf)
    (tmp_path / "d").write_bytes(whole[:502 + (len(whole) - 566) // 2])  # truncated stream
    for f in ("a", "b", "c", "d"):
        assert not extract_vmlinux(tmp_path / f, tmp_path / "out", log=msgs.append)
        assert not (tmp_path / "out").exists()
    assert len(msgs) == 4 and all("booting the bzImage" in m for m in msgs), msgs
    assert "truncated" in msgs[3]
