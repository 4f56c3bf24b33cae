"""A real headless browser for the board's tests: Debian's chromium, driven by selenium through Debian's
chromedriver (browser downloads are not reachable here; Selenium Manager is never asked)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from . import REPO

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def artifacts_dir() -> Path:
    """Where a test keeps what a person may want to look at after the run (screenshots); not in git."""
    d = Path(os.environ.get("ENLACE_TEST_ARTIFACTS", REPO / "test-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def chromium(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            raise AssertionError(f"{path} is missing: apt-get install chromium chromium-driver (.ci/run does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",  # the closed network refuses its calls home
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def wait_for(driver, find, timeout: float = 90, what: str = ""):
    """find(driver) until it returns something truthy (None and exceptions count as not yet)."""
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            got = find(driver)
            if got:
                return got
        except Exception as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or find}: {last!r}\n{driver.page_source[:3000]}")
