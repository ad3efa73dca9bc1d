"""Does the quickstart's RL gain hold? Runs it on several seeds and under changes of float rounding.

    python examples/quickstart/robustness.py [--out ./quickstart-robustness] [--jobs 2] [--only NAME ...]

Each row is one full ``run.py`` (SFT warm-up, then GRPO) in a folder of its own under ``--out``:

- ``seed 0`` / ``seed 1`` / ``seed 2``: the quickstart as shipped, ``--seed N`` (the data split,
  the model's initial weights, the shuffles and the sampling seeds all change);
- on seed 0, one change at a time that sends the float rounding elsewhere:
  ``1 torch thread`` (``OMP_NUM_THREADS=1``; the default gives each actor both cores here),
  ``transformers' forward`` (``explorer.rollout_model.enforce_eager: true``: no lean decoding
  step), ``no shared prompt forward`` (``trainer.share_prompt_forward: false``) and
  ``bf16 autocast`` (``trainer.dtype: bfloat16``: the trainer's forward and backward passes).

For each it prints the held-out accuracy the job logs (a right answer in ``<answer>`` tags, the
reward's rule; greedy) before and after RL, and the same checkpoints' format-blind accuracy (the
last number after ``</think>`` is right, tags or not): how much of the gain is the answer's form
and how much the arithmetic. ``--jobs 2`` runs two at a time: the numbers do not depend on it
(every run's seeds are fixed and each actor's thread count is set), the wall times do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: name -> (seed, environment, config changes as {dotted key: value})
SETTINGS: dict[str, tuple[int, dict[str, str], dict[str, object]]] = {
    "seed 0": (0, {}, {}),
    "seed 1": (1, {}, {}),
    "seed 2": (2, {}, {}),
    "1 torch thread": (0, {"OMP_NUM_THREADS": "1"}, {}),
    "transformers' forward": (0, {}, {"explorer.rollout_model.enforce_eager": True}),
    "no shared prompt forward": (0, {}, {"trainer.share_prompt_forward": False}),
    "bf16 autocast": (0, {}, {"trainer.dtype": "bfloat16"}),
}


def variant_config(out: Path, changes: dict[str, object]) -> Path:
    """quickstart.yaml with ``changes`` applied (its ``${oc.env:...}`` values kept as text)."""
    data = yaml.safe_load((HERE / "quickstart.yaml").read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = out / "quickstart.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def greedy_accuracy(model_path: Path, rows: list[dict]) -> dict[str, float]:
    """Greedy held-out accuracy by the reward's rule (``<answer>`` tags) and format-blind."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per checkpoint says nothing here
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tagged = blind = 0
    for row in rows:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": row["question"]}],
            add_generation_prompt=True, return_tensors="pt", return_dict=True,
        )  # fmt: skip
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        answer = re.search(r"<answer>(.*?)</answer>", text)
        tagged += bool(answer) and answer.group(1).strip() == row["answer"]
        numbers = re.findall(r"\d+", text.split("</think>")[-1])
        blind += bool(numbers) and numbers[-1] == row["answer"]
    return {"tagged": tagged / len(rows), "blind": blind / len(rows)}


def run_one(name: str, out: Path) -> dict:
    seed, env, changes = SETTINGS[name]
    folder = out / re.sub(r"\W+", "-", name).strip("-")
    folder.mkdir(parents=True, exist_ok=True)
    config = variant_config(folder, changes)
    work = folder / "work"
    command = [sys.executable, str(HERE / "run.py"), "--work-dir", str(work), "--config", str(config)]
    command += ["--seed", str(seed)]
    with (folder / "output.log").open("w") as log:
        code = subprocess.call(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        return {"name": name, "error": f"run.py exited {code}; see {folder / 'output.log'}"}
    text = (folder / "output.log").read_text()
    before = float(re.search(r"after SFT, before RL:\s+([\d.]+)%", text).group(1))
    after = float(re.search(r"after RL:\s+([\d.]+)%", text).group(1))
    minutes = float(re.search(r"wall time: ([\d.]+) min", text).group(1))
    rows = [json.loads(line) for line in (work / "data" / "test.jsonl").read_text().splitlines()]
    jobs = work / "checkpoints" / "quickstart" / "arithmetic"
    sft = greedy_accuracy(max(jobs.glob("sft_warmup/global_step_*")), rows)
    rl = max(jobs.glob("grpo/global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    result = {"name": name, "before": before, "after": after, "minutes": minutes,
              "blind_before": 100 * sft["blind"], "blind_after": 100 * greedy_accuracy(rl, rows)["blind"]}  # fmt: skip
    (folder / "result.json").write_text(json.dumps(result))
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| run | held-out before RL | after RL | gain | format-blind before | after | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} |||||")
            continue
        lines.append(
            f"| {r['name']} | {r['before']:.0f}% | {r['after']:.0f}% | **{r['after'] - r['before']:+.0f}** "
            f"| {r['blind_before']:.0f}% | {r['blind_after']:.0f}% | {r['minutes']:.1f} min |"
        )
    gains = [r["after"] - r["before"] for r in results if "error" not in r]
    if gains:
        spread = f"{min(gains):+.0f} to {max(gains):+.0f}"
        sd = f", sd {statistics.stdev(gains):.1f}" if len(gains) > 1 else ""
        lines.append(f"\ngain over {len(gains)} runs: mean {statistics.fmean(gains):+.1f}, {spread}{sd}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("quickstart-robustness"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--only", nargs="*", choices=list(SETTINGS), help="these rows only")
    args = parser.parse_args(argv)
    names = args.only or list(SETTINGS)
    out = args.out.resolve()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda name: run_one(name, out), names))
    print(table(results))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
