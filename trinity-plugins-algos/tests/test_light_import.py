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

    expected = {
        "advantage_fn": {"ppo", "grpo", "opmd", "rloo", "reinforceplusplus", "reinforce", "asymre", "remax"},
        "policy_loss_fn": {"ppo", "opmd", "sft", "dpo", "gspo", "cispo", "mix"},
        "kl_fn": {"none", "k1", "k2", "k3", "low_var_kl", "abs"},
        "entropy_loss_fn": {"default", "none"},
        "sample_strategy": {"default", "warmup", "mix", "staleness_control"},
        "algorithm_type": {
            "ppo", "grpo", "dapo", "opmd", "asymre", "rloo", "reinforceplusplus",
            "gspo", "cispo", "dpo", "sft", "mix",
        },
    }  # fmt: skip
    for kind, names in expected.items():
        assert set(list_components(kind)) == names, kind
