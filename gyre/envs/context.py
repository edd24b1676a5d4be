"""A multi-turn conversation's token ids, built turn by turn: token in, token out.

The model's turns are kept as the exact ids it sampled; only what the environment says is tokenised,
each observation once, as the tokens that close the model's turn and open the next (the chat
template's delta). Earlier turns are never re-tokenised, so the ids trained on are the ids sampled.

With a chat template the delta comes from a fixed two-message conversation: the text the template
writes after an assistant message, then a user message and the generation prompt. Without one, every
observation (the first too) is followed by a newline and later ones are preceded by one:
``obs0\n turn1 \nobs1\n turn2 ...`` (``plain_transcript`` writes the same text).

An observation of chat messages (``{"messages": [...], "tools": [...]}``: an agent program's requests,
``gyre.envs.agent``) is rendered by the template as it is: the first whole (with the tools' schemas), a
later one as the text the template writes for those messages after an assistant turn, read off a probe
conversation the same way (so tool results take the template's tool role, not the user's).
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.envs.protocol import EnvError

_PROBE_USER, _PROBE_REPLY = "<<gyre-user-probe>>", "<<gyre-reply-probe>>"
_PROBE = ({"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY})


@dataclass(frozen=True)
class TurnFrame:
    """The chat template's text around a turn (empty strings without a template)."""

    closing: str
    """What the template writes after an assistant message's content (e.g. "<|im_end|>\\n")."""
    opening: str
    """What it writes before a user message's content, up to the content."""
    prompt: str
    """What comes after a user message's content, through the generation prompt."""
    replied: str = ""
    """The probe conversation (a user message and the assistant's reply) as the template writes it."""


class ContextBuilder:
    def __init__(self, tokenizer, use_template: bool, system: str | None = None):
        self.tokenizer, self.use_template, self.system = tokenizer, use_template, system
        self.frame = _frame(tokenizer) if use_template else TurnFrame("", "\n", "\n")
        self.eos_ids = _eos_ids(tokenizer)

    def first(self, observation: str | dict) -> list[int]:
        """The prompt of the first turn."""
        if isinstance(observation, dict):
            return self._first_messages(observation["messages"], observation.get("tools"))
        if not self.use_template:
            text = (self.system + "\n" if self.system else "") + observation + self.frame.prompt
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": observation}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def observation(self, response_ids: list[int], observation: str | dict) -> list[int]:
        """The ids that follow the model's turn ``response_ids``: the end of its turn (unless it sampled
        the end-of-turn token itself), then ``observation`` as the next user message (or, chat messages,
        as the template writes them) and the prompt."""
        closing = self.frame.closing
        if response_ids and response_ids[-1] in self.eos_ids:
            eos_text = self.tokenizer.decode([response_ids[-1]])
            closing = closing[len(eos_text):] if closing.startswith(eos_text) else closing
        if isinstance(observation, dict):
            body = self._after_turn(observation["messages"])
        else:
            body = self.frame.opening + observation + self.frame.prompt
        return list(self.tokenizer(closing + body, add_special_tokens=False)["input_ids"])

    def _first_messages(self, messages: list[dict], tools: list | None) -> list[int]:
        if not self.use_template:
            text = "\n".join(m.get("content") or "" for m in messages) + self.frame.prompt
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if self.system and not (messages and messages[0]["role"] == "system"):
            messages = [{"role": "system", "content": self.system}, *messages]
        text = _render(self.tokenizer, messages, tools=tools or None)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _after_turn(self, messages: list[dict]) -> str:
        """What the template writes for ``messages`` after an assistant turn's closing, through the next
        generation prompt (without a template: their contents on lines of their own)."""
        if not self.use_template:
            return "".join(f"{self.frame.opening}{m.get('content') or ''}" for m in messages) + self.frame.prompt
        before = self.frame.replied
        after = _render(self.tokenizer, [*_PROBE, *messages])
        if not after.startswith(before):
            raise EnvError("the tokenizer's chat template rewrites earlier turns when these messages follow "
                             f"(roles {[m['role'] for m in messages]}): a conversation cannot grow token by token")
        return after[len(before):]


def _render(tokenizer, messages: list[dict], tools: list | None = None) -> str:
    """The template's text for an environment's (an agent's) messages; what it cannot render is the
    environment's mistake (an EnvError: that episode fails, the run goes on)."""
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - jinja2's errors, a template's raise_exception, bad values
        raise EnvError(f"the chat template cannot render these messages (roles {[m.get('role') for m in messages]})"
                       f": {type(exc).__name__}: {str(exc)[:200]}") from exc


def _frame(tokenizer) -> TurnFrame:
    """The template's text around turns, read off a probe conversation (raises if the template is not
    a plain concatenation of turns, which token-in/token-out needs)."""
    asked = tokenizer.apply_chat_template(list(_PROBE[:1]), tokenize=False, add_generation_prompt=True)
    replied = tokenizer.apply_chat_template(list(_PROBE), tokenize=False)
    again = tokenizer.apply_chat_template([*_PROBE, _PROBE[0]], tokenize=False, add_generation_prompt=True)
    if not (replied.startswith(asked + _PROBE_REPLY) and again.startswith(replied)):
        raise ValueError("the tokenizer's chat template rewrites earlier turns (e.g. drops reasoning), so a "
                         "conversation cannot grow token by token: set data.chat_template: never, or use a "
                         "template that appends turns")
    closing = replied[len(asked) + len(_PROBE_REPLY):]
    rest = again[len(replied):]
    opening, _, prompt = rest.partition(_PROBE_USER)
    return TurnFrame(closing, opening, prompt, replied)


def _eos_ids(tokenizer) -> set[int]:
    ids = tokenizer.eos_token_id
    out = set(ids) if isinstance(ids, list) else ({ids} if ids is not None else set())
    return out


def plain_transcript(observations: list[str], actions: list[str], system: str | None = None) -> str:
    """The text a template-less conversation has before the model's next turn, given the observations so
    far and the actions between them (one fewer): what ``ContextBuilder`` builds, as text (for SFT rows)."""
    text = (system + "\n" if system else "") + observations[0] + "\n"
    for action, observation in zip(actions, observations[1:]):
        text += action + "\n" + observation + "\n"
    return text
