"""Headless Chromium for the HTML report tests: load a page, check every image decodes, screenshot it.

The page is copied with a small script appended that, once the page has loaded, records for every
<img> whether it decoded (naturalWidth > 0) into a <pre id="gemtrain-check"> element; Chromium's
`--dump-dom` then returns the DOM with that result in it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"

_CHECK_JS = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var out = {images: imgs.length, decoded: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
             broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).map(function (i) { return i.alt; }),
             title: document.title};
  var pre = document.createElement('pre');
  pre.id = 'gemtrain-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--virtual-time-budget=2000"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no chromium on PATH: run .ci/install-chromium.sh (apt-get install chromium)")


def _run(args: list[str], profile: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=60)


def load_in_chromium(html_path: Path, screenshot: Path | None = None) -> tuple[dict, str]:
    """(image check result, the text of the rendered DOM); writes a screenshot if asked."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        text = html_path.read_text()
        page.write_text(text.replace("</body>", _CHECK_JS + "</body>"))
        proc = _run(["--dump-dom", page.as_uri()], str(Path(tmp) / "profile-dom"))
        assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
        dom = proc.stdout
        m = re.search(r'<pre id="gemtrain-check">(.*?)</pre>', dom, re.S)
        assert m, "the page did not finish loading in chromium (no check result in the DOM)"
        result = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            proc = _run([f"--screenshot={screenshot}", "--window-size=1100,1500", html_path.resolve().as_uri()],
                        str(Path(tmp) / "profile-shot"))
            assert proc.returncode == 0 and screenshot.exists(), f"screenshot failed: {proc.stderr[-2000:]}"
    text_only = re.sub(r"<[^>]+>", " ", dom)
    return result, text_only
