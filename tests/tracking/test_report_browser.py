"""report.html in a real browser: headless Chromium (Debian's ``chromium`` package, driven by the
playwright python package through ``executable_path``; playwright's own browser download is not used).

The page of a real tiny run, with generations added (one of them an injection attempt), loads with no
console error, no dialog and no request besides the file itself; every section is there; the timeline
has one lane per (role, rank) of timeline.jsonl, for the real run and for a hand-written one with every
role. A screenshot is taken; ``GYRE_DOCS_SCREENSHOT=1`` writes it to docs/report.png.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gyre.tracking.report import SECTIONS, write_report
from gyre.tracking.report_timeline import lane_label
from gyre.tracking.timeline import read_spans
from tests.tracking.run_dirs import add_generations, hand_written_run

DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "report.png"


def _chromium() -> str:
    """The system Chromium, installed with apt where it is missing and this user may install it."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("no chromium: install Debian's chromium package (apt-get install -y chromium) to run this test")
    for args in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        done = subprocess.run(args, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode != 0 and args[1] == "install":
            pytest.skip(f"chromium is missing and apt-get could not install it: {done.stderr.strip()[-300:]}")
    found = shutil.which("chromium")
    if found is None:
        pytest.skip("apt-get installed chromium but no chromium executable is on PATH")
    return found


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright python package (dev extra)")
    executable = _chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, path: Path):
    """The page at ``path`` and what went wrong while it loaded: console errors and warnings, uncaught
    errors, dialogs (a script that ran from the data would alert), requests other than the file itself."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("request", lambda r: problems.append(f"request: {r.url}") if r.url != path.as_uri() else None)
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("document.getElementById('timeline-chart') && "
                           "document.getElementById('timeline-chart')._fullLayout")
    return page, problems


def timeline_lanes(page) -> set[str]:
    return set(page.evaluate("[].concat(...document.getElementById('timeline-chart').data.map(t => t.y))"))


def expected_lanes(run_dir: Path) -> set[str]:
    return {lane_label(s.role, s.rank) for s in read_spans(run_dir / "timeline.jsonl")}


def test_report_of_a_real_run_in_headless_chromium(browser, trained_run, tmp_path):
    run = Path(shutil.copytree(trained_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "final_*")))
    add_generations(run, [1, 2])
    page, problems = open_page(browser, write_report(run))
    assert problems == []
    for sid, title in SECTIONS:
        assert page.locator(f"section#{sid} h2").inner_text() == title
    assert page.locator("section#curves .js-plotly-plot").count() >= 5
    assert timeline_lanes(page) == expected_lanes(run) == {"driver 0", "policy 0", "policy 1", "rollout 0", "reward 0"}
    assert page.locator("#timeline-chart .ytick").count() == 5  # one labelled lane per worker
    assert page.locator("#idle-table tr").count() == 1 + 3  # header + policy, rollout, reward
    # The generations browser: the last step shows; choosing another shows it instead; text stays text.
    shown = page.locator(".gen-step:visible")
    assert shown.count() == 1 and shown.get_attribute("data-step") == "val-2"
    page.select_option("#gen-select", "train-1")
    assert page.locator(".gen-step:visible").get_attribute("data-step") == "train-1"
    assert "</script><script>alert(1)</script>" in page.locator(".gen-step:visible pre").nth(1).inner_text()
    assert page.locator("section#validation td").count() > 0
    assert "placement:" in page.locator("section#run").inner_text()
    shot = page.screenshot(clip={"x": 0, "y": 0, "width": 1400,
                                 "height": page.evaluate("document.getElementById('generations').offsetTop")},
                           full_page=True)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    if os.environ.get("GYRE_DOCS_SCREENSHOT") == "1":
        DOCS_PNG.write_bytes(shot)
    page.close()


def test_a_lane_per_worker_of_every_role(browser, tmp_path):
    run = hand_written_run(tmp_path)
    page, problems = open_page(browser, write_report(run))
    assert problems == []
    lanes = expected_lanes(run)
    assert len(lanes) == 8 and timeline_lanes(page) == lanes
    page.close()
