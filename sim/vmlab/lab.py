"""VM lab orchestration: N QEMU guests running Linux soft-RoCE, all-reducing through the engine.

:func:`run_lab` (``netreduce vmlab run``):

1. ensures the guest image (:mod:`.image`; built and cached on first use);
2. prepares a run folder: the 9p share (guest scripts, the project's pure-Python sources, the
   job config, per-rank network settings) and the captures;
3. starts the switch service in-process (:class:`~netreduce.sim.emu.switch.SwitchThread`) with the
   reference engine (``backend="model"``) or the engine RTL under Verilator
   (``backend="verilator"``: :class:`~netreduce.sim.rtl.switch_engine.RtlSwitchEngine`, a
   64-bit build of :func:`rtl_lab_params`, built on first use and cached; its own management
   path answers rank 0's requests), the seeded loss ``loss`` in both directions (towards
   and from the engine), a capture of everything entering and leaving the engine, and rank 0's
   guest address on the management allow-list;
4. boots N VMs under TCG (``-m 512``, one vCPU, root on a ``snapshot=on`` drive), each NIC a
   ``-netdev socket`` connection to the service. Each guest brings up eth0 (MTU 1500 for PMTU
   1024, 4200 for 4096), rdma_rxe on it, and runs :file:`guest/job.py`: the all-reduce of
   seeded random int32 vectors with the verbs backend (:mod:`netreduce.sw_driver.verbs`); rank 0
   registers the jobs over the management protocol;
5. waits for every VM to power off, under a watchdog (``timeout_s`` overall: the VMs are killed
   and the run fails naming where each VM was, from its init log or console). A VM that dies
   before its init script runs (a TCG boot failure on a loaded host), or has not reached it
   within ``boot_timeout_s`` (a hung boot; it is killed), is booted again, up to
   :data:`BOOT_RETRIES` times; a VM that exits later without a result stops the run at once;
6. checks every guest's result bit-exactly against the host's own integer sum (SUM_WRAP), checks
   every captured RoCEv2 frame's ICRC, counts NAKs and retransmissions in the captures, and
   writes ``report.json`` into the run folder. :attr:`LabResult.ok` is False on any mismatch,
   guest error, hang or invalid ICRC (other than the control experiment's one frame).

Control experiment (``icrc_control``): the first result packet the engine emits with a payload
gets one payload byte flipped and keeps its now stale ICRC. A live ICRC check in the receiving
guest drops it silently; the sender's go-back-N then delivers the right result, so the run must
still be bit-exact, with exactly one invalid-ICRC frame in the capture (the tampered one) and a
retransmission of that PSN. A receiver that did not check the ICRC would write the flipped byte
and the result check would fail.

This measures correctness against a real RC stack, not speed: TCG runs a guest at tens of
Mbit/s. Figures are in the report (boot to rxe ACTIVE, all-reduce time, frames, NAKs, ...).

The RTL backend uses a 64-bit datapath (the 512-bit engine takes many minutes to build and is
the same design with wider beats; the guests cannot tell the difference at TCG speed), PMTU
``pmtu_max`` = the lab's PMTU, and the table sizes of ``netreduce sim``'s RTL backend for
max(4, workers) ranks; for 2-4 VMs at PMTU 1024 that is exactly the build the RTL tests use.
"""

from __future__ import annotations

import compileall
import dataclasses
import json
import os
import py_compile
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .image import Image, cached_image, ensure_image, host_problems, mirror_problem

__all__ = ["LabConfig", "LabResult", "run_lab", "analyze_captures", "lab_problems",
           "rtl_lab_params"]

GUEST_DIR = Path(__file__).parent / "guest"
MAC_PREFIX = "52:54:00:4e:52"
NAK_SEQ = 0x60
BOOT_RETRIES = 2  # per VM, only for VMs that die or hang before their init script runs


@dataclass(frozen=True)
class LabConfig:
    """One lab run. ``elems`` int32 per rank; ``seed`` of the data and the faults;
    ``loss`` per frame, each direction; ``pcap`` PREFIX to keep the captures (always taken, in
    the run folder otherwise); ``timeout_s`` watchdog over the whole run; ``boot_timeout_s``
    from a VM's start until its init script runs (a hung boot is killed and booted again);
    ``op_timeout_s`` in the guests without progress (rendezvous, completions: it must cover a
    slow peer's boot); ``run_dir`` (default a fresh temporary folder, kept); ``icrc_control``
    (module doc); ``qp_timeout`` of the guests' QPs: 16 (268 ms), so the 7 retries ride out
    about 2 s without an ACK when TCG guests on a loaded host stall (14, 67 ms, would give up
    with "retry exceeded" after half a second); rxe 6.1 also retransmits spuriously about one
    timeout after arming (docs/roce.md). ``qp_timeout=None`` (default): 16 with the model, 18
    (1.07 s; 8.6 s without an ACK) with the RTL, which handles a few hundred frames per second:
    a window of packets queued in front of a frame delays its answer by up to a second."""

    workers: int = 2
    backend: str = "model"
    loss: float = 0.0
    pmtu: int = 1024
    pcap: str | None = None
    elems: int = 64 * 1024
    seed: int = 1
    msg_packets: int = 16
    window: int = 256
    margin: int = 64
    qp_timeout: int | None = None  # 16 (model) / 18 (verilator): see above
    retry_cnt: int = 7
    memory_mb: int = 512
    timeout_s: float = 900.0
    boot_timeout_s: float = 240.0
    op_timeout_s: float = 400.0
    icrc_control: bool = False
    qp_error_check: bool = False
    run_dir: str | None = None
    cache: str | None = None

    def __post_init__(self):
        if not isinstance(self.workers, int) or not 2 <= self.workers <= 16:
            raise ValueError(f"workers must be 2..16, got {self.workers!r}")
        if self.backend not in ("model", "verilator"):
            raise ValueError(f"backend must be 'model' or 'verilator', got {self.backend!r}")
        if self.pmtu not in (1024, 4096):
            raise ValueError(f"pmtu must be 1024 or 4096, got {self.pmtu!r}")
        if not 0.0 <= self.loss < 0.5:
            raise ValueError(f"loss must be in [0, 0.5), got {self.loss!r}")
        if not isinstance(self.elems, int) or self.elems < 1:
            raise ValueError(f"elems must be a positive int, got {self.elems!r}")
        if self.qp_timeout is not None and not (isinstance(self.qp_timeout, int)
                                                and 1 <= self.qp_timeout <= 31):
            raise ValueError(f"qp_timeout must be 1..31 or None, got {self.qp_timeout!r}")
        if not 0 < self.boot_timeout_s <= self.timeout_s:
            raise ValueError(f"boot_timeout_s must be in (0, timeout_s={self.timeout_s}], got "
                             f"{self.boot_timeout_s!r}")


@dataclass
class LabResult:
    ok: bool
    problems: list[str]
    report: dict
    run_dir: Path

    def __str__(self) -> str:
        return f"vmlab {'OK' if self.ok else 'FAILED'} ({self.run_dir}): " + (
            "; ".join(self.problems) if self.problems else "all results bit-exact")


def lab_problems(cache: str | Path | None = None) -> list[str]:
    """Why the lab cannot run on this host (empty: it can). Tests skip with this reason.

    With the image cached only QEMU is needed; otherwise also the build's tools, root and a
    reachable Debian mirror (probed once, 15 s at most)."""
    if cached_image(Path(cache) if cache else None) is not None:
        return host_problems(build=False)
    probs = host_problems(build=True)
    if not probs:
        m = mirror_problem()
        if m:
            probs.append(m)
    return probs


def qp_timeout(cfg: LabConfig) -> int:
    """The guests' QP timeout exponent for ``cfg`` (see :class:`LabConfig`)."""
    if cfg.qp_timeout is not None:
        return cfg.qp_timeout
    return 18 if cfg.backend == "verilator" else 16


def rtl_lab_params(cfg: LabConfig) -> dict:
    """Engine build parameters of the RTL backend for ``cfg`` (module doc): 64-bit datapath,
    ``pmtu_max`` = ``cfg.pmtu``."""
    from netreduce.sim.net.simrun import SimConfig
    from netreduce.sim.rtl.fabric import rtl_params

    return {**rtl_params(SimConfig(workers=max(4, cfg.workers), pmtu=cfg.pmtu)),
            "data_width": 64, "pmtu_max": cfg.pmtu}


# ============================================================================ the engine hook
class _IcrcTamper:
    """Wraps ``engine.receive`` (``engine.run`` of a batched engine): flips one payload byte of
    the first result packet with a payload (opcode RDMA WRITE *) the engine emits, leaving its
    ICRC stale. Records what it did."""

    def __init__(self, engine):
        self.name = "run" if getattr(engine, "batched", False) else "receive"
        self.orig = getattr(engine, self.name)
        self.done: dict | None = None
        setattr(engine, self.name, self)

    def __call__(self, *args):
        emits = self.orig(*args)
        if self.done is None:
            from netreduce.wire import parse
            from netreduce.wire.view import WRITE_OPCODES, is_roce, opcode

            for i, e in enumerate(emits):
                f = e.frame
                if len(f) < 80 or not is_roce(f) or opcode(f) not in WRITE_OPCODES:
                    continue
                try:
                    rf = parse(f, check=False)
                except Exception:
                    continue
                if len(rf.payload) < 8:
                    continue
                off = len(f) - 4 - len(rf.payload) - (rf.padcnt or 0)
                b = bytearray(f)
                b[off + 3] ^= 0x5A
                emits[i] = e._replace(frame=bytes(b)) if hasattr(e, "_replace") else \
                    dataclasses.replace(e, frame=bytes(b))
                self.done = {"dqpn": rf.dqpn, "psn": rf.psn, "opcode": rf.opcode,
                             "dst_ip": rf.dst_ip, "byte_offset": off + 3}
                break
        return emits


# ============================================================================ captures
def analyze_captures(prefix: str) -> dict:
    """Counts over PREFIX.in.pcap (into the engine) and PREFIX.out.pcap (out of it): RoCEv2
    frames, ICRC-valid ones (the invalid ones listed), ACKs, NAKs by syndrome, and
    retransmissions (data packets whose (dst IP, QPN, PSN) was already seen in that capture)."""
    from netreduce.wire import ROCEV2_UDP_PORT, WireError, parse
    from netreduce.wire.pcap import iter_pcap
    from netreduce.wire.view import BTH_OFF, DATA_OPCODES, OP_ACK, OP_CNP, is_udp, udp_dport

    out = {}
    for side in ("in", "out"):
        path = f"{prefix}.{side}.pcap"
        c = Counter()
        bad = []
        seen = set()
        if not os.path.exists(path):
            out[side] = {"missing": True}
            continue
        for rec in iter_pcap(path):
            f = rec.data
            c["frames"] += 1
            if not (len(f) >= BTH_OFF and is_udp(f) and udp_dport(f) == ROCEV2_UDP_PORT):
                continue
            c["roce"] += 1
            try:
                rf = parse(f, check=True)
            except WireError as e:
                if e.reason == "icrc":
                    c["icrc_bad"] += 1
                    rf = parse(f, check=False)
                    bad.append({"dqpn": rf.dqpn, "psn": rf.psn, "opcode": rf.opcode})
                else:
                    c["malformed"] += 1
                continue
            c["icrc_ok"] += 1
            if rf.opcode == OP_ACK:
                synd = rf.syndrome
                if synd >> 5 == 0b11:
                    c["naks"] += 1
                    c[f"nak_0x{synd:02x}"] += 1
                elif synd >> 5 == 0:
                    c["acks"] += 1
            elif rf.opcode in DATA_OPCODES:
                c["data"] += 1
                key = (rf.dst_ip, rf.dqpn, rf.psn)
                if key in seen:
                    c["retransmitted"] += 1
                seen.add(key)
            elif rf.opcode == OP_CNP:
                c["cnps"] += 1
        out[side] = dict(c)
        out[side]["icrc_bad_frames"] = bad[:20]
    return out


# ============================================================================ run
def _project_sources(dst: Path) -> None:
    """The pure-Python part of the project the guests import, as an importable tree."""
    import netreduce.sw_driver as swd

    import netreduce

    root = Path(netreduce.__file__).parent
    ign = shutil.ignore_patterns("__pycache__", "*.pyc")
    pkg = dst / "netreduce"
    pkg.mkdir(parents=True)
    shutil.copy(root / "__init__.py", pkg / "__init__.py")
    for sub in ("wire", "regmap"):
        shutil.copytree(root / sub, pkg / sub, ignore=ign)
    shutil.copytree(Path(swd.__file__).parent, pkg / "sw_driver", ignore=ign)
    # Compiling these sources costs the guest's Python several seconds under TCG. Bookworm's
    # python3 is 3.11: when the host's is too, its bytecode is valid there (unchecked-hash pycs
    # do not depend on the share's timestamps); another host version writes pycs the guest
    # ignores (other cache tag), which is only slower.
    compileall.compile_dir(str(pkg), quiet=2, workers=1,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)


def _qemu_cmd(img: Image, cfg: LabConfig, rank: int, port: int, share: Path,
              console: Path) -> list[str]:
    mac = f"{MAC_PREFIX}:{rank + 1:02x}"
    return [
        shutil.which("qemu-system-x86_64") or "qemu-system-x86_64",
        "-accel", "tcg", "-m", str(cfg.memory_mb), "-smp", "1", "-no-reboot",
        "-display", "none", "-monitor", "none", "-serial", f"file:{console}",
        # the uncompressed vmlinux boots through PVH: no xz decompression under TCG
        "-kernel", str(img.boot_kernel), "-initrd", str(img.initrd),
        # no_timer_check: under TCG on a loaded host the IO-APIC timer check can fail and panic.
        # clocksource=hpet: the TSC's boot calibration can be far off on a loaded host (guest
        # clocks were seen running 2-5x fast, which cut every guest timeout, rxe's too, by as
        # much); QEMU's HPET counts the host's real time and needs no calibration.
        # mitigations=off: speculation workarounds only cost time in an emulated test guest.
        "-append", f"console=ttyS0 root=/dev/vda rw init=/sbin/netreduce-init panic=-1 "
                   f"no_timer_check clocksource=hpet mitigations=off loglevel=4 "
                   f"netreduce.rank={rank}",
        "-drive", f"file={img.rootfs},format=raw,if=virtio,snapshot=on",
        "-netdev", f"socket,id=n0,connect=127.0.0.1:{port}",
        "-device", f"virtio-net-pci,netdev=n0,mac={mac}",
        "-virtfs", f"local,path={share},mount_tag=share,security_model=none,id=share",
    ]


def _guest_ip(rank: int) -> int:
    return (10 << 24) | (rank + 1)


def expected_sum(cfg: LabConfig) -> np.ndarray:
    acc = np.zeros(cfg.elems, np.int64)
    for r in range(cfg.workers):
        rng = np.random.default_rng([cfg.seed, r])
        acc += rng.integers(-2**31, 2**31, cfg.elems, dtype=np.int64).astype(np.int32)
    return acc.astype(np.int32)  # wraps: SUM_WRAP is two's complement


def _tail(p: Path, n: int = 15) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(none)"


def _stage(run: Path, share: Path, rank: int, attempt: int) -> str:
    """Where a VM was (for watchdog messages): its last init-log line, or its boot state."""
    out = share / "out"
    if (out / f"rank{rank}.json").exists():
        return "finished"
    try:
        lines = [x for x in (out / f"rank{rank}.init.log").read_text(
            errors="replace").splitlines() if x.strip()]
    except OSError:
        sfx = "" if attempt == 0 else f".retry{attempt}"
        con = [x for x in _tail(run / f"vm{rank}{sfx}.console", 3).splitlines() if x.strip()]
        return "still booting (init not started), console: " + (con[-1][:120] if con else
                                                                  "(empty)")
    return "at: " + (lines[-1][:160] if lines else "(init log empty)")


def run_lab(cfg: LabConfig, log=print) -> LabResult:
    """Run one lab scenario (module doc); never raises for guest-side failures (they are in the
    result), raises ImageError/RuntimeError when the host cannot run the lab at all."""
    probs = host_problems(build=False)
    if probs:
        raise RuntimeError("the VM lab cannot run here: " + "; ".join(probs))
    from netreduce.sim.emu.switch import FaultConfig, SwitchConfig, SwitchThread
    from netreduce.sim.emu.tunnel import DEFAULT_MGMT_IP, ENGINE_MAC
    from netreduce.sim.model import Engine

    if cfg.backend == "verilator":
        from netreduce.sim.rtl.fastsim import verilator_missing

        reason = verilator_missing()
        if reason:
            raise RuntimeError(f"--backend verilator: {reason} (use --backend model)")
    t_start = time.monotonic()
    img = ensure_image(Path(cfg.cache) if cfg.cache else None, log=log)
    t_image = time.monotonic() - t_start
    run = Path(cfg.run_dir) if cfg.run_dir else Path(tempfile.mkdtemp(prefix="netreduce-vmlab-"))
    run.mkdir(parents=True, exist_ok=True)
    share = run / "share"
    if share.exists():
        shutil.rmtree(share)
    (share / "out").mkdir(parents=True)
    (share / "xchg").mkdir()
    shutil.copytree(GUEST_DIR, share / "guest",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _project_sources(share / "py")
    mtu = 1500 if cfg.pmtu == 1024 else 4200
    for r in range(cfg.workers):
        ip = ".".join(str(b) for b in _guest_ip(r).to_bytes(4, "big"))
        (share / "guest" / f"rank{r}.env").write_text(f"IP={ip}\nMTU={mtu}\n")
    (share / "config.json").write_text(json.dumps({
        "workers": cfg.workers, "pmtu": cfg.pmtu, "elems": cfg.elems, "seed": cfg.seed,
        "msg_packets": cfg.msg_packets, "window": cfg.window, "margin": cfg.margin,
        "qp_timeout": qp_timeout(cfg), "retry_cnt": cfg.retry_cnt,
        "op_timeout_s": cfg.op_timeout_s, "qp_error_check": cfg.qp_error_check,
        "mgmt_ip": DEFAULT_MGMT_IP,
        "mgmt_mac": ENGINE_MAC.hex()}, indent=1))
    prefix = cfg.pcap or str(run / "capture")
    fault = FaultConfig(loss=cfg.loss)
    scfg = SwitchConfig(up=fault, down=fault, seed=cfg.seed, pcap=prefix,
                        mgmt_sources=(_guest_ip(0),))
    t_engine = time.monotonic()
    if cfg.backend == "verilator":
        from netreduce.sim.rtl.switch_engine import RtlSwitchEngine

        params = rtl_lab_params(cfg)
        log(f"vmlab: engine RTL under Verilator ({', '.join(f'{k} {v}' for k, v in params.items())}"
            "); the first run of these parameters builds it (a few minutes), later runs reuse it")
        engine = RtlSwitchEngine(**params, seed=cfg.seed)
    else:
        engine = Engine(jobs=8)
    t_engine = time.monotonic() - t_engine
    tamper = _IcrcTamper(engine) if cfg.icrc_control else None
    problems: list[str] = []
    report: dict = {"config": asdict(cfg), "image": {"dir": str(img.dir),
                                                     **{k: v for k, v in img.manifest.items()
                                                        if k != "packages"}},
                    "image_s": round(t_image, 1), "engine_s": round(t_engine, 1),
                    "run_dir": str(run)}
    procs: list[subprocess.Popen] = []
    hung = False
    try:
        sw = SwitchThread(engine, scfg).start()
    except BaseException:
        getattr(engine, "close", lambda: None)()
        raise
    try:
        port = sw.address[1]
        t_boot = time.monotonic()
        out = share / "out"
        launched = [0.0] * cfg.workers

        def launch(r: int, attempt: int) -> subprocess.Popen:
            sfx = "" if attempt == 0 else f".retry{attempt}"
            cmd = _qemu_cmd(img, cfg, r, port, share, run / f"vm{r}{sfx}.console")
            launched[r] = time.monotonic()
            with open(run / f"vm{r}{sfx}.qemu.log", "w") as qlog:
                return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=qlog,
                                        stderr=subprocess.STDOUT)

        def stop_all() -> None:
            for q in procs:
                if q.poll() is None:
                    q.kill()

        for r in range(cfg.workers):
            procs.append(launch(r, 0))
        log(f"vmlab: {cfg.workers} VMs booting (switch on port {port}, run folder {run})")
        deadline = t_boot + cfg.timeout_s
        retries = [0] * cfg.workers
        stopping = False
        while True:
            now = time.monotonic()
            if now > deadline:
                hung = any(p.poll() is None for p in procs)
                break
            relaunched = False
            for r, p in enumerate(procs):
                if stopping or (out / f"rank{r}.json").exists():
                    continue
                started = (out / f"rank{r}.init.log").exists()
                if p.poll() is None:
                    if started or now - launched[r] <= cfg.boot_timeout_s:
                        continue
                    # running but its init never started: a hung TCG boot
                    p.kill()
                    p.wait(10)
                    why = f"did not reach its init script within {cfg.boot_timeout_s:.0f} s"
                elif not started:
                    # died before its init ran (a TCG boot failure on a loaded host, e.g. the
                    # IO-APIC timer check): nothing of the job started, so boot it again
                    why = f"died while booting (exit {p.returncode})"
                else:
                    why = None
                if why is not None and retries[r] < BOOT_RETRIES:
                    retries[r] += 1
                    relaunched = True
                    log(f"vmlab: VM {r} {why}; booting it again ({retries[r]}/{BOOT_RETRIES})")
                    procs[r] = launch(r, retries[r])
                elif why is not None:
                    problems.append(f"rank {r}: VM {why}, {BOOT_RETRIES + 1} boots failed; "
                                    f"the other VMs were stopped")
                    stopping = True
                    stop_all()
                elif any(q.poll() is None for q in procs):
                    # a VM is gone without a result: the others would only wait for it
                    problems.append(f"rank {r}: VM exited (status {p.returncode}) without a "
                                    f"result; the other VMs were stopped")
                    stopping = True
                    stop_all()
            if not relaunched and all(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)
        report["boot_retries"] = retries
        report["vms_s"] = round(time.monotonic() - t_boot, 1)
        if hung:
            report["stages_at_watchdog"] = [_stage(run, share, r, retries[r])
                                            for r in range(cfg.workers)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        counters = sw.stop()
        rtl_s = getattr(engine, "run_seconds", None)
        getattr(engine, "close", lambda: None)()
    report["switch"] = {k: v for k, v in counters.items() if v}
    report["qemu_exit"] = [p.returncode for p in procs]
    if hung:
        problems.append(f"watchdog: VMs still running after {cfg.timeout_s:.0f} s (killed); "
                        + "; ".join(f"rank {r}: {st}" for r, st in
                                    enumerate(report["stages_at_watchdog"])))
    # ---- guests
    want = expected_sum(cfg)
    ranks = []
    for r in range(cfg.workers):
        jf = share / "out" / f"rank{r}.json"
        try:
            rep = json.loads(jf.read_text())
        except (OSError, ValueError):
            rep = {"rank": r, "ok": False, "error": "no report (guest did not finish); init "
                   f"log:\n{_tail(share / 'out' / f'rank{r}.init.log')}\nconsole:\n"
                   f"{_tail(run / f'vm{r}.console')}"}
        try:
            rep["t_active"] = float((share / "out" / f"rank{r}.active").read_text())
        except (OSError, ValueError):
            pass
        try:  # first init-log line: "rank R: kernel K, init at T s" (guest uptime)
            first = (share / "out" / f"rank{r}.init.log").read_text().split("\n", 1)[0]
            rep["t_init"] = float(first.rsplit(" at ", 1)[1].split()[0])
        except (OSError, ValueError, IndexError):
            pass
        if rep.get("ok"):
            try:
                got = np.load(share / "out" / f"rank{r}.npy")
            except (OSError, ValueError) as e:
                got = None
                rep["ok"] = False
                rep["error"] = f"no result file: {e}"
            if got is not None:
                if got.dtype != np.int32 or got.shape != want.shape:
                    rep["mismatch"] = f"result is {got.dtype}{list(got.shape)}"
                else:
                    diff = np.flatnonzero(got != want)
                    rep["mismatches"] = int(diff.size)
                    if diff.size:
                        i = int(diff[0])
                        rep["mismatch"] = (f"{diff.size} of {want.size} elements differ, first "
                                           f"at {i}: got {int(got[i])}, want {int(want[i])}")
        if not rep.get("ok"):
            problems.append(f"rank {r}: {rep.get('error', 'failed')}")
        elif rep.get("mismatch"):
            problems.append(f"rank {r}: result not bit-exact: {rep['mismatch']}")
        ranks.append(rep)
    report["ranks"] = ranks
    # ---- captures
    cap = analyze_captures(prefix)
    report["capture"] = cap
    bad_in = cap.get("in", {}).get("icrc_bad", 0)
    bad_out = cap.get("out", {}).get("icrc_bad", 0)
    allowed = 1 if (tamper is not None and tamper.done is not None) else 0
    if bad_in:
        problems.append(f"{bad_in} frame(s) into the engine with an invalid ICRC")
    if bad_out != allowed:
        problems.append(f"{bad_out} frame(s) out of the engine with an invalid ICRC, expected "
                        f"{allowed}")
    if tamper is not None:
        report["icrc_control"] = tamper.done
        if tamper.done is None:
            problems.append("ICRC control: no result packet was tampered with")
    if cfg.qp_error_check:
        chk = [x.get("qp_error_check") or {} for x in ranks]
        report["qp_error_check"] = chk
        if not all(c.get("raised") for c in chk):
            problems.append(f"QP error check: not every rank raised a VerbsError: {chk}")
    ok_ranks = [x for x in ranks if x.get("ok")]
    report["figures"] = {
        "backend": cfg.backend,
        "workers": cfg.workers, "pmtu": cfg.pmtu, "loss": cfg.loss, "bytes": 4 * cfg.elems,
        # seconds since each guest's kernel started: init script, rxe0 ACTIVE, the job's Python
        # imports done (the job starts while rxe0 comes up)
        "init_s_max": max((x.get("t_init", 0) for x in ranks), default=None),
        "rxe_active_s_max": max((x.get("t_active", 0) for x in ranks), default=None),
        "job_start_s_max": max((x.get("t_ready", 0) for x in ok_ranks), default=None),
        "setup_s_max": max((x.get("t_setup", 0) - x.get("t_ready", 0) for x in ok_ranks),
                           default=None),
        "allreduce_s_max": max((x.get("allreduce_s", 0) for x in ok_ranks), default=None),
        "vms_s": report.get("vms_s"),
        "frames_checked": cap.get("in", {}).get("roce", 0) + cap.get("out", {}).get("roce", 0),
        "icrc_bad_in": bad_in, "icrc_bad_out": bad_out,
        "naks": cap.get("in", {}).get("naks", 0),
        "retransmitted_in": cap.get("in", {}).get("retransmitted", 0),
        "lost_up": counters.get("up_lost", 0), "lost_down": counters.get("down_lost", 0),
        "engine_drop_ahead": counters.get("engine.drop_ahead", 0),
    }
    if rtl_s is not None:  # the RTL backend: time inside the Verilator model, its cycles
        report["figures"].update(rtl_run_s=round(rtl_s, 2), rtl_cycles=counters.get(
            "rtl.cycles", 0), rtl_late_outputs=counters.get("rtl.late_outputs", 0),
            rtl_watchdog=counters.get("rtl.watchdog", 0))
    report["ok"] = not problems
    report["problems"] = problems
    (run / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return LabResult(not problems, problems, report, run)
