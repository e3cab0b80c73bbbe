"""The VM lab's guest image, built from Debian packages only and cached.

:func:`ensure_image` returns an :class:`Image` (kernel, initrd, raw ext4 root, manifest), building
it first when the cache holds none for the current :data:`RECIPE_VERSION`. Build
(:func:`build_image`, root and Debian host tools needed, about 2 min and 150 MB of downloads on an
idle machine):

1. ``debootstrap --variant=minbase bookworm`` into a temporary folder of the cache;
2. in a chroot, ``apt-get install`` of :data:`GUEST_PACKAGES` (kernel with rdma_rxe, rdma-core,
   perftest, python3-pyverbs, numpy for the project), with a small initrd (virtio-blk + ext4:
   ``MODULES=list``);
3. kernel modules a virtio guest never needs are removed (:data:`PRUNE_MODULES`, then
   ``depmod``); the guest init (:data:`INIT_SCRIPT`: mounts, the 9p share, then the run's own
   script from the share) goes to ``/sbin/netreduce-init``;
4. ``mkfs.ext4 -d`` packs the root into ``rootfs.img``; kernel and initrd are copied out;
   ``manifest.json`` records the guest kernel version (``uname -r`` of the guest: bookworm's
   kernel drifts), the package versions, the build time and the sizes.

Boot kernel: Debian's bzImage is xz-compressed and TCG spends several seconds per VM (more
under load) decompressing it before the kernel's clock even starts. :func:`ensure_image`
therefore also extracts the uncompressed ELF ``vmlinux`` (Python's lzma, about 1 s, 66 MB in the
cache) which QEMU boots directly through its PVH entry (the kernel has ``CONFIG_PVH=y``);
:attr:`Image.boot_kernel` falls back to the bzImage when that is not possible.

The project itself is not baked in: every run copies the current sources (netreduce.wire,
netreduce.regmap, netreduce.sw_driver) into the run's 9p share and the guest's Python imports
them from there, so a code change never needs an image rebuild.

The cache lives in ``$NETREDUCE_CACHE/vmlab`` (default ``~/.cache/netreduce/vmlab``, outside
the git tree). A build writes into ``<cache>/build.tmp`` and renames into place only when
complete, so an interrupted build never leaves a half image; a lock file serialises concurrent
builders (pytest workers). Errors: :class:`ImageError` naming the failing step and the tail of
its log.
"""

from __future__ import annotations

import fcntl
import json
import lzma
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Image", "ImageError", "ensure_image", "build_image", "cached_image", "cache_dir",
           "extract_vmlinux", "host_problems", "mirror_problem", "GUEST_PACKAGES", "HOST_PACKAGES",
           "RECIPE_VERSION"]

RECIPE_VERSION = 2  # bump when the recipe changes: old images are then rebuilt
SUITE = "bookworm"
MIRROR = os.environ.get("NETREDUCE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
GUEST_PACKAGES = ("linux-image-amd64", "kmod", "iproute2", "rdma-core", "ibverbs-utils",
                  "ibverbs-providers", "perftest", "python3-pyverbs", "python3-numpy")
HOST_PACKAGES = ("qemu-system-x86", "qemu-utils", "debootstrap", "e2fsprogs")
HOST_TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "debootstrap": "debootstrap",
              "mkfs.ext4": "e2fsprogs", "chroot": "coreutils"}
INITRD_MODULES = ("virtio_pci", "virtio_blk", "ext4", "crc32c_generic")
# kernel module trees a virtio guest never loads (about 200 MB of the 390 MB of modules)
PRUNE_MODULES = ("sound", "drivers/gpu", "drivers/media", "drivers/net/wireless",
                 "drivers/net/ethernet", "drivers/net/usb", "drivers/net/can", "drivers/staging",
                 "drivers/scsi", "drivers/usb", "drivers/hid", "drivers/input", "drivers/iio",
                 "drivers/bluetooth", "drivers/infiniband/hw", "drivers/isdn", "drivers/mtd",
                 "drivers/platform", "drivers/mfd", "drivers/hwmon", "drivers/video",
                 "drivers/ata", "drivers/md", "drivers/nvme", "drivers/target", "net/wireless",
                 "net/mac80211", "net/bluetooth")

# PID 1 of the guest: minimal, so that everything a run does lives in the share (no rebuilds).
INIT_SCRIPT = """#!/bin/sh
# netreduce vmlab guest init (PID 1): mounts, the 9p share, then the run's script from the share.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /run /tmp /share
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
modprobe -a 9pnet_virtio 9p
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share; then
    if [ -f /share/guest/init.sh ]; then
        /bin/sh /share/guest/init.sh
    else
        echo "netreduce-init: /share/guest/init.sh missing"
    fi
else
    echo "netreduce-init: cannot mount the 9p share"
fi
sync
echo o > /proc/sysrq-trigger
sleep 30
"""


class ImageError(RuntimeError):
    """The image could not be built or is unusable; the message names the step."""


@dataclass(frozen=True)
class Image:
    """A built guest image: ``kernel``, ``initrd``, ``rootfs`` (raw ext4, use with
    ``snapshot=on``) and the ``manifest`` dict (kernel_version, packages, build_s, sizes)."""

    dir: Path
    manifest: dict

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs.img"

    @property
    def vmlinux(self) -> Path:
        return self.dir / "vmlinux"

    @property
    def boot_kernel(self) -> Path:
        """The uncompressed PVH-bootable ``vmlinux`` when extracted, else the bzImage."""
        return self.vmlinux if self.vmlinux.is_file() else self.kernel

    @property
    def kernel_version(self) -> str:
        return self.manifest["kernel_version"]


def cache_dir() -> Path:
    """``vmlab/`` in the project's cache (:func:`netreduce.hw.cache.cache_dir`)."""
    from netreduce.hw.cache import cache_dir as project_cache

    return project_cache("vmlab")


def cached_image(cache: Path | None = None) -> Image | None:
    """The complete cached image of the current recipe, or None (never builds)."""
    return _load(_image_dir(Path(cache) if cache else cache_dir()))


def mirror_problem(timeout_s: float = 15.0) -> str | None:
    """Why the Debian mirror cannot serve a build (None: it answers). Honours http_proxy."""
    import urllib.error
    import urllib.request

    url = f"{MIRROR}/dists/{SUITE}/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                    timeout=timeout_s):
            return None
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"Debian mirror unreachable ({url}: {e}), so the guest image cannot be built"


def host_problems(build: bool = True) -> list[str]:
    """Why the lab cannot run here (empty list: it can). ``build``: also the image tools."""
    out = []
    need = dict(HOST_TOOLS) if build else {"qemu-system-x86_64": "qemu-system-x86"}
    for tool, pkg in need.items():
        if shutil.which(tool) is None:
            out.append(f"{tool} not found (Debian package {pkg})")
    if build and os.geteuid() != 0:
        out.append("building the guest image needs root (debootstrap, chroot, mkfs.ext4 -d)")
    return out


def _image_dir(cache: Path) -> Path:
    return cache / f"image-v{RECIPE_VERSION}-{SUITE}"


def _load(d: Path) -> Image | None:
    try:
        man = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    img = Image(d, man)
    if man.get("recipe") != RECIPE_VERSION or not all(
            p.is_file() for p in (img.kernel, img.initrd, img.rootfs)):
        return None
    return img


def ensure_image(cache: Path | None = None, log=print) -> Image:
    """The cached image, built first when missing (serialised by a lock across processes)."""
    cache = Path(cache) if cache else cache_dir()
    img = _load(_image_dir(cache))
    if img is not None and (img.vmlinux.is_file() or (img.dir / "vmlinux.none").exists()):
        return img
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        img = _load(_image_dir(cache))  # another process may have built it meanwhile
        if img is None:
            return build_image(cache, log=log)
        if not img.vmlinux.is_file() and not (img.dir / "vmlinux.none").exists():
            # images built before the PVH boot kernel existed; a failure is remembered
            if not extract_vmlinux(img.kernel, img.vmlinux, log=log):
                (img.dir / "vmlinux.none").write_text("no PVH-bootable kernel in vmlinuz\n")
        return img


def extract_vmlinux(bzimage: Path, dst: Path, log=print) -> bool:
    """Write the uncompressed ELF kernel inside the xz-compressed ``bzimage`` to ``dst``
    (atomically). Returns False, leaving no file, when the bzImage holds no xz stream or the
    result is no ELF with a PVH entry note: QEMU then boots the bzImage (slower, still fine)."""
    data = Path(bzimage).read_bytes()
    at = data.find(b"\xfd7zXZ\x00")
    if at < 0:
        log(f"vmlab: {bzimage} holds no xz stream: booting the bzImage (slower)")
        return False
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        elf = dec.decompress(data[at:])
    except lzma.LZMAError as e:
        log(f"vmlab: cannot decompress the kernel in {bzimage} ({e}): booting the bzImage")
        return False
    if not dec.eof:  # a truncated stream decompresses without error: never boot half a kernel
        log(f"vmlab: the xz stream in {bzimage} is truncated: booting the bzImage")
        return False
    # XEN_ELFNOTE_PHYS32_ENTRY (18) is what QEMU's PVH loader needs
    if elf[:4] != b"\x7fELF" or b"\x12\x00\x00\x00Xen\x00" not in elf:
        log(f"vmlab: the kernel in {bzimage} has no PVH entry: booting the bzImage (slower)")
        return False
    tmp = dst.with_suffix(".tmp")
    tmp.write_bytes(elf)
    tmp.replace(dst)
    return True


def _run(cmd: list[str], step: str, logf, env=None, timeout: float = 3600) -> None:
    logf.write(f"\n$ {' '.join(cmd)}\n")
    logf.flush()
    try:
        p = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ImageError(f"image build step '{step}' timed out after {timeout:.0f} s "
                         f"(log: {logf.name})") from e
    if p.returncode != 0:
        logf.flush()
        tail = Path(logf.name).read_text(errors="replace").splitlines()[-25:]
        raise ImageError(f"image build step '{step}' failed (exit {p.returncode}); last lines of "
                         f"{logf.name}:\n" + "\n".join(tail))


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def build_image(cache: Path | None = None, log=print) -> Image:
    """Build the image into the cache now (replacing any old one); see the module docstring."""
    cache = Path(cache) if cache else cache_dir()
    probs = host_problems(build=True)
    if probs:
        raise ImageError("cannot build the VM lab image here: " + "; ".join(probs))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / "build.tmp"
    if tmp.exists():
        _umount_all(tmp / "root")
        shutil.rmtree(tmp)
    tmp.mkdir()
    root = tmp / "root"
    t0 = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C", LANG="C")
    with open(tmp / "build.log", "w") as logf:
        log(f"vmlab: building the guest image in {tmp} (log: {logf.name})")
        _run(["debootstrap", "--variant=minbase", SUITE, str(root), MIRROR], "debootstrap", logf,
             env)
        log(f"vmlab: debootstrap done ({time.monotonic() - t0:.0f} s)")
        # a small initrd: only what mounting /dev/vda needs (conffile kept with --force-confold)
        (root / "etc/initramfs-tools/conf.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/initramfs-tools/conf.d/netreduce.conf").write_text(
            "MODULES=list\nCOMPRESS=gzip\n")
        (root / "etc/initramfs-tools/modules").write_text("\n".join(INITRD_MODULES) + "\n")
        (root / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
        os.chmod(root / "usr/sbin/policy-rc.d", 0o755)
        (root / "etc/apt/apt.conf.d/90netreduce").write_text(
            'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
            'Dpkg::Options { "--force-confold"; "--force-confdef"; };\n')
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=False)
        try:
            _run(["chroot", str(root), "apt-get", "install", "-y", "-q", *GUEST_PACKAGES],
                 "apt-get install (guest packages)", logf, env)
            kver = subprocess.run(["chroot", str(root), "sh", "-c", "ls /lib/modules | sort -V "
                                   "| tail -n1"], capture_output=True, text=True,
                                  check=True).stdout.strip()
            pk = subprocess.run(["chroot", str(root), "dpkg-query", "-W", "-f",
                                 "${Package} ${Version}\\n", *GUEST_PACKAGES],
                                capture_output=True, text=True, check=True).stdout
            _run(["chroot", str(root), "apt-get", "clean"], "apt-get clean", logf, env)
        finally:
            subprocess.run(["umount", "-l", str(root / "proc")], check=False)
        log(f"vmlab: packages installed, guest kernel {kver} ({time.monotonic() - t0:.0f} s)")
        if not kver:
            raise ImageError("no kernel found in the guest's /lib/modules after apt-get install")
        kmods = root / "lib/modules" / kver / "kernel"
        for sub in PRUNE_MODULES:
            shutil.rmtree(kmods / sub, ignore_errors=True)
        _run(["chroot", str(root), "depmod", "-a", kver], "depmod", logf, env)
        for junk in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/lib/apt/lists",
                     "var/cache/apt"):
            shutil.rmtree(root / junk, ignore_errors=True)
        (root / "usr/sbin/policy-rc.d").unlink()
        init = root / "sbin/netreduce-init"
        init.write_text(INIT_SCRIPT)
        os.chmod(init, 0o755)
        (root / "etc/hostname").write_text("netreduce-vm\n")
        out = tmp / "image"
        out.mkdir()
        shutil.copy(root / f"boot/vmlinuz-{kver}", out / "vmlinuz")
        shutil.copy(root / f"boot/initrd.img-{kver}", out / "initrd.img")
        if not extract_vmlinux(out / "vmlinuz", out / "vmlinux", log=log):
            (out / "vmlinux.none").write_text("no PVH-bootable kernel in vmlinuz\n")
        used = _du(root)
        size_mb = used * 13 // 10 // (1 << 20) + 128
        _run(["mkfs.ext4", "-q", "-F", "-L", "netreduce", "-d", str(root), str(out / "rootfs.img"),
              f"{size_mb}M"], "mkfs.ext4 -d", logf, env)
        manifest = {
            "recipe": RECIPE_VERSION, "suite": SUITE, "mirror": MIRROR,
            "kernel_version": kver,
            "packages": dict(line.split(" ", 1) for line in pk.splitlines() if " " in line),
            "build_s": round(time.monotonic() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "root_used_mb": round(used / (1 << 20), 1),
            "rootfs_mb": size_mb,
            "kernel_mb": round((out / "vmlinuz").stat().st_size / (1 << 20), 1),
            "initrd_mb": round((out / "initrd.img").stat().st_size / (1 << 20), 1),
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.copy(tmp / "build.log", out / "build.log")
    final = _image_dir(cache)
    if final.exists():
        shutil.rmtree(final)
    out.rename(final)
    shutil.rmtree(tmp, ignore_errors=True)
    for old in cache.glob("image-v*"):  # images of older recipes are never used again
        if old != final and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    log(f"vmlab: image ready in {final} ({manifest['build_s']:.0f} s, root {used >> 20} MB, "
        f"kernel {kver})")
    return Image(final, manifest)


def _umount_all(root: Path) -> None:
    for m in ("proc", "sys", "dev"):
        subprocess.run(["umount", "-l", str(root / m)], capture_output=True, check=False)
