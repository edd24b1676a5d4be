"""Final answers in free text: the content of the last ``\\boxed{...}`` (MATH's convention).

Read by the data loader (a ground truth given as a worked solution) and by the rewards that extract a
response's answer (``gyre.rewards.math``, ``gyre.rewards.choice``), so both find the same box.
"""

from __future__ import annotations

import re

# A box opener, an escaped brace or "\\" (skipped so that "\\{" is not read as an escaped brace), a brace.
_BOX_TOKENS = re.compile(r"\\boxed\s*\{|\\[\\{}]|[{}]")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` to close, braces matched (nested ``\\frac{1}{2}`` included,
    escaped ``\\{`` ignored); None if no box closes. One pass, linear in ``len(text)`` even for adversarial
    input such as thousands of unclosed boxes."""
    start = text.find("\\boxed")
    if start < 0:
        return None
    stack: list[int] = []  # per open brace: where the box content starts, or -1 for a plain brace
    last = None
    for m in _BOX_TOKENS.finditer(text, start):
        token = m.group()
        if token == "{":
            stack.append(-1)
        elif token == "}":
            if stack:  # a stray "}" closes nothing
                begin = stack.pop()
                if begin >= 0:
                    last = (begin, m.start())
        elif token.startswith("\\boxed"):
            stack.append(m.end())
    return None if last is None else text[last[0]:last[1]]
