"""Packet path figures: Yosys resources / logic depth, beats per cycle and latency in simulation.

* ``synthesis``: native Yosys ``synth_xilinx -family xcup`` (via :mod:`netreduce.hw.estimate`:
  LUT, FF, CARRY, LUTRAM and the longest register-to-register path in logic cells) for the
  512-bit parser + ICRC checker and the deparser + ICRC insert. Both run in parallel, in the
  background of the simulations.
* ``throughput``: Amaranth simulator, back-to-back minimum (60 B) and maximum (9018 B) frames,
  input never idle, outputs always ready: beats per cycle on the input and on each output.
* ``latency``: cycles from a frame's first input beat to its first beat on ``frame``; from the
  header-completing beat to ``hdr``; from the last input beat to ``verdict`` (parser); from the
  accepted header to the first output beat (deparser).

Writes bench/results/packet_path.json.

    .venv/bin/python bench/packet_path.py [--width 512] [--no-synth]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from netreduce.hw.packet.testing import (
    deparse_header,
    frame_to_beats,
    random_frame,
    run_deparser,
    run_loopback,
    run_parser,
)

from netreduce.wire import RETH, Opcode
from netreduce.wire.view import EXT_OFF, opcode

RESULTS = Path(__file__).resolve().parent / "results" / "packet_path.json"


def _hdr_len(f: bytes) -> int:
    """Header bytes of the bench's untagged WRITE_ONLY / SEND_ONLY frames."""
    return EXT_OFF + (RETH.size if opcode(f) == Opcode.WRITE_ONLY else 0)


def _synth(which: str, width: int) -> dict:
    from netreduce.hw.estimate import estimate
    from netreduce.hw.packet.deparser import Deparser
    from netreduce.hw.packet.parser import Parser

    comp = Parser(width) if which == "parser" else Deparser(width)
    t = time.monotonic()
    est = estimate(comp, name=which, family="xcup", design=f"{which}{width}",
                   params={"data_width": width})
    d = est.as_dict()
    d["wall_s"] = round(time.monotonic() - t, 1)
    return d


def _frames(kind: str, rng: random.Random, n: int) -> list[bytes]:
    if kind == "min":   # SEND_ONLY without payload: 58 bytes, padded to 60
        return [random_frame(rng, opcode=Opcode.SEND_ONLY, plen=0, vlan=False).pack()
                for _ in range(n)]
    return [random_frame(rng, opcode=Opcode.WRITE_ONLY, plen=9018 - 74, vlan=False).pack()
            for _ in range(n)]


def parser_figures(width: int) -> dict:
    nb = width // 8
    rng = random.Random(1)
    out = {}
    for kind, n in (("min", 200), ("max", 4)):
        frames = _frames(kind, rng, n)
        r = run_parser(width, frames)
        sinks = r["sinks"]
        # first input beat of each frame / beat that completes the header / last input beat
        src_cycles = r["src_cycles"]
        firsts, hdr_done, lasts = [], [], []
        pos = 0
        for f in frames:
            nbeats = len(frame_to_beats(f, nb))
            hl = _hdr_len(f)
            firsts.append(src_cycles[pos])
            hdr_done.append(src_cycles[pos + min(nbeats - 1, (hl - 1) // nb)])
            lasts.append(src_cycles[pos + nbeats - 1])
            pos += nbeats
        frame_first = [c for c, b in zip(sinks["frame"].cycles, sinks["frame"].items,
                                         strict=True) if b["first"]]
        out[kind] = {
            "frames": n, "frame_bytes": len(frames[0]), "in_beats": r["in_beats"],
            "in_beats_per_cycle": round(r["in_beats"] / r["in_span"], 4),
            "frame_out_beats_per_cycle": _rate(sinks["frame"].cycles),
            # payload beats over the cycles they span: below 1.0 only because the headers
            # carry no payload beats
            "payload_out_beats_per_cycle": _rate(sinks["payload"].cycles),
            "latency_first_beat_to_frame": _span(firsts, frame_first),
            "latency_header_beat_to_hdr": _span(hdr_done, sinks["hdr"].cycles),
            "latency_last_beat_to_verdict": _span(lasts, sinks["verdict"].cycles),
        }
    return out


def _rate(cycles: list[int]) -> float:
    return round(len(cycles) / (cycles[-1] - cycles[0] + 1), 4) if cycles else 0.0


def _span(a: list[int], b: list[int]) -> dict:
    d = [y - x for x, y in zip(a, b, strict=True)]
    return {"min": min(d), "max": max(d)}


def deparser_figures(width: int) -> dict:
    rng = random.Random(2)
    out = {}
    for kind, n in (("min", 200), ("max", 4)):
        items = []
        for f in _frames(kind, rng, n):
            hl = _hdr_len(f)
            plen = len(f) - hl - 4 if kind == "max" else 0
            items.append((deparse_header(f, hl, plen), f[hl:hl + plen]))
        r = run_deparser(width, items)
        sink = r["sink"]
        firsts = [c for c, b in zip(sink.cycles, sink.items, strict=True) if b["first"]]
        out[kind] = {
            "frames": n, "frame_bytes": len(r["o"][0][0]), "out_beats": r["out_beats"],
            "out_beats_per_cycle": _rate(sink.cycles),
            # from an idle pipeline; later headers are prefetched while a frame is still going
            # out, so their wait says nothing about the pipeline
            "latency_hdr_to_first_beat": firsts[0] - r["hdr_cycles"][0],
        }
    return out


def loopback_figures(width: int) -> dict:
    rng = random.Random(3)
    out = {}
    for kind, n in (("min", 100), ("max", 3)):
        frames = _frames(kind, rng, n)
        r = run_loopback(width, frames)
        assert [o for o, _ in r["o"]] == frames, "loopback changed a frame"
        out[kind] = {"frames": n, "out_beats_per_cycle": _rate(r["out_cycles"])}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--no-synth", action="store_true", help="skip the Yosys runs")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    doc = {"benchmark": "packet path (hw/packet): resources, beats per cycle, latency",
           "command": "python bench/packet_path.py " + " ".join(argv or sys.argv[1:]),
           "data_width": args.width}
    pool = ProcessPoolExecutor(max_workers=2)
    jobs = {} if args.no_synth else {
        w: pool.submit(_synth, w, args.width) for w in ("parser", "deparser")}
    doc["parser"] = parser_figures(args.width)
    doc["deparser"] = deparser_figures(args.width)
    doc["loopback"] = loopback_figures(args.width)
    print(json.dumps({k: doc[k] for k in ("parser", "deparser", "loopback")}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if jobs:   # the simulation figures first: Yosys on a busy machine can take long
        args.out.write_text(json.dumps(dict(doc, synthesis="running"), indent=1) + "\n")
    synth = {}
    for name, job in jobs.items():
        try:
            synth[name] = job.result()
        except Exception as e:  # report, do not lose the simulation figures
            synth[name] = {"error": str(e)}
    pool.shutdown()
    if synth:
        doc["synthesis"] = {
            name: {k: s.get(k) for k in ("design", "family", "resources", "logic_depth",
                                         "yosys", "seconds", "error") if k in s}
            for name, s in synth.items()}
        print(json.dumps(doc["synthesis"], indent=1))
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
