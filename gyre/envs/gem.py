"""gem-llm environments by id (``gem:<id>`` in a config), e.g. ``gem:game:GuessTheNumber-v0-easy``.

gem-llm is an optional extra (``pip install gyre[gem]``; it needs Python <= 3.12 and ``pylatexenc``,
which it uses without declaring). Its environments already follow the protocol gyre speaks. Importing
gem sets the root logger to INFO: the level is put back.
"""

from __future__ import annotations

import logging

from gyre.envs.protocol import EnvError


def make_gem(env_id: str, kwargs: dict):
    root = logging.getLogger()
    level = root.level
    try:
        import gem
    except ImportError as exc:
        raise EnvError(f"gem:{env_id} needs gem-llm: pip install 'gyre[gem]' (Python <= 3.12) ({exc})") from None
    finally:
        root.setLevel(level)
    try:
        return gem.make(env_id, **kwargs)
    except Exception as exc:  # noqa: BLE001 - gem raises several kinds for an unknown or broken id
        raise EnvError(f"gem could not make {env_id!r}: {type(exc).__name__}: {exc}") from None
