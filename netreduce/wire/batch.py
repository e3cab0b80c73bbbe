"""Batch packetiser and parser for RC RDMA WRITE messages (numpy; no per-byte Python loops).

:func:`packetise_write` turns one host buffer into the frames of one RC WRITE message (FIRST,
MIDDLE..., LAST[_IMM], or ONLY[_IMM]) held as a 2-D ``uint8`` array, one frame per row plus a
lengths vector. Headers are built once per packet kind by :meth:`RoceFrame.headers` and broadcast;
PSN, AckReq, IPv4 identification and IPv4 checksum are written column-wise; the ICRC is one
``zlib.crc32`` call per frame over a view of the row (its 7 masked bytes set to 0xFF meanwhile).
Every frame is byte-identical to what :meth:`RoceFrame.pack` makes from the same fields.

:func:`parse_write_batch` is the inverse: vectorised field extraction, structural checks, IPv4
checksum and ICRC per frame (a ``zlib.crc32`` pair: the masked 40-byte IPv4+UDP+BTH prefix copied
aside, then a view of the rest), WRITE sequencing, PSN continuity, PMTU and DMA-length checks, and
payload reassembly. The first bad frame raises :class:`WireError` with the same ``reason`` and
``field`` as :func:`netreduce.wire.parse` would give for it, the frame's position in ``detail`` and
in the exception's ``frame_index`` attribute.

Cost: linear in bytes; Python work is per frame (two list comprehensions), never per byte.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .errors import WireError
from .fields import BTH, ETH, IPV4, UDP
from .frame import MIN_FRAME, PSN_MOD, RoceFrame, parse
from .icrc import ICRC_MASKED_BYTES, ICRC_PREFIX
from .opcodes import OPCODES, Opcode

__all__ = ["FrameBatch", "WriteBatch", "WriteMessage", "packetise_write", "parse_write_batch",
           "PMTUS", "ACK_EVERY"]

PMTUS = (256, 512, 1024, 2048, 4096)
"""The InfiniBand path MTUs (payload bytes per FIRST/MIDDLE packet)."""

ACK_EVERY = 64
"""Default AckReq period: besides every message's last packet, every 64th packet asks for an ACK."""

_PREFIX_CRC = zlib.crc32(ICRC_PREFIX)
_L4 = IPV4.size + UDP.size  # BTH offset from the start of the IPv4 header
_MASKED_LEN = _L4 + BTH.size  # the ICRC masks all fall inside these 40 bytes
_MASKED_COLS = np.array(ICRC_MASKED_BYTES, dtype=np.intp)
_HDR_SPAN = _MASKED_LEN + 20  # IPv4 .. BTH + the longest extension headers (RETH + ImmDt)
_MAX_L3 = ETH.size + 4  # IPv4 offset of a tagged frame

_WRITE_OPS = np.zeros(256, dtype=bool)
_WRITE_OPS[[Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM,
            Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM]] = True
# Per-opcode lookup tables (index = BTH opcode): extension header bytes (-1: unknown opcode), and
# position flags of RC WRITE packets.
_EXT_LEN = np.full(256, -1, dtype=np.int64)
_HAS_PAYLOAD = np.zeros(256, dtype=bool)
_IS_FIRST = np.zeros(256, dtype=bool)
_IS_LAST = np.zeros(256, dtype=bool)
for _code, _o in OPCODES.items():
    _EXT_LEN[_code] = _o.ext_len
    _HAS_PAYLOAD[_code] = _o.has_payload
    _IS_FIRST[_code] = _o.first
    _IS_LAST[_code] = _o.last


def _be(cols: np.ndarray) -> np.ndarray:
    """Big-endian integers from the byte columns of a 2-D uint8 array (one value per row)."""
    v = np.zeros(cols.shape[0], dtype=np.uint64)
    for k in range(cols.shape[1]):
        v = (v << np.uint64(8)) | cols[:, k]
    return v


def _ipv4_checksums(ip_hdrs: np.ndarray) -> np.ndarray:
    """RFC 1071 checksums of the rows of an (n, 20) uint8 array (checksum field taken as zero)."""
    w = (ip_hdrs[:, 0:IPV4.size:2].astype(np.uint32) << 8) | ip_hdrs[:, 1:IPV4.size:2]
    s = w.sum(axis=1, dtype=np.uint32) - w[:, IPV4.checksum.offset // 2]
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return (~s & 0xFFFF).astype(np.uint16)


def _icrcs(data: np.ndarray, l3: np.ndarray, pay_end: np.ndarray, masked: np.ndarray) -> np.ndarray:
    """ICRC of every row: crc32 over 8 x 0xFF, the masked 40-byte prefix, then data up to pay_end.

    ``masked`` is the (n, 40) prefix with the ICRC masks applied; ``data`` must be C-contiguous.
    One pair of zlib.crc32 calls per frame; the bytes themselves are never touched by Python.
    """
    stride = data.shape[1]
    flat = memoryview(data.reshape(-1))
    pm = memoryview(np.ascontiguousarray(masked).reshape(-1))
    base = np.arange(data.shape[0], dtype=np.int64) * stride
    start = (base + l3 + _MASKED_LEN).tolist()
    stop = (base + pay_end).tolist()
    crc32 = zlib.crc32
    crcs = [crc32(flat[a:b], crc32(pm[k:k + _MASKED_LEN], _PREFIX_CRC))
            for k, a, b in zip(range(0, len(start) * _MASKED_LEN, _MASKED_LEN), start, stop,
                               strict=True)]
    return np.array(crcs, dtype=np.uint32)


def _icrcs_owned(data: np.ndarray, l3: int, pay_end: np.ndarray) -> np.ndarray:
    """Like :func:`_icrcs` for rows that all start their IPv4 header at ``l3``, with one crc32
    call per frame: the masked bytes are set to 0xFF in place for the computation and then
    restored, so only use it on an array nobody else can see yet (the packetiser's own output).
    """
    cols = l3 + _MASKED_COLS
    saved = data[:, cols].copy()
    data[:, cols] = 0xFF
    try:
        flat = memoryview(data.reshape(-1))
        base = np.arange(data.shape[0], dtype=np.int64) * data.shape[1]
        crc32 = zlib.crc32
        crcs = [crc32(flat[a:b], _PREFIX_CRC)
                for a, b in zip((base + l3).tolist(), (base + pay_end).tolist(), strict=True)]
    finally:
        data[:, cols] = saved
    return np.array(crcs, dtype=np.uint32)


def _put_be(data: np.ndarray, col: int, values: np.ndarray, size: int) -> None:
    """Write ``values`` big-endian into ``size`` byte columns starting at ``col`` of every row."""
    for k in range(size):
        data[:, col + k] = (values >> (8 * (size - 1 - k))) & 0xFF


# --------------------------------------------------------------------------------- packetiser
@dataclass(frozen=True, eq=False)
class FrameBatch:
    """Frames as rows of a 2-D array: ``data[i, :lengths[i]]`` is frame ``i`` (no FCS).

    Bytes of a row past its length are zero. ``len(batch)`` is the frame count; iterating (or
    :meth:`frames`) yields each frame as ``bytes``; ``batch[i]`` is frame ``i`` as ``bytes`` and
    ``batch[a:b]`` a FrameBatch view of those frames (e.g. go-back-N from a PSN:
    ``batch[batch.index_of_psn(p):]``, which resends MIDDLE/LAST frames unchanged, as RC requires).
    """

    data: np.ndarray  # (n, stride) uint8
    lengths: np.ndarray  # (n,) int64, frame bytes incl. Ethernet padding
    psn: np.ndarray  # (n,) uint32
    opcode: np.ndarray  # (n,) uint8
    ackreq: np.ndarray  # (n,) bool
    payload_offset: np.ndarray  # (n,) int64, first payload byte in the row
    payload_len: np.ndarray  # (n,) int64, payload bytes (pad excluded)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def frame(self, i: int) -> bytes:
        return self.data[i, : self.lengths[i]].tobytes()

    def frames(self) -> Iterator[bytes]:
        for row, n in zip(self.data, self.lengths.tolist(), strict=True):
            yield row[:n].tobytes()

    __iter__ = frames

    def __getitem__(self, key):
        if isinstance(key, slice):
            return FrameBatch(*(getattr(self, f)[key] for f in self.__dataclass_fields__))
        return self.frame(key)

    @classmethod
    def concat(cls, batches) -> FrameBatch:
        """One batch holding the frames of ``batches`` in order (e.g. several messages of a QP)."""
        batches = list(batches)
        if not batches:
            raise ValueError("FrameBatch.concat needs at least one batch")
        n = sum(len(b) for b in batches)
        data = np.zeros((n, max(b.data.shape[1] for b in batches)), dtype=np.uint8)
        r = 0
        for b in batches:
            data[r:r + len(b), :b.data.shape[1]] = b.data
            r += len(b)
        return cls(data, *(np.concatenate([getattr(b, f) for b in batches])
                           for f in list(cls.__dataclass_fields__)[1:]))

    @property
    def nbytes(self) -> int:
        """Total frame bytes (what a MAC would carry, FCS and preamble excluded)."""
        return int(self.lengths.sum())

    @property
    def next_psn(self) -> int:
        """The PSN after the last frame (start of the next message), modulo 2^24."""
        return (int(self.psn[-1]) + 1) % PSN_MOD

    def index_of_psn(self, psn: int) -> int:
        """Row of the frame with ``psn``; ValueError if the batch does not hold it."""
        if len(self):
            i = (int(psn) - int(self.psn[0])) % PSN_MOD
            if i < len(self) and int(self.psn[i]) == psn:
                return i
        raise ValueError(f"PSN {psn} is not in this batch")


def packetise_write(buf, template: RoceFrame, pmtu: int, start_psn: int, va: int, rkey: int,
                    imm: int | None = None, *, ack_every: int = ACK_EVERY,
                    solicited: bool = False, ip_id_step: int = 0) -> FrameBatch:
    """Packetise ``buf`` as one RC RDMA WRITE message of ``ceil(len/pmtu)`` packets (min. one).

    ``buf``: any C-contiguous buffer or numpy array; its memory bytes are the payload (host order,
    never byte-swapped). One packet: WRITE ONLY (``imm`` None) or ONLY_IMM. More: FIRST, MIDDLE...,
    LAST or LAST_IMM; FIRST and MIDDLE carry exactly ``pmtu`` bytes. RETH (``va``, ``rkey``, DMA
    length = ``len(buf)``) goes on FIRST/ONLY, ImmDt on the last packet. PSNs run from
    ``start_psn`` with 24-bit wrap. AckReq is set on the last packet and on every ``ack_every``-th
    packet counted from the message start (0: last only; the count restarts with each message,
    as every message's last packet carries AckReq anyway). SE is set on the last packet iff
    ``solicited``. The IPv4 identification of packet i is ``template.ident + i * ip_id_step``
    (mod 2^16). Every other field (MACs, VLAN, addresses, TOS, TTL, UDP source port, P_Key,
    DestQP, M, FECN/BECN) comes from ``template``; its opcode, PSN, payload and extension-header
    fields are ignored.

    Raises ValueError for a PMTU that is not an IBA one or a field that does not fit its width.
    """
    if pmtu not in PMTUS:
        raise ValueError(f"pmtu = {pmtu}, expected one of {PMTUS}")
    if isinstance(buf, np.ndarray):
        pay = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    else:
        pay = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    total = int(pay.shape[0])
    for name, v, bits in (("start_psn", start_psn, 24), ("va", va, 64), ("rkey", rkey, 32),
                          ("imm", 0 if imm is None else imm, 32), ("len(buf)", total, 32),
                          ("ip_id_step", ip_id_step, 16)):
        if not 0 <= v < (1 << bits):
            raise ValueError(f"{name} = {v} does not fit in {bits} bits")
    if ack_every < 0:
        raise ValueError(f"ack_every = {ack_every}, expected >= 0")

    n = max(1, -(-total // pmtu))
    last_len = total - (n - 1) * pmtu
    # Packet kinds as (first row, end row, opcode, payload bytes per row).
    if n == 1:
        kinds = [(0, 1, Opcode.WRITE_ONLY if imm is None else Opcode.WRITE_ONLY_IMM, total)]
    else:
        kinds = [(0, 1, Opcode.WRITE_FIRST, pmtu)]
        if n > 2:
            kinds.append((1, n - 1, Opcode.WRITE_MIDDLE, pmtu))
        kinds.append((n - 1, n, Opcode.WRITE_LAST if imm is None else Opcode.WRITE_LAST_IMM,
                      last_len))

    l2 = template.l2_len
    hdrs = []
    for _a, b, op, plen in kinds:
        f = template.copy(opcode=int(op), psn=0, ackreq=0, payload=bytes(plen), va=va, rkey=rkey,
                          dmalen=total, imm=imm or 0, se=int(solicited and b == n))
        hdrs.append(bytes(f.headers()))
    frame_len = [max(len(h) + plen + ((-plen) & 3) + 4, MIN_FRAME)
                 for h, (_, _, _, plen) in zip(hdrs, kinds, strict=True)]
    data = np.empty((n, max(frame_len)), dtype=np.uint8)
    lengths = np.empty(n, dtype=np.int64)
    opcode = np.empty(n, dtype=np.uint8)
    pay_off = np.empty(n, dtype=np.int64)
    pay_len = np.empty(n, dtype=np.int64)
    src = 0
    for h, (a, b, op, plen), flen in zip(hdrs, kinds, frame_len, strict=True):
        hl = len(h)
        data[a:b, :hl] = np.frombuffer(h, dtype=np.uint8)
        data[a:b, hl:hl + plen] = pay[src:src + (b - a) * plen].reshape(b - a, plen)
        data[a:b, hl + plen:] = 0  # pad, ICRC slot (filled below), Ethernet padding, row tail
        src += (b - a) * plen
        lengths[a:b], opcode[a:b], pay_off[a:b], pay_len[a:b] = flen, op, hl, plen

    idx = np.arange(n, dtype=np.int64)
    psn = ((start_psn + idx) % PSN_MOD).astype(np.uint32)
    ackreq = (idx == n - 1) | (((idx + 1) % ack_every == 0) if ack_every else False)
    bth = l2 + _L4
    _put_be(data, bth + BTH.psn.offset, psn, BTH.psn.size)
    data[:, bth + BTH.ackreq.offset] = ackreq.astype(np.uint8) << BTH.ackreq.shift  # resv7 is 0
    if ip_id_step:
        ident = (template.ident + idx * ip_id_step) & 0xFFFF
        _put_be(data, l2 + IPV4.identification.offset, ident, IPV4.identification.size)
        csum = _ipv4_checksums(data[:, l2:l2 + IPV4.size])
        _put_be(data, l2 + IPV4.checksum.offset, csum, IPV4.checksum.size)

    icrc_at = pay_off + pay_len + ((-pay_len) & 3)
    crc = _icrcs_owned(data, l2, icrc_at)
    for k in range(4):  # least-significant byte first
        data[idx, icrc_at + k] = (crc >> (8 * k)) & 0xFF
    return FrameBatch(data, lengths, psn, opcode, ackreq, pay_off, pay_len)


# --------------------------------------------------------------------------------- parser
@dataclass(frozen=True)
class WriteMessage:
    """One RC WRITE message found in a batch: frames ``first .. first+count-1``."""

    first: int  # row of its FIRST/ONLY frame
    count: int  # frames
    va: int
    rkey: int
    dmalen: int
    imm: int | None  # ImmDt of the last frame, None without immediate
    offset: int  # where its bytes start in WriteBatch.payload


@dataclass(frozen=True, eq=False)
class WriteBatch:
    """Result of :func:`parse_write_batch`: per-frame fields as arrays plus the payload bytes."""

    psn: np.ndarray  # (n,) uint32
    opcode: np.ndarray  # (n,) uint8
    ackreq: np.ndarray  # (n,) bool
    se: np.ndarray  # (n,) bool
    dqpn: np.ndarray  # (n,) uint32
    ecn: np.ndarray  # (n,) uint8 (ECN_CE = 3 needs a CNP back)
    payload_len: np.ndarray  # (n,) int64
    payload: np.ndarray  # all payload bytes, in frame order, uint8
    messages: tuple[WriteMessage, ...]

    def __len__(self) -> int:
        return int(self.psn.shape[0])

    def payload_as(self, dtype) -> np.ndarray:
        """The payload viewed as ``dtype`` (e.g. ``np.int32``; host byte order, no copy)."""
        return self.payload.view(dtype)


def _as_rows(frames) -> tuple[np.ndarray, np.ndarray]:
    """(data, lengths) with data C-contiguous and wide enough for the header gather."""
    if isinstance(frames, FrameBatch):
        data, lengths = frames.data, frames.lengths
    elif isinstance(frames, tuple) and len(frames) == 2 and isinstance(frames[0], np.ndarray):
        data, lengths = frames
    else:
        frames = [memoryview(f).cast("B") for f in frames]
        lengths = np.array([len(f) for f in frames], dtype=np.int64)
        data = np.zeros((len(frames), int(lengths.max(initial=0))), dtype=np.uint8)
        for row, f in zip(data, frames, strict=True):
            row[:len(f)] = np.frombuffer(f, dtype=np.uint8)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    lengths = np.asarray(lengths, dtype=np.int64)
    if data.ndim != 2 or lengths.shape != (data.shape[0],):
        raise ValueError(f"frames: a 2-D array and one length per row expected, got "
                         f"{data.shape} and {lengths.shape}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > data.shape[1]):
        raise ValueError(f"frame lengths outside 0..{data.shape[1]} (the row width)")
    if data.shape[1] < _MAX_L3 + _HDR_SPAN:  # short frames: widen so the gather stays in bounds
        data = np.pad(data, ((0, 0), (0, _MAX_L3 + _HDR_SPAN - data.shape[1])))
    return data, lengths


def _fail(data, lengths, i: int, err: WireError | None = None) -> WireError:
    """The WireError for frame ``i``: parse()'s own error for it, tagged with the frame index."""
    if err is None:
        try:
            parse(data[i, :lengths[i]].tobytes())
        except WireError as e:
            err = e
        else:  # the vectorised checks and parse() disagree: a bug here, never silently accepted
            err = WireError("batch", "frame", i, detail="rejected by the batch checks only")
    detail = err.detail
    new = WireError(err.reason, err.field, err.value, err.expected,
                    detail=f"frame {i}" + (f": {detail}" if detail else ""))
    new.frame_index = i
    return new


def parse_write_batch(frames, *, pmtu: int | None = None, expect_psn: int | None = None,
                      check: bool = True) -> WriteBatch:
    """Parse frames holding whole RC WRITE messages, in PSN order, and reassemble the payload.

    ``frames``: a :class:`FrameBatch`, a ``(data, lengths)`` pair of arrays, or an iterable of
    bytes-like frames. Checks, in this order, each raising :class:`WireError` for the first frame
    that fails (``err.frame_index``): everything :func:`~netreduce.wire.parse` checks, with
    ``check`` also the IPv4 checksum and the ICRC; then that every opcode is an RC WRITE
    (``reason "opcode"``), that FIRST/MIDDLE/LAST follow each other and the batch starts and ends
    on a message boundary (``"sequence"``), that PSNs are consecutive mod 2^24 and start at
    ``expect_psn`` if given (``"psn"``), that FIRST/MIDDLE payloads equal ``pmtu`` (default: the
    first such payload seen), LAST carries 1..pmtu and ONLY at most pmtu (``"payload_length"``),
    and that each message's bytes add up to its RETH DMA length (``"dmalen"``).
    """
    data, L = _as_rows(frames)
    n = int(L.shape[0])
    if n == 0:
        raise WireError("sequence", "frames", 0, detail="an empty batch holds no WRITE message")
    rows = np.arange(n)
    d = data

    # --- structural checks (vectorised mirror of parse(); parse() names the first failure)
    bad = L < ETH.size
    vlan = ((d[:, 12] == 0x81) & (d[:, 13] == 0x00))
    l3 = np.where(vlan, _MAX_L3, ETH.size).astype(np.int64)
    et = (d[rows, l3 - 2].astype(np.int64) << 8) | d[rows, l3 - 1]
    bad |= et != 0x0800
    bad |= L < l3 + _MASKED_LEN
    H = d[rows[:, None], l3[:, None] + np.arange(_HDR_SPAN)]  # IPv4 .. extension headers
    bad |= H[:, 0] != 0x45
    ff = (H[:, 6].astype(np.int64) << 8) | H[:, 7]
    bad |= (ff & 0x3FFF) != 0  # MF flag or a fragment offset
    bad |= H[:, 9] != 17
    bad |= ((H[:, 22].astype(np.int64) << 8) | H[:, 23]) != 4791
    total = (H[:, 2].astype(np.int64) << 8) | H[:, 3]
    end = l3 + total
    bad |= (total < _MASKED_LEN + 4) | (end > L) | ((end < L) & (L > MIN_FRAME))
    bad |= ((H[:, 24].astype(np.int64) << 8) | H[:, 25]) != total - IPV4.size
    if check:
        bad |= _ipv4_checksums(H[:, :IPV4.size]) != ((H[:, 10].astype(np.int64) << 8) | H[:, 11])
    opcode = H[:, _L4]
    bad |= (H[:, _L4 + 1] & 0x0F) != 0  # TVer
    ext = _EXT_LEN[opcode]
    bad |= ext < 0
    pay_off = l3 + _MASKED_LEN + ext
    pay_end = end - 4
    padded = pay_end - pay_off
    pad = (H[:, _L4 + 1] >> 4).astype(np.int64) & 3
    has_pay = _HAS_PAYLOAD[opcode]
    bad |= padded < 0
    bad |= np.where(has_pay, pad > padded, (padded != 0) | (pad != 0))
    if bad.any():
        raise _fail(d, L, int(np.argmax(bad)))

    if check:
        masked = H[:, :_MASKED_LEN].copy()
        masked[:, _MASKED_COLS] = 0xFF
        crc = _icrcs(d, l3, pay_end, masked)
        wire = np.zeros(n, dtype=np.uint32)
        for k in range(4):
            wire |= d[rows, pay_end + k].astype(np.uint32) << (8 * k)
        if (crc != wire).any():
            raise _fail(d, L, int(np.argmax(crc != wire)))

    # --- RC WRITE semantics
    def fail(mask, reason, field, values, expected=None, why=""):
        i = int(np.argmax(mask))
        exp = None if expected is None else int(np.broadcast_to(expected, (n,))[i])
        raise _fail(d, L, i, WireError(reason, field, int(values[i]), exp, detail=why))

    not_write = ~_WRITE_OPS[opcode]
    if not_write.any():
        fail(not_write, "opcode", "BTH.opcode", opcode, why="not an RC WRITE opcode")
    first, last = _IS_FIRST[opcode], _IS_LAST[opcode]
    prev_last = np.concatenate(([True], last[:-1]))  # a message boundary before this frame?
    seq_bad = first != prev_last
    seq_bad[-1] |= not last[-1]
    if seq_bad.any():
        i = int(np.argmax(seq_bad))
        why = ("FIRST/ONLY before the previous message's LAST" if first[i] and not prev_last[i]
               else "MIDDLE/LAST without a FIRST" if prev_last[i] and not first[i]
               else "the batch ends inside a message")
        fail(seq_bad, "sequence", "BTH.opcode", opcode, why=why)
    psn = ((H[:, _L4 + 9].astype(np.uint32) << 16) | (H[:, _L4 + 10].astype(np.uint32) << 8)
           | H[:, _L4 + 11])
    want = np.empty(n, dtype=np.int64)
    want[0] = psn[0] if expect_psn is None else expect_psn
    want[1:] = (psn[:-1].astype(np.int64) + 1) % PSN_MOD
    if (psn != want).any():
        fail(psn != want, "psn", "BTH.psn", psn, want, "PSNs must be consecutive")
    plen = padded - pad
    full = ~last  # FIRST and MIDDLE carry exactly one PMTU
    if pmtu is None:
        pmtu = int(plen[np.argmax(full)]) if full.any() else int(plen.max())
    bad_len = np.where(full, plen != pmtu, plen > pmtu) | (last & ~first & (plen == 0))
    if bad_len.any():
        i = int(np.argmax(bad_len))
        raise _fail(d, L, i, WireError(
            "payload_length", "payload", int(plen[i]), pmtu if full[i] else None,
            detail=f"PMTU {pmtu}: FIRST/MIDDLE carry exactly PMTU, LAST 1..PMTU, ONLY <= PMTU"))

    starts = np.flatnonzero(first)
    ends = np.flatnonzero(last) + 1
    va = _be(H[starts, _MASKED_LEN:_MASKED_LEN + 8])
    rkey = _be(H[starts, _MASKED_LEN + 8:_MASKED_LEN + 12])
    dmalen = _be(H[starts, _MASKED_LEN + 12:_MASKED_LEN + 16]).astype(np.int64)
    sums = np.add.reduceat(plen, starts)
    if (sums != dmalen).any():
        m = int(np.argmax(sums != dmalen))
        i = int(starts[m])
        raise _fail(d, L, i, WireError("dmalen", "RETH.dmalen", int(dmalen[m]), int(sums[m]),
                                       detail="the message's payload bytes add up differently"))
    imm_at = np.where(first, _MASKED_LEN + 16, _MASKED_LEN)  # ONLY_IMM: after RETH
    imm_all = _be(H[rows[:, None], imm_at[:, None] + np.arange(4)])
    has_imm = (ext == 4) | (ext == 20)

    # --- payload reassembly: one block copy per run of rows with equal offset and length
    cum = np.concatenate(([0], np.cumsum(plen)))
    payload = np.empty(int(cum[-1]), dtype=np.uint8)
    brk = np.flatnonzero((pay_off[1:] != pay_off[:-1]) | (plen[1:] != plen[:-1])) + 1
    for a, b in zip([0, *brk.tolist()], [*brk.tolist(), n], strict=True):
        o, m = int(pay_off[a]), int(plen[a])
        if m:
            payload[cum[a]:cum[b]].reshape(b - a, m)[...] = d[a:b, o:o + m]

    msgs = tuple(
        WriteMessage(first=int(s), count=int(e - s), va=int(v), rkey=int(r), dmalen=int(dl),
                     imm=int(imm_all[e - 1]) if has_imm[e - 1] else None, offset=int(cum[s]))
        for s, e, v, r, dl in zip(starts, ends, va, rkey, dmalen, strict=True))
    bth1 = H[:, _L4 + 1]
    return WriteBatch(
        psn=psn, opcode=opcode.copy(), ackreq=(H[:, _L4 + 8] & 0x80) != 0,
        se=(bth1 & 0x80) != 0, dqpn=_be(H[:, _L4 + 5:_L4 + 8]).astype(np.uint32),
        ecn=(H[:, 1] & 3).astype(np.uint8), payload_len=plen, payload=payload, messages=msgs)
