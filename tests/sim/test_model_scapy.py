"""The model's generated frames (results, re-emits, CNPs) as scapy sees them: scapy recomputes
the same IPv4 checksum and ICRC and decodes the CNP as one (scapy.contrib.roce)."""

from __future__ import annotations

import numpy as np
import pytest
from netreduce.sim.model.kit import RingJob, engine_with
from scapy.compat import raw
from scapy.contrib.roce import BTH, CNPPadding
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from netreduce.wire import ECN_CE, Opcode


@pytest.mark.parametrize("vlan", [None, 0x3007])
def test_model_frames_match_scapy(vlan):
    j = RingJob(world=3, window=4, vlan_tci=vlan)
    eng, _ = engine_with(j)
    x = np.arange(3 * 10, dtype=np.int32).reshape(3, 10) - 7
    out = []
    for r in range(3):
        f = j.data(r, 0, x[r], opcode=Opcode.WRITE_ONLY_IMM).copy(tos=(46 << 2) | ECN_CE)
        out += eng.receive(0, f.pack(), 10_000 * r)
    out += eng.receive(0, j.data_bytes(1, 0, x[1], opcode=Opcode.WRITE_ONLY_IMM), 50_000)
    kinds = []
    for i, e in enumerate(out):
        p = Ether(e.frame)
        kinds.append(p[BTH].opcode)
        q = p.copy()
        q[IP].chksum = None
        q[BTH].icrc = None
        assert raw(q) == e.frame  # scapy's own checksum and ICRC agree
        if p[BTH].opcode == Opcode.CNP:
            assert p.haslayer(CNPPadding) and p[BTH].becn == 1 and p[IP].tos == 46 << 2
        elif i < len(out) - 1:
            assert p[IP].tos == (46 << 2) | 0b10  # CE answered: ECT(0)
        else:
            assert p[IP].tos == 0  # the re-emit keeps the retransmission's not-ECT
    assert kinds == [0x81, 0x81, Opcode.WRITE_ONLY_IMM, Opcode.WRITE_ONLY_IMM,
                     Opcode.WRITE_ONLY_IMM, 0x81, Opcode.WRITE_ONLY_IMM]
