"""Our conversion and loss against the real veRL (CPU): run by ``nox -s verl`` and ``nox -s verl_api``.

Skipped elsewhere: veRL is an optional extra and never needed by the core test suite. These tests
start no veRL worker; ``test_verl_cpu.py`` (``nox -s verl``) runs veRL's FSDP workers for real.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

verl = pytest.importorskip("verl", reason="veRL is installed only in the `nox -s verl` / `verl_api` sessions")

from tensordict import TensorDictBase  # noqa: E402  (after the skip: tensordict comes with veRL)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

from trinity.config import load_config  # noqa: E402
from trinity.experience import EID, Experience  # noqa: E402
from trinity.trainer.verl.config import build_verl_config  # noqa: E402
from trinity.trainer.verl.dataproto import (  # noqa: E402
    batch_to_dataproto,
    build_verl_batch,
    experiences_to_dataproto,
    pad_rows,
)
from trinity.trainer.verl.loss import ActorLoss  # noqa: E402
from trinity.trainer.verl.trainer import full_verl_config  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "verl"


def _experiences() -> list[Experience]:
    def exp(prompt, response, task, reward, run=0, action_mask=None):
        return Experience(
            tokens=torch.tensor(prompt + response),
            prompt_length=len(prompt),
            reward=reward,
            logprobs=-torch.rand(len(response)),
            action_mask=None if action_mask is None else torch.tensor(action_mask),
            eid=EID(batch=0, task=task, run=run),
        )

    return [
        exp([1, 2, 3], [10, 11], 0, 1.0),
        exp([4], [12, 13, 14, 15], 0, 0.0, run=1, action_mask=[1, 0, 0, 1]),
        exp([5, 6], [16], 1, 0.5),
        exp([7, 8, 9, 9], [17, 18, 19], 1, 0.0, run=1),
    ]


def test_experiences_become_a_consistent_dataproto():
    data = experiences_to_dataproto(_experiences(), pad_token_id=0, temperature=0.7)
    assert isinstance(data, verl.DataProto)
    assert len(data) == 4
    data.check_consistency()
    for key in ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask"):
        assert key in data.batch.keys()  # noqa: SIM118  (TensorDict has no `in`)
    for key in ("rollout_log_probs", "token_level_scores", "token_level_rewards"):
        assert data.batch[key].shape == data.batch["responses"].shape
    uids = data.non_tensor_batch["uid"]
    assert uids[0] == uids[1] != uids[2] == uids[3]
    assert data.meta_info["temperature"] == 0.7
    # veRL's own batch operations work on it: select and chunk over two data-parallel ranks.
    assert len(data.select(batch_keys=["input_ids"]).batch.keys()) == 1
    halves = data.chunk(2)
    assert [len(h) for h in halves] == [2, 2]


def test_verls_unpadding_reads_our_layout():
    """Each response position of veRL's unpadded output is the model output one token earlier."""
    data = experiences_to_dataproto(_experiences())
    td = left_right_2_no_padding(data.to_tensordict())
    assert td["input_ids"].is_nested
    assert tu.get(td, "temperature") == 1.0  # veRL's engine scales logits by it
    # A stand-in model output: every position outputs its own token id.
    ids = td["input_ids"]
    out = no_padding_2_padding(
        torch.nested.nested_tensor_from_jagged(ids.values().float(), ids.offsets()), td
    )
    mask = data.batch["attention_mask"]
    full = data.batch["input_ids"]
    p = data.batch["prompts"].shape[1]
    for row in range(len(data)):
        resp_len = int(mask[row, p:].sum())
        expected = full[row, p - 1 : p - 1 + resp_len].float()  # the token before each response token
        assert torch.equal(out[row, :resp_len], expected)
        assert out[row, resp_len:].abs().sum() == 0


def _nested_like(values: torch.Tensor, td) -> torch.Tensor:
    """A nested per-token model output whose response part is ``values`` ``(B, T)``."""
    offsets = td["input_ids"].offsets()
    lens = offsets.diff()
    pieces = []
    prompts = td["prompts"]
    attention = td["attention_mask"]
    for row in range(len(lens)):
        p_len = int(attention[row, : prompts.shape[1]].sum())
        r_len = int(attention[row, prompts.shape[1] :].sum())
        piece = torch.zeros(int(lens[row]))
        piece[p_len - 1 : p_len - 1 + r_len] = values[row, :r_len]
        pieces.append(piece)
    return torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets)


def test_actor_loss_on_a_real_micro_batch_matches_the_padded_computation():
    loss_fn = ActorLoss(
        {
            "policy_loss_fn": "ppo",
            "policy_loss_fn_args": {},
            "kl_loss_fn": "low_var_kl",
            "kl_loss_fn_args": {"kl_coef": 0.1},
            "entropy_loss_fn": "default",
            "entropy_loss_fn_args": {"entropy_coef": 0.01},
            "loss_agg_mode": "token-mean",
        }
    )
    loss_fn = pickle.loads(pickle.dumps(loss_fn))  # as set_loss_fn ships it to the workers
    batch = build_verl_batch(_experiences())
    shape = batch["action_mask"].shape
    gen = torch.Generator().manual_seed(0)
    batch = batch.with_(
        old_logprob=-torch.rand(shape, generator=gen),
        ref_logprob=-torch.rand(shape, generator=gen),
        advantages=torch.randn(shape, generator=gen),
        returns=torch.randn(shape, generator=gen),
    )
    td = left_right_2_no_padding(batch_to_dataproto(batch).to_tensordict())
    # What veRL's FSDP engine assigns before calling the loss (two ranks; this is one).
    tokens = float(batch["action_mask"].sum())
    tu.assign_non_tensor(td, batch_num_tokens=tokens * 2, dp_size=2, global_batch_size=8)
    logprob = batch["old_logprob"] + 0.05 * torch.randn(shape, generator=gen)
    entropy = torch.rand(shape, generator=gen)
    model_output = {"log_probs": _nested_like(logprob, td), "entropy": _nested_like(entropy, td)}
    loss, metrics = loss_fn(model_output=model_output, data=td, dp_group=None)

    mask = batch["action_mask"]
    tensors = {k: batch[k] for k in ("old_logprob", "ref_logprob", "advantages", "returns")}
    tensors.update(action_mask=mask, group_ids=batch["group_ids"], expert_mask=batch["expert_mask"])
    expected, _ = loss_fn.compute(
        logprob * (batch["response_mask"] > 0), entropy * (batch["response_mask"] > 0), tensors
    )
    # This rank holds half of the global tokens and gradients are averaged over 2 ranks: scale 1.
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert {"pg_loss", "kl_loss", "entropy", "loss"} <= set(metrics)


def test_padding_to_the_world_size_keeps_dataproto_chunkable():
    batch = build_verl_batch(_experiences()[:3])
    padded, n = pad_rows(batch, 2)
    data = batch_to_dataproto(padded)
    assert n == 3 and len(data) == 4
    assert [len(c) for c in data.chunk(2)] == [2, 2]
    assert int(data.batch["response_mask"][3].sum()) == 0


@pytest.mark.parametrize("example", ["ppo.yaml", "grpo.yaml"])
def test_translated_examples_build_verls_config_dataclasses(example, tmp_path, monkeypatch):
    from verl.utils.config import omega_conf_to_dataclass

    from trinity.testing.tiny_model import create_tiny_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = str(create_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1))
    cfg = full_verl_config(build_verl_config(load_config(EXAMPLES / example)))
    cfg.actor_rollout_ref.model.path = cfg.critic.model.path = model  # HFModelConfig reads the model
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.ppo_mini_batch_size == 256
    assert actor.rollout_n == cfg.actor_rollout_ref.rollout.n  # interpolations resolved
    critic = omega_conf_to_dataclass(cfg.critic)
    assert critic.model.path == model
    from trinity.trainer.verl.trainer import VerlTrainer

    critic_cfg, training = VerlTrainer._critic_configs(cfg)
    assert training.model_type == "value_model"
    assert training.engine_config.max_token_len_per_gpu == critic_cfg.ppo_max_token_len_per_gpu


def test_our_actor_worker_registers_its_export_for_every_rank():
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch

    from trinity.trainer.verl.workers import TrinityActorWorker

    attrs = getattr(TrinityActorWorker.export_weights, MAGIC_ATTR)
    assert attrs["dispatch_mode"] == Dispatch.ONE_TO_ALL


def test_worker_outputs_are_tensordicts_or_futures():
    from trinity.trainer.verl.trainer import _result

    td = tu.get_tensordict({"a": torch.zeros(2)})
    assert _result(td) is td

    class Future:
        def get(self):
            return td

    assert isinstance(_result(Future()), TensorDictBase)


# -- the driver, with stand-in worker groups -----------------------------------------------------
# Stand-ins that take and return the same TensorDicts veRL's workers do (nested per-token outputs,
# a ``metrics`` entry): the driver's data flow alone, in milliseconds (test_verl_cpu.py runs it
# with veRL's real workers).


def _token_values(td, scale: float) -> torch.Tensor:
    ids = td["input_ids"]
    return torch.nested.nested_tensor_from_jagged(-(ids.values().float() % 7) * scale - 0.01, ids.offsets())


class _ActorGroup:
    def __init__(self, loss_fn: ActorLoss):
        self.loss_fn = loss_fn
        self.updates: list = []
        self.saved: list[str] = []
        self.loaded: list[str] = []

    def compute_log_prob(self, td):
        assert tu.get(td, "compute_loss") is False
        return tu.get_tensordict({"log_probs": _token_values(td, 0.1)}, {"metrics": {}})

    compute_ref_log_prob = compute_log_prob

    def update_actor(self, td):
        self.updates.append(td)
        # What veRL's engine adds before the loss (one rank, the whole mini-batch as one micro-batch).
        tu.assign_non_tensor(td, batch_num_tokens=float(td["loss_mask"].sum()), dp_size=1)
        model_output = {"log_probs": _token_values(td, 0.11)}
        if tu.get(td, "calculate_entropy"):
            model_output["entropy"] = _token_values(td, -0.2)
        loss, metrics = self.loss_fn(model_output=model_output, data=td)
        metrics = {k: [v] for k, v in metrics.items()}
        metrics.update(loss=[float(loss)], grad_norm=1.5, lr=1e-6)
        return tu.get_tensordict({}, {"metrics": metrics})

    def export_weights(self):
        return [{"w": torch.ones(2)}, None]

    def save_checkpoint(self, local_path, hdfs_path, step):
        hf = Path(local_path) / "huggingface"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text("{}")
        self.saved.append(local_path)

    def load_checkpoint(self, local_path, hdfs_path, del_local_after_load):
        self.loaded.append(local_path)


def _grpo_config(tmp_path, trainer: dict, **algorithm):
    from trinity.config import resolve_config
    from trinity.config.validation import validate_config
    from trinity.testing.tiny_model import create_tiny_model

    model = str(create_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1))
    return resolve_config(
        validate_config(
            {
                "mode": "train",
                "checkpoint_root_dir": str(tmp_path / "ckpt"),
                "model": {"model_path": model, "max_prompt_tokens": 8, "max_response_tokens": 8},
                "cluster": {"node_num": 1, "gpu_per_node": 2},
                "algorithm": {
                    "algorithm_type": "grpo",
                    "repeat_times": 2,
                    "kl_loss_fn": "low_var_kl",
                    "entropy_loss_fn_args": {"entropy_coef": 0.01},
                    **algorithm,
                },
                "buffer": {
                    "batch_size": 2,
                    "trainer_input": {
                        "experience_buffer": {"name": "e", "storage_type": "sql", "path": "sqlite:///x.db"}
                    },
                },
                "trainer": trainer,
            }
        )
    )


@pytest.fixture
def grpo_trainer(tmp_path):
    from trinity.trainer.verl.trainer import VerlTrainer

    config = _grpo_config(tmp_path, {"trainer_type": "verl", "save_hf_checkpoint": "always"})
    actor = _ActorGroup(ActorLoss.from_config(config))
    return VerlTrainer(config, workers={"actor": actor, "ref": actor}), actor


def test_driver_runs_a_step_with_our_advantage_and_loss(grpo_trainer):
    from trinity.plugins import get_component

    trainer, actor = grpo_trainer
    assert trainer.use_ref and trainer.world_size == 2
    exps = _experiences()[:3]  # 3 rows on 2 ranks: one padding row
    metrics = trainer.train_step(exps)
    assert trainer.global_step == 1
    for key in (
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/grad_norm",
        "timing/adv",
        "timing/ref",
    ):
        assert key in metrics, key
    td = actor.updates[0]
    assert td["response_mask"].shape[0] == 4 and int(td["response_mask"][3].sum()) == 0
    assert tu.get(td, "global_batch_size") == 4 and tu.get(td, "mini_batch_size") == 4
    assert tu.get(td, "calculate_entropy") is True
    # The advantages sent to the workers are our GRPO advantages of the real rows.
    batch = build_verl_batch(exps)
    expected, _ = get_component("advantage_fn", "grpo")(**trainer.config.algorithm.advantage_fn_args)(
        batch.to_dict()
    )
    assert torch.allclose(td["advantages"][:3], expected["advantages"])
    assert td["advantages"][3].abs().sum() == 0
    # Old log-probs came back from compute_log_prob through veRL's unpadding.
    assert torch.equal(td["old_log_probs"][:3] != 0, batch["response_mask"] > 0)


def test_driver_checkpoints_in_our_layout_and_resumes(grpo_trainer):
    from transformers import AutoTokenizer

    trainer, actor = grpo_trainer
    trainer.train_step(_experiences())
    path = trainer.save_checkpoint(extra_state={"reader": 7})
    assert actor.saved == [os.path.join(path, "actor")]
    assert os.path.islink(os.path.join(path, "config.json"))  # veRL's HF export, linked
    AutoTokenizer.from_pretrained(path)
    assert trainer.state_dict()["w"].sum() == 2
    trainer.global_step = 0
    assert trainer.load_checkpoint() == {"reader": 7}
    assert trainer.global_step == 1 and actor.loaded == [os.path.join(path, "actor")]


def test_driver_rejects_missing_rollout_logprobs_naming_the_loss(grpo_trainer):
    from trinity.trainer.components import MissingInputError

    trainer, actor = grpo_trainer
    trainer.config.trainer.use_rollout_logprobs = True
    exps = _experiences()
    exps[0].logprobs = None
    with pytest.raises(
        MissingInputError, match=r"policy_loss_fn 'ppo' needs 'old_logprob'.*use_rollout_logprobs"
    ):
        trainer.train_step(exps)
    assert actor.updates == []


def test_native_and_verl_losses_agree_on_a_real_micro_batch(tmp_path):
    """The same batch and model output through the native trainer's loss and through veRL's
    unpadded micro-batch into ActorLoss: the same loss and the same gradients."""
    from trinity.trainer.forward import forward_logprobs
    from trinity.trainer.native import NativeTrainer

    config = _grpo_config(tmp_path, {"trainer_type": "native"}, kl_loss_fn_args={"kl_coef": 0.1})
    native = NativeTrainer(config)
    batch = build_verl_batch(_experiences())
    shape = batch["action_mask"].shape
    gen = torch.Generator().manual_seed(0)
    batch = batch.with_(
        old_logprob=-torch.rand(shape, generator=gen),
        ref_logprob=-torch.rand(shape, generator=gen),
        advantages=torch.randn(shape, generator=gen),
    )
    logprob, entropy = forward_logprobs(native.model, batch, entropy="grad")
    native_loss, native_metrics = native._actor_loss(logprob, entropy, batch)

    loss_fn = pickle.loads(pickle.dumps(ActorLoss.from_config(config)))
    td = left_right_2_no_padding(batch_to_dataproto(batch).to_tensordict())
    tu.assign_non_tensor(td, batch_num_tokens=float(batch["action_mask"].sum()), dp_size=1)
    model_output = {"log_probs": _nested_like(logprob, td), "entropy": _nested_like(entropy, td)}
    verl_loss, verl_metrics = loss_fn(model_output=model_output, data=td)

    params = [p for p in native.model.parameters() if p.requires_grad]

    def grads(loss):
        out = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        return torch.cat(
            [(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(out, params)]
        )

    torch.testing.assert_close(verl_loss, native_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads(verl_loss), grads(native_loss), rtol=1e-5, atol=1e-7)
    for key in ("pg_loss", "kl_loss", "entropy_loss", "entropy"):
        assert verl_metrics[key] == pytest.approx(native_metrics[f"actor/{key}"], rel=1e-6), key
