"""Flow roles of the reference model: leaf and spine jobs (decision D17, docs/spine-leaf.md).

D17. ``FLOW.CFG.role`` gives each flow a role: MEMBER (everything D1-D16 say), UP, DOWN, RACK.
    A job with an UP or DOWN flow is a *leaf*: exactly one UP and one DOWN, no RACK, else
    ``JobError.ROLES`` at enable. Its contributors are the MEMBER flows and UP (N - 1 of them);
    a slot holding all of them is sent up in index order (the partial pointer,
    ``JOB.PARTIAL_PTR``) as UP's stored frame with the partial as payload (D5's rewrite) and
    MARK_PARTIAL (``partials_up``). A DOWN frame of index k marked MARK_TOTAL whose partial went
    up, of the slot's opcode and length, is the total: it is forwarded to its receiver without
    the mark (``totals``; a later copy re-emits the stored total, ``reemits``), and the MEMBER
    results are released in index order from the total (``released``, ``results_sent``). A
    DOWN frame otherwise in the window is dropped, ``drop_role``. A resent UP frame whose
    partial went up re-sends the partial (``reemits``); a MEMBER's gets the total once released.
    UP's ACKs are accepted up to the partial pointer, every other flow's up to rel_j. A job with
    RACK flows is a *spine*, otherwise an ordinary job; it rewrites a RACK frame's mark to
    MARK_TOTAL before taking it, so its results and re-emits carry it. On DOWN and RACK flows a
    payload-free WRITE MIDDLE is another engine's duplicate probe (D15) and is forwarded
    (``behind_window``; on DOWN with the mark cleared). Stage marks (:mod:`.marks`): a data frame
    of a leaf or spine job whose mark is not its role's (none on MEMBER/UP, MARK_PARTIAL on
    RACK, MARK_TOTAL on DOWN) is a frame of another stage, at the wrong engine or on the wrong
    flow: dropped, ``drop_role`` (no CNP even if CE-marked: its flow's sender did not send it
    on this path). ``JOB.CTRL.fast_retx`` is ignored on leaf and spine jobs.

A job on one engine has only MEMBER flows and never reaches this module. :mod:`.engine` calls in
here at enable (:func:`roles_ok`, :func:`leaf_state`), for every data frame of a leaf or spine
job (:func:`data`), when a leaf's slot completes (:func:`send_up`) and for a leaf contribution
already in its slot (:func:`again`); it hands over its frame builders with :func:`bind` (so this
module does not import it back).
"""

from __future__ import annotations

import numpy as np

from netreduce.regmap import Role
from netreduce.wire import ECN_CE, Opcode
from netreduce.wire.view import ecn

from .marks import MARK_AT, MARK_PARTIAL, MARK_TOTAL, MARKS
from .marks import remark as _remark

PSN_MASK = (1 << 24) - 1
_HALF = 1 << 23

__all__ = ["LeafState", "bind", "roles_ok", "leaf_state", "partial_ptr", "data", "send_up",
           "again"]

# the engine's Emit record and frame builders (D15's probe, D5's result), set by bind()
Emit = _probe = _result = None


def bind(emit, probe, result) -> None:
    """Called once by :mod:`.engine` with its ``Emit``, ``_probe`` and ``_result``."""
    global Emit, _probe, _result
    Emit, _probe, _result = emit, probe, result


class LeafState:
    """A leaf job's role bookkeeping: its UP and DOWN flows, the MEMBER ranks, the number of
    contributors (MEMBER + UP) and the partial pointer (next index to send up)."""

    __slots__ = ("up", "down", "members", "nloc", "upptr")

    def __init__(self, up, down, members):
        self.up, self.down, self.members = up, down, members
        self.nloc = len(members) + 1
        self.upptr = 0


def roles_ok(roles: list[int]) -> bool:
    """A job's roles fit one engine (all MEMBER), a spine (MEMBER/RACK) or a leaf (one UP, one
    DOWN, MEMBER otherwise)."""
    up, down, rack = (roles.count(r) for r in (Role.UP, Role.DOWN, Role.RACK))
    if up or down:
        return up == 1 and down == 1 and not rack
    return True


def leaf_state(flows) -> LeafState | None:
    ups = [f for f in flows if f.role == Role.UP]
    if not ups:
        return None
    down = next(f for f in flows if f.role == Role.DOWN)
    return LeafState(ups[0], down, [f.rank for f in flows if f.role == Role.MEMBER])


def partial_ptr(job) -> int:
    """``JOB.PARTIAL_PTR``: a leaf job's partial pointer, else 0."""
    return job.leaf.upptr if job is not None and job.leaf is not None else 0


def _is_probe(p, plen: int) -> bool:
    return plen == 0 and p.opcode == Opcode.WRITE_MIDDLE


def data(eng, job, fl, port: int, buf: bytes, l2: int, p, plen: int, time: int):
    """A data frame of a leaf or spine job that passed the per-packet checks. Returns the emits
    (handled here), or the frame for the engine to treat as an ordinary contribution: a
    worker's frame on MEMBER/UP, a leaf's partial on RACK with its mark turned into the
    total's (the spine's results and re-emits then carry MARK_TOTAL)."""
    mark = buf[l2 + MARK_AT] & MARKS
    if fl.role in (Role.DOWN, Role.RACK) and _is_probe(p, plen):
        # another engine's duplicate probe (D15): the receiver decides; marks stay on the ISLs
        eng._count(job, "behind_window")
        return [Emit(port, _remark(buf, l2, 0) if fl.role == Role.DOWN else buf, time)]
    want = {Role.RACK: MARK_PARTIAL, Role.DOWN: MARK_TOTAL}.get(fl.role, 0)
    if mark != want:  # a frame of another stage: at the wrong engine or on the wrong flow
        eng._count(job, "drop_role")
        return []
    if fl.role == Role.RACK:
        return _remark(buf, l2, MARK_TOTAL)
    if fl.role != Role.DOWN:
        return buf
    buf = _remark(buf, l2, 0)  # what leaves towards the receiver carries no mark
    k = (p.psn - fl.start) & PSN_MASK
    d = (k - job.free) & PSN_MASK
    if d >= _HALF:
        eng._count(job, "behind_window")
        return [Emit(port, _probe(buf, l2), time)]
    out: list[Emit] = []
    if d >= job.w:
        eng._count(job, "drop_ahead")
    else:
        slot = job.slots.get(job.base + (k & job.wmask))
        if (slot is None or slot.index != k or not slot.sent_up or p.opcode != slot.opcode
                or plen != slot.length):
            eng._count(job, "drop_role")  # not a total this leaf can have caused
        elif slot.total is None:
            slot.total = np.frombuffer(buf, dtype="<i4", count=plen >> 2, offset=p.x).copy()
            eng._count(job, "totals")
            out.append(Emit(port, _result(buf[:p.x], l2, slot.total.tobytes()), time))
            _release_members(eng, job, time, out)
        else:
            eng._count(job, "reemits")
            out.append(Emit(port, _result(buf[:p.x], l2, slot.total.tobytes()), time))
    if ecn(buf, l2) == ECN_CE:
        eng._cnp(job, fl, buf, l2, port, time, out)
    return out


def send_up(eng, job, time: int, out: list[Emit]) -> None:
    """Send every complete slot from the partial pointer on up, in index order: UP's stored
    frame of the index with the partial as payload (D5's rewrite)."""
    lf = job.leaf
    slots, base, wmask, up = job.slots, job.base, job.wmask, lf.up.rank
    while True:
        slot = slots.get(base + (lf.upptr & wmask))
        if slot is None or slot.index != lf.upptr or slot.count != lf.nloc or slot.sent_up:
            return
        l2 = slot.l2[up]
        out.append(Emit(slot.ports[up], _result(_remark(slot.hdrs[up], l2, MARK_PARTIAL), l2,
                                                slot.acc.tobytes()), time))
        slot.sent_up = True
        lf.upptr = (lf.upptr + 1) & PSN_MASK
        eng._count(job, "partials_up")


def _release_members(eng, job, time: int, out: list[Emit]) -> None:
    """Release the MEMBER results of every slot from rel_j on that holds its total."""
    members = job.leaf.members
    slots, base, wmask = job.slots, job.base, job.wmask
    while True:
        slot = slots.get(base + (job.rel & wmask))
        if slot is None or slot.index != job.rel or slot.total is None or slot.released:
            return
        payload = slot.total.tobytes()
        for r in members:
            out.append(Emit(slot.ports[r], _result(slot.hdrs[r], slot.l2[r], payload), time))
        slot.released = True
        job.rel = (job.rel + 1) & PSN_MASK
        eng._count(job, "released")
        eng._count(job, "results_sent", len(members))


def again(eng, job, fl, slot, port: int, buf: bytes, l2: int, p, time: int,
          out: list[Emit]) -> None:
    """A leaf contributor's frame whose contribution is already in the slot: the UP flow's
    resent packet re-sends the partial once it went up (the spine may have lost it); a MEMBER's
    gets its result re-emitted once released (D4); otherwise a duplicate."""
    if fl.role == Role.UP and slot.sent_up:
        eng._count(job, "reemits")
        out.append(Emit(port, _result(_remark(buf[:p.x], l2, MARK_PARTIAL), l2,
                                      slot.acc.tobytes()), time))
    elif fl.role == Role.MEMBER and slot.released:
        eng._count(job, "reemits")
        out.append(Emit(port, _result(buf[:p.x], l2, slot.total.tobytes()), time))
    else:
        eng._count(job, "duplicates")
