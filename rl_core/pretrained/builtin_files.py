"""The builtin tokenizer of ``builtin:*`` models as Hugging Face tokenizer files.

So an exported random-init model is a complete Hugging Face folder: ``AutoTokenizer``
encodes text to the ids rlaas trained on, and its chat template renders the turns
`BuiltinTokenizer.render_messages` does. The vocabulary is a ``WordLevel`` model over
single characters (every character is its own pre-token) with the specials and the game
words as added tokens, which the ``tokenizers`` library matches leftmost-longest first: the
builtin tokenizer's greedy longest match. One difference: a special marker typed inside
a text (``"<|end|>"``) is that special token here, and its characters in rlaas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_core.models.tokenizer import BuiltinTokenizer

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def hf_tokenizer(tokenizer: BuiltinTokenizer) -> Any:
    """A ``tokenizers.Tokenizer`` that encodes as ``tokenizer`` does (ids included)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    pieces = tokenizer.pieces
    out = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    out.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    out.decoder = decoders.Fuse()  # pieces join as they are: no spaces between them
    out.add_special_tokens(
        [AddedToken(p, special=True, normalized=False) for p in tokenizer.special_pieces]
    )
    out.add_tokens([AddedToken(p, special=False, normalized=False) for p in tokenizer.words])
    return out


def write_tokenizer_files(tokenizer: BuiltinTokenizer, directory: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (chat template included)."""
    hf_tokenizer(tokenizer).save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2) + "\n", encoding="utf-8"
    )
