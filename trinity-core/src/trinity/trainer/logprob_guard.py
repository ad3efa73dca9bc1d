"""The log-prob guard: warn once, with the likely cause, when the trainer and the engine disagree.

Every step compares the trainer's log-probs of the sampled tokens with the engine's
(``rollout/logprob_diff/{mean,max}``, a histogram of the difference; :mod:`trinity.trainer.metrics`).
Above ``trainer.logprob_guard_threshold`` (on the mean), :class:`LogprobGuard` warns once, naming
what differs between how the engine sampled and how the trainer scores (:func:`likely_causes`):

* the temperature: the trainer divides logits by ``model.temperature``; a taskset's
  ``rollout_args.temperature`` (or a workflow's own) samples at another one;
* top-k / top-p: vLLM reports log-probs renormalised over the tokens they keep
  (``processed_logprobs``), the trainer over the whole vocabulary;
* a repetition penalty the engine applied (recorded in ``info["rollout_args"]``; the built-in
  engines apply none);
* the dtype: a bf16 / fp16 engine against an fp32 trainer (or the reverse) rounds differently.

With ``trainer.logprob_guard_auto_correct`` it then switches ``algorithm.rollout_correction`` on
(veRL's defaults) for the rest of the run, from the next step.

The built-in engines record what they sampled with per experience
(``Experience.info["rollout_args"]``: temperature, top_p, top_k, ``logprobs_renormalised``;
:meth:`trinity.rollout.base.SamplingArgs.applied`), so a workflow's own settings are seen too;
any engine or workflow may record them (``repetition_penalty`` as well). They take precedence
over the configured ones.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config
    from trinity.config.sections.algorithm import RolloutCorrectionConfig

logger = logging.getLogger("trinity.trainer")

_DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def _dtype_name(value: Any) -> str | None:
    """``float32`` / ``bfloat16`` / ``float16`` for a name or a ``torch.dtype``; ``None`` if unknown."""
    if value is None:
        return None
    text = str(value).removeprefix("torch.").lower()
    return _DTYPE_NAMES.get(text)


def trainer_dtype(config: Config, backend: Any = None) -> str | None:
    """The dtype the trainer computes in: the back-end's ``compute_dtype`` when it has one, else
    ``trainer.dtype`` (``auto``: bfloat16 on a GPU, float32 elsewhere, as both back-ends resolve it)."""
    known = _dtype_name(getattr(backend, "compute_dtype", None))
    if known:
        return known
    name = config.trainer.dtype
    if name != "auto":
        return _dtype_name(name)
    device = getattr(backend, "device", None)
    if device is None:
        return None
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def _tasksets(config: Config) -> list[tuple[str, Any]]:
    ei = config.buffer.explorer_input
    found = [(f"buffer.explorer_input.tasksets[{i}]", ts) for i, ts in enumerate(ei.tasksets)]
    if ei.taskset is not None:
        found.append(("buffer.explorer_input.taskset", ei.taskset))
    return found


def _logprob_temperature(temperature: float) -> float:
    # Greedy calls (temperature 0) report log-probs at temperature 1.
    return temperature if temperature > 0 else 1.0


def likely_causes(config: Config, infos: list[dict[str, Any]], dtype: str | None) -> list[str]:
    """What differs between how the engine sampled (the configured tasksets' ``rollout_args``,
    overridden by the experiences' ``info["rollout_args"]``) and how the trainer scores
    (``model.temperature``, the whole vocabulary, no penalty, ``dtype``), most likely first."""
    trainer_t = config.model.temperature
    engine = config.explorer.rollout_model.engine_type
    causes: list[str] = []
    sampling: list[tuple[str, dict[str, Any]]] = []
    for key, ts in _tasksets(config):
        ra = ts.rollout_args
        sampling.append(
            (f"{key}.rollout_args", {"temperature": ra.temperature, "top_p": ra.top_p, "top_k": ra.top_k})
        )
    recorded = [info["rollout_args"] for info in infos if isinstance(info.get("rollout_args"), dict)]
    if recorded:
        sampling = [
            (f'the experiences\' info["rollout_args"] ({len(recorded)} of {len(infos)})', r) for r in recorded
        ]

    def values(name: str) -> list[tuple[str, Any]]:
        seen: dict[Any, str] = {}
        for where, args in sampling:
            value = args.get(name)
            if value is not None and value not in seen:
                seen[value] = where
        return [(where, value) for value, where in seen.items()]

    temps = [
        (w, t) for w, t in values("temperature") if abs(_logprob_temperature(float(t)) - trainer_t) > 1e-6
    ]
    if temps:
        shown = ", ".join(f"{t} ({w})" for w, t in temps)
        causes.append(
            f"temperature: the engine sampled at {shown} but the trainer scores at model.temperature "
            f"{trainer_t}; set them equal"
        )
    # vLLM renormalises its reported log-probs over what top-k / top-p keep, the transformers
    # engine reports the full softmax: the built-in engines say which in what they record; a
    # recording without it (another engine, a workflow) is taken to have applied them.
    if recorded:
        renormalises = any(r.get("logprobs_renormalised", True) for r in recorded)
    else:
        renormalises = engine == "vllm"
    cut = [(w, f"top_p {v}") for w, v in values("top_p") if float(v) < 1.0]
    cut += [(w, f"top_k {v}") for w, v in values("top_k") if int(v) > 0]
    if cut and renormalises:
        shown = ", ".join(f"{v} ({w})" for w, v in cut)
        causes.append(
            f"top-k/top-p: the engine reports log-probs renormalised over the tokens {shown} keeps, the "
            "trainer over the whole vocabulary; sample with top_p 1 and top_k -1, or correct with "
            "algorithm.rollout_correction"
        )
    penalties = [(w, p) for w, p in values("repetition_penalty") if float(p) != 1.0]
    if penalties:
        shown = ", ".join(f"{p} ({w})" for w, p in penalties)
        causes.append(
            f"repetition penalty: the engine applied {shown}, which changes its distribution; the "
            "trainer applies none"
        )
    engine_dtype = _dtype_name(config.explorer.rollout_model.dtype)
    if engine_dtype and dtype and engine_dtype != dtype:
        causes.append(
            f"dtype: the engine runs in {engine_dtype} (explorer.rollout_model.dtype), the trainer in "
            f"{dtype} (trainer.dtype); their log-probs round differently"
        )
    return causes


class LogprobGuard:
    """One trainer's guard: :meth:`check` each step's agreement metrics; warns once.

    :attr:`correction` is the rollout correction the guard switched on (``None`` until then).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.fired = False
        self.correction: RolloutCorrectionConfig | None = None

    def check(
        self, metrics: dict[str, float], infos: list[dict[str, Any]], backend: Any = None, step: int = 0
    ) -> bool:
        """Warn (once) when ``rollout/logprob_diff/mean`` of ``metrics`` is over the threshold;
        returns whether it warned now."""
        threshold = self.config.trainer.logprob_guard_threshold
        mean = metrics.get("rollout/logprob_diff/mean")
        if self.fired or threshold is None or mean is None or not mean > threshold:
            return False
        self.fired = True
        causes = likely_causes(self.config, infos, trainer_dtype(self.config, backend))
        if causes:
            cause = "likely cause: " + "; ".join(causes)
        else:
            cause = (
                "no sampling-setting or dtype difference found: check that the weights reach the engine "
                "(weight sync) and the off-policy lag (synchronizer.sync_offset, asynchronous sync)"
            )
        action = ""
        if (
            self.config.trainer.logprob_guard_auto_correct
            and self.config.algorithm.rollout_correction is None
        ):
            from trinity.config.sections.algorithm import RolloutCorrectionConfig

            self.correction = RolloutCorrectionConfig()
            action = "; rollout correction is now on (algorithm.rollout_correction, veRL's defaults) from the next step"
        logger.warning(
            "step %d: the trainer's log-probs of the sampled tokens are %.4g from the engine's on average "
            "(rollout/logprob_diff/mean; max %.4g), over trainer.logprob_guard_threshold %g; %s%s. "
            "This warning is shown once.",
            step,
            mean,
            metrics.get("rollout/logprob_diff/max", float("nan")),
            threshold,
            cause,
            action,
        )
        return True


_GUARDS: weakref.WeakKeyDictionary[Any, LogprobGuard] = weakref.WeakKeyDictionary()


def guard_for(backend: Any) -> LogprobGuard:
    """The guard of ``backend`` (one per trainer back-end, made on first use)."""
    guard = _GUARDS.get(backend)
    if guard is None or guard.config is not backend.config:
        guard = _GUARDS[backend] = LogprobGuard(backend.config)
    return guard


__all__ = ["LogprobGuard", "guard_for", "likely_causes", "trainer_dtype"]
