"""Configs of the ecosystem environment kinds: ``reasoning_gym`` and ``openenv`` (pure pydantic).

A spec names them as ``environment.name`` and configures them in
``environment.config`` (docs/ecosystem.md). The control plane checks a config
here when a run is submitted (``check_config``), so a bad one is a 422 naming
the field, before any compute is spent; the worker's environments
(``rl_core.envs.reasoning_gym``, ``rl_core.envs.openenv``) parse the same
models. Nothing here imports the ecosystem's packages: reasoning-gym takes
seconds to import, and the control plane does not install it, so the dataset
names it registers are listed here (`REASONING_GYM_DATASETS`, reasoning-gym
0.1.25; a test holds the list equal to the installed package's registry).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

REASONING_GYM = "reasoning_gym"
OPENENV = "openenv"
KINDS = (REASONING_GYM, OPENENV)

REASONING_GYM_DATASETS: tuple[str, ...] = (
    "ab",
    "acre",
    "advanced_geometry",
    "aiw",
    "arc_1d",
    "arc_agi",
    "base_conversion",
    "basic_arithmetic",
    "bf",
    "binary_alternation",
    "binary_matrix",
    "bitwise_arithmetic",
    "boxnet",
    "caesar_cipher",
    "calendar_arithmetic",
    "chain_sum",
    "circuit_logic",
    "codeio",
    "coin_flip",
    "color_cube_rotation",
    "complex_arithmetic",
    "composite",
    "count_bits",
    "count_primes",
    "countdown",
    "course_schedule",
    "cryptarithm",
    "decimal_arithmetic",
    "decimal_chain_sum",
    "dice",
    "emoji_mystery",
    "family_relationships",
    "figlet_font",
    "fraction_simplification",
    "futoshiki",
    "game_of_life",
    "game_of_life_halting",
    "gcd",
    "graph_color",
    "group_anagrams",
    "gsm_symbolic",
    "intermediate_integration",
    "isomorphic_strings",
    "jugs",
    "kakurasu",
    "knight_swap",
    "knights_knaves",
    "largest_island",
    "lcm",
    "leg_counting",
    "letter_counting",
    "letter_jumble",
    "list_functions",
    "mahjong_puzzle",
    "manipulate_matrix",
    "maze",
    "mini_sudoku",
    "modulo_grid",
    "n_queens",
    "needle_haystack",
    "number_filtering",
    "number_format",
    "number_sequence",
    "number_sorting",
    "palindrome_generation",
    "palindrome_partitioning",
    "path_star",
    "polynomial_equations",
    "polynomial_multiplication",
    "pool_matrix",
    "power_function",
    "prime_factorization",
    "products",
    "propositional_logic",
    "puzzle24",
    "quantum_lock",
    "ransom_note",
    "rearc",
    "rectangle_count",
    "rotate_matrix",
    "rotten_oranges",
    "rubiks_cube",
    "rush_hour",
    "self_reference",
    "sentence_reordering",
    "shortest_path",
    "simple_equations",
    "simple_geometry",
    "simple_integration",
    "sokoban",
    "spell_backward",
    "spiral_matrix",
    "string_insertion",
    "string_manipulation",
    "string_splitting",
    "string_synthesis",
    "sudoku",
    "survo",
    "syllogism",
    "time_intervals",
    "tower_of_hanoi",
    "tsumego",
    "word_ladder",
    "word_sequence_reversal",
    "word_sorting",
    "zebra_puzzles",
)

# Set by our own fields (`ReasoningGymConfig.seed`, `.size`), never by ``dataset_config``.
_OWN_KEYS = ("seed", "size")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReasoningGymConfig(_Config):
    """One reasoning-gym dataset as an environment: an episode is the task at index
    ``reset seed % size`` of the dataset generated from ``seed``."""

    dataset: Annotated[str, Field(min_length=1, max_length=100)]
    # Keyword arguments of the dataset's own config class (reasoning-gym's docs list them).
    dataset_config: dict[str, Any] = Field(default_factory=dict)
    size: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    # Answers the model may give: a wrong one (score under 1) gets the task again while
    # attempts are left; the episode's reward is the last answer's score.
    attempts: Annotated[int, Field(ge=1, le=16)] = 1
    # A system message before the question: one of reasoning-gym's SYSTEM_PROMPTS by name
    # ("default" asks for the answer in <answer></answer> tags); None: the question alone.
    system_prompt: Annotated[str, Field(max_length=100)] | None = None

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value not in REASONING_GYM_DATASETS:
            raise ValueError(
                f"unknown reasoning-gym dataset {value!r}; known datasets are: "
                + ", ".join(REASONING_GYM_DATASETS)
            )
        return value

    @field_validator("dataset_config")
    @classmethod
    def _not_ours(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = [k for k in _OWN_KEYS if k in value]
        if taken:
            raise ValueError(
                f"dataset_config must not set {taken}: write them as config.seed and "
                "config.size (the episode's task is the reset seed modulo size)"
            )
        return value


class OpenEnvConfig(_Config):
    """An OpenEnv server and how the model's turns map to its Action type and its
    observations to messages. The server is a registered one (``environment``:
    ``env_<id>`` from ``POST /v1/environments``, whose URL and secret the worker is
    given), or, for a run on one's own machine with no control plane (``rlaas train``),
    a ``url``; the control plane refuses ``url``: its servers are registered."""

    environment: Annotated[str, Field(pattern=r"^env_[A-Za-z0-9]+$", max_length=200)] | None = None
    url: Annotated[str, Field(pattern=r"^https?://", max_length=2000)] | None = None
    # "text": the model's text becomes Action.<action_field>; "tool_call": the model calls
    # one tool (`tool_name`), whose parameters are the Action's own JSON schema (the
    # server's GET /schema), and its arguments are the action.
    action_mode: Literal["text", "tool_call"] = "text"
    action_field: Annotated[str, Field(min_length=1, max_length=200)] = "message"
    tool_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "act"
    # Fields sent with every action, beside the model's (a fixed mode, a language, ...).
    action_fixed: dict[str, Any] = Field(default_factory=dict)
    # The observation field the model reads; None: the whole observation as JSON.
    observation_field: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    # A user message before the first observation: the task, in words.
    instructions: Annotated[str, Field(max_length=100_000)] | None = None
    # Keyword arguments of the environment's reset, beside seed and episode_id.
    reset: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reset")
    @classmethod
    def _not_ours(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = [k for k in ("seed", "episode_id") if k in value]
        if taken:
            raise ValueError(f"reset must not set {taken}: rlaas sends each episode's own")
        return value

    @model_validator(mode="after")
    def _one_server(self) -> OpenEnvConfig:
        if (self.environment is None) == (self.url is None):
            raise ValueError(
                "name the OpenEnv server: environment (env_<id> of a registered one) or, "
                "for a local run, url"
            )
        return self


CONFIGS: dict[str, type[_Config]] = {
    REASONING_GYM: ReasoningGymConfig,
    OPENENV: OpenEnvConfig,
}


class ConfigProblem(ValueError):
    """A config of an ecosystem kind is wrong; ``field`` is its path from ``config`` ("" when
    the problem is the config as a whole)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_config(kind: str, config: dict[str, Any]) -> Any:
    """``config`` as the model of ``kind``, or `ConfigProblem` naming the first wrong field."""
    model = CONFIGS[kind]
    try:
        return model.model_validate(config)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        path = ".".join(str(p) for p in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        more = len(exc.errors()) - 1
        tail = f" ({more} more: {_others(exc)})" if more else ""
        where = f"environment.config.{path}" if path else "environment.config"
        raise ConfigProblem(path, f"{where}: {message}{tail}") from None


def _others(exc: ValidationError) -> str:
    return "; ".join(
        ".".join(str(p) for p in e["loc"]) + ": " + str(e["msg"])
        for e in exc.errors(include_url=False)[1:]
    )


def registered_environment(name: str, config: Any) -> str | None:
    """The registered environment (``env_<id>``) a spec's environment calls: its name,
    or, for ``openenv``, its ``config.environment``; None when it calls none."""
    if name == OPENENV and isinstance(config, dict):
        target = config.get("environment")
        return target if isinstance(target, str) else None
    return name if name.startswith("env_") else None


__all__ = [
    "CONFIGS",
    "KINDS",
    "OPENENV",
    "REASONING_GYM",
    "REASONING_GYM_DATASETS",
    "ConfigProblem",
    "OpenEnvConfig",
    "ReasoningGymConfig",
    "parse_config",
    "registered_environment",
]
