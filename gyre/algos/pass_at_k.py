"""Evaluation metrics over k samples per prompt: the unbiased pass@k estimator and mean@k.

With n samples of a prompt of which c are correct, pass@k is the probability that at least one of k
samples drawn from the n without replacement is correct (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", the Codex paper): 1 - C(n - c, k) / C(n, k). Drawing k of the n (n >= k)
gives an unbiased estimate of the pass@k of the model, where the plain "any of the first k correct"
is noisier. mean@k is the mean score over the k samples (the fraction correct, for correctness).
"""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` correct among ``n`` samples (1 <= k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(correct: list[list[bool]], k: int) -> float:
    """pass@k averaged over prompts; ``correct[i]`` holds the correctness of prompt i's samples."""
    if not correct:
        raise ValueError("pass@k of no prompts")
    return sum(pass_at_k(len(row), sum(bool(x) for x in row), k) for row in correct) / len(correct)


def mean_at_k(scores: list[list[float]]) -> float:
    """The mean over prompts of each prompt's mean sample score (equal weight per prompt)."""
    if not scores or any(not row for row in scores):
        raise ValueError("mean@k needs at least one sample of every prompt")
    return sum(sum(float(x) for x in row) / len(row) for row in scores) / len(scores)


def default_ks(n: int) -> list[int]:
    """The k values reported for n samples: powers of two below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]
