"""A checkpoint's own tokenizer, built with the ``tokenizers`` library.

Two sources:

- a Hugging Face folder: ``tokenizer.json`` as is, special tokens named by
  ``tokenizer_config.json`` (falling back to the ids in ``config.json``);
- a GGUF file's metadata (llama.cpp keys). Only byte-level BPE (``tokenizer.ggml.model =
  "gpt2"``: SmolLM, Qwen2/3, Llama 3) is built: the vocabulary is
  ``tokenizer.ggml.tokens`` (already spelled in the GPT-2 byte alphabet), the merges
  ``tokenizer.ggml.merges``, tokens typed CONTROL (3) become special added tokens and
  USER_DEFINED (4) plain added tokens, so they are matched whole in text. The
  pre-tokenizer follows ``tokenizer.ggml.pre``, the name llama.cpp gives the split its
  vocabulary was trained with (a name we do not know is an error, not a guess: a wrong split
  changes token ids silently).

``encode`` adds no special tokens unless asked (chat templates write their own BOS), and
``decode`` drops special tokens unless asked, as the RL core's `Tokenizer` protocol does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from rl_core.pretrained.errors import TokenizerError

if TYPE_CHECKING:
    from rl_core.pretrained.gguf import GGUFFile
    from rl_core.pretrained.hf_config import ArchConfig

# llama.cpp token types (llama_token_type): 1 normal, 2 unknown, 3 control, 4 user defined,
# 5 unused, 6 byte.
_CONTROL: Final = 3
_USER_DEFINED: Final = 4

# Split patterns of the vocabularies llama.cpp names in `tokenizer.ggml.pre`. GPT-2's own
# pattern is the one `ByteLevel(use_regex=True)` applies.
_QWEN2_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# pre name -> how text is split before byte-level BPE
_GPT2: Final = "gpt2"
_DIGITS_THEN_GPT2: Final = "digits+gpt2"  # every digit alone, then GPT-2's pattern (StarCoder)
_PRE_TOKENIZERS: Final[dict[str, str]] = {
    "default": _GPT2,
    "gpt2": _GPT2,
    "gpt-2": _GPT2,
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
}
SPECIAL_TOKEN_NAMES: Final = ("bos_token", "eos_token", "unk_token", "pad_token")


class CheckpointTokenizer:
    """Text <-> token ids with a checkpoint's vocabulary (a ``tokenizers.Tokenizer`` inside).

    ``vocab_size`` counts the tokenizer's tokens, added ones included; a model's embedding
    may have more rows (padding), never fewer. ``pad_id`` falls back to ``eos_id`` when the
    checkpoint names no pad token.
    """

    def __init__(self, backend: Tokenizer, special_tokens: Mapping[str, str | None]) -> None:
        self.backend = backend
        self._special: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            token = special_tokens.get(name)
            if token is None:
                continue
            if backend.token_to_id(token) is None:
                raise TokenizerError(f"{name} {token!r} is not in the vocabulary")
            self._special[name] = token
        if "eos_token" not in self._special:
            raise TokenizerError("the checkpoint names no end-of-sequence token (eos_token)")

    # the Tokenizer protocol -------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int:
        return self._id("eos_token")

    @property
    def pad_id(self) -> int:
        return self._id("pad_token") if "pad_token" in self._special else self.eos_id

    @property
    def bos_id(self) -> int | None:
        return self._id("bos_token") if "bos_token" in self._special else None

    @property
    def unk_id(self) -> int | None:
        return self._id("unk_token") if "unk_token" in self._special else None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special))

    def token_to_id(self, token: str) -> int | None:
        found = self.backend.token_to_id(token)
        return None if found is None else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        found = self.backend.id_to_token(token_id)
        return None if found is None else str(found)

    @property
    def special_tokens(self) -> dict[str, str]:
        """``{"bos_token": "<s>", "eos_token": ...}``: what chat templates see by those names."""
        return dict(self._special)

    def _id(self, name: str) -> int:
        found = self.backend.token_to_id(self._special[name])
        assert found is not None  # checked in __init__
        return int(found)

    # construction -----------------------------------------------------------------------

    @classmethod
    def from_hf_dir(
        cls, directory: str | Path, config: ArchConfig | None = None
    ) -> CheckpointTokenizer:
        """From ``tokenizer.json`` (+ ``tokenizer_config.json``; ids of ``config`` as fallback)."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{directory} has no tokenizer.json")
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception on a bad file
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({err})") from err
        settings = _read_json(directory / "tokenizer_config.json")
        special: dict[str, str | None] = {
            name: _token_content(settings.get(name)) for name in SPECIAL_TOKEN_NAMES
        }
        if config is not None:
            fallback = {
                "bos_token": config.bos_token_id,
                "eos_token": config.eos_token_id,
                "pad_token": config.pad_token_id,
            }
            for name, token_id in fallback.items():
                if special.get(name) is None and token_id is not None:
                    special[name] = backend.id_to_token(token_id)
        return cls(backend, special)

    @classmethod
    def from_gguf(cls, file: GGUFFile) -> CheckpointTokenizer:
        """From the ``tokenizer.ggml.*`` metadata of a GGUF file (byte-level BPE only)."""
        kind = file.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(
                f"{file.path.name}: tokenizer.ggml.model = {kind!r}; only byte-level BPE "
                "('gpt2') vocabularies are built from GGUF metadata"
            )
        tokens: list[str] = file.get("tokenizer.ggml.tokens") or []
        merges: list[str] = file.get("tokenizer.ggml.merges") or []
        if not tokens or not merges:
            missing = "tokenizer.ggml.tokens" if not tokens else "tokenizer.ggml.merges"
            raise TokenizerError(f"{file.path.name}: {missing} is missing or empty")
        token_types: list[int] = file.get("tokenizer.ggml.token_type") or []
        pre = file.get("tokenizer.ggml.pre", "default")

        vocab: dict[str, int] = {}
        for index, token in enumerate(tokens):
            if token in vocab:
                raise TokenizerError(
                    f"{file.path.name}: token {token!r} appears twice in tokenizer.ggml.tokens "
                    f"(ids {vocab[token]} and {index})"
                )
            vocab[token] = index
        pairs: list[tuple[str, str]] = []
        for merge in merges:
            left, sep, right = merge.partition(" ")
            if not sep or not left or not right or " " in right:
                raise TokenizerError(f"{file.path.name}: malformed merge {merge!r}")
            pairs.append((left, right))

        backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        backend.pre_tokenizer = _pre_tokenizer(pre, file.path.name)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(token_types)
                if t == _CONTROL
            ]
        )
        backend.add_tokens(
            [
                AddedToken(tokens[i], special=False, normalized=False)
                for i, t in enumerate(token_types)
                if t == _USER_DEFINED
            ]
        )

        def token_of(key: str) -> str | None:
            index = file.get(key)
            if index is None:
                return None
            if isinstance(index, bool) or not isinstance(index, int):
                raise TokenizerError(f"{file.path.name}: {key} = {index!r} is not a token id")
            if not 0 <= index < len(tokens):
                raise TokenizerError(f"{file.path.name}: {key} = {index} is outside the vocabulary")
            return str(tokens[index])

        special = {
            "bos_token": token_of("tokenizer.ggml.bos_token_id"),
            "eos_token": token_of("tokenizer.ggml.eos_token_id"),
            "unk_token": token_of("tokenizer.ggml.unknown_token_id"),
            "pad_token": token_of("tokenizer.ggml.padding_token_id"),
        }
        backend.post_processor = _post_processor(
            bos=special["bos_token"] if file.get("tokenizer.ggml.add_bos_token", False) else None,
            eos=special["eos_token"] if file.get("tokenizer.ggml.add_eos_token", False) else None,
            vocab=vocab,
        )
        return cls(backend, special)


def _pre_tokenizer(pre: str, where: str) -> pre_tokenizers.PreTokenizer:
    split = _PRE_TOKENIZERS.get(pre)
    if split is None:
        raise TokenizerError(
            f"{where}: tokenizer.ggml.pre = {pre!r} is not a split we know "
            f"(known: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    if split == _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _post_processor(
    *, bos: str | None, eos: str | None, vocab: Mapping[str, int]
) -> processors.PostProcessor:
    """BOS/EOS around a sequence when the file asks for them (``add_bos_token``)."""
    head = f"{bos}:0 " if bos else ""
    tail = f" {eos}:0" if eos else ""
    pair_head = f"{bos}:1 " if bos else ""
    pair_tail = f" {eos}:1" if eos else ""
    specials = [(t, vocab[t]) for t in dict.fromkeys(x for x in (bos, eos) if x)]
    return processors.TemplateProcessing(
        single=f"{head}$A:0{tail}",
        pair=f"{head}$A:0{tail} {pair_head}$B:1{pair_tail}",
        special_tokens=specials,
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise TokenizerError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return value


def _token_content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None
