"""The live dashboard in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

A notebook launches 2 ranks; while the cell runs, the bars' widths are read from the DOM every
half second. Both ranks must advance live (several distinct widths mid-run) and end at 100% in
green. Screenshots (mid-run, final) go to tests/artifacts/.

Needs: ``apt-get install -y chromium`` and ``pip install jupyterlab playwright`` (Playwright
cannot download its own browser here; Debian's is used). Skips when those are missing, except in
CI (``CI`` set) or with ``NBTRAIN_REQUIRE_BROWSER=1``: there a missing browser fails the test, so
a broken CI image cannot pass it silently.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

TRAIN = """
import os, time
from nbtrain import notebook_launcher, progress, log

def train(steps):
    rank = int(os.environ["RANK"])
    for i in progress(range(steps), desc="train"):
        time.sleep(0.04 + 0.01 * rank)
        log({"loss": 1.0 / (i + 1) + 0.1 * rank})
        if i % 40 == 0:
            print(f"rank {rank} at step {i}")
    return rank

notebook_launcher(train, (150,), num_processes=2, start_method="fork")
"""

# The live rows while the launch runs; once it ended, the static rows that replaced them (their
# bar's data-style is the live bar's bar_style).
ROWS_JS = """() => Array.from(document.querySelectorAll('.nbtrain-dashboard .widget-hbox'))
    .filter(row => row.querySelector('.progress-bar'))
    .map(row => {
        const bar = row.querySelector('.progress-bar');
        return {label: row.querySelector('.widget-html').innerText,
                width: bar.style.width, classes: bar.className};
    }).concat(Array.from(document.querySelectorAll('.nbtrain-static .nbtrain-row')).map(row => {
        const bar = row.querySelector('.nbtrain-bar');
        return {label: row.querySelector('.nbtrain-label').innerText,
                width: bar.firstElementChild.style.width,
                classes: 'progress-bar-' + bar.dataset.style};
    }))"""


# The notebook is the current widget and its kernel is idle: run-all will act on it.
NOTEBOOK_READY_JS = """() => {
    const app = window.jupyterapp;
    const widget = app && app.shell.currentWidget;
    const session = widget && widget.sessionContext && widget.sessionContext.session;
    return Boolean(widget && widget.context && widget.context.path === 'live.ipynb'
                   && session && session.kernel && session.kernel.status === 'idle');
}"""


def _requirements() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium"
    for module in ("playwright", "jupyterlab"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed: pip install jupyterlab playwright"
    return None


def _browser_required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("NBTRAIN_REQUIRE_BROWSER") == "1"


MISSING = _requirements()

pytestmark = [
    pytest.mark.skipif(
        MISSING is not None and not _browser_required(), reason=str(MISSING)
    ),
    pytest.mark.slow,
]


@pytest.fixture(autouse=True)
def _browser_present() -> None:
    if MISSING is not None:  # only reached when required (CI): otherwise the test is skipped
        pytest.fail(f"CI or NBTRAIN_REQUIRE_BROWSER=1 requires the browser test: {MISSING}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A JupyterLab server on a free port, with its own config, data and kernelspec."""
    root, home = tmp_path / "root", tmp_path / "jupyter"
    root.mkdir()
    env = dict(os.environ)
    for name, sub in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
    ):
        env[name] = str(home / sub)
        (home / sub).mkdir(parents=True)
    env.pop("JUPYTER_PATH", None)
    # The python3 kernel is this interpreter, whatever other kernelspecs the machine has.
    spec = home / "data" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3",
                "language": "python",
            }
        )
    )
    # No news pop-up over the notebook.
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir()
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    port, token = _free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "lab.log"
    with open(log, "wb") as log_file:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True",
                "--allow-root",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
        try:
            _wait_for(url, token, server, log)
            yield url, token, root
        finally:
            server.send_signal(signal.SIGTERM)  # also shuts down its kernels
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_for(url: str, token: str, server: subprocess.Popen, log: Path) -> None:
    request = urllib.request.Request(
        f"{url}/api/status", headers={"Authorization": f"token {token}"}
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"jupyter lab exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"jupyter lab did not answer in 90 s:\n{log.read_text()[-3000:]}")


def _rank_of(label: str) -> int:
    return int(label.split("rank ")[1].split()[0])


def _percent(width: str) -> float:
    return float(width.rstrip("%")) if width.endswith("%") else 0.0


@pytest.mark.timeout(300)
def test_both_ranks_advance_live_and_end_green(lab) -> None:
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(TRAIN)])
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(notebook, root / "live.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/lab/tree/live.ipynb?token={token}")
            page.wait_for_function(NOTEBOOK_READY_JS, timeout=90_000)
            # Fire and forget: the command's promise resolves only when the cell is done.
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_selector(".nbtrain-dashboard .progress-bar", timeout=120_000)
            widths, final, mid_shot = _watch(page)
        finally:
            browser.close()

    assert sorted(final) == [0, 1], f"dashboard rows seen at the end: {final}"
    for rank in (0, 1):
        between = {w for w in widths[rank] if 0 < w < 100}
        assert len(between) >= 3, f"rank {rank} did not advance live: {sorted(widths[rank])}"
        width, classes = final[rank]
        assert width == 100.0 and "progress-bar-success" in classes, final[rank]
    assert mid_shot, "no mid-run screenshot was taken"


def _watch(page) -> tuple[dict[int, list[float]], dict[int, tuple[float, str]], bool]:
    """Sample the bars until the cell is done; screenshot once mid-run and at the end."""
    widths: dict[int, list[float]] = {0: [], 1: []}
    mid_shot = False
    deadline = time.monotonic() + 180
    final: dict[int, tuple[float, str]] = {}
    while time.monotonic() < deadline:
        rows = page.evaluate(ROWS_JS)
        for row in rows:
            widths.setdefault(_rank_of(row["label"]), []).append(_percent(row["width"]))
        current = {_rank_of(r["label"]): (_percent(r["width"]), r["classes"]) for r in rows}
        if not mid_shot and len(current) == 2 and all(30 < w < 80 for w, _ in current.values()):
            _screenshot(page, "live_view_mid.png")
            mid_shot = True
        if len(current) == 2 and all("progress-bar-success" in c for _, c in current.values()):
            final = current
            break
        time.sleep(0.5)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    _screenshot(page, "live_view_final.png")
    return widths, final, mid_shot


def _screenshot(page, name: str) -> None:
    """The whole dashboard (scrolled into view inside the notebook panel): live, or the static
    rendering that replaced it when the launch ended."""
    page.locator(".nbtrain-dashboard, .nbtrain-static").first.screenshot(
        path=str(ARTIFACTS / name)
    )
