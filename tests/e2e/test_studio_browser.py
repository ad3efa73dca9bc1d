"""Trinity Studio in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver`` packages, which ``.ci/run`` installs) driven by Selenium.

One studio server and one browser serve the whole module. The system chromedriver is passed
explicitly, so Selenium Manager never downloads anything. Set ``TRINITY_STUDIO_SCREENSHOTS`` to a
folder to save a screenshot of each page there (``docs/images`` holds the ones in docs/studio.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from .chrome import missing, start_chrome, wait

SCREENSHOTS = os.environ.get("TRINITY_STUDIO_SCREENSHOTS")


pytestmark = pytest.mark.skipif(missing() is not None, reason=f"studio browser tests: {missing()}")

QUICKSTART_VALUES = {  # the core of examples/quickstart/quickstart.yaml, typed in the beginner form
    "project": "quickstart",
    "name": "arithmetic",
    "model.model_path": "${oc.env:QUICKSTART_DIR,./quickstart-run}/model",
    "model.max_prompt_tokens": "32",
    "model.max_response_tokens": "56",
    "algorithm.algorithm_type": "grpo",
    "algorithm.repeat_times": "8",
    "algorithm.optimizer.lr": "3.0e-4",
    "buffer.batch_size": "16",
    "buffer.total_steps": "120",
    "buffer.explorer_input.taskset.name": "arithmetic",
    "buffer.explorer_input.taskset.path": "${oc.env:QUICKSTART_DIR,./quickstart-run}/data/rl",
    "buffer.explorer_input.taskset.split": "train",
    "buffer.explorer_input.taskset.format.prompt_key": "question",
    "buffer.explorer_input.taskset.format.response_key": "answer",
    "buffer.explorer_input.default_workflow_type": "math_workflow",
    "buffer.explorer_input.default_reward_fn_type": "math_reward",
    "buffer.trainer_input.experience_buffer.name": "experiences",
    "monitor.monitor_type": "tensorboard",
}
QUICKSTART_CHOICES = {
    "buffer.trainer_input.experience_buffer.storage_type": "queue",
    "explorer.rollout_model.engine_type": "transformers",
    "trainer.trainer_type": "native",
    "synchronizer.sync_method": "memory",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def studio_root(tmp_path_factory) -> Path:
    from trinity.monitor.tensorboard import TensorboardMonitor
    from trinity.run_status import write_run_status
    from trinity_studio.demo import make_demo_run, write_jsonl_experiences

    root = tmp_path_factory.mktemp("studio_browser")
    make_demo_run(str(root), steps=8, experiences=60)
    write_jsonl_experiences(str(root / "debug.jsonl"), 12)
    # A later start of the same job that failed before logging anything (as launchers before
    # the clean-up left them): the newest row, but no data.
    failed = root / "demo" / "tiny_20990101000000"
    write_run_status(failed, "failed", "starting actors: an actor died")
    TensorboardMonitor(str(failed / "monitor" / "tensorboard"), "trainer").close()
    return root


@pytest.fixture(scope="module")
def studio(studio_root):
    """The base URL of a studio served from a thread for the whole module."""
    import uvicorn

    from trinity_studio.app import create_app

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(str(studio_root)), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "the studio server did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    downloads = tmp_path_factory.mktemp("downloads")
    driver = start_chrome(downloads)
    driver.downloads = downloads
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def _css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _open(driver, url, ready_selector):
    driver.get(url)
    driver.refresh()  # a hash change alone would keep the previous page's state
    wait(driver, lambda d: _css(d, ready_selector), what=ready_selector)


def _screenshot(driver, name):
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        # The viewport itself at 1280x800 (the window size includes the browser's own bars).
        metrics = {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(0.3)
        driver.save_screenshot(os.path.join(SCREENSHOTS, f"studio_{name}.png"))
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def _js_errors(driver):
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _field(driver, key):
    (element,) = _css(driver, f'[data-key="{key}"]')
    return element


def _type(driver, key, text):
    from selenium.webdriver.common.keys import Keys

    element = _field(driver, key)
    element.clear()
    element.send_keys(text, Keys.TAB)  # the form reads a value on change (leaving the field)


def test_each_page_loads(browser, studio):
    _open(browser, f"{studio}/#config", '[data-key="model.model_path"]')
    assert "Trinity Studio" in browser.title
    _open(browser, f"{studio}/#runs", 'tr[data-run="demo/tiny"]')
    _open(browser, f"{studio}/#experiences", "#exp-source")
    assert _css(browser, "#page-experiences")[0].is_displayed()
    assert _js_errors(browser) == []


def test_beginner_form_builds_the_quickstart_config_which_dry_runs(browser, studio, tmp_path):
    from selenium.webdriver.support.ui import Select

    _open(browser, f"{studio}/#config", '[data-key="model.model_path"]')
    for key, text in QUICKSTART_VALUES.items():
        _type(browser, key, text)
    for key, value in QUICKSTART_CHOICES.items():
        Select(_field(browser, key)).select_by_value(value)
    # The picked reward function's default_args() appear as its argument fields.
    wait(
        browser,
        lambda d: _css(d, '[data-key="buffer.explorer_input.taskset.reward_fn_args.format_score"]'),
        what="reward_fn_args",
    )
    _type(browser, "buffer.explorer_input.taskset.reward_fn_args.format_score", "0.0")
    wait(browser, lambda d: "valid" in _css(d, "#cfg-status")[0].text, what="the config to validate")
    _screenshot(browser, "config")

    saved = tmp_path / "quickstart.yaml"
    path_box = _css(browser, "#cfg-save-path")[0]
    path_box.clear()
    path_box.send_keys(str(saved))
    _css(browser, "#cfg-save")[0].click()
    wait(
        browser,
        lambda d: saved.is_file() and "saved" in _css(d, "#cfg-message")[0].text,
        what="the saved file",
    )
    _css(browser, "#cfg-download")[0].click()
    downloaded = browser.downloads / "config.yaml"
    wait(browser, lambda d: downloaded.is_file() and downloaded.stat().st_size > 0, what="the download")
    assert yaml.safe_load(downloaded.read_text()) == yaml.safe_load(saved.read_text())

    config = yaml.safe_load(saved.read_text())
    expected = yaml.safe_load(
        (Path(__file__).parents[2] / "examples" / "quickstart" / "quickstart.yaml").read_text()
    )
    assert config["algorithm"] == {"algorithm_type": "grpo", "repeat_times": 8, "optimizer": {"lr": 3.0e-4}}
    taskset = expected["buffer"]["explorer_input"]["taskset"]
    assert config["buffer"]["explorer_input"]["taskset"] == {
        **{k: taskset[k] for k in ("name", "path", "split", "reward_fn_args")},
        "format": {"prompt_key": "question", "response_key": "answer"},
    }
    assert config["trainer"] == {"trainer_type": "native"}
    (tmp_path / "model").mkdir()  # the dry run checks that the model and the data are there
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data" / "rl").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(saved), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QUICKSTART_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "algorithm_type: grpo" in proc.stdout

    _css(browser, "#cfg-dry-run")[0].click()
    wait(browser, lambda d: "checkpoint_job_dir" in _css(d, "#cfg-output")[0].text, what="the dry-run output")


def test_live_field_error_beside_the_field(browser, studio):
    _open(browser, f"{studio}/#config", '[data-key="buffer.batch_size"]')
    _type(browser, "buffer.batch_size", "eight")
    slot = '[data-error-for="buffer.batch_size"]'
    wait(browser, lambda d: "expected an integer" in _css(d, slot)[0].text, what="the field error")
    assert "has-error" in _css(browser, '[data-field="buffer.batch_size"]')[0].get_attribute("class")
    _type(browser, "buffer.batch_size", "8")
    wait(browser, lambda d: _css(d, slot)[0].text == "", what="the error to clear")


def test_expert_mode_shows_every_section(browser, studio):
    from selenium.webdriver.support.ui import Select

    _open(browser, f"{studio}/#config", '[data-key="model.model_path"]')
    Select(_css(browser, "#cfg-mode")[0]).select_by_value("expert")
    wait(browser, lambda d: _css(d, 'details[data-section="algorithm"]'), what="the expert form")
    sections = {e.get_attribute("data-section") for e in _css(browser, "details[data-section]")}
    assert {
        "algorithm",
        "model",
        "buffer",
        "explorer",
        "trainer",
        "monitor",
        "synchronizer",
        "stages",
    } <= sections
    _css(browser, 'details[data-section="algorithm"] > summary')[0].click()
    wait(browser, lambda d: _css(d, '[data-key="algorithm.policy_loss_fn"]'), what="the algorithm section")
    _type(browser, "algorithm.policy_loss_fn", "ppo")
    wait(
        browser,
        lambda d: _css(d, '[data-key="algorithm.policy_loss_fn_args.clip_range"]'),
        what="ppo's arguments",
    )
    assert _field(browser, "algorithm.policy_loss_fn_args.clip_range").get_attribute("placeholder") == "0.2"
    # Lists of sections: add an eval taskset and fill in its name.
    for section in ("buffer", "buffer.explorer_input", "buffer.explorer_input.eval_tasksets"):
        summary = f'details[data-section="{section}"] > summary'
        wait(browser, lambda d, summary=summary: _css(d, summary), what=section)
        _css(browser, summary)[0].click()
    # The button shows once its section has opened (a button's text is empty until visible).
    add = wait(
        browser,
        lambda d: [b for b in _css(d, "button") if b.text == "add eval_tasksets item"],
        what="the eval_tasksets add button",
    )
    add[0].click()
    wait(
        browser,
        lambda d: _css(d, '[data-key="buffer.explorer_input.eval_tasksets[0].name"]'),
        what="a taskset",
    )
    _type(browser, "buffer.explorer_input.eval_tasksets[0].name", "heldout")
    wait(
        browser,
        lambda d: "- name: heldout" in _css(d, "#cfg-yaml")[0].get_attribute("value"),
        what="the YAML",
    )


def test_reward_curve_of_a_finished_run(browser, studio):
    from trinity_studio.demo import logprob_gap_at, reward_at

    _open(browser, f"{studio}/#runs", 'tr[data-run="demo/tiny"]')
    row = _css(browser, 'tr[data-run="demo/tiny"]')[0]
    assert "finished" in row.text
    chart = '.chart[data-title="Reward"] circle.point'
    wait(browser, lambda d: _css(d, chart), what="the reward chart")
    points = [
        (int(c.get_attribute("data-step")), float(c.get_attribute("data-value")))
        for c in _css(browser, chart)
    ]
    assert [s for s, _ in points] == list(range(1, 9))
    assert [round(v, 4) for _, v in points] == [reward_at(s) for s in range(1, 9)]
    evals = _css(browser, '.chart[data-title="Eval accuracy per taskset"] polyline.series')
    assert {e.get_attribute("data-label") for e in evals} == {"heldout", "practice"}
    # The log-prob guard's measure, from the trainer's scalars.
    gap = [
        float(c.get_attribute("data-value"))
        for c in _css(browser, '.chart[data-title="Rollout vs trainer log-prob gap"] circle.point')
    ]
    assert gap == [pytest.approx(logprob_gap_at(s)) for s in range(1, 9)]
    _screenshot(browser, "runs")


def test_open_an_experience_and_see_its_token_colouring(browser, studio, studio_root):
    from selenium.webdriver.support.ui import Select

    from trinity_studio.demo import demo_experiences

    source = studio_root / "demo" / "tiny" / "buffer" / "experiences.db"
    _open(browser, f"{studio}/#experiences?source={source}", "#exp-table-rows tbody tr[data-id]")
    assert "1–50 of 60" in _css(browser, "#exp-range")[0].text
    _css(browser, '#exp-table-rows tr[data-id="2"]')[0].click()
    wait(browser, lambda d: _css(d, "#exp-tokens .tok"), what="the token view")
    exp = list(demo_experiences(2))[1]
    tokens = _css(browser, "#exp-tokens .tok")
    assert len(tokens) == len(exp.tokens)
    response = [t for t in tokens if "prompt" not in t.get_attribute("class")]
    assert len(response) == exp.response_length
    values = [float(t.get_attribute("data-value")) for t in response]
    assert values == pytest.approx(exp.logprobs.tolist(), abs=1e-6)
    colours = {t.value_of_css_property("background-color") for t in response}
    assert len(colours) > 1 and "rgba(0, 0, 0, 0)" not in colours  # coloured, and by value
    Select(_css(browser, "#exp-colour")[0]).select_by_value("mask")
    masked = [t.get_attribute("data-value") for t in _css(browser, "#exp-tokens .tok:not(.prompt)")]
    assert masked == ["true" if m else "false" for m in exp.action_mask.tolist()]
    _screenshot(browser, "experiences")


def test_the_newest_run_with_data_is_ticked_and_an_empty_failed_start_greyed(browser, studio):
    _open(browser, f"{studio}/#runs", 'tr[data-run="demo/tiny_20990101000000"]')
    rows = [r.get_attribute("data-run") for r in _css(browser, "#runs-table tbody tr")]
    assert rows == ["demo/tiny_20990101000000", "demo/tiny"]  # newest first
    empty = _css(browser, 'tr[data-run="demo/tiny_20990101000000"]')[0]
    assert "no-data" in empty.get_attribute("class") and "(no data)" in empty.text
    ticked = [
        b.get_attribute("data-run")
        for b in _css(browser, "#runs-table input[type=checkbox]")
        if b.is_selected()
    ]
    assert ticked == ["demo/tiny"]
    wait(browser, lambda d: _css(d, '.chart[data-title="Reward"] circle.point'), what="the reward chart")


def test_a_runs_saved_config_opens_on_the_runs_page(browser, studio):
    _open(browser, f"{studio}/#runs", 'tr[data-run="demo/tiny"] a[data-config="config.yaml"]')
    assert "not saved" in _css(browser, 'tr[data-run="demo/tiny_20990101000000"]')[0].text
    _css(browser, 'tr[data-run="demo/tiny"] a[data-config="config.yaml"]')[0].click()
    wait(browser, lambda d: _css(d, "#runs-config")[0].is_displayed(), what="the config panel")
    text = _css(browser, "#runs-config-text")[0].text
    config = yaml.safe_load(text)
    assert config["project"] == "demo" and config["name"] == "tiny"
    assert "demo/tiny/config.yaml" in _css(browser, "#runs-config-title")[0].text
    _css(browser, "#runs-config-close")[0].click()
    assert not _css(browser, "#runs-config")[0].is_displayed()


def test_tokens_show_as_text_decoded_with_the_runs_tokenizer(browser, studio, studio_root):
    from trinity_studio.demo import demo_experiences

    source = studio_root / "demo" / "tiny" / "buffer" / "experiences.db"
    _open(browser, f"{studio}/#experiences?source={source}", "#exp-table-rows tbody tr[data-id]")
    _css(browser, '#exp-table-rows tr[data-id="3"]')[0].click()
    wait(browser, lambda d: _css(d, "#exp-tokens .tok"), what="the token view")
    exp = list(demo_experiences(3))[2]
    pieces = [t.text for t in _css(browser, "#exp-tokens .tok")]
    assert "".join(pieces) == exp.prompt_text + exp.response_text
    model = str(studio_root / "demo" / "tiny" / "model")
    assert _css(browser, "#exp-decoded")[0].text == f"tokens decoded with {model}"
    assert _css(browser, "#exp-tokenizer")[0].get_attribute("value") == model
