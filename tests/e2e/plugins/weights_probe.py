"""Test plugin (``--plugin-dir tests/e2e/plugins``): the ``weights_probe`` eval workflow.

It scores a fixed token sequence under the explorer's current weights and reports the sum of
its logprobs (``probe_logprob``) and the weights' version (``probe_version``), so a test can
tell from the logged eval metrics exactly which weights the explorer held: :func:`score`
computes the same number from a checkpoint folder.
"""

from __future__ import annotations

import torch

from trinity import hookimpl
from trinity.experience import Experience
from trinity.workflow import Workflow

TOKENS = list(range(4, 40))


class WeightsProbe(Workflow):
    def run(self) -> list[Experience]:
        logprobs = self.model.logprobs(TOKENS)
        return [
            Experience(
                tokens=torch.tensor(TOKENS),
                prompt_length=1,
                logprobs=logprobs,
                reward=0.0,
                metrics={
                    "probe_logprob": float(logprobs.double().sum()),
                    "probe_version": float(self.model.model_version),
                },
            )
        ]


def score(model_path) -> float:
    """``probe_logprob`` of the weights saved at ``model_path``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return float(torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).double().sum())


@hookimpl
def register_workflows(register):
    register("weights_probe", WeightsProbe)
