"""Stop sequences: where an answer ends when its text reaches one of the client's strings.

The engine stops only at the model's end-of-turn token or at the token limit, so a
request's ``stop`` strings are applied to the finished completion, as OpenAI
describes them: the answer ends where the first stop string appears, the string left
out, with ``finish_reason: "stop"``.

The cut is made between tokens, never inside one. The completion keeps the sampled
tokens up to and including the first one whose text completes a stop string, and
those are what the session records and the trainer trains on: what the model sampled,
its logprobs, nothing re-tokenised. The tokens after it were sampled but never shown
to the client, and are dropped: each kept token was drawn given only the tokens before
it, so what is kept is a sample of the policy as an engine that stopped there would
have drawn it.

The client reads the kept tokens' text before the stop string. The whole text of the
kept tokens (the stop string, and whatever else the last token holds after it,
included) is what the session renders when the client sends the answer back
(`rl_core.sessions.render`): the next call then continues the recorded tokens, and
the template closes the turn the model never closed, as after a turn cut at the
token limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_core.models.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class StopCut:
    kept: int  # tokens up to and including the first whose text completes a stop string
    shown: str  # what the client reads: the kept tokens' text before the stop string
    text: str  # the kept tokens' whole text, the stop string included


def find_stop(tokens: Sequence[int], stops: Sequence[str], tokenizer: Tokenizer) -> StopCut | None:
    """``tokens`` cut after the first token whose text completes one of ``stops``; None when
    their text holds none. Text is decoded as the answer reads it (special tokens left out).
    """
    if not stops or not tokens:
        return None

    def holds_stop(n: int) -> bool:
        text = tokenizer.decode(tokens[:n])
        return any(s in text for s in stops)

    if not holds_stop(len(tokens)):
        return None
    # The shortest prefix whose text holds a stop string, by bisection: a prefix's text only
    # grows as tokens are added (but for an incomplete character at its end, which no stop
    # string matches), and decoding every prefix of a long answer in turn would hold the
    # event loop for a good part of a second (2000 tokens of SmolLM2: 0.3 s).
    without, with_stop = 0, len(tokens)
    while with_stop - without > 1:
        middle = (without + with_stop) // 2
        if holds_stop(middle):
            with_stop = middle
        else:
            without = middle
    text = tokenizer.decode(tokens[:with_stop])
    # Every stop string the text holds ends in its last token; the earliest start leaves
    # none of them in what the client reads.
    start = min(i for s in stops if (i := text.find(s)) >= 0)
    return StopCut(kept=with_stop, shown=text[:start], text=text)


__all__ = ["StopCut", "find_stop"]
