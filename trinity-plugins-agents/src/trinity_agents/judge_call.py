"""A judge model asked through its OpenAI API: one call with a time limit that never raises.

The judged workflows here (``email_search_workflow``, ``agentscope_v1_react_search_workflow``)
each read the judge's reply their own way and fall back, counted, when there is none.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def ask_judge(
    judge: Any, messages: list[dict[str, Any]], timeout: float
) -> tuple[str | None, str, str]:
    """``(reply, failure, detail)``: the judge's reply to ``messages`` (``failure`` empty), or
    ``None`` with why: ``no_judge`` (``judge`` is ``None``: no ``explorer.auxiliary_models``),
    ``timeout`` (no reply within ``timeout`` seconds) or ``error`` (the call failed)."""
    if judge is None:
        return None, "no_judge", "no explorer.auxiliary_models configured"
    try:
        client = judge.get_openai_async_client()
        model_id = getattr(judge, "model_path", None) or judge.model_name
        try:
            completion = await asyncio.wait_for(
                client.chat.completions.create(model=model_id, messages=messages, stream=False), timeout
            )
        finally:
            await client.close()  # on this event loop: the workflow's loop may end after the run
        return completion.choices[0].message.content or "", "", ""
    except asyncio.TimeoutError:
        return None, "timeout", f"no reply within {timeout:g} s"
    except Exception as exc:  # any failure of the judge falls back, counted by the caller
        return None, "error", f"{type(exc).__name__}: {exc}"[:300]
