"""`ChatSession`: one client-driven episode, answered by the run's engine and recorded.

::

    session = ChatSession("s-1", engine=engine, tokenizer=tokenizer, config=config)
    request = parse_request(body)  # raises ChatCompletionError (OpenAI's error body)
    answer = await session.complete(request)  # ChatCompletion, or ChatCompletionError
    events = stream_completion(answer) if request.stream else None
    text = await session.complete_text(parse_completion_request(body))  # legacy /completions
    ...
    trajectory = session.finish(reward=1.0)  # for the trainer

Each call is sampled with the run's sampler (`SessionConfig.sampling`), or with the
client's ``temperature``, ``top_p``, penalties and ``top_k`` within the run's bounds
(`SessionConfig.client_sampling`, `rl_core.sessions.sampling`), and under a grammar
when the request asks for strict tools, a forced tool choice, one call at most or a
JSON answer (`rl_core.sessions.grammar`). The logprobs recorded are those of the
distribution each token was drawn from (the client's sampler, the grammar's mask),
and each call's sampler is kept with it (`CallRecord`, and ``call_samplers`` in the
trajectory's info). ``max_tokens`` is an upper bound under the session's own
``max_new_tokens`` and ``max_context``. ``stop`` strings are applied to the sampled
tokens (`rl_core.sessions.stop`): what is recorded, counted in ``usage`` and given
logprobs for is the tokens the answer stands for. A refused call names every problem
of the request in one error.

Calls are recorded in the order they finish. A session is meant for one
conversation at a time; concurrent calls are answered, but each can only extend
the one recorded before it, so branches show up as prefix breaks.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from rl_core.agent.ledger import Trajectory
from rl_core.errors import RlCoreError, RolloutError
from rl_core.models.tokenizer import Tokenizer
from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    ChatCompletionRequest,
    Choice,
    Problem,
    Usage,
    refusal,
)
from rl_core.protocol.completions import CompletionChoice, CompletionRequest, TextCompletion
from rl_core.protocol.responses import Response, ResponsesRequest
from rl_core.records import EpisodeEnd
from rl_core.rollout.base import Completion, Grammar, RolloutEngine, SamplingParams
from rl_core.sessions.grammar import output_grammar, schema_problems
from rl_core.sessions.ledger import SessionLedger
from rl_core.sessions.render import SampledReplies, render_prompt, splice
from rl_core.sessions.reply import (
    SampledText,
    read_reply,
    read_text,
    recorded,
    text_logprobs,
    token_logprobs,
)
from rl_core.sessions.responses import ResponseStore
from rl_core.sessions.sampling import Asked, ClientSampling, call_sampler, is_run_sampler


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionConfig:
    sampling: SamplingParams  # the run's sampler
    max_new_tokens: int = 512  # per call
    max_context: int = 4096  # prompt + completion tokens of one call
    # What of the sampler a client may choose (the spec's rollout.client_sampling).
    client_sampling: ClientSampling = dataclasses.field(default_factory=ClientSampling)

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
        self._replies = SampledReplies()  # each answer -> the text the model sampled
        self._finished = False
        self.spliced = 0  # calls whose history came back as other tokens, spliced (render.py)
        self.responses = ResponseStore(session_id)  # Responses API calls, by id

    async def complete(self, request: ChatCompletionRequest) -> ChatCompletion:
        """Answer one call and record it; `ChatCompletionError` for what cannot be served."""
        self._check_open()
        sampling, problems = self._sampler(request)
        problems += schema_problems(request)
        if problems:
            raise refusal(problems)
        grammar = output_grammar(request)
        try:
            prompt = render_prompt(request, self.tokenizer, self._replies)
        except (ValueError, RlCoreError) as exc:
            raise ChatCompletionError(
                f"the model's chat template cannot render these messages: {exc}",
                param="messages",
                code="invalid_value",
            ) from exc
        prompt = self._spliced(prompt)
        top = request.top_logprobs_asked
        call = _Call(sampling, grammar, top)
        completion = await self._generate(
            prompt, request.token_limit, request.seed, "messages", call
        )
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
        self._record(prompt, recorded(completion, sampled), call)
        self._replies.add(reply.message, sampled.text)
        logprobs = None
        if request.logprobs:
            n = sampled.text_tokens
            logprobs = token_logprobs(
                completion.tokens[:n],
                completion.logprobs[:n],
                self.tokenizer,
                top=_top(completion, n, top),
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
        sampling, problems = self._sampler(request)
        if problems:
            raise refusal(problems)
        prompt = self.tokenizer.encode(request.prompt)
        if not prompt:
            raise ChatCompletionError(
                "the prompt encodes to no tokens; send some text",
                param="prompt",
                code="invalid_value",
            )
        prompt = self._spliced(prompt)
        top = request.logprobs or 0
        call = _Call(sampling, None, top)
        completion = await self._generate(prompt, request.token_limit, request.seed, "prompt", call)
        turn = len(self.ledger.calls)  # no await from here to the record, as in `complete`
        sampled = read_text(completion, self.tokenizer, request.stop or ())
        self._record(prompt, recorded(completion, sampled), call)
        logprobs = None
        if request.logprobs is not None:
            n = sampled.text_tokens
            logprobs = text_logprobs(
                completion.tokens[:n],
                completion.logprobs[:n],
                self.tokenizer,
                start=len(request.prompt),
                top=_top(completion, n, top),
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
            info={
                "session_id": self.session_id,
                "spliced": self.spliced,
                "constrained": sum(c.constrained for c in self.ledger.calls),
                "call_samplers": self._call_samplers(),
            },
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

    def _sampler(
        self, request: ChatCompletionRequest | CompletionRequest
    ) -> tuple[SamplingParams, list[Problem]]:
        asked = Asked(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
        )
        return call_sampler(self.config.sampling, self.config.client_sampling, asked)

    def _record(self, prompt: list[int], completion: Completion, call: _Call) -> None:
        run = self.config.sampling
        sampling = None if is_run_sampler(run, call.sampling) else call.sampling
        self.ledger.record(
            prompt, completion, sampling=sampling, constrained=call.grammar is not None
        )

    def _call_samplers(self) -> list[dict[str, Any]]:
        """Each call sampled with other than the run's sampler: its index and sampler."""
        return [
            {"call": i, **dataclasses.asdict(c.sampling)}
            for i, c in enumerate(self.ledger.calls)
            if c.sampling is not None
        ]

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
        self, prompt: list[int], token_limit: int | None, seed: int | None, param: str, call: _Call
    ) -> Completion:
        """One engine call under the call's sampler and grammar and the tightest of the limits.

        An engine that does not serve what the call asks for (a grammar, alternatives,
        penalties: `rl_core.rollout.base.refuse_unserved`) refuses it; the client reads
        that reason, as a 400, rather than a server failure.
        """
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
        try:
            # Asked for only when used, so an engine written before the seam had them
            # still serves every call that needs neither.
            extra: dict[str, Any] = {}
            if call.grammar is not None:
                extra["grammars"] = [call.grammar]
            if call.top_logprobs:
                extra["top_logprobs"] = call.top_logprobs
            (completion,) = await self.engine.generate(
                [prompt], max_new_tokens=limit, sampling=call.sampling, seeds=[seed], **extra
            )
        except RolloutError as exc:
            if not (call.asks_engine_features and "does not serve" in str(exc)):
                raise
            raise ChatCompletionError(
                f"this run's engine cannot serve this call: {exc}. Leave out what it names",
                code="unsupported_value",
            ) from exc
        return completion

    def _seed(self, turn: int) -> int:
        # Distinct per session and call, the same on a replay of the session.
        return zlib.crc32(f"{self.session_id}/{turn}".encode()) & 0x7FFFFFFF


@dataclasses.dataclass(frozen=True)
class _Call:
    """How one call is sampled."""

    sampling: SamplingParams
    grammar: Grammar | None
    top_logprobs: int

    @property
    def asks_engine_features(self) -> bool:
        s = self.sampling
        penalties = bool(s.frequency_penalty or s.presence_penalty)
        return self.grammar is not None or self.top_logprobs > 0 or penalties


def _top(completion: Completion, n: int, k: int) -> list[list[tuple[int, float]]] | None:
    """The first ``n`` tokens' ``k`` alternatives (None when none were asked for)."""
    if not k or completion.top_logprobs is None:
        return None
    return [list(alternatives[:k]) for alternatives in completion.top_logprobs[:n]]


def _usage(prompt: Sequence[int], sampled: SampledText) -> Usage:
    return Usage(
        prompt_tokens=len(prompt),
        completion_tokens=sampled.kept,
        total_tokens=len(prompt) + sampled.kept,
    )


__all__ = ["ChatSession", "SessionConfig"]
