"""VM lab pieces that run without VMs: capture analysis, the ICRC control hook, the expected sum,
the verbs backend's host-side parts (lazy pyverbs import, config checks, file rendezvous) and
the CLI's refusals."""

import threading

import numpy as np
import pytest
from click.testing import CliRunner
from netreduce.sim.model.engine import Emit
from netreduce.sim.vmlab.lab import LabConfig, _IcrcTamper, analyze_captures, expected_sum
from netreduce.sw_driver import verbs

from netreduce.cli import main
from netreduce.wire import RoceFrame, parse
from netreduce.wire.pcap import write_pcap


def _data(psn, payload=bytes(range(64)), dqpn=17, opcode=0x0A):
    return RoceFrame(opcode=opcode, dqpn=dqpn, psn=psn, payload=payload, va=0x1000, rkey=5,
                     dmalen=len(payload)).pack()


def test_analyze_counts_icrc_naks_and_retransmissions(tmp_path):
    good = [_data(10), _data(11), _data(10)]  # PSN 10 twice: one retransmission
    bad = bytearray(_data(12))
    bad[-10] ^= 1  # payload byte flipped, ICRC stale
    naks = [RoceFrame.nak_seq(11).pack()]
    acks = [RoceFrame.ack(12).pack()]
    write_pcap(tmp_path / "c.in.pcap", good + [bytes(bad)] + naks + acks + [b"\xff" * 60])
    write_pcap(tmp_path / "c.out.pcap", good[:2])
    cap = analyze_captures(str(tmp_path / "c"))
    i = cap["in"]
    assert i["frames"] == 7 and i["roce"] == 6
    assert i["icrc_bad"] == 1 and i["icrc_bad_frames"][0]["psn"] == 12
    assert i["icrc_ok"] == 5
    assert i["naks"] == 1 and i["nak_0x60"] == 1 and i["acks"] == 1
    assert i["data"] == 3 and i["retransmitted"] == 1
    assert cap["out"]["icrc_ok"] == 2 and cap["out"].get("icrc_bad", 0) == 0


def test_analyze_missing_capture(tmp_path):
    cap = analyze_captures(str(tmp_path / "none"))
    assert cap["in"] == {"missing": True} and cap["out"] == {"missing": True}


class _FakeEngine:
    def __init__(self, frames):
        self.frames = frames

    def receive(self, port, frame, time):
        return [Emit(port, f, time) for f in self.frames]


def test_icrc_tamper_flips_one_payload_byte_once():
    ack = RoceFrame.ack(3).pack()
    data = _data(7)
    eng = _FakeEngine([ack, data])
    t = _IcrcTamper(eng)
    out = eng.receive(0, b"", 0)
    assert out[0].frame == ack  # ACKs are never touched
    assert out[1].frame != data and len(out[1].frame) == len(data)
    assert sum(a != b for a, b in zip(out[1].frame, data, strict=True)) == 1
    with pytest.raises(Exception, match="ICRC"):
        parse(out[1].frame)
    assert parse(out[1].frame, check=False).payload != parse(data).payload
    assert t.done["psn"] == 7 and t.done["dqpn"] == 17
    again = eng.receive(0, b"", 0)  # only the first one
    assert again[1].frame == data


def test_expected_sum_wraps_like_int32():
    cfg = LabConfig(workers=3, elems=1000, seed=5)
    xs = [np.random.default_rng([5, r]).integers(-2**31, 2**31, 1000, dtype=np.int64)
          .astype(np.int32) for r in range(3)]
    with np.errstate(over="ignore"):
        want = xs[0] + xs[1] + xs[2]
    assert np.array_equal(expected_sum(cfg), want)


@pytest.mark.parametrize("kw", [{"workers": 1}, {"backend": "fpga"}, {"pmtu": 2048},
                                {"loss": 0.7}, {"elems": 0}])
def test_lab_config_rejects(kw):
    with pytest.raises(ValueError):
        LabConfig(**kw)


def test_verbs_imports_without_pyverbs_and_says_so():
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pyverbs is installed here")
    with pytest.raises(verbs.VerbsUnavailable, match="python3-pyverbs"):
        verbs.VerbsDevice()


@pytest.mark.parametrize("kw", [{"pmtu": 2048}, {"window": 100}, {"margin": 256},
                                {"msg_packets": 0}, {"timeout": 32}, {"max_bytes": 6},
                                {"int32": False, "float32": False}])
def test_verbs_config_rejects(kw):
    with pytest.raises(ValueError):
        verbs.VerbsConfig(**kw)


def test_wc_status_words_for_qp_failures():
    assert verbs.WC_STATUS[12] == "transport retry counter exceeded"
    assert verbs.WC_STATUS[10] == "remote access error"


def test_file_exchange_all_gather(tmp_path):
    world = 3
    out = [None] * world

    def rank(r):
        ex = verbs.FileExchange(tmp_path, r, world, timeout_s=30)
        a = ex({"r": r, "gid": bytes([r]) * 16})
        b = ex(r * 10)
        out[r] = (a, b)

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for r in range(world):
        a, b = out[r]
        assert [x["r"] for x in a] == [0, 1, 2]
        assert a[2]["gid"] == b"\x02" * 16
        assert b == [0, 10, 20]


def test_file_exchange_timeout_names_missing_ranks(tmp_path):
    ex = verbs.FileExchange(tmp_path, 0, 3, timeout_s=0.2)
    with pytest.raises(TimeoutError, match=r"\[1, 2\]"):
        ex("hello")


def test_cli_refuses_verilator_backend():
    r = CliRunner().invoke(main, ["vmlab", "run", "--backend", "verilator"])
    assert r.exit_code == 2
    assert "verilator" in r.output


def test_cli_help_lists_vmlab():
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "vmlab" in r.output
