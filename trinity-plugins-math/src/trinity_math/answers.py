"""Finding the answer in a response or a reference: ``<answer>`` tags, ``\\boxed{}``, GSM8K ``####``.

Pure text handling (no math-verify): what is *equal* is decided in :mod:`trinity_math.verify`.
"""

from __future__ import annotations

import re

_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
_BOXED = ("\\boxed", "\\fbox")


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` pair in ``text`` (stripped), else ``None``.

    The last pair counts because models often restate or correct themselves; an unclosed tag
    is no answer.
    """
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    Nested braces (``\\boxed{\\frac{1}{2}}``) and nested boxes are kept whole; ``\\boxed 5``
    (no braces) gives ``5``. An unclosed last box gives ``None``.
    """
    start = max(text.rfind(name) for name in _BOXED)
    if start < 0:
        return None
    name = "\\boxed" if text.startswith("\\boxed", start) else "\\fbox"
    i = start + len(name)
    if i < len(text) and text[i] == " ":
        # ``\boxed 5``: the argument is the next token.
        rest = text[i:].split()
        return rest[0].rstrip("$.") if rest else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def reference_answer(truth: str) -> str:
    """The final answer inside a reference solution.

    GSM8K rows (``... #### 1,234``) give the part after ``####`` without thousands
    separators; solutions with a ``\\boxed{}`` give its content; anything else is returned
    stripped, as is.
    """
    final = _GSM8K_FINAL.search(truth)
    if final:
        return final.group(1).replace(",", "").strip()
    boxed = last_boxed(truth)
    if boxed is not None:
        return boxed
    return truth.strip()


def think_is_well_formed(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order."""
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    return text.index("<think>") < text.index("</think>")
