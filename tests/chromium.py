"""Headless Chromium for the tests that render HTML pages (Debian's ``chromium`` + ``chromium-driver``, selenium).

Without them the calling test fails (never skips) and says how to install them. Selenium Manager is
kept offline, and the browser's background network traffic is switched off.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = ("headless Chromium is needed to check the HTML pages: run `apt-get update && apt-get install -y chromium "
           "chromium-driver` and `pip install selenium`")


def start_chromium(profile: Path, *, console: bool = False, width: int = 1400):
    """A selenium driver for headless Chromium with its profile in ``profile``, a window ``width`` pixels wide;
    ``console`` keeps the console log."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(f"selenium is not installed; {INSTALL}")
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists() and shutil.which(Path(path).name) is None:
            pytest.fail(f"{path} is missing; {INSTALL}")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={profile}", f"--window-size={width},1000"):
        options.add_argument(flag)
    if console:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")             # Selenium Manager must never download anything
        return webdriver.Chrome(service=Service(shutil.which("chromedriver") or CHROMEDRIVER), options=options)
