"""End-to-end: open a kvsim report in real headless Chromium over the DevTools protocol.

Checks: every figure rendered (one ``.plotly-graph-div`` holding
a ``.main-svg`` per figure the page announces), no JavaScript exception or console
error, no dialog opened, and a session / scenario named ``<script>alert(1)</script>``
shows up as text.  Saves a PNG screenshot next to the report for a human look.

Set-up installs Debian's ``chromium`` with apt when it is missing (we run as root);
the test is skipped, with the reason, only when neither chromium nor apt is there.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import websocket  # websocket-client, dev extra (the test command installs it)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from report_helpers import EVIL, make_run, plan_table

from kvsim.report import write_report

pytestmark = pytest.mark.e2e


def _chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and apt-get is unavailable to install it")
    # NOTE: a fresh machine's package lists are empty until `apt-get update`.
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get install -y chromium did not provide a chromium binary")
    return found


class Browser:
    """Minimal DevTools-protocol client: one page, events collected as they come."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--window-size=1280,2000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, **params: object) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if msg.get("id") is None:
                self.events.append(msg)
            if msg.get("method") == "Page.javascriptDialogOpening":
                # NOTE: an open dialog blocks the page; dismiss it (it is recorded above)
                self.ws.send(json.dumps({"id": next(self.ids), "method":
                                         "Page.handleJavaScriptDialog",
                                         "params": {"accept": True}}))

    def evaluate(self, expression: str) -> object:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            det = p["exceptionDetails"]
            out.append(str((det.get("exception") or {}).get("description") or det["text"])[:300])
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(json.dumps(p.get("args"))[:300])
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(p["entry"].get("text", "")[:300])
        elif method == "Page.javascriptDialogOpening":
            out.append(f"dialog opened: {p.get('message')}")
    return out


@pytest.fixture(scope="module")
def chromium() -> str:
    return _chromium()


def _report(path: Path) -> Path:
    runs = [make_run(EVIL), make_run("q8_0 KV", kv_scale=0.5)]
    compare = pd.DataFrame({
        "gpu": ["rtx-4060-ti-16gb", "rtx-4090", EVIL], "feasible": [True, True, False],
        "best_parallel": [2, 4, 0], "best_context_tokens": [16384, 32768, 0],
        "price_usd": [499.0, 1599.0, 1999.0], "ttft_p95_s": [0.9, 0.4, float("nan")]})
    sweep = pd.DataFrame({"engine.parallel": [1, 2, 4], "engine.cache_type": ["f16", "q8_0", EVIL],
                          "ttft_p95_s": [0.3, 0.5, 0.9], "peak_device_fraction": [0.6, 0.7, 0.8]})
    extra = {"title": EVIL, "slo": {"ttft_p95_s": 2.0, "itl_p95_s": 0.15}, "plan": plan_table(),
             "compare": compare, "sweep": sweep,
             "recommendation": {"context_tokens": 16384, "parallel": 2,
                                "flags": f"llama-server -c 32768 --parallel 2 # {EVIL}"}}
    return write_report(path, runs, extra)


def _open(chromium: str, report: Path, profile: Path) -> dict:
    """Load ``report``, wait until every announced figure drew its SVG, collect state."""
    browser = Browser(chromium, profile)
    try:
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            browser.call(domain)
        browser.call("Page.navigate", url=report.as_uri())
        state = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            state = browser.evaluate(
                "[document.readyState, Number(document.body && document.body.dataset.figures),"
                " document.querySelectorAll('.plotly-graph-div').length,"
                " [...document.querySelectorAll('.plotly-graph-div')]"
                ".filter(d => d.querySelector('.main-svg')).length]")
            if state and state[0] == "complete" and state[3] == state[1]:
                break
            time.sleep(0.2)
        time.sleep(0.5)  # let late errors arrive
        out = {"state": state, "text": browser.evaluate("document.body.innerText"),
               "verdict": browser.evaluate(
                   "(document.getElementById('verdict') || {innerText: ''}).innerText"),
               "first": browser.evaluate(
                   "[...document.body.children].filter(e => e.tagName === 'SECTION')"
                   ".map(e => e.id || e.className)[0]"),
               "title": browser.evaluate("document.title"),
               "svg_text": browser.evaluate("[...document.querySelectorAll('.main-svg text')]"
                                            ".map(t => t.textContent).join('\\n')"),
               "png": base64.b64decode(browser.call("Page.captureScreenshot",
                                                    format="png")["data"])}
        browser.evaluate("1")  # drain pending events
    finally:
        browser.close()
    out["errors"] = _errors(browser.events)
    return out


def test_report_renders_in_chromium_without_errors(chromium: str, tmp_path: Path) -> None:
    report = _report(tmp_path / "report.html")
    seen = _open(chromium, report, tmp_path / "profile")
    (tmp_path / "report.png").write_bytes(seen["png"])
    state = seen["state"]
    # 9 overall (plan, GPUs, sweep, policies, TTFT, ITL, E2E, prefix, recall per
    # session) + 5 per run × 2 runs
    assert state[1:] == [19, 19, 19], state
    assert seen["errors"] == []
    assert EVIL in seen["text"] and EVIL in seen["title"]
    assert EVIL in seen["svg_text"]  # the session id / scenario label in the plots, as text
    # the verdict comes first, one per run, then the runs side by side
    assert seen["first"] == "verdict" and seen["verdict"].count("verdict: ") == 2
    assert "Runs side by side" in seen["text"]


def test_simulated_run_report_in_chromium(chromium: str, tmp_path: Path) -> None:
    from kvsim.api import simulate
    from kvsim.cli.report import load_for_report
    from kvsim.scenario import load_scenario

    sc = load_scenario("quickstart", ["workload.max_sessions=6", f"name={EVIL}"])
    res_dir = simulate(sc).save(tmp_path / "res")
    report = write_report(tmp_path / "sim.html", [load_for_report(res_dir)])
    seen = _open(chromium, report, tmp_path / "profile")
    state = seen["state"]
    assert state[0] == "complete" and state[1] >= 6 and state[1] == state[2] == state[3], state
    assert seen["errors"] == []
    assert EVIL in seen["text"] and EVIL in seen["svg_text"]
    # the page opens with the run's verdict against kvsim's default SLOs
    assert seen["first"] == "verdict"
    assert seen["verdict"].startswith("Verdict\n") and "verdict: " in seen["verdict"]
    assert "(SLOs: kvsim's defaults)" in seen["verdict"]


def test_checker_catches_scripts_that_run(chromium: str, tmp_path: Path) -> None:
    """Negative control: an unescaped payload and a script error are both reported."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body data-figures='0'><p>x</p><script>alert(1)</script>"
                    "<script>undefinedFunction()</script></body></html>")
    seen = _open(chromium, page, tmp_path / "profile")
    assert any(e.startswith("dialog opened: 1") for e in seen["errors"]), seen["errors"]
    assert any("undefinedFunction" in e for e in seen["errors"]), seen["errors"]
