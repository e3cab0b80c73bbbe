"""``netreduce verilog``: the phases on the status line (a clock that runs while a phase does,
one line per finished phase) and the file written; the conversion itself is tested in
tests/hw/test_verilog_convert.py and tests/hw/test_verilog_top.py."""

import contextlib
import json
import time

from click.testing import CliRunner

from netreduce.cli import main
from netreduce.cli._console import phases


class _Console:
    """Stands in for a rich Console on a terminal: records the status texts and the lines."""

    def __init__(self):
        self.status_texts, self.lines = [], []

    @contextlib.contextmanager
    def status(self, text):
        self.status_texts.append(text)
        outer = self

        class St:
            def update(self, text):
                outer.status_texts.append(text)

        yield St()

    def print(self, text):
        self.lines.append(text)


def test_the_status_line_counts_while_a_phase_runs():
    c = _Console()
    with phases(c, tick=0.02) as progress:
        progress("rtlil", "writing RTLIL")
        time.sleep(0.3)
        progress("yosys", "converting")
    rtlil = [t for t in c.status_texts if t.startswith("writing RTLIL")]
    assert len(rtlil) >= 3  # refreshed during the phase, not only when it starts
    assert rtlil[0].endswith("(rtlil: 0 s; 0 s in all)")
    assert [ln.split(":")[0].strip() for ln in c.lines] == ["rtlil", "yosys"]
    assert float(c.lines[0].split(":")[1].split()[0]) >= 0.3


def test_verilog_command_reports_phases_and_writes_the_file(tmp_path, monkeypatch):
    import netreduce.hw.engine as engine

    seen = {}

    class Top:
        verilog = "module netreduce_engine; endmodule\n"
        streams = []

        def info(self):
            return {"name": "netreduce_engine"}

    def fake(regmap, path, *, name, progress, **kw):
        seen.update(kw, width=regmap.params["data_width"])
        for phase in ("elaborate", "rtlil", "yosys"):
            progress(phase, f"doing {phase}")
        with open(path, "w") as f:
            f.write(Top.verilog)
        return Top()

    monkeypatch.setattr(engine, "engine_verilog", fake)
    out, info = tmp_path / "e.v", tmp_path / "e.json"
    r = CliRunner().invoke(main, ["verilog", "--width", "64", "-o", str(out), "--info",
                                  str(info)])
    assert r.exit_code == 0, r.output
    assert [ln.split(":")[0].strip() for ln in r.output.splitlines()[:3]] == \
        ["elaborate", "rtlil", "yosys"]
    assert out.read_text() == Top.verilog and seen["width"] == 64
    assert json.loads(info.read_text())["params"]["data_width"] == 64
