"""A checkpoint's tokenizer and chat template behind the agent's `Tokenizer` protocol.

The agent asks for whole turns (a prompt, or observations appended after a model turn) and
for the tokens that open the assistant's turn. Chat templates render whole conversations,
so a turn is rendered as the difference between the conversation with it and without it,
after a fixed system message: that keeps a template's default system prompt (SmolLM2 adds
one when the first message is not a system message) from being repeated in every
observation. Templates whose output is not prefix-stable this way are rendered directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_core.models.tokenizer import Message
from rl_core.pretrained.chat_template import render_chat_template
from rl_core.pretrained.errors import ChatTemplateError
from rl_core.pretrained.tokenizers_io import CheckpointTokenizer

_ANCHOR: Message = {"role": "system", "content": "."}
_PROBE: Message = {"role": "user", "content": "."}
# Turn-end markers of the common template families, by preference; else the eos token.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>")


class ChatTokenizer:
    """`rl_core.models.tokenizer.Tokenizer` over a `CheckpointTokenizer` and its chat template."""

    def __init__(self, tokenizer: CheckpointTokenizer, chat_template: str | None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        found = (tokenizer.token_to_id(t) for t in _END_OF_TURN)
        self._end_of_turn = next((i for i in found if i is not None), tokenizer.eos_id)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def end_of_turn_id(self) -> int:
        return self._end_of_turn

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special=skip_special)

    def render_messages(self, messages: Sequence[Message]) -> list[int]:
        if messages and messages[0].get("role") == "system":
            return self.encode(self._render(messages, generation=False))
        return self.encode(self._suffix([_ANCHOR], [_ANCHOR, *messages], generation=False))

    def assistant_prefix(self) -> list[int]:
        base = [_ANCHOR, _PROBE]
        return self.encode(self._suffix(base, base, generation=True))

    def _suffix(self, head: list[Message], full: list[Message], *, generation: bool) -> str:
        before = self._render(head, generation=False)
        after = self._render(full, generation=generation)
        if not after.startswith(before):
            raise ChatTemplateError(
                "the chat template does not render a conversation as a prefix of its "
                "continuation; set agent.chat_template to a template that does"
            )
        return after[len(before) :]

    def _render(self, messages: Sequence[Message], *, generation: bool) -> str:
        if self.chat_template is None:
            raise ChatTemplateError(
                "the checkpoint has no chat template; set agent.chat_template in the spec"
            )
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=generation,
            special_tokens=self.tokenizer.special_tokens,
        )
