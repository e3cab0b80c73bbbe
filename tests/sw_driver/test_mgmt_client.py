"""The management client: EngineControl over UDP register frames into the reference Engine, with
loss, retries, replay recovery, refusals and timeouts."""

import pytest
from netreduce.sim.model import Engine
from netreduce.sim.model.mgmt import attach_mgmt
from netreduce.sim.net.model_fabric import ModelFabric
from netreduce.sim.net.network import LinkConfig, NetConfig
from netreduce.sw_driver.control import EngineControl, FlowConfig, JobConfig, Op
from netreduce.sw_driver.mgmt import (
    FabricLink,
    MgmtClient,
    MgmtError,
    MgmtNak,
    MgmtSettings,
    MgmtSource,
    MgmtTimeout,
    provision,
)

from netreduce.regmap import BusError
from netreduce.wire import ip
from netreduce.wire.mgmt import (
    MGMT_DEFAULT_PORT,
    MGMT_MAX_OPS,
    MgmtFrame,
    MgmtMessage,
    MgmtOp,
    MgmtOpcode,
    MgmtStatus,
    MgmtType,
    pack_mgmt,
)

KEY = bytes(range(32, 48))
E_IP, E_MAC = ip("10.0.0.254"), b"\x02\xee\x00\x00\x00\x01"
C_IP, C_MAC, C_PORT = ip("10.0.0.1"), b"\x02\xcc\x00\x00\x00\x01", 40000


def _engine(key=KEY, sources=None):
    eng = Engine(jobs=4, flows=16, slots=256)
    attach_mgmt(eng, MgmtSettings(E_IP, E_MAC, sources=sources or [MgmtSource(C_IP)], key=key))
    return eng


def _client(link, key=KEY, **kw):
    args = dict(engine_ip=E_IP, engine_mac=E_MAC, ip=C_IP, mac=C_MAC, port=C_PORT, key=key)
    args.update(kw)
    return MgmtClient(link, **args)


def _job(job=1, n=3, base=0):
    flows = [FlowConfig(r, ip(f"10.1.{job}.{r}"), 0x100 + r, ip(f"10.1.{job}.{(r + 1) % n}"),
                        0x200 + r, 1000 * r) for r in range(n)]
    return JobConfig(job, n, 16, base, 1024, Op.SUM_SAT, flows, cnp_interval=77)


def _dump(eng):
    # counter tables excluded: CNT, and PORT (which counts the frames themselves as traffic)
    return {i.name: eng.regs.read(i.addr) for i in eng.regmap.instances()
            if i.table.name not in ("CNT", "PORT") and i.reg.name != "LAST_SEQ"}


class DirectLink:
    """Frames straight into engine.receive; ``drop_resp(n)``/``drop_req(n)`` decide, by the
    running count of responses/requests, which to lose. Records everything."""

    def __init__(self, eng, drop_req=lambda n: False, drop_resp=lambda n: False):
        self.eng, self.drop_req, self.drop_resp = eng, drop_req, drop_resp
        self.q, self.sent, self.nreq, self.nresp = [], [], 0, 0

    def send(self, frame):
        self.sent.append(frame)
        self.nreq += 1
        if self.drop_req(self.nreq):
            return
        for e in self.eng.receive(0, frame, 0):
            self.nresp += 1
            if not self.drop_resp(self.nresp):
                self.q.append(e.frame)

    def recv(self, timeout_s):
        return self.q.pop(0) if self.q else None


@pytest.mark.parametrize("posted", [False, True])
def test_add_job_over_model_fabric_reads_back(posted):
    eng = _engine()
    fab = ModelFabric(eng)
    cl = _client(FabricLink(fab, C_MAC))
    ctl = EngineControl(cl)
    assert ctl.identify().flows == 16
    cfg = _job()
    if posted:
        with cl.posted():
            ctl.add_job(cfg)
    else:
        ctl.add_job(cfg)
    # read back through the host's view of the engine and through the client
    host = EngineControl(eng.bus)
    assert host.job_status(1).enabled and ctl.job_status(1).enabled
    rm = eng.regmap
    for path, v in (("JOB.WORLD", 3), ("JOB.WINDOW", 16), ("JOB.PMTU", 1024),
                    ("JOB.OP", int(Op.SUM_SAT)), ("JOB.CNP_INTERVAL", 77)):
        assert eng.regs.read(rm.addr(path, 1)) == v == cl.read(rm.addr(path, 1))
    keys = {(eng.regs.read(rm.addr("FLOW.FWD_IP", e)), eng.regs.read(rm.addr("FLOW.START_PSN", e)))
            for e in range(16) if eng.regs.read(rm.addr("FLOW.CFG", e)) & 1}
    assert keys == {(f.fwd_ip, f.start_psn) for f in cfg.flows}
    c = eng.counters()
    assert c["mgmt_accepted"] == cl.stats["ok"] == c["mgmt_rx"]
    assert cl.stats["retransmits"] == 0
    assert eng.regs.read(rm.addr("MGMT_SRC.LAST_SEQ", 0)) == cl.next_seq - 1


def test_posting_batches_writes():
    frames = {}
    for posted in (False, True):
        eng = _engine()
        link = DirectLink(eng)
        cl = _client(link)
        ctl = EngineControl(cl)
        if posted:
            with cl.posted():
                ctl.add_job(_job())
        else:
            ctl.add_job(_job())
        frames[posted] = (len(link.sent), _dump(eng))
    assert frames[True][1] == frames[False][1]  # same registers either way
    n_writes = 6 * 3 + 9  # EngineControl.add_job: 6 per flow + 9 job registers
    assert frames[False][0] - frames[True][0] >= n_writes - 4


def test_lossy_duplicating_reordering_fabric_same_result():
    """Management frames lost (30 %), duplicated and reordered in both directions: the job still
    lands exactly as over a clean fabric."""
    clean = _engine()
    EngineControl(_client(DirectLink(clean))).add_job(_job())
    eng = _engine()
    bad = LinkConfig(loss=0.3, dup=0.2, reorder=0.3, reorder_ns=20_000)
    fab = ModelFabric(eng, NetConfig(overrides={("up", "other"): bad, ("down", "other"): bad}),
                      seed=3)
    cl = _client(FabricLink(fab, C_MAC), retries=30, timeout_s=20e-6)
    EngineControl(cl).add_job(_job())
    assert _dump(eng) == _dump(clean)
    assert cl.stats["retransmits"] > 0 and cl.stats["executed_unanswered"] > 0
    c = eng.counters()
    assert c["mgmt_reject_replay"] > 0  # duplicates / retransmissions refused, not re-executed


def test_lost_response_of_write_is_not_reexecuted():
    eng = _engine()
    link = DirectLink(eng, drop_resp=lambda n: n == 2)  # 1: sync, 2: the write's answer
    cl = _client(link)
    s = eng.regmap.addr("GLOBAL.SCRATCH")
    ctrl = eng.regmap.addr("GLOBAL.CONTROL")
    eng.count_global("rx_data", 5)
    # a non-idempotent write (clear counters) + a read, response lost: retransmission is a
    # REPLAY, the clear is not repeated, the read is re-issued as a new request
    vals = cl.transact([MgmtOp.write(s, 0xABCD), MgmtOp.write(ctrl, 1), MgmtOp.read(s)])
    assert vals == [0xABCD, 1, 0xABCD]
    assert cl.stats["executed_unanswered"] == 1 and cl.stats["retransmits"] == 1
    c = eng.counters()
    assert c["rx_data"] == 0  # cleared exactly once, after which ...
    assert c["mgmt_reject_replay"] == 1 and c["mgmt_accepted"] == 2  # ... 2 requests counted


def test_timeout_names_the_address_and_counts_tries():
    eng = _engine()
    link = DirectLink(eng, drop_req=lambda n: True)
    cl = _client(link, retries=2)
    with pytest.raises(MgmtTimeout, match=r"seq 1 .*READ 0x0 \(GLOBAL.MAGIC\).* 3 tries.*"
                       r"before READ 0x1084 \(JOB\[2\].WORLD\)"):
        cl.read(eng.regmap.addr("JOB.WORLD", 2))
    assert len(link.sent) == 3
    cl.synced = True
    with pytest.raises(MgmtTimeout, match=r"seq 2 .*WRITE 0x30 \(GLOBAL.SCRATCH\) = 0x5"):
        cl.write(0x30, 5)
    assert isinstance(MgmtTimeout("x"), BusError)


@pytest.mark.parametrize("path,op,status", [
    ("MGMT.KEY0", "read", MgmtStatus.DENIED),
    ("MGMT.KEY2", "write", MgmtStatus.DENIED),
    (None, "write", MgmtStatus.BAD_ADDR),
])
def test_refusal_raises_bus_error_naming_address(path, op, status):
    eng = _engine()
    cl = _client(DirectLink(eng))
    addr = eng.regmap.addr(path) if path else 0x0384 + 0x1000 * 5
    before = _dump(eng)
    with pytest.raises(MgmtNak) as e:
        cl.read(addr) if op == "read" else cl.write(addr, 5)
    assert isinstance(e.value, BusError) and e.value.status == status
    assert f"0x{addr:x}" in str(e.value) and status.name in str(e.value)
    if path:
        assert path in str(e.value)
    assert _dump(eng) == before
    assert cl.read(0) == 0x4E524443  # the client carries on


def test_posted_errors_surface_at_flush_and_run_nothing():
    eng = _engine()
    cl = _client(DirectLink(eng))
    s = eng.regmap.addr("GLOBAL.SCRATCH")
    with pytest.raises(MgmtNak, match="0x7020"), cl.posted():
        cl.write(s, 1)
        cl.write(eng.regmap.addr("MGMT.KEY0"), 1)
        cl.write(s, 2)
    assert eng.regs.read(s) == 0
    with pytest.raises(RuntimeError), cl.posted():
        cl.write(s, 3)
        raise RuntimeError("driver bug")
    assert eng.regs.read(s) == 0 and cl.stats["posted_dropped"] == 1
    with cl.posted():  # a full batch goes out by itself, the rest at the end
        for i in range(MGMT_MAX_OPS + 3):
            cl.write(s, i)
    assert eng.regs.read(s) == MGMT_MAX_OPS + 2


def test_sync_continues_above_an_earlier_clients_sequence():
    eng = _engine()
    old = _client(DirectLink(eng))
    for _ in range(20):
        old.read(0)
    last = eng.regs.read(eng.regmap.addr("MGMT_SRC.LAST_SEQ"))
    assert last == 21
    new = _client(DirectLink(eng))
    s = eng.regmap.addr("GLOBAL.SCRATCH")
    new.write(s, 9)
    assert eng.regs.read(s) == 9 and new.next_seq > last
    assert eng.counters()["mgmt_reject_replay"] == 1  # the first sync try


def test_two_clients_on_one_entry_conflict_detected():
    eng = _engine()
    a, b = _client(DirectLink(eng)), _client(DirectLink(eng))
    s = eng.regmap.addr("GLOBAL.SCRATCH")
    a.write(s, 1)
    b.write(s, 2)  # b syncs above a
    with pytest.raises(MgmtError, match="sequence conflict.*another client"):
        a.write(s, 3)
    assert eng.regs.read(s) == 2


def test_wrong_key_or_unlisted_source_times_out_and_is_counted():
    eng = _engine()
    before = _dump(eng)
    with pytest.raises(MgmtTimeout):
        _client(DirectLink(eng), key=bytes(16), retries=1).write(0x30, 1)
    with pytest.raises(MgmtTimeout):
        _client(DirectLink(eng), ip=C_IP + 1, retries=1).write(0x30, 1)
    c = eng.counters()
    assert c["mgmt_reject_auth"] == 2 and c["mgmt_reject_source"] == 2
    assert _dump(eng) == before


def test_forged_and_stale_responses_ignored():
    eng = _engine()
    link = DirectLink(eng)
    cl = _client(link)
    s = eng.regmap.addr("GLOBAL.SCRATCH")
    cl.write(s, 0x1234)

    def resp(seq, key, sport=MGMT_DEFAULT_PORT):
        msg = MgmtMessage(MgmtType.RESPONSE, seq, [MgmtOp(MgmtOpcode.READ, s, 0x6666)])
        return pack_mgmt(MgmtFrame(msg, E_MAC, C_MAC, E_IP, C_IP, sport, C_PORT), key)

    seq = cl.next_seq  # the sequence number of the next request
    fakes = [resp(seq, bytes(16)), resp(seq, None), resp(seq - 1, KEY),
             resp(seq, KEY, sport=MGMT_DEFAULT_PORT + 1), b"\x00" * 60]
    orig_send = link.send

    def send(frame):
        link.q += fakes  # answers that arrive before the real one
        orig_send(frame)
    link.send = send
    assert cl.read(s) == 0x1234
    st = cl.stats
    assert (st["ignored_bad_tag"], st["ignored_stale"], st["ignored_foreign"],
            st["ignored_malformed"]) == (2, 1, 1, 1)


def test_no_auth_mode_and_provision_validation():
    eng = _engine(key=None)
    cl = _client(DirectLink(eng), key=None)
    cl.write(0x30, 5)
    assert eng.regs.read(0x30) == 5
    with pytest.raises(ValueError, match="allow-list holds 8"):
        provision(eng.bus, MgmtSettings(E_IP, E_MAC, sources=[MgmtSource(1)] * 9))
    with pytest.raises(ValueError, match="16 bytes"):
        MgmtClient(DirectLink(eng), engine_ip=1, engine_mac=E_MAC, ip=2, mac=C_MAC, key=b"x")
