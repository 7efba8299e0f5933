"""report.html in a real browser: Debian's headless Chromium renders the page of a realistic run directory
(tests/report_fixture.py: manifest, stage JSON, the real plots), and the test checks that every image loaded
(naturalWidth > 0), that every section is there and takes space, that the page runs no script of its own,
and keeps a screenshot.

How: a copy of report.html with one checking script appended before </body> is loaded with `--dump-dom`;
the script runs on the window's load event (every image decoded or failed by then) and writes what it
found as JSON into the DOM that Chromium prints. The screenshot is of report.html itself, unmodified. The
test skips, saying why, when /usr/bin/chromium is absent (`apt-get install -y chromium`)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from infertool.report import write_report
from tests.report_fixture import CANDIDATE, ORIGINAL, make_run_dir

CHROMIUM = next((p for p in (os.environ.get("INFERTOOL_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")) if p and Path(p).is_file()), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (/usr/bin/chromium; "
                                "`apt-get install -y chromium`): report.html is not checked in a browser")
# what headless Chromium needs on these machines: no sandbox as root, no GPU, and no background network
# traffic (the network is closed: without these it keeps failing to reach Google's hosts)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio"]
SECTIONS = ["summary", "run", "quantize", "eval", "profile", "serve", "bench"]
FIGURES = {"kld_histogram", "roofline", "latency_throughput"}
SCREENSHOT_DIR = Path(os.environ.get("INFERTOOL_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "out" / "test-artifacts")

CHECK = """<script>
window.addEventListener('load', () => {
  const found = {
    title: document.title,
    height: document.documentElement.scrollHeight,
    scripts: document.scripts.length,
    images: [...document.images].map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
                                             shown: i.getBoundingClientRect().width})),
    sections: [...document.querySelectorAll('section')].map(s => ({id: s.id,
      title: (s.querySelector('h2') || {}).textContent || '', height: s.getBoundingClientRect().height,
      text: s.textContent})),
  };
  const out = document.createElement('pre');
  out.id = 'infertool-check';
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>"""


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    profile = tmp / f"chromium-profile-{len(list(tmp.glob('chromium-profile-*')))}"
    profile.mkdir()
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp)


def render_and_check(page: Path, tmp: Path) -> dict:
    """What the checking script found in ``page`` rendered by Chromium."""
    text = page.read_text(encoding="utf-8")
    head, sep, tail = text.rpartition("</body>")
    assert sep, "report.html has no </body>"
    check = page.with_name(page.stem + ".check.html")
    check.write_text(head + CHECK + sep + tail, encoding="utf-8")
    r = _chromium(["--virtual-time-budget=10000", "--window-size=1200,900", "--dump-dom", check.as_uri()], tmp)
    m = re.search(r'<pre id="infertool-check">(.*?)</pre>', r.stdout, re.S)
    assert m, f"Chromium printed no check (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return json.loads(html.unescape(m.group(1)))


def screenshot(page: Path, tmp: Path, height: int) -> Path:
    shot = tmp / "report.png"
    h = max(900, min(int(height) + 40, 12000))
    r = _chromium([f"--screenshot={shot}", f"--window-size=1200,{h}", "--virtual-time-budget=10000", page.as_uri()], tmp)
    assert shot.is_file(), f"no screenshot (exit {r.returncode}): {r.stderr[-3000:]}"
    return shot


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_page_in_chromium(tmp_path, capsys):
    run = make_run_dir(tmp_path / "runs", verdict="FAIL")
    page = Path(write_report(run).files["report.html"])
    found = render_and_check(page, tmp_path)

    assert found["scripts"] == 1  # the checking script: the report itself runs none
    # every image loaded and is shown
    assert {i["alt"] for i in found["images"]} == FIGURES
    broken = [i for i in found["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0 and i["shown"] > 0)]
    assert not broken, f"images that did not load: {broken}"
    # every section, in order, the summary first, each taking space on the page
    assert [s["id"] for s in found["sections"]] == SECTIONS
    assert all(s["height"] > 20 for s in found["sections"]), found["sections"]
    summary = found["sections"][0]
    assert summary["title"] == "Summary: do not ship the candidate"
    for phrase in (ORIGINAL, CANDIDATE, "output tokens/s at concurrency 8", "$ per 1M output tokens at concurrency 8",
                   "0.171 .. 0.196", "Verdict: FAIL", "Next to try", "W8A8"):
        assert phrase in summary["text"], phrase
    assert "cc951d3e" not in json.dumps(found)

    shot = screenshot(page, tmp_path, found["height"])
    w, h = _png_size(shot)
    assert w == 1200 and h >= 900 and shot.stat().st_size > 20_000
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    kept = SCREENSHOT_DIR / "report-browser.png"
    shutil.copyfile(shot, kept)
    with capsys.disabled():
        print(f"\nreport.html screenshot: {shot} (copied to {kept})")


def test_hostile_names_stay_text_in_chromium(tmp_path):
    """A recipe name and model labels full of markup render as text: no element, no script, no broken image."""
    evil = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
    run = make_run_dir(tmp_path / "runs", recipe_name=evil, original="bundled:<b>bold</b>", candidate=f"GPTQ of {evil}")
    found = render_and_check(Path(write_report(run).files["report.html"]), tmp_path)
    assert found["scripts"] == 1 and found["title"] == f"infertool report: {evil}"  # shown as text, not run
    assert {i["alt"] for i in found["images"]} == FIGURES and all(i["w"] > 0 for i in found["images"])
    assert [s["id"] for s in found["sections"]] == SECTIONS
    assert f"GPTQ of {evil}" in found["sections"][0]["text"] and "bundled:<b>bold</b>" in found["sections"][0]["text"]
