"""Frame mutations of the fuzz tests (netreduce.sim.verif.mutate)."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob
from netreduce.sim.verif.mutate import FIELDS, fixup, impersonates, mutate

from netreduce.wire import WireError, parse

JOB = RingJob(job=0, world=2, window=4, slot_base=0, pmtu=256, start_psns=[5, 9])
FRAME = JOB.data_bytes(0, 0, np.arange(16, dtype=np.int32))
OTHER = JOB.data_bytes(1, 0, np.full(16, 7, dtype=np.int32))
KEYS = {(JOB.ip(r), JOB.rq(JOB.succ(r))) for r in range(2)}


def _field(name: str) -> int:
    return next(k for k, (_, f, _) in enumerate(FIELDS) if f.name == name)


def test_each_kind():
    assert mutate(FRAME, [("flip", 3, 1)], False)[3] == FRAME[3] ^ 2
    assert mutate(FRAME, [("trunc", 20)], False) == FRAME[:20]
    assert mutate(FRAME, [("trunc", len(FRAME) + 1)], False) == b""  # modulo len + 1
    assert mutate(FRAME, [("extend", b"xy")], False) == FRAME + b"xy"
    cut = mutate(FRAME, [("splice", 1, 50)], False, [FRAME, OTHER])
    assert cut == FRAME[:50] + OTHER[50:]
    assert mutate(b"", [("flip", 0, 0)], False) == b""


def test_field_rewrite_and_fixup_make_a_well_formed_forgery():
    forged = mutate(FRAME, [("field", _field("psn"), 1234)], False)
    with pytest.raises(WireError):  # the ICRC no longer matches
        parse(forged)
    fixed = mutate(FRAME, [("field", _field("psn"), 1234)], True)
    assert parse(fixed).psn == 1234 and parse(fixed).payload == parse(FRAME).payload
    b = bytearray(forged)
    fixup(b)
    assert bytes(b) == fixed
    # a field beyond a truncated frame's end is left alone
    short = mutate(FRAME, [("trunc", 40), ("field", _field("psn"), 1)], False)
    assert short == FRAME[:40]


def test_impersonation_is_rc_data_on_a_forward_key():
    assert impersonates(FRAME, KEYS)
    assert not impersonates(FRAME, set())
    assert not impersonates(JOB.ack(1, 0), KEYS)  # not RC data
    assert not impersonates(FRAME[:30], KEYS)  # not a RoCE frame at all


def test_bad_mutations_are_refused():
    with pytest.raises(ValueError, match="unknown mutation 'rot'"):
        mutate(FRAME, [("rot", 1)], False)
    with pytest.raises(ValueError, match="needs a pool"):
        mutate(FRAME, [("splice", 0, 3)], False)
