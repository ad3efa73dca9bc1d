"""The Labels page in a real browser (Debian's ``chromium`` and ``chromium-driver``, driven by
Selenium as in ``test_studio_browser.py``): ``human_preference_annotation_mapper`` waits for
labels of upstream's demo pairs and serves the page; a person types a name and clicks; a
reload asks only for what is left; a pair someone else labelled meanwhile is not labelled
twice; the operator returns the clicked choices as DPO rows with who and when."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from .chrome import missing, start_chrome, wait

SCREENSHOTS = os.environ.get("TRINITY_STUDIO_SCREENSHOTS")  # a folder: save the page there (docs/images)
DEMO = Path(__file__).parents[1] / "upstream_configs" / "dpo_human_in_the_loop" / "demo-data.jsonl"


pytestmark = pytest.mark.skipif(missing() is not None, reason=f"studio browser tests: {missing()}")


@pytest.fixture
def browser():
    driver = start_chrome()
    yield driver
    driver.quit()


def _text(driver, element_id):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).text


def _click(driver, element_id):
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, element_id).click()


def _shows(driver, prompt):
    wait(driver, lambda d: _text(d, "lab-prompt") == prompt, f"the pair {prompt!r}")


def test_clicked_labels_land_as_dpo_rows(browser, tmp_path):
    from selenium.webdriver.common.by import By

    from trinity.data.annotation import HumanPreferenceAnnotationMapper, PreferenceStore
    from trinity.data.operator import OperatorContext

    demo = [json.loads(line) for line in DEMO.read_text().splitlines()][:3]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    op = HumanPreferenceAnnotationMapper(
        project_name_prefix="Human_Preference_Annotation_Demo",
        wait_for_annotations=True,
        poll_interval=0.2,
        timeout=120,
        api_url=f"http://127.0.0.1:{port}",
    )
    op.bind(
        OperatorContext(job_dir=str(tmp_path / "dpo_example" / "trinity_dpo"), checkpoint_root=str(tmp_path))
    )
    result: list = []
    waiting = threading.Thread(target=lambda: result.append(op.process([dict(r) for r in demo])), daemon=True)
    waiting.start()
    try:
        page = f"http://127.0.0.1:{port}/#labels"
        wait(browser, lambda d: _served(d, page), "the operator's studio")
        _shows(browser, demo[0]["prompt"])
        assert _text(browser, "lab-answer1") == demo[0]["answer1"]
        assert _text(browser, "lab-answer2") == demo[0]["answer2"]
        assert "0 labelled, 0 skipped, 3 to go" in _text(browser, "lab-progress")

        _click(browser, "lab-pick2")  # no name yet: refused, nothing recorded
        wait(browser, lambda d: "Type your name" in _text(d, "lab-message"), "the name request")
        store = PreferenceStore(op.store_path)
        assert store.counts()["pending"] == 3
        browser.find_element(By.ID, "lab-name").send_keys("Ada")
        _click(browser, "lab-pick2")
        _shows(browser, demo[1]["prompt"])
        if SCREENSHOTS:
            browser.set_window_size(1280, 560)
            browser.save_screenshot(os.path.join(SCREENSHOTS, "studio_labels.png"))

        browser.refresh()  # a restarted page asks only for what is left
        _shows(browser, demo[1]["prompt"])
        assert browser.find_element(By.ID, "lab-name").get_attribute("value") == "Ada"
        other = store.pairs(pending=True)[0]
        store.label(other.pair_id, "answer1", "Grace")  # someone else, meanwhile
        _click(browser, "lab-pick2")
        _shows(browser, demo[2]["prompt"])
        assert "labelled already by Grace" in _text(browser, "lab-message")
        # Script errors so far (the refused label's 409 is the browser's network line, expected);
        # after the last decision the operator stops the page's server, so the log ends here.
        errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert [e for e in errors if "409 (Conflict)" not in e] == [] and len(errors) == 1
        browser.find_element(By.TAG_NAME, "body").send_keys("s")  # the skip key

        waiting.join(timeout=30)
        assert not waiting.is_alive(), "the operator still waits after every pair was decided"
    finally:
        op.close()
    rows, metrics = result[0]
    assert [(r["prompt"], r["chosen"], r["rejected"], r["labelled_by"]) for r in rows] == [
        (demo[0]["prompt"], demo[0]["answer2"], demo[0]["answer1"], "Ada"),
        (demo[1]["prompt"], demo[1]["answer1"], demo[1]["answer2"], "Grace"),
    ]
    assert all(r["labelled_at"].endswith("Z") for r in rows)
    assert metrics["skipped"] == 1 and metrics["unlabelled"] == 0


def _served(driver, url) -> bool:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        driver.get(url)
    except WebDriverException:
        return False
    return bool(driver.find_elements(By.ID, "lab-card"))
