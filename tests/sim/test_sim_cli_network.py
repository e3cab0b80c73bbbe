"""The link option ``netreduce sim`` relies on: ``LinkConfig.priority`` (ACKs overtake queued
data, their wire time charged to the frames queued after them), off by default."""

from __future__ import annotations

from netreduce.sim.net.network import Link, LinkConfig, NetConfig
from netreduce.sim.net.scheduler import Scheduler
from netreduce.sim.net.simrun import SimConfig, net_config

from netreduce.wire import Opcode, RoceFrame


def _frame(op, payload=b""):
    kw = {"va": 0, "rkey": 1, "dmalen": len(payload)} if op == Opcode.WRITE_ONLY else {}
    return RoceFrame(opcode=op, dqpn=5, psn=1, payload=payload, **kw).pack()


def _arrivals(net):
    sched = Scheduler()
    got = []
    link = Link(sched, "l", "up", net, 0, lambda f: got.append((sched.now(), f[42])))
    data = _frame(Opcode.WRITE_ONLY, bytes(4096))
    for _ in range(10):
        link.send(data)
    link.send(_frame(Opcode.ACK))
    link.send(data)
    sched.run_all()
    return got, len(data)


def test_fifo_by_default_ack_waits_behind_data():
    got, _ = _arrivals(NetConfig(LinkConfig()))
    assert [op for _, op in got].index(0x11) == 10


def test_priority_ack_overtakes_and_is_charged():
    ack = LinkConfig(priority=True)
    fifo_got, n = _arrivals(NetConfig(LinkConfig()))
    got, _ = _arrivals(NetConfig(LinkConfig(), overrides={("up", "ack"): ack}))
    assert [op for _, op in got].index(0x11) == 0
    # the data frame after the ACK leaves no earlier than in the FIFO (same bytes on the wire)
    assert got[-1][0] == fifo_got[-1][0]
    assert got[0][0] < fifo_got[10][0]


def test_sim_net_config_ack_priority_switch():
    on = net_config(SimConfig(workers=2, size=64, loss=0.01))
    off = net_config(SimConfig(workers=2, size=64, ack_priority=False))
    assert on.get("up", "ack").priority and on.get("down", "ack").priority
    assert not on.get("up", "data").priority and on.get("up", "ack").loss == 0.01
    assert not off.get("up", "ack").priority
