"""Resource estimates of the management path around the agent (netreduce.hw.mgmt_path) at the
production width (512 bits, two ports, default register map): the per-port splitter, the per-port
TX merge, the AXI4-Lite arbiter and the whole MgmtPath (agent, request FIFOs, merge, width
converters). Yosys ``synth_xilinx -family xcup`` via :func:`netreduce.hw.estimate.estimate`;
writes bench/results/mgmt_path.json. Run: ``.venv/bin/python bench/mgmt_path.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from netreduce.hw.estimate import estimate, write_json
from netreduce.hw.mgmt_path import AxiLiteArbiter, FrameArbiter, MgmtPath, MgmtSplitter

from netreduce.regmap import build_regmap

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mgmt_path.json"


def main() -> None:
    rm = build_regmap(data_width=512, ports=2)
    designs = [
        ("mgmt_splitter_512", MgmtSplitter(512), {"width": 512}),
        ("mgmt_txmerge_512", FrameArbiter(512, 2), {"width": 512, "n": 2}),
        ("mgmt_axil_arbiter", AxiLiteArbiter(16), {"addr_width": 16}),
        ("mgmt_path_512x2", MgmtPath(rm, 512, 2), {"width": 512, "ports": 2}),
    ]
    out = []
    for name, dut, params in designs:
        e = estimate(dut, name=name, params=params)
        print(f"{name}: {e.resources}", file=sys.stderr)
        out.append(e)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, RESULTS, command=".venv/bin/python bench/mgmt_path.py")


if __name__ == "__main__":
    main()
