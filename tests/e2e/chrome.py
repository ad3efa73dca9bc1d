"""Chromium for the studio's browser tests: Debian's ``chromium`` and ``chromedriver`` (nothing
is downloaded), headless; the reason to skip when they are missing; waiting for the page."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why the browser tests cannot run here (``None``: they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium; it is in trinity-core[dev])"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(path):
            return f"{path} not found: apt-get install -y {package} (.ci/run does this on CI)"
    return None


def start_chrome(downloads: Path | None = None) -> Any:
    """A headless Chromium (1280x800, the page's console kept; ``downloads``: where it saves)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(arg)
    if downloads is not None:
        options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def wait(driver: Any, condition: Any, what: str = "the page", timeout: float = 15.0) -> Any:
    """What ``condition(driver)`` returns once it is true, polled; a timeout names ``what``."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, message=f"timed out waiting for {what}"
    )
