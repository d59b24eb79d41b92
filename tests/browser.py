"""A page as a user's browser shows it: Debian's Chromium, headless, run to the end of its
scripts (Snakemake's report is a JavaScript application: its HTML file alone holds data, not
the page). `.ci/run` installs Chromium; a machine without it fails here, saying so."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=20000",
]  # fmt: skip


def chromium() -> str:
    """Chromium's path, or a failure naming how to install it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "no chromium on PATH: apt-get install chromium (what .ci/run does)"
    return found


def rendered(page: Path, screenshot: Path | None = None) -> str:
    """The DOM of `page` after its scripts ran (and, if asked, a screenshot of it)."""
    with tempfile.TemporaryDirectory() as profile:
        args = [chromium(), *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1000"]
        dom = subprocess.run([*args, "--dump-dom", page.resolve().as_uri()],
                             capture_output=True, text=True, timeout=180)  # fmt: skip
        assert dom.returncode == 0, dom.stderr[-2000:]
        if screenshot is not None:
            subprocess.run([*args, f"--screenshot={screenshot}", page.resolve().as_uri()],
                           capture_output=True, timeout=180, check=True)  # fmt: skip
    return dom.stdout
