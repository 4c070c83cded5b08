"""`ChatSession`: one client-driven episode, answered by the run's engine and recorded.

::

    session = ChatSession("s-1", engine=engine, tokenizer=tokenizer, config=config)
    request = parse_request(body)  # raises ChatCompletionError (OpenAI's error body)
    answer = await session.complete(request)  # ChatCompletion, or ChatCompletionError
    events = stream_completion(answer) if request.stream else None
    text = await session.complete_text(parse_completion_request(body))  # legacy /completions
    ...
    trajectory = session.finish(reward=1.0)  # for the trainer

Every call is sampled with the run's sampler (`SessionConfig.sampling`): the trainer
scores the recorded tokens under it (the logprobs at the run's temperature), so a
request whose ``temperature`` or ``top_p`` differ is refused, naming the field,
rather than sampled another way or silently overridden. ``max_tokens`` is an upper
bound under the session's own ``max_new_tokens`` and ``max_context``. ``stop``
strings are applied to the sampled tokens (`rl_core.sessions.stop`): what is recorded,
counted in ``usage`` and given logprobs for is the tokens the answer stands for.

Calls are recorded in the order they finish. A session is meant for one
conversation at a time; concurrent calls are answered, but each can only extend
the one recorded before it, so branches show up as prefix breaks.
"""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from collections.abc import Callable, Sequence

from rl_core.agent.ledger import Trajectory
from rl_core.errors import RlCoreError
from rl_core.models.tokenizer import Tokenizer
from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    ChatCompletionRequest,
    Choice,
    Usage,
)
from rl_core.protocol.completions import CompletionChoice, CompletionRequest, TextCompletion
from rl_core.protocol.responses import Response, ResponsesRequest
from rl_core.records import EpisodeEnd
from rl_core.rollout.base import Completion, RolloutEngine, SamplingParams
from rl_core.sessions.ledger import SessionLedger
from rl_core.sessions.render import ReplyKey, render_prompt, reply_key, splice
from rl_core.sessions.reply import (
    SampledText,
    read_reply,
    read_text,
    recorded,
    text_logprobs,
    token_logprobs,
)
from rl_core.sessions.responses import ResponseStore


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionConfig:
    sampling: SamplingParams  # the run's sampler
    max_new_tokens: int = 512  # per call
    max_context: int = 4096  # prompt + completion tokens of one call

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.max_context < 2:
            raise ValueError("max_new_tokens must be at least 1 and max_context at least 2")


class ChatSession:
    def __init__(
        self,
        session_id: str,
        *,
        engine: RolloutEngine,
        tokenizer: Tokenizer,
        config: SessionConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.session_id = session_id
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.ledger = SessionLedger()
        self._clock = clock
        self._replies: dict[ReplyKey, str] = {}  # each answer -> the text the model sampled
        self._finished = False
        self.spliced = 0  # calls whose history came back as other tokens, spliced (render.py)
        self.responses = ResponseStore(session_id)  # Responses API calls, by id

    async def complete(self, request: ChatCompletionRequest) -> ChatCompletion:
        """Answer one call and record it; `ChatCompletionError` for what cannot be served."""
        self._check_open()
        self._check_sampling(request.temperature, request.top_p)
        try:
            prompt = render_prompt(request, self.tokenizer, self._replies)
        except (ValueError, RlCoreError) as exc:
            raise ChatCompletionError(
                f"the model's chat template cannot render these messages: {exc}",
                param="messages",
                code="invalid_value",
            ) from exc
        prompt = self._spliced(prompt)
        completion = await self._generate(prompt, request.token_limit, request.seed, "messages")
        # Read and recorded with no await between: ``turn`` is the index the ledger gives
        # (concurrent calls are recorded in the order they end).
        turn = len(self.ledger.calls)
        reply = read_reply(
            completion,
            self.tokenizer,
            calls_tools=request.calls_tools,
            id_prefix=f"call_{turn}",
            stop=request.stop or (),
        )
        sampled = reply.sampled
        self.ledger.record(prompt, recorded(completion, sampled))
        self._replies[reply_key(reply.message)] = sampled.text
        logprobs = None
        if request.logprobs:
            n = sampled.text_tokens
            logprobs = token_logprobs(
                completion.tokens[:n], completion.logprobs[:n], self.tokenizer
            )
        return ChatCompletion(
            id=f"chatcmpl-{self.session_id}-{turn}",
            created=int(self._clock()),
            model=request.model,
            choices=[
                Choice(message=reply.message, logprobs=logprobs, finish_reason=reply.finish_reason)
            ],
            usage=_usage(prompt, sampled),
        )

    async def respond(self, request: ResponsesRequest) -> Response:
        """A Responses API call, answered as the chat call it stands for and kept by id
        for ``previous_response_id`` (`rl_core.sessions.responses`)."""
        return await self.responses.respond(request, self.complete)

    async def complete_text(self, request: CompletionRequest) -> TextCompletion:
        """Answer one legacy completions call and record it in the same ledger.

        The prompt is the client's text encoded as it is, with no chat template: the
        client owns the formatting. A prompt that extends the session's tokens so far
        (by token ids, or by text where the model's own tokens can be spliced back, as
        for chat) joins the current sample; any other starts one, a counted prefix
        break. So a session may mix the two kinds of call.
        """
        self._check_open()
        self._check_sampling(request.temperature, request.top_p)
        prompt = self.tokenizer.encode(request.prompt)
        if not prompt:
            raise ChatCompletionError(
                "the prompt encodes to no tokens; send some text",
                param="prompt",
                code="invalid_value",
            )
        prompt = self._spliced(prompt)
        completion = await self._generate(prompt, request.token_limit, request.seed, "prompt")
        turn = len(self.ledger.calls)  # no await from here to the record, as in `complete`
        sampled = read_text(completion, self.tokenizer, request.stop or ())
        self.ledger.record(prompt, recorded(completion, sampled))
        logprobs = None
        if request.logprobs is not None:
            n = sampled.text_tokens
            logprobs = text_logprobs(
                completion.tokens[:n],
                completion.logprobs[:n],
                self.tokenizer,
                start=len(request.prompt),
            )
        choice = CompletionChoice(
            text=sampled.shown, logprobs=logprobs, finish_reason=sampled.finish_reason
        )
        return TextCompletion(
            id=f"cmpl-{self.session_id}-{turn}",
            created=int(self._clock()),
            model=request.model,
            choices=[choice],
            usage=_usage(prompt, sampled),
        )

    def finish(
        self,
        reward: float,
        *,
        turn_rewards: Sequence[float] | None = None,
        end_state: EpisodeEnd = "done",
        end_reason: str | None = "client_done",
    ) -> Trajectory:
        """End the session and assemble its trajectory (see `SessionLedger.trajectory`)."""
        sampling = self.config.sampling
        trajectory = self.ledger.trajectory(
            self.session_id,
            reward=reward,
            turn_rewards=turn_rewards,
            end_state=end_state,
            end_reason=end_reason,
            sampling={
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,
            },
            info={"session_id": self.session_id, "spliced": self.spliced},
        )
        self._finished = True
        return trajectory

    def _check_open(self) -> None:
        if self._finished:
            raise ChatCompletionError(
                f"session {self.session_id!r} is finished; start a new session",
                code="session_finished",
                status=409,
            )

    def _check_sampling(self, temperature: float | None, top_p: float | None) -> None:
        run = self.config.sampling
        for field, asked, used in (
            ("temperature", temperature, run.temperature),
            ("top_p", top_p, run.top_p),
        ):
            if asked is not None and not math.isclose(asked, used, abs_tol=1e-6):
                raise ChatCompletionError(
                    f"{field} {asked} is not this run's sampler ({field} {used}): the trainer "
                    f"scores the sampled tokens under the run's sampler. Omit {field}, or "
                    f"send {used}",
                    param=field,
                    code="unsupported_value",
                )

    def _spliced(self, prompt: list[int]) -> list[int]:
        """``prompt`` with the session's own tokens spliced back where its text holds them."""
        if not self.ledger.samples:
            return prompt
        last = self.ledger.samples[-1]
        spliced = splice(prompt, last.tokens, self.tokenizer, sampled=last.loss_mask)
        if spliced is None or spliced == prompt:
            return prompt
        self.spliced += 1
        return spliced

    async def _generate(
        self, prompt: list[int], token_limit: int | None, seed: int | None, param: str
    ) -> Completion:
        """One engine call under the run's sampler and the tightest of the limits."""
        room = self.config.max_context - len(prompt)
        if room < 1:
            raise ChatCompletionError(
                f"the prompt is {len(prompt)} tokens; this session's context is "
                f"{self.config.max_context}. Shorten the {param}",
                param=param,
                code="context_length_exceeded",
            )
        limit = min(self.config.max_new_tokens, room, token_limit or room)
        if seed is None:
            seed = self._seed(len(self.ledger.calls))
        (completion,) = await self.engine.generate(
            [prompt], max_new_tokens=limit, sampling=self.config.sampling, seeds=[seed]
        )
        return completion

    def _seed(self, turn: int) -> int:
        # Distinct per session and call, the same on a replay of the session.
        return zlib.crc32(f"{self.session_id}/{turn}".encode()) & 0x7FFFFFFF


def _usage(prompt: Sequence[int], sampled: SampledText) -> Usage:
    return Usage(
        prompt_tokens=len(prompt),
        completion_tokens=sampled.kept,
        total_tokens=len(prompt) + sampled.kept,
    )


__all__ = ["ChatSession", "SessionConfig"]
