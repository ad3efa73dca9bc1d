"""Task selectors for curricula: ``offline_easy2hard`` and ``difficulty_based`` (BOTS).

Both read per-row difficulty features named by ``data_selector.feature_keys``; numpy is imported
inside methods, so importing this module (``trinity plugins`` does) stays light.

``offline_easy2hard``: a fixed curriculum. Rows are sorted once by their feature values,
highest first (higher = easier, e.g. a reference model's pass rate), ties by the later row
first; every epoch reads that order again. No feedback, no state beyond the read position.

``difficulty_based`` (BOTS, Trinity-RFT's ``DifficultyBasedSelector``): every row has a Beta
posterior of the policy's pass rate, ``Beta(alpha, beta)``. The two feature keys are reference
pass rates of a weaker and a stronger model (``f0``, ``f1``); after each explore step the
observed pass rates (mean reward over a task's rollouts) update

* the policy's capability estimate ``c`` (where its batch pass rate falls between the batch's
  mean ``f0`` and mean ``f1``; the first estimate, then an exponential average with
  ``cap_coef_update_discount``), which interpolates a prior ``p~ = clip(f0 + (f1 - f0) c, 0, 1)``
  for every row (rows observed now take their observed value instead);
* every row's posterior: ``alpha <- (1 - lamb) alpha + lamb + (1 - rho) s + rho m p~`` and
  ``beta <- (1 - lamb) beta + lamb + (1 - rho) f + rho m (1 - p~)``, where ``s = m * pass rate``
  and ``f = m * (1 - pass rate)`` for the rows observed now (0 elsewhere). With
  ``adaptive_rho``, ``rho`` halves whenever the prior missed the observed pass rates by a mean
  absolute error of 0.25 or more.

Each request scores rows by ``-|target_reward - p|`` (``p``: the posterior mean, or a draw from
the posterior with ``do_sample``) and takes the ``count`` best (``tau: 0``) or samples ``count``
rows without replacement with probabilities ``softmax(score / tau)``. Draws are seeded by
``(seed, position)``; the posteriors are the selector's state, saved with the reader's position.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from trinity.buffer.selector import Selector

logger = logging.getLogger(__name__)


def _numbers(selector: str, key: str, values: Sequence[Any]) -> list[float]:
    """The column as floats; a missing, non-numeric or non-finite value is a ValueError that
    counts them and names the first row (0-based among the taskset's usable rows)."""
    out: list[float] = []
    bad: list[int] = []
    for i, value in enumerate(values):
        number = float(value) if isinstance(value, numbers.Real) else math.nan
        if not math.isfinite(number):
            bad.append(i)
        out.append(number)
    if bad:
        first = values[bad[0]]
        raise ValueError(
            f"{selector} needs a finite number in feature {key!r} of every row; {len(bad)} of "
            f"{len(values)} rows have none (first: usable row {bad[0]}, value {first!r:.40})"
        )
    return out


class OfflineEasy2HardSelector(Selector):
    """``offline_easy2hard``: rows sorted by ``feature_keys`` (compared in that order), highest
    (easiest) first, read in that order every epoch. Takes no ``kwargs``."""

    def __init__(
        self,
        size: int,
        *,
        seed: int = 42,
        features: Mapping[str, Sequence[Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(size, seed=seed, features=features, **kwargs)
        if not self.features:
            raise ValueError(
                "offline_easy2hard needs feature_keys: the columns rating each row's ease "
                "(higher = easier; rows are read from the highest down)"
            )
        columns = [_numbers("offline_easy2hard", key, values) for key, values in self.features.items()]
        keys = [(*(column[i] for column in columns), i) for i in range(size)]
        self.order: list[int] = sorted(range(size), key=keys.__getitem__, reverse=True)

    def index(self, position: int) -> int:
        return self.order[position % self.size]


class DifficultyBasedSelector(Selector):
    """``difficulty_based`` (BOTS): samples rows whose estimated pass rate is near
    ``target_reward``, learning the estimates from observed pass rates (see the module doc).

    ``feature_keys``: exactly two columns, the pass rates of a weaker and a stronger reference
    model. ``kwargs`` (Trinity-RFT's names and defaults): ``m`` (16, rollouts a pass rate counts
    for), ``lamb`` (0.2, forgetting of past estimates), ``rho`` (0.2, weight of the
    feature-interpolated prior), ``adaptive_rho`` (false), ``target_reward`` (1.0), ``tau``
    (1.0, sampling temperature; 0 takes the best rows), ``do_sample`` (false: score posterior
    means; true: posterior draws), and ``cap_coef_update_discount`` (0.9, fixed upstream).
    """

    def __init__(
        self,
        size: int,
        *,
        seed: int = 42,
        features: Mapping[str, Sequence[Any]] | None = None,
        m: float = 16,
        lamb: float = 0.2,
        rho: float = 0.2,
        adaptive_rho: bool = False,
        target_reward: float = 1.0,
        tau: float = 1.0,
        do_sample: bool = False,
        cap_coef_update_discount: float = 0.9,
        **kwargs: Any,
    ) -> None:
        super().__init__(size, seed=seed, features=features, **kwargs)
        import numpy as np

        if len(self.features) != 2:
            raise ValueError(
                "difficulty_based needs exactly 2 feature_keys (pass rates of a weaker and a stronger "
                f"reference model), got {len(self.features)}: {list(self.features)}"
            )
        for name, value, low, high in (
            ("m", m, 0, None),
            ("lamb", lamb, 0, 1),
            ("rho", rho, 0, 1),
            ("tau", tau, 0, None),
            ("cap_coef_update_discount", cap_coef_update_discount, 0, 1),
            ("target_reward", target_reward, None, None),
        ):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (low is not None and value < low) or (high is not None and value > high):
                bounds = (
                    f" in [{low}, {high}]" if high is not None else f" >= {low}" if low is not None else ""
                )
                raise ValueError(f"difficulty_based: {name} must be a number{bounds}, got {value!r}")
        if m == 0:
            raise ValueError("difficulty_based: m must be positive (the rollouts a pass rate counts for)")
        columns = [_numbers("difficulty_based", key, values) for key, values in self.features.items()]
        self.anchors = np.array(columns, dtype=float).T  # (size, 2): weaker, stronger model
        self.m = float(m)
        self.lamb = float(lamb)
        self.rho = float(rho)
        self.adaptive_rho = bool(adaptive_rho)
        self.target_reward = float(target_reward)
        self.tau = float(tau)
        self.do_sample = bool(do_sample)
        self.cap_coef_update_discount = float(cap_coef_update_discount)
        self.cap_coef: float | None = None
        self.alphas = np.ones(size, dtype=float)
        self.betas = np.ones(size, dtype=float)
        self._warned_clip = False

    # -- selection -----------------------------------------------------------------------

    def predicted_pass_rates(self, rng: Any = None) -> Any:
        """Posterior means, or (``do_sample`` and an ``rng``) one draw per row."""
        if self.do_sample and rng is not None:
            return rng.beta(self.alphas, self.betas)
        return self.alphas / (self.alphas + self.betas)

    def indices(self, start: int, count: int) -> list[int]:
        import numpy as np

        rng = np.random.default_rng([self.seed, start])
        scores = -np.abs(self.target_reward - self.predicted_pass_rates(rng))
        out: list[int] = []
        while len(out) < count:  # more than `size` rows asked: again without replacement
            # Gumbel top-k: the first k of a draw without replacement from softmax(scores / tau).
            keys = scores if self.tau == 0 else scores / self.tau + rng.gumbel(size=self.size)
            ranking = np.argsort(-keys, kind="stable")
            out.extend(int(i) for i in ranking[: count - len(out)])
        return out

    # -- feedback ------------------------------------------------------------------------

    def update(self, indices: Sequence[int], values: Sequence[float]) -> None:
        """Observed pass rates (clipped to [0, 1]; a row given twice counts its mean)."""
        import numpy as np

        if len(indices) != len(values):
            raise ValueError(f"update: {len(indices)} indices but {len(values)} values")
        per_row: dict[int, list[float]] = defaultdict(list)
        for i, v in zip(indices, values):
            v = float(v)
            if math.isfinite(v):
                per_row[int(i)].append(v)
        if not per_row:
            return
        rows = np.array(list(per_row), dtype=int)
        observed = np.array([math.fsum(v) / len(v) for v in per_row.values()])
        if ((observed < 0) | (observed > 1)).any() and not self._warned_clip:
            self._warned_clip = True
            logger.warning(
                "difficulty_based: observed rewards outside [0, 1] are clipped to be read as pass rates "
                "(seen: %s .. %s)",
                observed.min(),
                observed.max(),
            )
        observed = np.clip(observed, 0.0, 1.0)

        low, high = self.anchors[rows].mean(axis=0)
        estimate = (observed.mean() - low) / (high - low + 1e-6)
        if self.cap_coef is None:
            self.cap_coef = float(estimate)
        else:
            d = self.cap_coef_update_discount
            self.cap_coef = float(d * self.cap_coef + (1 - d) * estimate)
        prior = np.clip((self.anchors[:, 1] - self.anchors[:, 0]) * self.cap_coef + self.anchors[:, 0], 0, 1)
        error = float(np.mean(np.abs(prior[rows] - observed)))
        if self.adaptive_rho and error >= 0.25:
            self.rho *= 0.5
        logger.debug("difficulty_based: prior mean abs error %.3f, rho %.4f", error, self.rho)
        prior[rows] = observed
        successes = np.zeros(self.size)
        failures = np.zeros(self.size)
        successes[rows] = observed * self.m
        failures[rows] = (1 - observed) * self.m
        keep, rho, m = 1 - self.lamb, self.rho, self.m
        self.alphas = keep * self.alphas + self.lamb + (1 - rho) * successes + rho * prior * m
        self.betas = keep * self.betas + self.lamb + (1 - rho) * failures + rho * (1 - prior) * m

    # -- resume --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "alphas": self.alphas.tolist(),
            "betas": self.betas.tolist(),
            "cap_coef": self.cap_coef,
            "rho": self.rho,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import numpy as np

        alphas = np.asarray(state["alphas"], dtype=float)
        betas = np.asarray(state["betas"], dtype=float)
        if alphas.shape != (self.size,) or betas.shape != (self.size,):
            raise ValueError(
                f"difficulty_based: the saved state holds {alphas.size} rows but the taskset has "
                f"{self.size}; the dataset changed since the checkpoint"
            )
        self.alphas, self.betas = alphas, betas
        cap = state.get("cap_coef")
        self.cap_coef = None if cap is None else float(cap)
        self.rho = float(state.get("rho", self.rho))


#: The selectors of this plugin, by name (registered by ``trinity_algos.hooks``).
SELECTORS: dict[str, type[Selector]] = {
    "offline_easy2hard": OfflineEasy2HardSelector,
    "difficulty_based": DifficultyBasedSelector,
}
