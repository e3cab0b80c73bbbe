"""SipHash24 gateware (netreduce.hw.mgmt) against the Python reference (netreduce.wire.mgmt)."""

import random

from amaranth.sim import Simulator
from netreduce.hw.mgmt import SipHash24

from netreduce.wire.mgmt import auth_input, siphash24


def _words(msg: bytes):
    """(data, nbytes, last) words as the core's input contract describes."""
    full = len(msg) // 8
    out = [(int.from_bytes(msg[8 * w:8 * w + 8], "little"), 0, 0) for w in range(full)]
    tail = msg[8 * full:]
    # bytes above nbytes are don't-care: fill them with junk to check they are masked
    junk = int.from_bytes(tail + b"\xa5" * (8 - len(tail)), "little")
    out.append((junk, len(tail), 1))
    return out


def run(jobs, hold=0):
    """Hash every (key, msg) in ``jobs`` back to back; return the tags and the cycles each took
    from its first word offered to its tag valid. ``hold``: cycles the tag is back-pressured."""
    dut = SipHash24()
    tags, cycles = [], []

    async def bench(ctx):
        n = 0
        for key, msg in jobs:
            ctx.set(dut.key, int.from_bytes(key, "little"))
            start = n
            for data, nbytes, last in _words(msg):
                ctx.set(dut.i.payload, {"data": data, "nbytes": nbytes, "last": last})
                ctx.set(dut.i.valid, 1)
                while not ctx.get(dut.i.ready):
                    await ctx.tick()
                    n += 1
                await ctx.tick()  # the transfer
                n += 1
                ctx.set(dut.i.valid, 0)
            while not ctx.get(dut.o.valid):
                assert not ctx.get(dut.i.ready)  # busy: no word taken
                await ctx.tick()
                n += 1
            cycles.append(n - start)
            tag = ctx.get(dut.o.payload)
            for _ in range(hold):  # backpressure: the tag holds, no new word is taken
                await ctx.tick()
                assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == tag
                assert not ctx.get(dut.i.ready)
            tags.append(tag)
            ctx.set(dut.o.ready, 1)
            await ctx.tick()
            ctx.set(dut.o.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return tags, cycles


def test_reference_vectors():
    key = bytes(range(16))
    jobs = [(key, bytes(range(n))) for n in range(17)]
    tags, _ = run(jobs)
    assert tags == [siphash24(key, m) for _, m in jobs]
    assert tags[0] == 0x726FDB47DD0E0E31 and tags[15] == 0xA129CA6149BE45E5


def test_random_keys_messages_and_backpressure():
    rng = random.Random(5)
    jobs = [(rng.randbytes(16), rng.randbytes(rng.randrange(0, 300))) for _ in range(12)]
    # a real tag input: pseudo-header + a management payload (length a multiple of 4, not 8)
    jobs.append((rng.randbytes(16), auth_input(1, 2, 3, 4, rng.randbytes(24 + 12 * 5))))
    tags, cycles = run(jobs, hold=3)
    assert tags == [siphash24(k, m) for k, m in jobs]
    for (_, m), c in zip(jobs, cycles, strict=True):
        assert c == 6 * (len(m) // 8 + 1) + 8  # the documented timing
