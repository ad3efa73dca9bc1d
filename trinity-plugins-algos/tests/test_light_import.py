"""`trinity plugins` imports the hooks module: it must not pull in torch (or ray/transformers)."""

import json
import subprocess
import sys


def test_hooks_import_does_not_load_torch():
    code = (
        "import json, sys, trinity_algos.hooks\n"
        "print(json.dumps([m in sys.modules for m in ('torch', 'ray', 'transformers')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False, False]


def test_every_name_registered_under_the_plugin(algos_manager):
    from trinity.plugins import list_components

    # Trinity-RFT 0.6's names (upstream configs use them), plus `raft`'s selection stage.
    expected = {
        "advantage_fn": {
            "ppo", "grpo", "grpo_verl", "step_wise_grpo", "gigpo", "reinforceplusplus", "reinforce",
            "remax", "rloo", "opmd", "opmd_verl", "asymre", "asymre_verl", "rec", "on_policy_distill",
            "jsd", "clipb", "clipv", "raft",
        },
        "policy_loss_fn": {
            "ppo", "opmd", "sft", "dpo", "gspo", "cispo", "mix", "topr", "sft_is", "sft_phi",
            "mix_chord", "sppo", "rec", "sapo", "importance_sampling", "m2po",
        },
        "kl_fn": {"none", "k1", "k2", "k3", "low_var_kl", "abs", "corrected_k3"},
        "entropy_loss_fn": {"default", "none", "mix"},
        "sample_strategy": {"default", "warmup", "mix", "staleness_control"},
        "selector": {"sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based"},  # core + ours
        "algorithm_type": {
            "ppo", "grpo", "dapo", "opmd", "asymre", "rloo", "reinforceplusplus", "gspo", "cispo",
            "m2po", "dpo", "sft", "mix", "cpt", "topr", "sapo", "mix_chord", "raft", "sppo", "rec",
            "multi_step_grpo", "gigpo", "on_policy_distill", "jsd", "grpo_verl",
        },
    }  # fmt: skip
    for kind, names in expected.items():
        assert set(list_components(kind)) == names, kind
