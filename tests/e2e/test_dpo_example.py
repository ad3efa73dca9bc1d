"""The DPO example (``examples/dpo/dpo.yaml``), CI-sized, through ``trinity run``: tiny model,
real Ray, preference pairs of generated arithmetic problems.

Its own module (not test_quickstart.py's), so that xdist can run it beside the quickstart's runs.
"""

from __future__ import annotations

import sys

import pytest
import yaml

from .test_quickstart import ROOT, halves, run, scalars

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: The loss often rises for a few steps before it falls. Over 20 steps (seeds 0-2) the halves'
#: mean loss falls by 0.13-0.24 and their accuracy rises by 0.16-0.28; each step is about half a
#: second.
DPO_STEPS = 20


def test_dpo_example_loss_falls_and_prefers_chosen(tmp_path, math_job):
    math_job(tmp_path, train=200, test=55, difficulty=3, dpo=200)
    data = yaml.safe_load((ROOT / "examples" / "dpo" / "dpo.yaml").read_text())
    data["buffer"]["total_steps"] = DPO_STEPS
    config = tmp_path / "dpo.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    run([sys.executable, "-m", "trinity.cli", "run", "--config", str(config)], DPO_DIR=str(tmp_path))

    trainer = scalars(tmp_path / "checkpoints" / "dpo-cpu" / "arithmetic", "trainer")
    loss, accuracy = trainer["actor/dpo_loss"], trainer["actor/accuracy"]
    assert len(loss) == DPO_STEPS
    assert loss[0] == pytest.approx(0.693, abs=0.01)  # log 2: the policy starts as its reference
    first, last = halves(loss)
    assert last < first, loss
    first, last = halves(accuracy)
    assert last > first, accuracy
