"""In-band management client: a :class:`~netreduce.regmap.RegisterBus` over UDP frames.

A switch-attached engine has no host bus; :class:`MgmtClient` reaches its register bank with the
management protocol of ``docs/management.md`` (frame format: :mod:`netreduce.wire.mgmt`), so
:class:`~netreduce.sw_driver.control.EngineControl` runs over it unchanged::

    link = FabricLink(fabric, my_mac)                 # or any FrameLink (e.g. a TCP tunnel)
    bus = MgmtClient(link, engine_ip=..., engine_mac=..., ip=..., mac=..., port=..., key=...)
    EngineControl(bus).add_job(cfg)

Transport: a :class:`FrameLink` (``send(frame)``; ``recv(timeout_s)`` -> next frame for us or
None). :class:`FabricLink` adapts an in-process :class:`~netreduce.sim.net.scheduler.Fabric`
(time is then simulated time); the switch service supplies its own over its tunnel.

Contract
--------
* Stop-and-wait: one request outstanding; each :meth:`MgmtClient.read` / :meth:`write` is one
  request unless writes are posted (:meth:`MgmtClient.posted`), in which case they are batched,
  up to ``MGMT_MAX_OPS`` per frame, and sent with the next read, when the batch fills, or when
  the ``with`` block ends (errors of posted writes surface there, naming the address).
* Sequence numbers: strictly increasing per client; the client starts with a read-only
  *sync* request and, if the engine answers REPLAY, continues above the engine's ``LAST_SEQ``.
  One client per allow-list entry (sources sharing an entry share its sequence space).
* Loss: a request without a valid response within ``timeout_s`` is retransmitted unchanged (same
  sequence number) up to ``retries`` times, then :class:`MgmtTimeout`. If the engine executed the
  request but the response was lost, the retransmission is answered REPLAY with ``LAST_SEQ`` equal
  to its sequence number: the writes are done, and any reads are re-issued as a new request.
* Refusals: BAD_OPCODE / BAD_ADDR / DENIED raise :class:`MgmtNak` naming the op and address (a
  :class:`~netreduce.regmap.BusError`, as a bus's DECERR would). Nothing of that request ran.
* Responses are accepted only from the engine's IP/port, to ours, with the outstanding sequence
  number, echoing our ops, and (with a key) a valid tag; anything else is ignored and counted in
  ``stats``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from netreduce.regmap import Access, BusError, RegisterBus, RegMap, build_regmap
from netreduce.wire import DOT1Q, WireError
from netreduce.wire.mgmt import (
    MGMT_DEFAULT_PORT,
    MGMT_MAX_OPS,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtOpcode,
    MgmtStatus,
    MgmtType,
    mgmt_tag,
    pack_mgmt,
    parse_mgmt,
)
from netreduce.wire.view import IPV4_OFF, udp_payload

__all__ = ["FrameLink", "FabricLink", "MgmtClient", "MgmtError", "MgmtTimeout", "MgmtNak",
           "MgmtSource", "MgmtSettings", "provision", "MGMT_DEFAULT_PORT", "ReadAheadBus"]

_U32 = 0xFFFFFFFF


class MgmtError(BusError):
    """A management request failed (transport or protocol)."""


class MgmtTimeout(MgmtError):
    """No valid response after every retransmission."""


class MgmtNak(MgmtError):
    """The engine refused a request; nothing of it was executed.

    ``status`` (:class:`MgmtStatus`), ``index`` (the refused op), ``op``, ``seq``."""

    def __init__(self, msg: str, status: MgmtStatus, index: int, op: MgmtOp | None, seq: int):
        super().__init__(msg)
        self.status, self.index, self.op, self.seq = status, index, op, seq


@runtime_checkable
class FrameLink(Protocol):
    """Carries the client's Ethernet frames: ``send`` one; ``recv`` the next one addressed to the
    client, waiting at most ``timeout_s`` (None on timeout)."""

    def send(self, frame: bytes) -> None: ...

    def recv(self, timeout_s: float) -> bytes | None: ...


class FabricLink:
    """A :class:`FrameLink` on an in-process fabric: attaches ``mac`` and runs the fabric's event
    loop inside :meth:`recv` until a frame arrives or ``timeout_s`` of *simulated* time passed."""

    def __init__(self, fabric, mac: bytes):
        self.fabric = fabric
        self.mac = bytes(mac)
        self._q: list[bytes] = []
        fabric.attach(self.mac, self._q.append)

    def send(self, frame: bytes) -> None:
        self.fabric.send(frame)

    def recv(self, timeout_s: float) -> bytes | None:
        if not self._q:
            fired = []
            t = self.fabric.call_at(self.fabric.now() + int(timeout_s * 1e9), fired.append, 1)
            self.fabric.run_until(lambda: bool(self._q) or bool(fired))
            t.cancel()
        return self._q.pop(0) if self._q else None


def _op_str(op: MgmtOp, rm: RegMap | None) -> str:
    inst = rm.decode(op.addr) if rm is not None else None
    where = f"0x{op.addr:x}" + (f" ({inst.name})" if inst is not None else "")
    try:
        name = MgmtOpcode(op.opcode).name
    except ValueError:
        name = f"opcode {op.opcode}"
    return f"{name} {where}" + (f" = 0x{op.value:x}" if op.opcode == MgmtOpcode.WRITE else "")


class MgmtClient:
    """Implements :class:`~netreduce.regmap.RegisterBus` over management frames (see module doc).

    ``ip``/``mac``/``port``: the client's own addresses (``port`` is its UDP source port);
    ``engine_*``: the engine's management addresses (``MGMT.IP``, ``MGMT.MAC_*``, ``MGMT.PORT``);
    ``key``: the 16-byte SipHash key when the engine runs with ``MGMT.CTRL.auth`` (requests are
    tagged and responses must carry a valid tag); ``regmap``: only used to name registers in error
    messages. ``clock`` (seconds, monotonic) bounds waits on links whose ``recv`` may return early.
    """

    def __init__(self, link: FrameLink, *, engine_ip: int, engine_mac: bytes, ip: int,
                 mac: bytes, port: int = 0xC000, engine_port: int = MGMT_DEFAULT_PORT,
                 key: bytes | None = None, timeout_s: float = 0.005, retries: int = 4,
                 vlan_tci: int | None = None, regmap: RegMap | None = None,
                 clock: Callable[[], float] | None = None):
        if key is not None and len(key) != 16:
            raise ValueError(f"key must be 16 bytes, got {len(key)}")
        if retries < 0 or timeout_s <= 0:
            raise ValueError(f"retries = {retries} must be >= 0, timeout_s = {timeout_s} > 0")
        self.link = link
        self.engine_ip, self.engine_mac, self.engine_port = engine_ip, bytes(engine_mac), \
            engine_port
        self.ip, self.mac, self.port = ip, bytes(mac), port
        self.key, self.timeout_s, self.retries, self.vlan_tci = key, timeout_s, retries, vlan_tci
        self.regmap = regmap if regmap is not None else build_regmap()
        self.clock = clock
        self.next_seq = 1
        self.synced = False
        self.stats: Counter = Counter()
        self._posted: list[MgmtOp] | None = None

    # ------------------------------------------------------------------ RegisterBus
    def read(self, addr: int) -> int:
        op = MgmtOp.read(addr)
        if self._posted is not None:
            ops, self._posted = self._posted + [op], []
            return self._run(ops)[-1]
        return self._run([op])[0]

    def write(self, addr: int, value: int) -> None:
        if not isinstance(value, int) or not 0 <= value <= _U32:
            raise BusError(f"write of {value!r} to 0x{addr:x}: not a 32-bit value")
        op = MgmtOp.write(addr, value)
        if self._posted is None:
            self._run([op])
            return
        self._posted.append(op)
        if len(self._posted) >= MGMT_MAX_OPS:
            self.flush()

    def flush(self) -> None:
        """Send the posted writes now (no-op when none are pending)."""
        if self._posted:
            ops, self._posted = self._posted, []
            self._run(ops)

    @contextlib.contextmanager
    def posted(self) -> Iterator[MgmtClient]:
        """Within the block, writes are queued and sent batched (see the module doc). If the
        block raises, unsent writes are dropped (counted ``stats["posted_dropped"]``)."""
        if self._posted is not None:
            yield self
            return
        self._posted = []
        try:
            yield self
            self.flush()
        except BaseException:
            self.stats["posted_dropped"] += len(self._posted or ())
            raise
        finally:
            self._posted = None

    def transact(self, ops: list[MgmtOp]) -> list[int]:
        """Run ``ops`` (any number; split into frames of ``MGMT_MAX_OPS``, each atomic in the
        sense that a refusal runs none of its ops). Returns one value per op (READ: the value
        read; WRITE: the value written)."""
        out: list[int] = []
        for i in range(0, len(ops), MGMT_MAX_OPS):
            out += self._run(list(ops[i:i + MGMT_MAX_OPS]))
        return out

    def sync(self) -> int:
        """Bring the sequence number above the engine's ``LAST_SEQ`` for our entry with a
        read-only request (reads ``GLOBAL.MAGIC``); returns the magic read."""
        return self._request([MgmtOp.read(0)])[0]

    # ------------------------------------------------------------------ protocol
    def _run(self, ops: list[MgmtOp]) -> list[int]:
        if not self.synced:
            try:
                self.sync()
            except MgmtTimeout as e:
                raise MgmtTimeout(f"{e}; while synchronising before "
                                  f"{'; '.join(_op_str(o, self.regmap) for o in ops)}") from None
        return self._request(ops)

    def _request(self, ops: list[MgmtOp]) -> list[int]:
        replays = 0
        while True:
            seq = self.next_seq
            if seq > _U32:
                raise MgmtError("sequence numbers exhausted (2^32 - 1 used): the engine's "
                                "allow-list entry needs a reset before it accepts more requests")
            self.next_seq += 1
            resp = self._exchange(seq, ops)
            st = resp.status
            if st == MgmtStatus.OK:
                self.synced = True
                self.stats["ok"] += 1
                return [o.value for o in resp.ops]
            if st == MgmtStatus.REPLAY:
                self.stats["replay"] += 1
                last = resp.last_seq
                if self.synced and last == seq:
                    # Executed: our earlier copy of this request ran, its answer was lost.
                    self.stats["executed_unanswered"] += 1
                    reads = [i for i, o in enumerate(ops) if o.opcode == MgmtOpcode.READ]
                    vals = [o.value for o in ops]
                    if reads:
                        again = self._request([ops[i] for i in reads])
                        for i, v in zip(reads, again, strict=True):
                            vals[i] = v
                    return vals
                writes = any(o.opcode != MgmtOpcode.READ for o in ops)
                replays += 1
                if (self.synced and writes) or replays > 3:
                    raise MgmtError(
                        f"sequence conflict: the engine's LAST_SEQ for our entry is {last}, we "
                        f"sent {seq} ({'; '.join(_op_str(o, self.regmap) for o in ops)}): "
                        "another client is using the same allow-list entry?")
                self.next_seq = max(self.next_seq, last + 1)
                continue  # not executed (and read-only, or not yet synced): resend above LAST_SEQ
            idx = resp.err_index
            op = ops[idx] if idx < len(ops) else None
            try:
                status = MgmtStatus(st)
            except ValueError:
                status = st
            name = status.name if isinstance(status, MgmtStatus) else f"status {st}"
            self.synced = True
            self.stats["nak"] += 1
            what = _op_str(op, self.regmap) if op is not None else "?"
            raise MgmtNak(f"engine {_ip(self.engine_ip)} refused {what}: {name} (op {idx} of "
                          f"{len(ops)}, seq {seq})", status, idx, op, seq)

    def _exchange(self, seq: int, ops: list[MgmtOp]) -> MgmtMessage:
        msg = MgmtMessage(MgmtType.REQUEST, seq, list(ops))
        frame = pack_mgmt(MgmtFrame(msg, self.mac, self.engine_mac, self.ip, self.engine_ip,
                                    self.port, self.engine_port, self.vlan_tci), self.key)
        for attempt in range(self.retries + 1):
            self.link.send(frame)
            self.stats["sent"] += 1
            if attempt:
                self.stats["retransmits"] += 1
            resp = self._await(seq, ops)
            if resp is not None:
                return resp
        raise MgmtTimeout(
            f"no response from engine {_ip(self.engine_ip)}:{self.engine_port} to seq {seq} "
            f"({'; '.join(_op_str(o, self.regmap) for o in ops)}) after {self.retries + 1} "
            f"tries of {self.timeout_s} s")

    def _await(self, seq: int, ops: list[MgmtOp]) -> MgmtMessage | None:
        """The valid response to ``seq`` or None after ``timeout_s``; other frames are counted."""
        deadline = None if self.clock is None else self.clock() + self.timeout_s
        left = self.timeout_s
        while True:
            frame = self.link.recv(left)
            if frame is None:
                return None
            msg = self._accept(frame, seq, ops)
            if msg is not None:
                return msg
            if deadline is not None:
                left = deadline - self.clock()
                if left <= 0:
                    return None

    def _accept(self, frame: bytes, seq: int, ops: list[MgmtOp]) -> MgmtMessage | None:
        try:
            fr = parse_mgmt(frame, strict=False)
        except WireError:
            self.stats["ignored_malformed"] += 1
            return None
        m = fr.msg
        if (m.type != MgmtType.RESPONSE or fr.src_ip != self.engine_ip or fr.dst_ip != self.ip
                or fr.sport != self.engine_port or fr.dport != self.port):
            self.stats["ignored_foreign"] += 1
            return None
        if m.seq != seq:
            self.stats["ignored_stale"] += 1
            return None
        if len(m.ops) != len(ops) or any(a.opcode != b.opcode or a.addr != b.addr
                                         for a, b in zip(m.ops, ops, strict=True)):
            self.stats["ignored_mismatch"] += 1
            return None
        if self.key is not None:
            l3 = IPV4_OFF + (0 if fr.vlan_tci is None else DOT1Q.size)
            want = mgmt_tag(self.key, fr.src_ip, fr.dst_ip, fr.sport, fr.dport,
                            udp_payload(frame, l3))
            if want != m.tag:
                self.stats["ignored_bad_tag"] += 1
                return None
        return m


def _ip(v: int) -> str:
    return ".".join(str(v >> s & 0xFF) for s in (24, 16, 8, 0))


# ---------------------------------------------------------------------------- provisioning
@dataclass
class MgmtSource:
    """An allow-list entry: source IPv4, and optionally the source MAC and UDP port."""

    ip: int
    mac: bytes | None = None
    port: int | None = None


@dataclass
class MgmtSettings:
    """The engine side of the management path: its addresses, allow-list and optional key."""

    ip: int
    mac: bytes
    port: int = MGMT_DEFAULT_PORT
    sources: list[MgmtSource] = field(default_factory=list)
    key: bytes | None = None  # 16 bytes: sets MGMT.CTRL.auth
    enable: bool = True


def provision(bus: RegisterBus, s: MgmtSettings, regmap: RegMap | None = None) -> None:
    """Write ``s`` into the MGMT / MGMT_SRC registers through a *trusted* bus (host bus, or the
    model's bank standing in for bitstream reset values): the key registers cannot be written
    over the management path itself. Entries beyond ``s.sources`` are invalidated."""
    rm = regmap if regmap is not None else build_regmap()
    t = rm.table("MGMT_SRC")
    if len(s.sources) > t.count:
        raise ValueError(f"{len(s.sources)} management sources, the allow-list holds {t.count}")
    if s.key is not None and len(s.key) != 16:
        raise ValueError(f"key must be 16 bytes, got {len(s.key)}")
    if len(s.mac) != 6:
        raise ValueError(f"mac must be 6 bytes, got {s.mac!r}")
    w = bus.write
    w(rm.addr("MGMT.CTRL"), 0)  # quiet while reconfiguring
    w(rm.addr("MGMT.IP"), s.ip)
    m = int.from_bytes(s.mac, "big")
    w(rm.addr("MGMT.MAC_HI"), m >> 32)
    w(rm.addr("MGMT.MAC_LO"), m & _U32)
    w(rm.addr("MGMT.PORT"), s.port)
    key = s.key or bytes(16)
    for i in range(4):
        w(rm.addr(f"MGMT.KEY{i}"), int.from_bytes(key[4 * i:4 * i + 4], "little"))
    cfg = rm.reg("MGMT_SRC.CFG")
    for i in range(t.count):
        if i >= len(s.sources):
            w(t.addr(i, "CFG"), 0)
            continue
        src = s.sources[i]
        v = cfg.field("valid").put(0, 1)
        if src.mac is not None:
            if len(src.mac) != 6:
                raise ValueError(f"source {i} mac must be 6 bytes, got {src.mac!r}")
            v = cfg.field("match_mac").put(v, 1)
            sm = int.from_bytes(src.mac, "big")
            w(t.addr(i, "MAC_HI"), sm >> 32)
            w(t.addr(i, "MAC_LO"), sm & _U32)
        if src.port is not None:
            v = cfg.field("match_port").put(v, 1)
            v = cfg.field("port").put(v, src.port)
        w(t.addr(i, "IP"), src.ip)
        w(t.addr(i, "CFG"), v)
    ctrl = rm.reg("MGMT.CTRL")
    v = ctrl.field("enable").put(0, int(s.enable))
    v = ctrl.field("auth").put(v, int(s.key is not None))
    w(rm.addr("MGMT.CTRL"), v)


class ReadAheadBus:
    """A register bus over a :class:`~netreduce.sw_driver.mgmt.MgmtClient` that reads the flow
    table a whole column at a time (one batched request per 64 entries instead of one round trip
    per entry: :class:`~netreduce.sw_driver.control.EngineControl` scans every entry's CFG when it
    adds or removes a job). The cache holds only the FLOW configuration registers (all fields
    RW), which nothing but drivers write, and any write through this bus drops it; every other
    read goes straight through. Like EngineControl itself, it assumes one configuring client at a
    time."""

    def __init__(self, client: MgmtClient):
        self.client = client
        rm = client.regmap
        self._flow = rm.table("FLOW")
        # only configuration registers (every field RW): STATUS and ACKED change in the engine
        self._cached = {r.offset for r in self._flow.registers
                        if r.fields and all(f.access == Access.RW for f in r.fields)}
        self._cache: dict[int, int] = {}
        self._count: int | None = None  # the engine's flow entries (GLOBAL.FLOWS), on first use

    def read(self, addr: int) -> int:
        t = self._flow
        off = (addr - t.base) % t.stride
        if not (t.base <= addr < t.base + t.count * t.stride) or off not in self._cached:
            return self.client.read(addr)
        if self._count is None:
            # the engine's table may be smaller than the client's default register map's
            self._count = min(t.count, self.client.read(self.client.regmap.addr("GLOBAL.FLOWS")))
        if (addr - t.base) // t.stride >= self._count:
            return self.client.read(addr)  # beyond the engine's table: its answer (BAD_ADDR)
        v = self._cache.get(addr)
        if v is None:
            col = [t.base + e * t.stride + off for e in range(self._count)]
            vals = self.client.transact([MgmtOp.read(a) for a in col])
            self._cache.update(zip(col, vals, strict=True))
            v = self._cache[addr]
        return v

    def write(self, addr: int, value: int) -> None:
        self._cache.clear()
        self.client.write(addr, value)
