"""Per-iteration training speed-up of NetReduce over ring all-reduce for real models' gradients,
with PyTorch DDP's bucketing and compute/communication overlap.

Models (built here from their published layer shapes, no weights, no torchvision/transformers
needed; the parameter counts are asserted against the reference implementations'):
AlexNet, VGG-16, ResNet-50 (torchvision definitions, 224x224 input), BERT-base (uncased, with
pooler, sequence 128) and GPT-2 small (124M, sequence 1024, tied LM head).

Iteration model (printed with every run):
* compute time per iteration t_c (input, ``--compute-ms name=ms``; defaults below: one
  V100-class GPU, fp32, the stated batch) splits into forward 1/3 and backward 2/3; within the
  backward pass each layer's gradient becomes ready in reverse layer order, after a share of the
  backward time proportional to the layer's forward FLOPs (convolutions 2 K^2 Cin Cout Ho Wo,
  linear layers 2 in out per sample/token; normalisation, embeddings and attention scores
  counted as 0);
* DDP buckets: parameters in reverse order, cut at 25 MiB (the first bucket at 1 MiB, as DDP's
  default first-bucket cap), float32 gradients; a bucket's all-reduce starts when its last
  gradient is ready and the previous bucket's all-reduce has finished (one communication stream);
* the iteration ends when both the backward pass and the last all-reduce are done (optimizer step
  and data loading not counted: they are the same on both sides);
* all-reduce times from the analytic model of netreduce.sim.net.perf with the latency terms fitted
  by simulation (bench/vs_ring.py validates the model against the simulation): ring over the
  workers' links; NetReduce through an engine of P ports x C (striped over its ports), plus the
  float path's exponent pass (4 bytes per 64 KiB chunk, its own latency term).

Sweeps worker link rates and worker counts; writes bench/results/training.json::

    .venv/bin/python bench/training.py [--links 10,25,40,100] [--workers 4,8,16,32,64]
        [--engine 2x100] [--compute-ms resnet50=100,...] [--gpus G --intra-gbps I] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from netreduce.sim.net import perf

MIB = 1 << 20
PMTU = 4096
CHUNK = 64 * PMTU  # bytes per quantisation chunk (CollectiveConfig: 64-packet messages)

# (name, kind, batch, default compute ms per iteration, reference parameter count)
MODELS = {
    "alexnet": ("CV", "batch 128", 70.0, 61_100_840),
    "vgg16": ("CV", "batch 32", 160.0, 138_357_544),
    "resnet50": ("CV", "batch 32", 105.0, 25_557_032),
    "bert_base": ("NLP", "batch 32 x 128 tokens", 150.0, 109_482_240),
    "gpt2_small": ("NLP", "batch 8 x 1024 tokens", 300.0, 124_439_808),
}
PAPER = {"CV": 1.7, "NLP": 1.5}


# ------------------------------------------------------------------------------ architectures
def _conv(layers, name, cin, cout, k, hw_out, bias=True):
    layers.append((name, cin * cout * k * k + (cout if bias else 0),
                   2.0 * k * k * cin * cout * hw_out * hw_out))


def _linear(layers, name, fin, fout, tokens=1, bias=True):
    layers.append((name, fin * fout + (fout if bias else 0), 2.0 * fin * fout * tokens))


def _free(layers, name, n):  # normalisation / embedding parameters: no FLOPs counted
    layers.append((name, n, 0.0))


def alexnet():
    ls: list = []
    _conv(ls, "conv1", 3, 64, 11, 55)
    _conv(ls, "conv2", 64, 192, 5, 27)
    _conv(ls, "conv3", 192, 384, 3, 13)
    _conv(ls, "conv4", 384, 256, 3, 13)
    _conv(ls, "conv5", 256, 256, 3, 13)
    _linear(ls, "fc6", 256 * 6 * 6, 4096)
    _linear(ls, "fc7", 4096, 4096)
    _linear(ls, "fc8", 4096, 1000)
    return ls


def vgg16():
    ls: list = []
    cin, hw, i = 3, 224, 0
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"):
        if v == "M":
            hw //= 2
            continue
        i += 1
        _conv(ls, f"conv{i}", cin, v, 3, hw)
        cin = v
    _linear(ls, "fc6", 512 * 7 * 7, 4096)
    _linear(ls, "fc7", 4096, 4096)
    _linear(ls, "fc8", 4096, 1000)
    return ls


def resnet50():
    ls: list = []
    _conv(ls, "conv1", 3, 64, 7, 112, bias=False)
    _free(ls, "bn1", 128)
    cin, hw = 64, 56
    for li, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for b in range(blocks):
            stride = 2 if (b == 0 and li > 0) else 1
            hw_out = hw // stride
            p = f"layer{li + 1}.{b}"
            _conv(ls, p + ".conv1", cin, width, 1, hw, bias=False)
            _free(ls, p + ".bn1", 2 * width)
            _conv(ls, p + ".conv2", width, width, 3, hw_out, bias=False)
            _free(ls, p + ".bn2", 2 * width)
            _conv(ls, p + ".conv3", width, 4 * width, 1, hw_out, bias=False)
            _free(ls, p + ".bn3", 8 * width)
            if b == 0:
                _conv(ls, p + ".downsample", cin, 4 * width, 1, hw_out, bias=False)
                _free(ls, p + ".downsample.bn", 8 * width)
            cin, hw = 4 * width, hw_out
    _linear(ls, "fc", 2048, 1000)
    return ls


def bert_base(tokens=128):
    d, ff = 768, 3072
    ls: list = []
    _free(ls, "embeddings", 30522 * d + 512 * d + 2 * d + 2 * d)
    for i in range(12):
        for w in ("query", "key", "value", "attn_out"):
            _linear(ls, f"layer{i}.{w}", d, d, tokens)
        _free(ls, f"layer{i}.ln1", 2 * d)
        _linear(ls, f"layer{i}.intermediate", d, ff, tokens)
        _linear(ls, f"layer{i}.output", ff, d, tokens)
        _free(ls, f"layer{i}.ln2", 2 * d)
    _linear(ls, "pooler", d, d, 1)
    return ls


def gpt2_small(tokens=1024):
    d = 768
    ls: list = []
    _free(ls, "wte+wpe", 50257 * d + 1024 * d)
    for i in range(12):
        _free(ls, f"h{i}.ln_1", 2 * d)
        _linear(ls, f"h{i}.c_attn", d, 3 * d, tokens)
        _linear(ls, f"h{i}.attn.c_proj", d, d, tokens)
        _free(ls, f"h{i}.ln_2", 2 * d)
        _linear(ls, f"h{i}.c_fc", d, 4 * d, tokens)
        _linear(ls, f"h{i}.mlp.c_proj", 4 * d, d, tokens)
    _free(ls, "ln_f", 2 * d)
    # the LM head is tied to wte: its matmul costs FLOPs but adds no gradient tensor of its own
    ls.append(("lm_head (tied)", 0, 2.0 * d * 50257 * tokens))
    return ls


BUILDERS = {"alexnet": alexnet, "vgg16": vgg16, "resnet50": resnet50, "bert_base": bert_base,
            "gpt2_small": gpt2_small}


def layers_of(name: str) -> list:
    ls = BUILDERS[name]()
    n = sum(p for _, p, _ in ls)
    ref = MODELS[name][3]
    if n != ref:
        raise AssertionError(f"{name}: {n} parameters, the reference model has {ref}")
    return ls


# ------------------------------------------------------------------------------ DDP timeline
def buckets(layers, cap=25 * MIB, first_cap=1 * MIB) -> list[tuple[int, float]]:
    """DDP buckets in backward order: ``(bytes, ready fraction of the backward pass)``."""
    total_flops = sum(f for _, _, f in layers) or 1.0
    done = 0.0
    out, cur, cur_cap = [], 0, first_cap
    for _, params, flops in reversed(layers):
        done += flops / total_flops
        if params == 0:
            continue
        cur += 4 * params
        if cur >= cur_cap:
            out.append((cur, done))
            cur, cur_cap = 0, cap
    if cur:
        out.append((cur, done))
    # the last bucket is ready when the backward pass is over
    b, _ = out[-1]
    out[-1] = (b, 1.0)
    return out


def iteration_ms(bks, compute_ms, allreduce_ns) -> tuple[float, float]:
    """(iteration ms, exposed communication ms) with DDP's overlap."""
    fwd, bwd = compute_ms / 3, 2 * compute_ms / 3
    t = 0.0
    for nbytes, frac in bks:
        ready = fwd + frac * bwd
        t = max(t, ready) + allreduce_ns(nbytes) / 1e6
    end = max(compute_ms, t)
    return end, end - compute_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", default="10,25,40,100", help="worker link rates B (Gb/s)")
    ap.add_argument("--workers", default="4,8,16,32,64", help="worker counts N")
    ap.add_argument("--engine", default="2x100", help="engine ports x port rate, e.g. 1x100")
    ap.add_argument("--compute-ms", default="", help="name=ms,... per-iteration compute times")
    ap.add_argument("--gpus", type=int, default=1,
                    help="devices per host G (> 1: hierarchical NetReduce against hierarchical "
                         "ring; --workers counts devices, H = N / G hosts)")
    ap.add_argument("--intra-gbps", type=float, default=400.0,
                    help="intra-host link per device and direction (Gb/s), with --gpus > 1")
    ap.add_argument("--out", default="bench/results/training.json")
    a = ap.parse_args(argv)
    try:
        links = [float(x) for x in a.links.split(",")]
        workers = [int(x) for x in a.workers.split(",")]
        p, c = a.engine.lower().split("x")
        ports, port_gbps = int(p), float(c)
    except ValueError:
        ap.error(f"bad --links {a.links!r}, --workers {a.workers!r} or --engine {a.engine!r}")
    if any(b not in (10, 25, 40, 50, 100, 200, 400) for b in links):
        ap.error(f"--links {a.links!r}: rates must be among 10,25,40,50,100,200,400")
    if any(not 2 <= n <= 64 for n in workers):
        ap.error(f"--workers {a.workers!r}: each must be 2..64")
    if not 1 <= a.gpus <= 16:
        ap.error(f"--gpus must be 1..16, got {a.gpus}")
    if a.intra_gbps <= 0:
        ap.error(f"--intra-gbps must be > 0, got {a.intra_gbps:g}")
    if a.gpus > 1 and any(n % a.gpus or n == a.gpus for n in workers):
        ap.error(f"--workers {a.workers!r}: each must be a multiple (> 1) of --gpus {a.gpus}")
    if ports < 1 or port_gbps <= 0:
        ap.error(f"--engine {a.engine!r}: need P >= 1 ports of C > 0 Gb/s")
    compute = {k: v[2] for k, v in MODELS.items()}
    for item in filter(None, a.compute_ms.split(",")):
        k, _, v = item.partition("=")
        if k not in compute:
            ap.error(f"--compute-ms: unknown model {k!r} (known: {', '.join(compute)})")
        try:
            compute[k] = float(v)
        except ValueError:
            ap.error(f"--compute-ms: {item!r} is not name=ms")
        if compute[k] <= 0:
            ap.error(f"--compute-ms: {item!r} must be > 0")
    t0 = time.perf_counter()
    alphas = {}
    for b in links:
        x = perf.fit_alphas(b, PMTU)
        alphas[b] = perf.Alphas(x.nr, x.ring, 1000.0)
    assumptions = [
        "compute per iteration (one GPU, fp32; forward 1/3, backward 2/3): " + ", ".join(
            f"{k} {compute[k]:g} ms ({MODELS[k][1]})" for k in MODELS),
        "gradient readiness in reverse layer order, proportional to forward FLOPs per layer",
        "DDP buckets 25 MiB (first 1 MiB), float32 gradients, one communication stream",
        f"engine {ports} x {port_gbps:g} Gb/s, timed from bench/results/engine_512_p1.json "
        f"({perf.engine_port_rate(port_gbps, PMTU):.1f} Gb/s payload per port), striped over "
        "its ports; float path: exponent pass + quantised sum pass",
        f"PMTU {PMTU}, 82 B per-frame overhead, 500 ns per hop, no loss",
        "latency terms (ns) fitted by simulation per link rate: " + ", ".join(
            f"{b:g}G nr {x.nr:.0f} ring-step {x.ring:.0f}" for b, x in alphas.items()),
        "ring: reduce-scatter + all-gather over the workers' links (NCCL-like, one ring)",
        ("one GPU per worker (no intra-host phase)" if a.gpus == 1 else
         f"{a.gpus} GPUs per host behind one NIC, intra-host {a.intra_gbps:g} Gb/s per device: "
         "hierarchical NetReduce (sim/net/hier.py) against the hierarchical ring"),
        "optimizer step and data loading not counted",
    ]
    print("assumptions:")
    for s in assumptions:
        print("  -", s)
    rows = []
    for name in MODELS:
        bks = buckets(layers_of(name))
        grad = sum(b for b, _ in bks)
        for b in links:
            al = alphas[b]
            for n in workers:
                g, hosts = a.gpus, n // a.gpus

                def ring_ns(nb, n=n, b=b, al=al, g=g, hosts=hosts):
                    if g > 1:
                        return perf.t_hier_ring(hosts, g, nb, b, a.intra_gbps, PMTU, a=al)
                    return perf.t_ring(n, nb, b, PMTU, a=al)

                def nr_ns(nb, n=n, b=b, al=al, g=g, hosts=hosts):
                    exp = 4 * -(-nb // CHUNK)
                    if g > 1:  # exponents: a tiny pass through the engine, no intra phase
                        return (perf.t_hier_nr(hosts, g, nb, b, ports, port_gbps, a.intra_gbps,
                                               PMTU, a=al)
                                + perf.t_netreduce(hosts, exp, b, ports, port_gbps, PMTU,
                                                   striped=True, a=al))
                    return (perf.t_netreduce(n, nb, b, ports, port_gbps, PMTU, striped=True,
                                             a=al)
                            + perf.t_netreduce(n, exp, b, ports, port_gbps, PMTU, striped=True,
                                               a=al))
                t_ring, x_ring = iteration_ms(bks, compute[name], ring_ns)
                t_nr, x_nr = iteration_ms(bks, compute[name], nr_ns)
                rows.append({"model": name, "kind": MODELS[name][0], "grad_mib": round(grad / MIB,
                                                                                       2),
                             "buckets": len(bks), "link_gbps": b, "workers": n,
                             "compute_ms": compute[name], "iter_ring_ms": round(t_ring, 2),
                             "iter_netreduce_ms": round(t_nr, 2),
                             "exposed_comm_ring_ms": round(x_ring, 2),
                             "exposed_comm_netreduce_ms": round(x_nr, 2),
                             "speedup": round(t_ring / t_nr, 3)})
    best = {}
    for r in rows:
        k = r["kind"]
        if r["speedup"] > best.get(k, {"speedup": 0})["speedup"]:
            best[k] = r
    print(f"\n{'model':<11} {'MiB':>6} " + " ".join(f"{f'{b:g}G N={n}':>10}" for b in links
                                                     for n in workers))
    for name in MODELS:
        rs = [r for r in rows if r["model"] == name]
        print(f"{name:<11} {rs[0]['grad_mib']:>6.1f} " + " ".join(f"{r['speedup']:>10.2f}"
                                                                  for r in rs))
    for k, r in best.items():
        print(f"best {k}: {r['speedup']:.2f}x ({r['model']}, {r['link_gbps']:g} Gb/s, N="
              f"{r['workers']}) beside the paper's {PAPER[k]}x")
    cmd = "python bench/training.py" + "".join(
        f" --{k} {v}" for k, v in (("links", a.links), ("workers", a.workers),
                                   ("engine", a.engine), ("compute-ms", a.compute_ms),
                                   ("gpus", a.gpus), ("intra-gbps", a.intra_gbps),
                                   ("out", a.out))
        if v != ap.get_default(k.replace("-", "_")))
    res = {"command": cmd, "gpus_per_host": a.gpus, "assumptions": assumptions,
           "engine": {"ports": ports, "port_gbps": port_gbps},
           "paper": PAPER, "best": best, "rows": rows,
           "wall_s": round(time.perf_counter() - t0, 1)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
