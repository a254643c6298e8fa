"""``orchestrator report``: figures from the tables, and the page as a real headless Chromium renders it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from orchestrator.apps.report import level_curves, load_curves
from orchestrator.apps.report_tables import _in_flight_at_send

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


# ------------------------------------------------------------------ pure parts
def _requests(rows):
    cols = ["trial_id", "level", "warmup", "success", "sent_s", "end_s", "ttft_ms", "tpot_ms", "output_tokens"]
    return pd.DataFrame(rows, columns=cols)


def test_in_flight_counts_requests_open_at_each_send():
    # [0, 10), [1, 2), [3, 4), [5, 12): sent at 0 -> 0 open; at 1 -> 1 (the first); at 3 -> 1; at 5 -> 1.
    sent = np.array([0.0, 1.0, 3.0, 5.0])
    end = np.array([10.0, 2.0, 4.0, 12.0])
    assert _in_flight_at_send(sent, end).tolist() == [0, 1, 1, 1]
    # A request ending exactly when another is sent is no longer in flight.
    assert _in_flight_at_send(np.array([0.0, 2.0]), np.array([2.0, 3.0])).tolist() == [0, 0]


def test_load_curves_one_point_per_level_when_levels_exist():
    rows = []
    for level, (rate, ttft) in enumerate([(1.0, 100.0), (4.0, 400.0)]):
        for i in range(10):
            sent = level * 100 + i / rate
            rows.append(("t1", level, False, True, sent, sent + 1.0, ttft + i, 10.0, 50))
    rows.append(("t1", 0, True, True, -5.0, -4.0, 9999.0, 99.0, 50))  # warm-up: ignored
    trials = pd.DataFrame({"trial_id": ["t1"], "gpus": [2]})
    curves = load_curves(_requests(rows), trials, ["t1"])
    assert list(curves["source"]) == ["level", "level"]
    # Level 0: 500 tokens from 0 to 10 s on 2 GPUs; level 1: 500 tokens from 100 to 103.25 s.
    assert curves["x"].tolist() == pytest.approx([500 / 10 / 2, 500 / 3.25 / 2])
    assert curves["ttft_p99_ms"].tolist() == pytest.approx([np.percentile(np.arange(10) + 100.0, 99),
                                                            np.percentile(np.arange(10) + 400.0, 99)])


def test_load_curves_bins_by_in_flight_load_within_one_level():
    # Sent every second, each lasting 3.5 s: in flight at send = 0, 1, 2, 3, 3, 3, ...; TTFT grows with it.
    rows = [("t1", 0, False, True, float(i), i + 3.5, 100.0 * min(i, 3), 5.0, 10) for i in range(12)]
    curves = load_curves(_requests(rows), pd.DataFrame({"trial_id": ["t1"], "gpus": [1]}), ["t1"], bins=4)
    assert set(curves["source"]) == {"in_flight"}
    assert curves["requests"].sum() == 12
    assert curves.sort_values("x")["ttft_p99_ms"].is_monotonic_increasing
    assert curves["x"].min() < 1 and curves["x"].max() == pytest.approx(3)


def test_level_curves_reads_a_capacity_search_levels_table():
    levels = pd.DataFrame({"trial_id": ["a", "a", "b"], "level": [1, 0, 0], "rate": [8.0, 2.0, 4.0],
                           "output_throughput_per_gpu": [800.0, 200.0, 400.0], "ttft_p99_ms": [900.0, 100.0, 200.0],
                           "slo_met": [False, True, True]})
    curves = level_curves(levels, ["a"])
    assert curves["rate"].tolist() == [2.0, 8.0] and curves["latency"].tolist() == [100.0, 900.0]
    assert set(curves["latency_metric"]) == {"ttft_p99_ms"}
    assert level_curves(levels.drop(columns=["ttft_p99_ms"])) is None


def test_start_phases_table_and_its_stacked_bars():
    """One row per trial whose engine start was read, in the order they started; the bars of a trial
    add up to its startup_s (what the phases do not hold is the last, grey part)."""
    from orchestrator.apps.figures import start_figure
    from orchestrator.apps.report_tables import START_PHASE_LABELS, start_table

    nan = np.nan
    trials = pd.DataFrame({
        "trial_number": [1, 0, 2], "trial_id": ["b", "a", "c"],
        "started_at": pd.to_datetime(["2026-12-07 10:05", "2026-12-07 10:00", "2026-12-07 10:10"], utc=True),
        "startup_s": [30.0, 80.0, nan], "start_import_s": [20.0, 40.0, nan], "start_load_s": [1.0, 1.0, nan],
        "start_compile_s": [4.0, 30.0, nan], "start_graphs_s": [nan, nan, nan], "start_profile_s": [2.0, 5.0, nan],
        "start_ready_s": [1.0, 1.0, nan], "start_compile_cached": [True, False, None]})
    table = start_table(trials)
    assert list(table["trial_id"]) == ["a", "b"]  # c never started
    assert list(table["start_other_s"]) == [3.0, 2.0] and list(table["compile_cached"]) == [False, True]
    bars = start_figure(table).axes[0].patches
    assert len(bars) == len(START_PHASE_LABELS) * 2
    ends = {round(b.get_y() + b.get_height() / 2): b.get_x() + b.get_width() for b in bars}
    assert ends == {0: 80.0, 1: 30.0}
    assert start_table(trials.drop(columns=[c for c in trials if c.startswith("start_")])).empty


def test_a_real_engines_report_shows_where_its_starts_went():
    """The vLLM-CPU study of benchmarks/start_cache.py (results/examples): its report has the engine
    starts' section, one bar per trial, with the table of the rows' own phases."""
    from orchestrator.apps.report import build_report
    from orchestrator.results import load_trials
    from orchestrator.results.definition import read_study_definition

    study_dir = REPO / "results" / "examples" / "start-cache-cpu-vllm" / "shared" / "start-cache-shared"
    trials = load_trials(study_dir)
    page, pngs = build_report(trials, pd.DataFrame(), read_study_definition(str(study_dir)))
    assert "starts.png" in pngs and '<section id="starts">' in page
    for compile_s in trials["start_compile_s"]:
        assert f"<td>{compile_s:,.4g}</td>" in page.replace('<td class="">', "<td>")


# ------------------------------------------------------------------ the browser
def chromium_path() -> str:
    """A Chromium binary; installed with apt-get when missing and possible, else the test fails saying why."""
    found = os.environ.get("CHROMIUM") or next((p for b in BROWSERS if (p := shutil.which(b))), None)
    if found:
        return found
    why = "no chromium on PATH"
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        r = subprocess.run("apt-get install -y -qq chromium || (apt-get update -qq && apt-get install -y -qq chromium)",
                           shell=True, env=env, capture_output=True, text=True, timeout=900)
        found = next((p for b in BROWSERS if (p := shutil.which(b))), None)
        if found:
            return found
        why += f"; apt-get install chromium failed: {r.stderr.strip()[-300:]}"
    else:
        why += "; apt-get is not available as root to install it"
    pytest.fail(f"headless Chromium is needed to look at the report (./dev test installs it): {why}")


@dataclass
class PageVisit:
    url: str
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    screenshot: bytes = b""


class Browser:
    """Headless Chromium driven over the DevTools protocol (listening on 127.0.0.1 only)."""

    def __init__(self, binary: str, profile: Path, width: int = 1280, height: int = 900):
        self.width, self.height = width, height
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start: {self.proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
        self.port = int(port_file.read_text().splitlines()[0])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def visit(self, url: str, probe: str = "({})") -> PageVisit:
        return asyncio.run(self._visit(url, probe))

    async def _visit(self, url: str, probe: str) -> PageVisit:
        import aiohttp

        visit = PageVisit(url)
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as r:
                target = await r.json(content_type=None)
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 1_000_000))
                pending: dict[int, asyncio.Future] = {}
                loaded = asyncio.Event()

                async def reader():
                    async for msg in ws:
                        data = json.loads(msg.data)
                        if "id" in data and data["id"] in pending:
                            pending.pop(data["id"]).set_result(data)
                            continue
                        method, params = data.get("method"), data.get("params", {})
                        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                            visit.console_errors.append(" ".join(str(a.get("value", a.get("description")))
                                                                 for a in params.get("args", [])))
                        elif method == "Runtime.exceptionThrown":
                            details = params["exceptionDetails"]
                            visit.console_errors.append(f"{details.get('text', 'exception')} "
                                                        f"{details.get('exception', {}).get('description', '')}")
                        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                            visit.console_errors.append(params["entry"].get("text", ""))
                        elif method == "Network.requestWillBeSent":
                            visit.requests.append(params["request"]["url"])
                        elif method == "Page.loadEventFired":
                            loaded.set()

                async def call(method, **params):
                    i = next(ids)
                    pending[i] = asyncio.get_running_loop().create_future()
                    await ws.send_json({"id": i, "method": method, "params": params})
                    reply = await asyncio.wait_for(pending[i], 60)
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})

                task = asyncio.create_task(reader())
                for domain in ("Runtime", "Log", "Network", "Page"):
                    await call(f"{domain}.enable")
                await call("Page.navigate", url=url)
                await asyncio.wait_for(loaded.wait(), 60)
                await asyncio.sleep(0.5)  # late console messages
                result = await call("Runtime.evaluate", expression=f"JSON.stringify({probe})", returnByValue=True)
                visit.facts = json.loads(result["result"]["value"])
                metrics = await call("Page.getLayoutMetrics")
                size = metrics["cssContentSize"]
                shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                  clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
                visit.screenshot = base64.b64decode(shot["data"])
                task.cancel()
        return visit


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(chromium_path(), tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


PROBE = """({
  images: Array.from(document.images).map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                                                 external: !i.src.startsWith('data:')})),
  frontRows: Array.from(document.querySelectorAll('#front-table tbody tr'))
                  .map(r => r.querySelector('td').textContent.trim()),
  sections: Array.from(document.querySelectorAll('section')).map(s => s.id),
  scripts: document.scripts.length,
  height: document.documentElement.scrollHeight,
})"""


def test_browser_check_catches_console_errors_and_network_loads(browser, tmp_path):
    """The checker itself catches a script error and a remote image (else the next test would prove nothing)."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                   '<img src="https://cdn.example.invalid/x.png"><script>console.error("boom"); undefinedCall();'
                   '</script></body></html>')
    visit = browser.visit(bad.as_uri())
    assert any("boom" in e for e in visit.console_errors)
    assert any("undefinedCall" in e for e in visit.console_errors)
    assert "https://cdn.example.invalid/x.png" in visit.requests


@pytest.mark.slow
def test_quickstart_report_renders_in_chromium(browser, tmp_path_factory, tmp_path):
    from matplotlib.image import imread
    from support.quickstart_dataset import shared_quickstart

    from orchestrator.apps.report import front_of
    from orchestrator.results import load_trials
    from orchestrator.results.definition import read_study_definition

    study_dir = shared_quickstart(tmp_path_factory)
    out = tmp_path / "report"
    r = subprocess.run([sys.executable, "-m", "orchestrator", "report", str(study_dir), "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    pngs = {p.name for p in out.glob("*.png")}
    assert {"pareto.png", "latency_load.png", "importance.png", "timeline.png", "failures.png"} <= pngs
    for p in out.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and imread(p).shape[0] > 100

    page = out / "index.html"
    visit = browser.visit(page.as_uri(), PROBE)
    (tmp_path / "report.png").write_bytes(visit.screenshot)
    assert visit.console_errors == []
    assert [u for u in visit.requests if not u.startswith("data:")] == [page.as_uri()], \
        "the page must load nothing but itself (images are inline data: URIs)"
    assert visit.facts["scripts"] == 0
    assert visit.facts["images"] and all(i["ok"] and not i["external"] for i in visit.facts["images"])
    for section in ("summary", "front", "front-table", "recommendation", "curves", "importance", "timeline",
                    "failures"):
        assert section in visit.facts["sections"]

    # The front table lists exactly the front (under the SLOs, or ignoring them when none met them).
    study = read_study_definition(str(study_dir))
    front, _ = front_of(load_trials(study_dir), study)
    assert len(front) >= 1
    assert sorted(visit.facts["frontRows"]) == sorted(front["trial_id"])

    # The screenshot is the whole page, and not blank.
    shot = imread(tmp_path / "report.png")
    assert shot.shape[0] >= min(visit.facts["height"], 16000) - 2 and shot.shape[1] >= 1000
    assert shot[..., :3].std() > 0.05
