"""The three token limits of a model section (``max_model_len``, ``max_prompt_tokens``,
``max_response_tokens``), derived and checked by Trinity-RFT's rules for the trained model, the
rollout model and each auxiliary model (:func:`derive_token_limits`)."""

from __future__ import annotations

import logging
from typing import Any

from trinity.config.errors import ConfigError

logger = logging.getLogger("trinity.config.resolve")


def derive_token_limits(m: Any, key: str, *, auxiliary: bool = False) -> None:
    """Trinity-RFT's rules for the three token limits of a model section (``model``, the rollout
    model, an auxiliary model), applied in place:

    - ``max_model_len`` unset: ``max_prompt_tokens + max_response_tokens`` (both must be set);
    - neither per-part limit set: half of ``max_model_len`` each (the prompt gets the floor);
    - one of them set: the other is what is left of ``max_model_len`` (the one given is first
      lowered to ``max_model_len - 1`` so that the other keeps a token);
    - ``min_response_tokens`` not below ``max_response_tokens``: lowered to one below it.

    Enforced at rollout (:mod:`trinity.rollout.base`): a prompt over
    ``max_prompt_tokens`` is masked out (``enable_prompt_truncation``) or refused, and no
    response runs past ``max_model_len``.

    ``auxiliary``: an auxiliary model's limits may add up to more than its ``max_model_len``
    (Trinity-RFT checks only the trained model's; its RULER example gives its judge 12288 +
    12288 in 16384): a warning, its replies then stop at ``max_model_len``.
    """
    derived: list[str] = []
    if m.max_model_len is None:
        if m.max_prompt_tokens is None or m.max_response_tokens is None:
            raise ConfigError(
                f"not set and cannot be derived; set {key}.max_model_len, or both {key}.max_prompt_tokens "
                f"and {key}.max_response_tokens (max_model_len = their sum)",
                key=f"{key}.max_model_len",
            )
        m.max_model_len = m.max_prompt_tokens + m.max_response_tokens
        derived.append("max_model_len")
    if (
        auxiliary
        and None not in (m.max_prompt_tokens, m.max_response_tokens)
        and (m.max_prompt_tokens + m.max_response_tokens > m.max_model_len)
    ):
        logger.warning(
            "%s: max_prompt_tokens + max_response_tokens (%d + %d) exceed max_model_len %d: a reply to a "
            "long prompt stops at max_model_len",
            key,
            m.max_prompt_tokens,
            m.max_response_tokens,
            m.max_model_len,
        )
    else:
        check_model_len(m, key)
    if m.max_model_len < 2:
        raise ConfigError(
            f"{m.max_model_len} leaves no room for a prompt and a reply; use at least 2",
            key=f"{key}.max_model_len",
        )
    if m.max_prompt_tokens is None and m.max_response_tokens is None:
        m.max_prompt_tokens = m.max_model_len // 2
        m.max_response_tokens = m.max_model_len - m.max_prompt_tokens
        derived += ["max_prompt_tokens", "max_response_tokens"]
    elif m.max_prompt_tokens is None:
        m.max_response_tokens = min(m.max_response_tokens, m.max_model_len - 1)
        m.max_prompt_tokens = m.max_model_len - m.max_response_tokens
        derived.append("max_prompt_tokens")
    elif m.max_response_tokens is None:
        m.max_prompt_tokens = min(m.max_prompt_tokens, m.max_model_len - 1)
        m.max_response_tokens = m.max_model_len - m.max_prompt_tokens
        derived.append("max_response_tokens")
    if derived:
        logger.info(
            "%s: %s derived (max_model_len %d = max_prompt_tokens %d + max_response_tokens %d)",
            key,
            ", ".join(derived),
            m.max_model_len,
            m.max_prompt_tokens,
            m.max_response_tokens,
        )
    if (m.min_response_tokens or 0) >= m.max_response_tokens:
        lowered = m.max_response_tokens - 1
        logger.warning(
            "%s.min_response_tokens %d is not below max_response_tokens %d; lowered to %d",
            key,
            m.min_response_tokens,
            m.max_response_tokens,
            lowered,
        )
        m.min_response_tokens = lowered


def check_model_len(m: Any, key: str) -> None:
    """``max_model_len`` must hold the longest prompt plus the longest response (when all are set)."""
    if None in (m.max_model_len, m.max_prompt_tokens, m.max_response_tokens):
        return
    needed = m.max_prompt_tokens + m.max_response_tokens
    if m.max_model_len < needed:
        raise ConfigError(
            f"{m.max_model_len} is smaller than {key}.max_prompt_tokens + {key}.max_response_tokens "
            f"({m.max_prompt_tokens} + {m.max_response_tokens} = {needed}); raise max_model_len or lower "
            "the token limits",
            key=f"{key}.max_model_len",
        )
