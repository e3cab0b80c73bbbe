"""AggControl's flow roles (model D17, spine-leaf) against the reference model, frame by frame.

A leaf engine's job (MEMBER ranks, one UP, one DOWN) and a spine engine's job (RACK ranks), each
run on its own model instance and on the gateware (:class:`AggControl` with ``roles=True``) in
the Amaranth simulator, with the harness of ``test_agg_control``. Compared per frame: the
disposition, the action, the stage mark the frame's outputs carry (forwarded, stored, re-sent),
whether a re-emit or total uses the slot's total buffer, the CNP; per job the partial commands
(UP rank, MARK_PARTIAL) and the release commands (ranks, total buffer) in order; every counter;
the job status registers (``JOB.PARTIAL_PTR`` included) and the flow status.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from netreduce.hw.agg.control import Action, AggControl
from netreduce.sim.model.kit import RingJob
from netreduce.sim.model.marks import remark

from netreduce.regmap import DISPOSITIONS, JOB_COUNTERS, Role
from netreduce.wire import ECN_CE, Opcode, parse
from netreduce.wire.marks import MARK_PARTIAL, MARK_TOTAL

from .test_agg_control import Gateware, Scenario, header_of

PSN_MASK = (1 << 24) - 1
L2 = 14
N = 16  # int32 lanes per packet


class RolesAggControl(AggControl):
    def __init__(self, regmap):
        super().__init__(regmap, roles=True)


class RoleScenario(Scenario):
    """A scenario whose expectations also record the marks, total-buffer use and the commands
    (partials and releases) the model's frames imply."""

    def add_roles(self, job: RingJob, roles: list[Role]) -> RingJob:
        cfg = job.config()
        for f, role in zip(cfg.flows, roles, strict=True):
            f.role = role
        self.ctl.add_job(cfg)
        return job

    def _flow_of(self, dqpn: int, psn: int):
        for f in self.eng._fwd.values():
            if int.from_bytes(f.fwd[4:7], "big") == dqpn:
                return f, (psn - f.start) & PSN_MASK
        raise AssertionError(f"no flow with DestQP {dqpn:#x}")

    def frame(self, buf: bytes, port: int = 0, time: int = 0):
        eng = self.eng
        before = eng.counters()
        h = header_of(buf, port, time)
        out = eng.receive(port, buf, time)
        after = eng.counters()
        disp = [d for d in DISPOSITIONS if after[d] != before[d]]
        assert len(disp) == 1, disp
        cnp = after["cnp_sent"] != before["cnp_sent"]
        frames = [e.frame for e in out[:len(out) - int(cnp)]]
        e = {"disp": disp[0], "cnp": cnp, "mark": None, "total": None, "cmds": []}
        lead = disp[0].startswith("fwd_") or disp[0] in ("behind_window", "reemits", "totals")
        if lead:
            f0 = frames.pop(0)
            e["mark"] = f0[L2 + 32] & 3
            if disp[0] in ("reemits", "totals"):
                fl, k = self._flow_of(h["dqpn"], h["psn"])
                e["total"] = self._from_total(fl.job, k, f0)
            if disp[0] == "behind_window":
                probe_fwd = f0 == remark(buf, L2, f0[L2 + 32] & 3)
                e["action"] = Action.FORWARD if probe_fwd else Action.PROBE
        elif disp[0] == "contributions":
            fl, _ = self._flow_of(h["dqpn"], h["psn"])
            e["mark"] = MARK_TOTAL if fl.role == Role.RACK else 0  # the header stored
        # the frames released by this one: group them by index, in order
        for f in frames:
            p = parse(f)
            fl, k = self._flow_of_result(p.dqpn, p.psn)
            mark = f[L2 + 32] & 3
            mark = mark if mark == MARK_PARTIAL else 0  # a spine's results: marked when stored
            if not e["cmds"] or tuple(e["cmds"][-1][:2]) != (fl.job, k) or e["cmds"][-1][3] != mark:
                e["cmds"].append([fl.job, k, 0, mark, self._from_total(fl.job, k, f)])
            e["cmds"][-1][2] |= 1 << fl.rank
        e["cmds"] = [tuple(c) for c in e["cmds"]]
        self.ops.append(("frame", h, e))
        return e

    def _flow_of_result(self, dqpn: int, psn: int):
        return self._flow_of(dqpn, psn)

    def _from_total(self, j: int, k: int, frame: bytes) -> bool:
        """The frame's payload is the slot's total (a leaf's total buffer), not its sum."""
        job = self.eng._jobs[j]
        slot = job.slots[job.base + (k & job.wmask)]
        pay = parse(frame).payload
        if slot.total is None:
            return False
        if slot.total.tobytes() == slot.acc.tobytes():
            raise AssertionError("scenario: a total equal to the partial tells nothing")
        return pay == slot.total.tobytes()


def check_roles(sc: RoleScenario, **run_kw) -> Gateware:
    gw = Gateware(sc, RolesAggControl).run(**run_kw)
    frames = [op for op in sc.ops if op[0] == "frame"]
    names = list(DISPOSITIONS)
    want: dict[int, list] = {}
    for i, ((_, h, e), d) in enumerate(zip(frames, gw.decisions, strict=True)):
        ctx = f"frame {i}: header {h}"
        got = names[d["disp"]]
        assert got == e["disp"], f"{ctx}: disposition {got}, model {e['disp']}"
        act = e.get("action") or {"contributions": Action.CONTRIBUTE, "reemits": Action.REEMIT,
                                  "totals": Action.TOTAL, "behind_window": Action.PROBE}.get(
            e["disp"], Action.FORWARD if e["disp"].startswith("fwd_") else Action.DROP)
        assert Action(d["action"]) == act, f"{ctx}: action {Action(d['action'])}, model {act}"
        assert d["cnp"] == e["cnp"], ctx
        if e["mark"] is not None:
            mark = d["mark"] if d["remark"] else h["mark"]
            assert mark == e["mark"], f"{ctx}: mark {mark}, model {e['mark']}"
        if e["total"] is not None:
            assert d["total"] == e["total"], f"{ctx}: total buffer {d['total']}"
        assert d["release"] == bool(e["cmds"]), ctx
        for c in e["cmds"]:
            want.setdefault(c[0], []).append(c[1:])
    got: dict[int, list] = {}
    for r in gw.releases:
        got.setdefault(r["job"], []).append((r["index"], r["mask"], r["mark"], bool(r["total"])))
    for j in set(want) | set(got):
        # partials and releases are two in-order streams; their interleaving is not specified
        for up in (True, False):
            w = [c for c in want.get(j, []) if (c[2] == MARK_PARTIAL) == up]
            g = [c for c in got.get(j, []) if (c[2] == MARK_PARTIAL) == up]
            assert g == w, f"job {j} {'partials' if up else 'releases'}"
    for j in range(sc.params["jobs"]):
        model = sc.eng.counters(j)
        for c in JOB_COUNTERS:
            if c.name != "saturations":
                assert gw.cnt[j][c.name] == model[c.name], f"job {j} counter {c.name}"
    model = sc.eng.counters()
    for k, v in gw.gcnt.items():
        assert v == model[k], f"global counter {k}"
    rm = sc.rm
    for j in range(sc.params["jobs"]):
        st = gw.status["job"][j]
        v = sc.eng.bus.read(rm.addr("JOB.STATUS", j))
        assert st["status"] & 1 == rm.field("JOB.STATUS.enabled").get(v), f"job {j} enabled"
        assert st["status"] >> 1 == rm.field("JOB.STATUS.error").get(v), f"job {j} error"
        for reg in ("free_ptr", "release_ptr", "slots_busy", "partial_ptr"):
            assert st[reg] == sc.eng.bus.read(rm.addr(f"JOB.{reg.upper()}", j)), \
                f"job {j} {reg}: {st[reg]}"
    for e in range(sc.params["flows"]):
        st = gw.status["flow"][e]
        assert st["acked"] == sc.eng.bus.read(rm.addr("FLOW.ACKED", e)), f"flow {e} acked"
    return gw


def vec(rng) -> np.ndarray:
    return np.array([rng.randrange(-1000, 1000) for _ in range(N)], np.int32)


LEAF = [Role.MEMBER, Role.MEMBER, Role.UP, Role.DOWN]  # leaf: ranks 0,1 + UP 2, DOWN 3


def leaf_frames(job: RingJob, rng, k: int, kind: str, ce: bool = False) -> bytes:
    """A frame for a leaf of roles LEAF at index ``k``: a contribution of rank 0-2, a total
    (DOWN), a raw worker frame on DOWN, a partial on DOWN (wrong stage), a probe on DOWN, a
    total of the wrong length, or an ACK of a random flow."""
    kw = {"ecn": ECN_CE} if ce else {}
    if kind == "contrib":
        return job.data_bytes(rng.randrange(3), k, vec(rng), **kw)
    if kind == "total":
        return remark(job.data_bytes(3, k, vec(rng), **kw), L2, MARK_TOTAL)
    if kind == "raw_down":
        return job.data_bytes(3, k, vec(rng), **kw)
    if kind == "partial_down":
        return remark(job.data_bytes(3, k, vec(rng), **kw), L2, MARK_PARTIAL)
    if kind == "short_total":
        return remark(job.data_bytes(3, k, vec(rng)[:8], **kw), L2, MARK_TOTAL)
    if kind == "probe":
        return remark(job.data_bytes(3, k, b"", opcode=Opcode.WRITE_MIDDLE), L2,
                      rng.choice([0, MARK_TOTAL]))
    if kind == "marked_member":  # a total looped back onto a contributor flow
        return remark(job.data_bytes(rng.randrange(3), k, vec(rng), **kw), L2, MARK_TOTAL)
    if kind == "ack":
        return job.ack(rng.randrange(4), k, nak=rng.random() < 0.2)
    raise AssertionError(kind)


def test_leaf_in_order():
    """Contributions go up as partials in index order, totals release the MEMBER results, UP's
    ACKs count against the partial pointer, the others' against the release pointer."""
    sc = RoleScenario()
    rng = random.Random(3)
    job = sc.add_roles(RingJob(job=0, world=4, window=4), LEAF)
    for k in range(6):
        for r in (1, 0, 2):
            sc.frame(job.data_bytes(r, k, vec(rng)))
        sc.frame(job.ack(2, k))  # UP's receiver (in the next rack) acknowledges the partial
        sc.frame(remark(job.data_bytes(3, k, vec(rng)), L2, MARK_TOTAL))
        for r in (0, 1, 3):
            sc.frame(job.ack(r, k))
    gw = check_roles(sc)
    assert sc.eng.counters(0)["partials_up"] == 6 and sc.eng.counters(0)["totals"] == 6
    assert sum(r["mark"] == MARK_PARTIAL for r in gw.releases) == 6


def test_leaf_out_of_order_resends_and_wrong_stages():
    """Partials and totals completing out of order (the two chains), UP's resend re-sending the
    partial, a MEMBER's re-emit from the total buffer, a second copy of a total, probes passing
    DOWN, frames of the wrong stage dropped (with and without CE)."""
    sc = RoleScenario()
    rng = random.Random(5)
    job = sc.add_roles(RingJob(job=0, world=4, window=8), LEAF)
    sc.add(RingJob(job=1, world=2, window=4, slot_base=8))  # a plain job next to it
    for k in (1, 2, 0):  # slots 1 and 2 complete before 0: a chain of partials
        for r in (0, 1, 2):
            sc.frame(job.data_bytes(r, k, vec(rng)))
    sc.frame(job.data_bytes(2, 1, vec(rng)))  # UP resends: the partial again
    sc.frame(job.data_bytes(0, 1, vec(rng)))  # a MEMBER's duplicate
    sc.frame(leaf_frames(job, rng, 3, "total"))  # partial 3 not up: drop_role
    sc.frame(leaf_frames(job, rng, 1, "raw_down"))  # a worker's frame on DOWN
    sc.frame(leaf_frames(job, rng, 1, "partial_down", ce=True))
    sc.frame(leaf_frames(job, rng, 1, "short_total", ce=True))
    sc.frame(leaf_frames(job, rng, 1, "marked_member"))
    for k in (2, 1, 0):  # totals out of order: a chain of releases
        sc.frame(leaf_frames(job, rng, k, "total", ce=k == 1))
    sc.frame(leaf_frames(job, rng, 1, "total"))  # the total again: re-emitted
    sc.frame(job.data_bytes(1, 0, vec(rng)))  # a MEMBER's resend: its result re-emitted
    sc.frame(job.data_bytes(2, 0, vec(rng)))  # UP's resend: still the partial
    sc.frame(leaf_frames(job, rng, 9, "total"))  # ahead of the window
    sc.frame(leaf_frames(job, rng, 0, "probe"))
    plain = RingJob(job=1, world=2, window=4)
    for r in (0, 1):
        sc.frame(plain.data_bytes(r, 0, vec(rng)))
    for r in range(4):
        sc.frame(job.ack(r, 2))
    sc.frame(leaf_frames(job, rng, 1, "probe"))  # behind the window now
    sc.frame(leaf_frames(job, rng, 1, "total"))  # a total behind the window: its probe
    check_roles(sc)


@pytest.mark.parametrize("seed", [1, 2])
def test_leaf_random_against_model(seed):
    """Random traffic around the model's own pointers: contributions (some ahead, resent),
    totals (some before their partial went up), ACKs / NAKs of every flow up to what it can
    have seen, wrong-stage frames and probes, 10 % CE; random gaps and ``dec`` stalls."""
    sc = RoleScenario()
    rng = random.Random(seed)
    job = sc.add_roles(RingJob(job=0, world=4, window=4, slot_base=4), LEAF)
    st = sc.eng._jobs[0]
    kinds = ["contrib"] * 10 + ["total"] * 4 + ["ack"] * 8 + [
        "raw_down", "partial_down", "short_total", "probe", "marked_member"]
    for i in range(400):
        kind = rng.choice(kinds)
        if kind == "ack":
            r = rng.randrange(4)
            if rng.random() < 0.5:  # the flow holding free_j back
                r = min(range(4), key=lambda f: (st.flows[f].acked - st.free) % (1 << 24))
            lim = st.leaf.upptr if r == 2 else st.rel
            ahead = (lim - st.flows[r].acked) % (1 << 24)  # what it can acknowledge
            k = (st.flows[r].acked + rng.randrange(-1, ahead + 1) - 1) % (1 << 24)
            buf = job.ack(r, k, nak=rng.random() < 0.2)
        elif kind in ("total", "short_total", "probe"):
            k = (st.rel + rng.randrange(-1, 3)) % (1 << 24)
            buf = leaf_frames(job, rng, k, kind, ce=rng.random() < 0.1)
        else:
            k = (st.leaf.upptr + rng.choice([-2, -1, 0, 0, 0, 0, 1, 2, 3])) % (1 << 24)
            buf = leaf_frames(job, rng, k, kind, ce=rng.random() < 0.1)
        sc.frame(buf, time=i)
    gw = check_roles(sc, gap=0.2, stall=0.2, seed=seed)
    c = sc.eng.counters(0)
    assert min(c["partials_up"], c["totals"], c["drop_role"], c["reemits"]) > 0, c
    assert c["freed"] >= 4, str(sorted((k, v) for k, v in c.items() if v))
    assert gw.releases


def test_spine_against_model():
    """A spine's RACK flows: partials (MARK_PARTIAL) are contributions whose stored header and
    re-emits carry MARK_TOTAL; unmarked or total-marked frames are dropped (drop_role); another
    engine's probe passes unchanged."""
    sc = RoleScenario()
    rng = random.Random(7)
    job = sc.add_roles(RingJob(job=0, world=3, window=4), [Role.RACK] * 3)
    part = lambda r, k: remark(job.data_bytes(r, k, vec(rng)), L2, MARK_PARTIAL)  # noqa: E731
    for k in range(5):
        for r in rng.sample(range(3), 3):
            sc.frame(part(r, k), time=k)
        sc.frame(part(1, k))  # a leaf re-sends its partial: the total re-emitted
    sc.frame(job.data_bytes(0, 5, vec(rng)))  # a worker's frame bypassing its leaf
    sc.frame(remark(job.data_bytes(1, 5, vec(rng)), L2, MARK_TOTAL))  # a total sent up again
    sc.frame(part(2, 5))
    sc.frame(remark(job.data_bytes(0, 5, b"", opcode=Opcode.WRITE_MIDDLE), L2, 0))  # a probe
    for k in range(3):
        for r in range(3):
            sc.frame(job.ack(r, k))
    sc.frame(part(0, 1))  # behind the window: its probe carries MARK_TOTAL
    sc.frame(remark(job.data_bytes(1, 6, vec(rng), ecn=ECN_CE), L2, MARK_PARTIAL), time=99)
    check_roles(sc)
    assert sc.eng.counters(0)["drop_role"] == 2


def test_bad_role_sets_refused_like_the_model():
    """A job re-enabled with roles that fit neither a leaf nor a spine is refused (ROLES) by
    the gateware as by the model; the job next to it keeps running."""
    sc = RoleScenario()
    rm = sc.rm
    rng = random.Random(9)
    job = sc.add_roles(RingJob(job=0, world=3, window=4), [Role.MEMBER, Role.UP, Role.DOWN])
    plain = sc.add(RingJob(job=1, world=2, window=4, slot_base=4))
    role_f, ctrl_en = rm.field("FLOW.CFG.role"), rm.field("JOB.CTRL.enable")
    cfg_f = rm.reg("FLOW.CFG")
    entry = {}
    for e in range(sc.params["flows"]):
        v = sc.bus.read(rm.addr("FLOW.CFG", e))
        if cfg_f.field("valid").get(v) and cfg_f.field("job").get(v) == 0:
            entry[cfg_f.field("rank").get(v)] = e
    for roles in ([Role.UP, Role.MEMBER, Role.MEMBER], [Role.UP, Role.DOWN, Role.RACK],
                  [Role.UP, Role.UP, Role.DOWN], [Role.RACK, Role.MEMBER, Role.RACK]):
        sc.bus.write(rm.addr("JOB.CTRL", 0), 0)
        for r, role in enumerate(roles):
            a = rm.addr("FLOW.CFG", entry[r])
            v = sc.bus.read(a)
            sc.bus.write(a, (v & ~role_f.mask) | (int(role) << role_f.lsb))
        sc.bus.write(rm.addr("JOB.CTRL", 0), ctrl_en.mask)
        for r in (0, 1):
            sc.frame(plain.data_bytes(r, 0, vec(rng)))
        sc.frame(job.data_bytes(0, 0, vec(rng)))
    # the last role set (a spine: RACK and MEMBER flows) is accepted by both
    assert sc.eng.job_state(0) is not None
    check_roles(sc)
