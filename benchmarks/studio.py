"""Benchmark: how fast Trinity Studio's first page renders on a run folder with 10k experiences,
against the same pages on a run with 100 (a ratio near 1 means paging keeps the cost
independent of the buffer's size).

    python benchmarks/studio.py [--experiences 10000] [--baseline 100] [--repeats 3]

For each run it starts a studio server and measures, with a fresh server each time (cold
caches): the HTTP time of what the first page loads (the page, its scripts, ``/api/info``,
``/api/runs``, the first page of experiences, from the run's SQL buffer and from a jsonl file
of as many experiences), and, when Debian's chromium + chromedriver and
selenium are installed, the time headless Chromium takes from navigation to a rendered
Experiences table and to a drawn Runs chart. The target is a first render within 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
import urllib.request

TARGET_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A studio server on a free port, in a thread."""

    def __init__(self, root: str) -> None:
        import uvicorn

        from trinity_studio.app import create_app

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(root), host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join()


def http_first_page(url: str, source: str) -> float:
    """Seconds to fetch everything the first Experiences page needs, one request after another."""
    from urllib.parse import quote

    paths = [
        "/",
        *(
            f"/static/{f}"
            for f in ("studio.css", "studio.js", "chart.js", "config.js", "runs.js", "experiences.js")
        ),
        "/api/info",
        "/api/runs",
        f"/api/experiences?source={quote(source)}&offset=0&limit=50",
    ]
    start = time.perf_counter()
    for path in paths:
        with urllib.request.urlopen(url + path) as response:
            response.read()
    return time.perf_counter() - start


def browser() -> object | None:
    """Headless Chromium, or None when it (or selenium) is not installed."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not (chromium and driver):
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def browser_render(driver: object, url: str, selector: str) -> float:
    """Seconds from navigating to ``url`` until ``selector`` is on the page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    start = time.perf_counter()
    driver.get(url)
    WebDriverWait(driver, 30, poll_frequency=0.01).until(lambda d: d.find_elements(By.CSS_SELECTOR, selector))
    return time.perf_counter() - start


def measure(root: str, source: str, jsonl: str, driver: object | None, repeats: int) -> dict[str, float]:
    from urllib.parse import quote

    results: dict[str, list[float]] = {"http (sql buffer)": [], "http (jsonl file)": []}
    results.update({"experiences page": [], "runs page": []})
    for _ in range(repeats):
        with Server(root) as server:
            results["http (sql buffer)"].append(http_first_page(server.url, source))
        with Server(root) as server:  # a jsonl file is indexed whole on its first request
            results["http (jsonl file)"].append(http_first_page(server.url, jsonl))
        if driver is not None:
            with Server(root) as server:
                results["experiences page"].append(
                    browser_render(
                        driver,
                        f"{server.url}/#experiences?source={quote(source)}",
                        "#exp-table-rows tr[data-id]",
                    )
                )
            with Server(root) as server:
                results["runs page"].append(
                    browser_render(driver, f"{server.url}/#runs", ".chart circle.point")
                )
    return {k: statistics.median(v) for k, v in results.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiences", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from trinity_studio.demo import make_demo_run, write_jsonl_experiences

    driver = browser()
    if driver is None:
        print("chromium, chromedriver or selenium missing: measuring HTTP only")
    with tempfile.TemporaryDirectory() as tmp:
        timings = {}
        for count in (args.baseline, args.experiences):
            root = os.path.join(tmp, f"root{count}")
            start = time.perf_counter()
            run = make_demo_run(root, steps=50, experiences=count)
            jsonl = os.path.join(run, "buffer", "debug.jsonl")
            write_jsonl_experiences(jsonl, count)
            print(f"made a run with {count} experiences in {time.perf_counter() - start:.1f}s")
            sql = os.path.join(run, "buffer", "experiences.db")
            timings[count] = measure(root, sql, jsonl, driver, args.repeats)
    if driver is not None:
        driver.quit()
    print(f"\nfirst render (median of {args.repeats}, fresh server each time):")
    print(f"{'':28}{args.baseline:>10} exp{args.experiences:>10} exp{'ratio':>8}")
    for what in timings[args.experiences]:
        small, big = timings[args.baseline][what], timings[args.experiences][what]
        print(f"{what:28}{small:>13.3f}s{big:>13.3f}s{big / small:>8.2f}")
    worst = max(timings[args.experiences].values())
    verdict = "within" if worst <= TARGET_S else "OVER"
    print(
        f"\nslowest first render with {args.experiences} experiences: {worst:.3f}s ({verdict} the {TARGET_S:.0f} s target)"
    )


if __name__ == "__main__":
    main()
