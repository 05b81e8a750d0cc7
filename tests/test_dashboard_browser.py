"""`broker dashboard` as a real process: stopped by SIGTERM, and every page driven in Debian's chromium through
Playwright on a populated store (jobs with runs and progress, prices, a main job's bubbles, a backtest), waiting for
each page's elements rather than for a fixed time. Screenshots go to test-artifacts/dashboard/ (or
BROKER_SCREENSHOT_DIR) for a person to look at."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from test_dashboard import backtest_dir, seed_bubbles

from conftest import ROOT, free_port

CHROMIUM = shutil.which("chromium")
SHOTS = Path(os.environ.get("BROKER_SCREENSHOT_DIR") or ROOT / "test-artifacts" / "dashboard")
WAIT_MS = 120_000  # the first visit imports pandas, altair and the catalog: slow on a busy 2-core machine


def healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status == 200
    except OSError:
        return False


def start_dashboard(redis_url: str, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """`broker dashboard` in its own session (for clean-up), once it answers."""
    port = free_port()
    env = {**os.environ, "BROKER_REDIS_URL": redis_url, "BROKER_HOME": str(tmp_path)}
    broker = Path(sys.executable).parent / "broker"
    server = subprocess.Popen(
        [str(broker), "dashboard", "--port", str(port), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not healthy(port):
        if time.monotonic() > deadline or server.poll() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            pytest.fail("`broker dashboard` did not answer within 60 s")
        time.sleep(0.3)
    return server, port


def test_a_sigterm_to_broker_dashboard_stops_the_streamlit_server(redis_url, tmp_path):
    """As systemd or `kill PID` stop it: the signal goes to the broker process alone, not its group."""
    server, port = start_dashboard(redis_url, tmp_path)
    try:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
        deadline = time.monotonic() + 10
        while healthy(port) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not healthy(port), "the streamlit server outlived `broker dashboard`"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture
def populated(seeded, store, tmp_path):
    """The seeded jobs (the migrated one with progress on both runs), a main job's bubbles and a backtest."""

    def with_progress(job):
        for run in job.runs:
            for i in range(5):
                run.record_progress(run.started_at + timedelta(minutes=10 * i), float(i))
            run.progress_done = 4.0  # as an agent's reports leave it: the runs table and the chart agree
        return job

    store.update_job("migrated", with_progress, emit=False)
    seed_bubbles(store)
    return {**seeded, "backtest": backtest_dir(tmp_path)}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_every_dashboard_page_draws_its_content_in_chromium(populated, redis_url, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    server, port = start_dashboard(redis_url, tmp_path, "--backtest", str(populated["backtest"]))
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            page.goto(f"http://127.0.0.1:{port}/")

            def visit(name: str, *texts: str) -> str:
                if name != "Overview":
                    page.locator('[data-testid="stSidebar"]').get_by_text(name, exact=True).click()
                for text in texts:
                    page.get_by_text(text, exact=False).first.wait_for()
                page.locator('[data-testid="stVegaLiteChart"], [data-testid="stArrowVegaLiteChart"]').first.wait_for()
                page.screenshot(path=str(SHOTS / f"{name.split()[0].lower()}.png"), full_page=True)
                return page.locator("section.main, [data-testid='stMain']").first.inner_text()

            overview = visit("Overview", "Spend to date", "Spend over time by tier")
            assert f"${populated['spend']:,.2f}" in overview and "Deadline misses" in overview

            page.locator('[data-testid="stSidebar"]').get_by_text("Jobs", exact=True).click()
            page.locator('[data-testid="stSelectbox"]').first.click()
            page.get_by_role("option", name="migrated").click()
            jobs = visit("Jobs", "Runs across offers", "Progress over time")
            migrations = page.locator('[data-testid="stMetric"]', has_text="Migrations")
            assert migrations.locator('[data-testid="stMetricValue"]').inner_text() == "1" and "Quoted" in jobs

            prices = visit("Prices and risk", "price per GPU-hour by cloud", "Preemption hazard per spot offer")
            assert "Spot vs on-demand by region" in prices

            bubbles = visit("Bubbles", "Main job llama")
            assert "no main training jobs" not in bubbles

            backtest = visit("Backtest", "Cost by policy", "Cumulative spend", "Tier mix")
            assert "Cost (hedge+bubbles)" in backtest and "Cost / joint bound" in backtest
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    for name in ("overview", "jobs", "prices", "bubbles", "backtest"):
        assert (SHOTS / f"{name}.png").stat().st_size > 20_000, name  # drawn, not blank (a blank page is ~8 kB)
