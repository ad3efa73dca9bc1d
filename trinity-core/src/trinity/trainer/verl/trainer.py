"""``VerlTrainer``: the veRL back-end (``trainer.trainer_type: verl``), on GPUs or on CPU.

Same interface as :class:`~trinity.trainer.native.NativeTrainer` (``train_step``,
``state_dict``, ``save_checkpoint``, ``load_checkpoint``, ``global_step``, ``tokenizer``), same
step (:mod:`trinity.trainer.step`, which runs the KL penalty and our ``AdvantageFn`` here, on the
driver); its primitives call veRL's FSDP worker groups:

- :meth:`~VerlTrainer.prepare`: experiences → our padded batch
  (:func:`~trinity.trainer.verl.dataproto.build_verl_batch`), padded to the world size per call;
- reference log-probs (``compute_ref_log_prob``), critic values (``infer_batch``), old log-probs
  and entropy (``compute_log_prob``);
- critic update (``train_mini_batch`` with veRL's value loss), then the actor update
  (``update_actor``) whose loss is our :class:`~trinity.trainer.verl.loss.ActorLoss`.

The workers are one Ray worker per trainer rank, the actor, reference model and critic colocated
in each, driven from the Trainer actor. Where the config or Ray has GPUs a rank is a GPU
(``trainer_gpu_split``); where neither has any, a rank is a gloo process on one CPU
(``trainer.trainer_config.trainer.n_gpus_per_node`` ranks, default 1), on this project's veRL
platform (:mod:`~trinity.trainer.verl.platform`) with the settings of
:data:`~trinity.trainer.verl.config.CPU_SETTINGS`. Their placement is reserved first, with a
time limit (:func:`place_workers`): a cluster without room fails in one line naming what is
missing instead of waiting for ever.
Checkpoints follow our layout (``<job_dir>/global_step_N/``, ``trainer_state.pt`` written last)
with veRL's sharded state in ``actor/`` and ``critic/`` and the Hugging Face weights veRL exports
linked into the step folder, so ``from_pretrained(global_step_N)`` works as with the native one.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import TYPE_CHECKING, Any

from trinity.trainer import checkpoint as ckpt
from trinity.trainer.components import AlgorithmComponents
from trinity.trainer.step import train_step
from trinity.trainer.verl.config import build_verl_config, total_training_steps
from trinity.trainer.verl.dataproto import batch_to_dataproto, build_verl_batch, pad_rows
from trinity.trainer.verl.loss import ActorLoss

if TYPE_CHECKING:
    import torch

    from trinity.config import Config
    from trinity.experience import Experience
    from trinity.trainer.batch import TrainBatch

logger = logging.getLogger(__name__)

HF_SUBDIR = os.path.join("actor", "huggingface")


def full_verl_config(translated: dict[str, Any]) -> Any:
    """``translated`` laid over veRL's own complete defaults (its generated PPO trainer YAML),
    interpolations resolved as veRL's ``main_ppo`` does: the workers get sub-sections, which
    must not depend on keys outside them."""
    import verl
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml")
    cfg = OmegaConf.merge(OmegaConf.load(path), OmegaConf.create(translated))
    OmegaConf.resolve(cfg)
    return cfg


#: Seconds to wait for Ray to place veRL's workers before failing with what is missing, unless
#: ``TRINITY_VERL_PLACEMENT_TIMEOUT_S`` says otherwise (a ``TRINITY_`` variable reaches the trainer
#: actor on any cluster). Short enough that a job which cannot start says so within a minute.
PLACEMENT_TIMEOUT_S = 45.0


def placement_timeout_s() -> float:
    """:data:`PLACEMENT_TIMEOUT_S`, or ``$TRINITY_VERL_PLACEMENT_TIMEOUT_S`` when set."""
    raw = os.environ.get("TRINITY_VERL_PLACEMENT_TIMEOUT_S", "").strip()
    if not raw:
        return PLACEMENT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(
            f"TRINITY_VERL_PLACEMENT_TIMEOUT_S must be a positive number of seconds, got {raw!r}"
        )
    return value


def cluster_size(config: Config) -> tuple[str, int, int]:
    """``(device, node_num, gpu_per_node)`` of the cluster veRL's workers are placed on.

    ``("cuda", nodes, gpus)`` from ``cluster.*``, or what Ray reports where the config says 0;
    ``("cpu", 0, 0)`` where neither the config nor Ray has a GPU: the workers then run on CPU
    with gloo, as many as :func:`~trinity.trainer.verl.config.cpu_trainer_split` says.
    """
    nodes, per_node = config.cluster.node_num, config.cluster.gpu_per_node
    if nodes and per_node:
        return "cuda", nodes, per_node
    import ray

    gpu_nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
    if not gpu_nodes:
        if per_node:
            raise RuntimeError(
                f"cluster.gpu_per_node is {per_node} but the Ray cluster reports no GPU; set it to 0 to "
                "train with veRL on CPU"
            )
        return "cpu", 0, 0
    return "cuda", nodes or len(gpu_nodes), per_node or int(gpu_nodes[0]["Resources"]["GPU"])


def _resources_line(ray: Any) -> str:
    """What the Ray cluster has, for placement errors: per alive node, free / total CPUs and GPUs."""
    free = ray.available_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = ", ".join(
        f"{n['Resources'].get('CPU', 0):g} CPU / {n['Resources'].get('GPU', 0):g} GPU" for n in nodes
    )
    return (
        f"Ray has {len(nodes)} node(s) ({per_node or 'none'}), {free.get('CPU', 0):g} CPU and "
        f"{free.get('GPU', 0):g} GPU free"
    )


def place_workers(nnodes: int, per_node: int, use_gpu: bool, name: str, timeout_s: float) -> list[Any]:
    """One placement group per node, ``per_node`` bundles each (one veRL rank per bundle: one CPU,
    and one GPU where ``use_gpu``), ready within ``timeout_s`` seconds.

    veRL creates the same groups itself but waits for them without a limit, so a job that asks
    for more than the cluster has would hang; a request no node can ever hold fails at once.
    Raises ``RuntimeError`` (one line naming what is missing).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {"CPU": 1.0, **({"GPU": 1.0} if use_gpu else {})}
    kind = "GPU" if use_gpu else "CPU"
    need = (
        f"the veRL trainer needs {nnodes} node(s) x {per_node} {kind} bundle(s) for its "
        f"{nnodes * per_node} rank(s) ({' + '.join(f'{v:g} {k}' for k, v in bundle.items())} each)"
    )
    if use_gpu:
        fix = "lower cluster.gpu_per_node, or the explorer's engine_num, or add GPUs"
    else:
        fix = (
            "lower trainer.trainer_config.trainer.n_gpus_per_node (ranks per node on CPU) or give Ray "
            "more CPUs"
        )
    fits = [
        n
        for n in ray.nodes()
        if n.get("Alive") and all(n["Resources"].get(k, 0) >= v * per_node for k, v in bundle.items())
    ]
    if len(fits) < nnodes:
        raise RuntimeError(
            f"{need}, and only {len(fits)} node(s) are that large; {_resources_line(ray)}; {fix}"
        )
    groups = [
        placement_group([dict(bundle) for _ in range(per_node)], strategy="STRICT_PACK", name=f"{name}_{i}")
        for i in range(nnodes)
    ]
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        line = f"{need}, and Ray could not place them in {timeout_s:g} s; {_resources_line(ray)}; {fix}"
        for group in groups:
            remove_placement_group(group)
        raise RuntimeError(line)
    return groups


def _log_cpu_settings(merged: dict[str, Any]) -> None:
    """Say once, in the trainer's log, that veRL runs on CPU and with which CPU-specific values."""
    from trinity.trainer.verl.config import cpu_settings_summary

    t = merged["trainer"]
    logger.info(
        "veRL trainer on CPU (Ray reports no GPU): %d node(s) x %d gloo rank(s); %s (see trinity-core/README.md)",
        t["nnodes"],
        t["n_gpus_per_node"],
        cpu_settings_summary(merged),
    )


def _mean(value: Any) -> float:
    if isinstance(value, (list, tuple)):
        flat = [float(v) for v in value if v is not None]
        return sum(flat) / len(flat) if flat else 0.0
    return float(value)


def _result(output: Any) -> Any:
    """A worker call's TensorDict; non-blocking calls return a future to wait on first."""
    from tensordict import TensorDictBase

    return output if isinstance(output, TensorDictBase) else output.get()


def _metrics(output: Any, prefix: str) -> dict[str, float]:
    from verl.utils import tensordict_utils as tu

    raw = tu.get(_result(output), "metrics") or {}
    # Our loss names carry no prefix; veRL's perf/… names keep theirs.
    return {(k if "/" in k else f"{prefix}/{k}"): _mean(v) for k, v in raw.items()}


class VerlTrainer:
    """Trains ``config.model.model_path`` with ``config.algorithm`` on veRL's FSDP workers.

    Args:
        config: a resolved :class:`~trinity.config.Config` with ``trainer.trainer_type: verl``.
        total_steps: training steps for warm-up ratios and the cosine schedule (as NativeTrainer).
        workers: ready worker groups by role (``actor``, ``ref``, ``critic``) instead of spawning
            veRL's; for tests of the driver alone (nothing is placed).
    """

    def __init__(
        self, config: Config, *, total_steps: int | None = None, workers: dict[str, Any] | None = None
    ) -> None:
        from transformers import AutoTokenizer

        self.config = config
        algo = config.algorithm
        # The same components, rules and checks as the native trainer; the loss part travels to
        # the workers as names (ActorLoss) and is rebuilt there by the same class.
        self.components = AlgorithmComponents.from_config(algo)
        self.algorithm_type = self.components.algorithm_type
        if self.algorithm_type.schema == "dpo":
            raise ValueError(
                f"algorithm {algo.algorithm_type!r} trains DPO pairs, which the veRL trainer does not support "
                "(its dynamic batching may split a pair); use trainer.trainer_type: native"
            )
        self.actor_loss = ActorLoss.from_config(config)
        self.use_ref = self.components.use_reference
        self.use_critic = bool(self.algorithm_type.use_critic)

        self.device, node_num, gpu_per_node = cluster_size(config)
        translated = build_verl_config(
            config, node_num=node_num, gpu_per_node=gpu_per_node, device=self.device
        )
        if self.device == "cpu":
            _log_cpu_settings(translated)
        steps = total_steps or total_training_steps(config)
        if steps:
            for section in (translated["actor_rollout_ref"]["actor"], translated["critic"]):
                section.setdefault("optim", {})["total_training_steps"] = steps
        self._group: Any = None
        self._placement_groups: list[Any] = []
        if workers is None:
            # Reserve the ranks' CPUs (and GPUs) first: a cluster without room for them fails here,
            # in seconds, before veRL is even imported.
            ranks = translated["trainer"]
            self._placement_groups = place_workers(
                int(ranks["nnodes"]),
                int(ranks["n_gpus_per_node"]),
                self.device != "cpu",
                f"{config.trainer.name}_verl",
                placement_timeout_s(),
            )
        try:
            self.verl_config = cfg = full_verl_config(translated)
            self.world_size = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node

            model_path = config.model.model_path
            self.tokenizer = AutoTokenizer.from_pretrained(
                model_path, trust_remote_code=config.model.trust_remote_code
            )
            self.pad_token_id = self.tokenizer.pad_token_id or 0

            self.workers = workers if workers is not None else self._spawn(cfg)
        except BaseException:
            self.close()  # the reserved CPUs/GPUs and any worker already started
            raise
        self.global_step = 0

    def _spawn(self, cfg: Any) -> dict[str, Any]:
        """veRL's worker groups, one colocated Ray worker per trainer rank, initialised.

        On GPUs a rank is a GPU; on CPU (no GPU in the config or in Ray) a gloo process on one
        CPU, with this project's veRL platform (:mod:`~trinity.trainer.verl.platform`).
        """
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.single_controller.ray.base import (
            create_colocated_worker_cls,
            sort_placement_group_by_node_ip,
        )
        from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

        from trinity.trainer.verl.platform import worker_env
        from trinity.trainer.verl.workers import TrinityActorWorker

        use_gpu = self.device != "cpu"
        name = f"{self.config.trainer.name}_verl"
        # One process per rank holds the actor, the reference model and the critic (colocated),
        # so a bundle needs one CPU (and one GPU), not veRL's default ten CPUs per GPU.
        pool = RayResourcePool(
            process_on_nodes=[cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes,
            use_gpu=use_gpu,
            name_prefix=name,
            max_colocate_count=1,
        )
        pool.pgs = sort_placement_group_by_node_ip(self._placement_groups)
        class_dict = {
            "actor": RayClassWithInitArgs(
                cls=ray.remote(TrinityActorWorker), config=cfg.actor_rollout_ref, role="actor"
            )
        }
        if self.use_ref:
            class_dict["ref"] = RayClassWithInitArgs(
                cls=ray.remote(ActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="ref"
            )
        critic_cfg = None
        if self.use_critic:
            critic_cfg, training_cfg = self._critic_configs(cfg)
            class_dict["critic"] = RayClassWithInitArgs(cls=ray.remote(TrainingWorker), config=training_cfg)
        group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict),
            device_name=self.device,
            # veRL picks its platform once per process, when it is first asked; CPU workers are
            # told to pick ours (a GPU host's CUDA platform would otherwise win there).
            worker_env={} if use_gpu else worker_env(),
        )
        self._group = group
        workers = group.spawn(prefix_set=list(class_dict))
        if critic_cfg is not None:
            from verl.workers.utils.losses import value_loss

            workers["critic"].reset()
            workers["critic"].set_loss_fn(partial(value_loss, config=critic_cfg))
        if self.use_ref:
            workers["ref"].init_model()
        workers["actor"].init_model()
        # veRL's actor installs its own PPO loss in init_model; ours replaces it.
        workers["actor"].set_loss_fn(self.actor_loss)
        return workers

    def close(self) -> None:
        """Stop veRL's workers and free their placement (CPUs/GPUs) now rather than when the Ray
        job ends: another trainer can then be placed on them (a resumed run, a test)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        group, self._group = self._group, None
        for worker in getattr(group, "workers", None) or []:
            ray.kill(worker)
        for placement in self._placement_groups:
            remove_placement_group(placement)
        self._placement_groups = []

    @staticmethod
    def _critic_configs(cfg: Any) -> tuple[Any, Any]:
        """veRL's critic dataclass and the training-worker config built from it (as veRL's trainer)."""
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import CriticConfig, TrainingWorkerConfig

        critic: CriticConfig = omega_conf_to_dataclass(cfg.critic)
        engine = critic.engine
        engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
        engine.max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
        training = TrainingWorkerConfig(
            model_type="value_model",
            model_config=critic.model,
            engine_config=engine,
            optimizer_config=critic.optim,
            checkpoint_config=critic.checkpoint,
        )
        return critic, training

    # -- one training step ----------------------------------------------------------------------

    def _tensordict(self, batch: TrainBatch, **meta: Any) -> Any:
        """veRL's unpadded TensorDict of ``batch`` (already padded to the world size)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        td = left_right_2_no_padding(batch_to_dataproto(batch, self.config.model.temperature).to_tensordict())
        tu.assign_non_tensor(td, **meta)
        return td

    def _infer(self, batch: TrainBatch, n: int, call: Any, key: str, **meta: Any) -> torch.Tensor:
        """Run a forward-only worker call; returns ``key`` as ``(n, T)`` float tensor."""
        return self._infer_keys(batch, n, call, (key,), **meta)[key]

    def _infer_keys(
        self, batch: TrainBatch, n: int, call: Any, keys: tuple[str, ...], **meta: Any
    ) -> dict[str, torch.Tensor]:
        """One forward-only worker call; each of ``keys`` as an ``(n, T)`` float tensor."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._tensordict(batch, compute_loss=False, **meta)
        output = _result(call(td))
        return {k: no_padding_2_padding(tu.get(output, k), td).float()[:n].cpu() for k in keys}

    # -- the step's primitives (trinity.trainer.step runs them) ----------------------------------

    #: veRL's workers give log-probs and entropy, not the whole distribution (no ``old_nec``).
    policy_stats_names = ("old_logprob", "old_entropy")
    #: veRL's update takes ``old_log_probs`` as input: the step computes them first.
    old_logprob_from_update = False

    def train_step(self, experiences: list[Experience]) -> dict[str, float]:
        """Train on one batch of experiences (:func:`trinity.trainer.step.train_step`); returns
        metrics with Trinity-RFT names."""
        return train_step(self, experiences)

    def prepare(self, experiences: list[Experience]) -> tuple[TrainBatch, None]:
        """Our padded batch with veRL's group keys (on CPU; each worker call pads it to the world
        size and sends it); no plan."""
        return build_verl_batch(experiences, self.pad_token_id), None

    def ref_logprobs(self, batch: TrainBatch, plan: None = None) -> torch.Tensor:
        """The reference workers' log-probs ``(B, T)`` (``compute_ref_log_prob``)."""
        padded, n = pad_rows(batch, self.world_size)
        call = self.workers["ref"].compute_ref_log_prob
        return self._infer(padded, n, call, "log_probs", calculate_entropy=False)

    def values(self, batch: TrainBatch, plan: None = None) -> torch.Tensor:
        """The critic workers' values ``(B, T)`` (``infer_batch``)."""
        padded, n = pad_rows(batch, self.world_size)
        return self._infer(padded, n, self.workers["critic"].infer_batch, "values")

    def policy_stats(self, batch: TrainBatch, plan: None, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """``old_logprob`` / ``old_entropy`` (those in ``names``) from one ``compute_log_prob``."""
        padded, n = pad_rows(batch, self.world_size)
        want_entropy = "old_entropy" in names
        keys = ("log_probs", "entropy") if want_entropy else ("log_probs",)
        call = self.workers["actor"].compute_log_prob
        out = self._infer_keys(padded, n, call, keys, calculate_entropy=want_entropy)
        ours = {"old_logprob": out["log_probs"], "old_entropy": out.get("entropy")}
        return {name: ours[name] for name in names}

    def _update_meta(self, padded: TrainBatch) -> dict[str, Any]:
        rows = padded.num_rows
        return {
            "global_batch_size": rows,
            "mini_batch_size": self._mini_batch_rows(rows),
            "epochs": self.config.trainer.ppo_epochs,
            "seed": self.config.trainer.seed,
            "dataloader_kwargs": {"shuffle": False},
            "global_step": self.global_step + 1,  # the policy loss's global_step (1-based)
        }

    def update_critic(self, batch: TrainBatch, plan: None = None) -> dict[str, float]:
        """The critic workers' ``train_mini_batch`` (veRL's value loss); metrics under ``critic/``."""
        padded, _ = pad_rows(batch, self.world_size)
        td = self._tensordict(padded, **self._update_meta(padded))
        return _metrics(self.workers["critic"].train_mini_batch(td), "critic")

    def update_actor(self, batch: TrainBatch, plan: None = None) -> tuple[dict[str, float], None]:
        """The actor workers' ``update_actor`` with our loss (:class:`ActorLoss`); metrics under
        ``actor/`` (``old_logprob`` never comes from here)."""
        padded, _ = pad_rows(batch, self.world_size)
        entropy = self.components.needs_entropy
        td = self._tensordict(
            padded, compute_loss=True, calculate_entropy=entropy, **self._update_meta(padded)
        )
        return _metrics(self.workers["actor"].update_actor(td), "actor"), None

    def _mini_batch_rows(self, rows: int) -> int:
        """Rows per optimizer step: veRL's ``ppo_mini_batch_size * rollout.n``, capped at the batch."""
        actor = self.verl_config.actor_rollout_ref
        mini = int(actor.actor.ppo_mini_batch_size) * int(actor.rollout.n)
        if mini >= rows or rows % mini or mini % self.world_size:
            return rows  # one optimizer step per epoch, as the native trainer does
        return mini

    # -- weights and checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The actor's full weights as CPU tensors with Hugging Face names (for weight sync)."""
        results = self.workers["actor"].export_weights()
        return next(r for r in results if r is not None)

    def save_checkpoint(self, step: int | None = None, extra_state: dict[str, Any] | None = None) -> str:
        """Save ``<job_dir>/global_step_<step>/`` (veRL shards in ``actor/``, ``critic/``); returns it."""
        import torch

        step = self.global_step if step is None else step
        path = ckpt.checkpoint_dir(self.config.job_dir, step)
        os.makedirs(path, exist_ok=True)
        self.workers["actor"].save_checkpoint(os.path.join(path, "actor"), None, step)
        if self.use_critic:
            self.workers["critic"].save_checkpoint(os.path.join(path, ckpt.CRITIC_DIR), None, step)
        self._link_hf_weights(path)
        self.tokenizer.save_pretrained(path)
        state = {"trainer_step": self.global_step, "global_step": step, "extra": extra_state or {}}
        # Written last: its presence is what marks the checkpoint complete (see trainer.checkpoint).
        torch.save({**state, "rng": ckpt.rng_state()}, os.path.join(path, ckpt.STATE_FILE))
        latest = os.path.join(self.config.job_dir, ckpt.LATEST_FILE)
        with open(f"{latest}.tmp", "w") as f:
            f.write(str(step))
        os.replace(f"{latest}.tmp", latest)
        t = self.config.trainer
        keep = t.max_actor_ckpt_to_keep or t.max_checkpoints_to_keep
        if keep:
            ckpt.prune_checkpoints(self.config.job_dir, keep)
        return path

    @staticmethod
    def _link_hf_weights(path: str) -> None:
        # veRL writes Hugging Face files to actor/huggingface; links make the step folder itself
        # loadable (explorer checkpoint sync, from_pretrained) without a second copy of the weights.
        hf_dir = os.path.join(path, HF_SUBDIR)
        if not os.path.isdir(hf_dir):
            return
        for name in os.listdir(hf_dir):
            link = os.path.join(path, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(HF_SUBDIR, name), link)

    def load_checkpoint(self, path: str | None = None) -> dict[str, Any] | None:
        """Restore the workers' weights and optimizers and the step from ``path`` (default: the
        job's latest checkpoint); returns the saved ``extra_state``, or ``None`` if there is none."""
        if path is None:
            found = ckpt.find_latest_checkpoint(self.config.job_dir)
            if found is None:
                return None
            path = found[1]
        state = ckpt.load_trainer_state(path)
        self.workers["actor"].load_checkpoint(os.path.join(path, "actor"), None, False)
        if self.use_critic:
            self.workers["critic"].load_checkpoint(os.path.join(path, ckpt.CRITIC_DIR), None, False)
        ckpt.set_rng_state(state["rng"])
        self.global_step = int(state["trainer_step"])
        return state.get("extra", {})


__all__ = [
    "PLACEMENT_TIMEOUT_S",
    "VerlTrainer",
    "cluster_size",
    "full_verl_config",
    "place_workers",
    "placement_timeout_s",
]
