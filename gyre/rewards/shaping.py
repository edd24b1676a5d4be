"""Shaping terms, each meant to be added to a base reward (composition is wired elsewhere).

- ``format_reward``: ``score`` when the whole response matches a regex (default: it contains a
  ``\\boxed{...}`` with something in it), else ``penalty``. Prior art: the format rewards of DeepSeek-R1
  style training and ROLL's agentic ``format_penalty`` (-0.001 to -0.05 for an unparsable action).
  Deviation: the default regex is a linear-time equivalent of ``(?s).*\\\\boxed\\{.+\\}.*`` (see
  ``BOXED_PATTERN``).
- ``overlong_penalty``: DAPO's soft overlong punishment (arXiv 2503.14476) for one response, from its token
  count: 0 up to ``max_tokens - cache_tokens``, then linear down to -1 at ``max_tokens``, -1 beyond. It wraps
  ``gyre.algos.masks.soft_overlong_penalty`` so that the reward transform and this term cannot disagree.
  Unlike the others it is not a ``fn(response, ground_truth)`` reward: the response's token count is not
  recoverable from its text without the tokenizer.
- ``length_penalty``: ``-coef * max(0, len(response) - target_chars)``, a character-level stand-in for a
  token-length penalty that needs no tokenizer.

All return plain floats; none reports ``correct``, which is the base reward's business.
"""

from __future__ import annotations

import re

# Matches exactly what r"(?s).*\\boxed\{.+\}.*" matches (a box opener, then at least one character, then a
# "}"), but in linear time: that form backtracks quadratically on a response full of unclosed boxes,
# because each "\boxed{" makes ".+" scan to the end again. Here the prefix stops at the first opener.
BOXED_PATTERN = r"(?s)(?:(?!\\boxed\{).)*\\boxed\{.+\}.*"


def format_reward(response: str, ground_truth: str = "", pattern: str = BOXED_PATTERN, score: float = 1.0,
                  penalty: float = 0.0) -> float:
    """``score`` when ``pattern`` fullmatches the response (with re.DOTALL, so "." spans lines), else
    ``penalty``. ``ground_truth`` is unused; it is there to fit the reward-function contract."""
    return float(score) if re.fullmatch(pattern, response, re.DOTALL) else float(penalty)


def overlong_penalty(response_tokens: int, max_tokens: int, cache_tokens: int) -> float:
    """DAPO soft overlong punishment for one response of ``response_tokens`` tokens, in [-1, 0]."""
    # Imported here: the text-only terms should not make a reward worker process load torch.
    import torch

    from gyre.algos.masks import soft_overlong_penalty

    lengths = torch.tensor([response_tokens], dtype=torch.float64)
    return float(soft_overlong_penalty(lengths, max_tokens, cache_tokens)[0])


def length_penalty(response: str, ground_truth: str = "", target_chars: int = 1000, coef: float = 0.001) -> float:
    """``-coef`` per character beyond ``target_chars`` (0 at or below it)."""
    if target_chars < 0 or coef < 0:
        raise ValueError(f"need target_chars >= 0 and coef >= 0, got target_chars={target_chars}, coef={coef}")
    return -coef * max(0, len(response) - target_chars)
