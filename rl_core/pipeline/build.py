"""Build a `Pipeline` from a job spec, with the real parts: model, rollout engine, trainer.

One function per part (`build_engine`, `build_agent`, `build_evaluator`,
`build_trainer`); each takes its settings from `rl_core.pipeline.configs`, the
one place that maps spec fields onto configs. `build_pipeline` wires them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax

from rl_core.agent.agent import Agent
from rl_core.artifacts import EXPORT_FORMATS
from rl_core.envs import build_environment
from rl_core.envs.base import Environment
from rl_core.envs.walls import WallPolicy
from rl_core.errors import UnsupportedSpec
from rl_core.host.control import RunControl
from rl_core.host.sinks import RunSink
from rl_core.host.telemetry import Profiler, SpanRecorder
from rl_core.models import Model
from rl_core.models.tokenizer import Tokenizer
from rl_core.pipeline import configs
from rl_core.pipeline.batch import StragglerRewards, build_batch
from rl_core.pipeline.collector import Collector, EpisodePlayer
from rl_core.pipeline.colocation import Colocation, shares_base
from rl_core.pipeline.device import DeviceThread
from rl_core.pipeline.evaluate import Evaluator
from rl_core.pipeline.hosted import StartHosts
from rl_core.pipeline.initial import initial_adapters
from rl_core.pipeline.pipeline import Pipeline
from rl_core.pipeline.queue import Admission, Group, GroupQueue
from rl_core.pretrained.sources import load_model
from rl_core.records import CheckpointRecord
from rl_core.rollout.adapter_policy import AdapterPolicyEngine
from rl_core.rollout.base import RolloutEngine
from rl_core.rollout.jax_engine import JaxEngine
from rl_core.sessions.broker import SessionBroker
from rl_core.sessions.sampling import ClientSampling
from rl_core.sessions.session import SessionConfig
from rl_core.spec import MAX_HOSTS_BUILT, MAX_ROLLOUT_SERVERS_BUILT, SESSIONS, JobSpec
from rl_core.training.stored import RunArtifacts, StoreTarget, folder_bytes
from rl_core.training.trainer import Trainer
from rl_core.training.trainer_group import TrainerAPI

log = logging.getLogger(__name__)

SERVER_LOG = "vllm-server.log"  # in the run's artifacts folder


class OrbaxCheckpointer:
    """`Checkpointer` over `rl_core.training.checkpointing`.

    Writes ``artifacts_dir/checkpoints/step-NNNNNNNN``, then, when given ``exports``, the
    checkpoint's downloads beside it (`rl_core.training.exports`): made with the checkpoint,
    by the process that holds the base model, so the control plane (no JAX) only streams
    files.
    """

    def __init__(
        self,
        artifacts_dir: Path,
        trainer: TrainerAPI,
        exports: Callable[[Path, int], object] | None = None,
        stored: RunArtifacts | None = None,
    ) -> None:
        self.artifacts_dir, self.trainer, self.exports = artifacts_dir, trainer, exports
        # The artifact store (docs/storage.md): uploads and retention after each save.
        self.stored = stored
        # Imported now, while the pipeline is built, not in the first save: the import
        # takes seconds (2.1 s on two busy cores), and the default cadence times each save
        # to choose the interval (rl_core.pipeline.cadence), which the import would inflate.
        import orbax.checkpoint  # noqa: F401

    def save(self, step: int, extra: Mapping[str, Any]) -> CheckpointRecord:
        from rl_core.training.checkpointing import checkpoint_dir, save_checkpoint

        local = checkpoint_dir(self.artifacts_dir, step)
        record = save_checkpoint(local, step=step, trainer=self.trainer, extra=extra)
        if self.stored is not None:  # in the store whole before it is reported, or an error
            record = self.stored.after_save(record, step)
        if self.exports is not None:
            try:
                self.exports(local, step)
                if self.stored is not None:
                    lora = self.trainer.config.lora is not None
                    self.stored.after_exports(step, EXPORT_FORMATS, lora=lora)
            except Exception:
                # The checkpoint is what a resume needs; a failed export costs a download
                # (the API answers that it is missing), never the run.
                log.exception("step %d: the checkpoint's exports failed", step)
        if self.stored is not None:
            try:
                self.stored.prune()
            except Exception:
                log.exception("step %d: retention failed; older checkpoints stay", step)
        # What the run keeps now, for the tenant's storage quota: counted in the store when
        # there is one, since uploaded exports leave the worker's disk.
        kept = (
            self.stored.kept_bytes()
            if self.stored is not None
            else folder_bytes(self.artifacts_dir)
        )
        return dataclasses.replace(record, stored_bytes=kept)


def checkpoint_exports(
    spec: JobSpec, model: Model, tokenizer: Tokenizer, artifacts_dir: Path
) -> Callable[[Path, int], object] | None:
    """``export(checkpoint, step)``: the run's exports of a checkpoint; None for a model
    no Hugging Face family expresses (ALiBi), which has nothing to export."""
    from rl_core.training.exports import adapter_base_name, export_all

    if model.config.alibi_slope:
        return None
    lora = configs.trainer_config(spec).lora
    base_name = adapter_base_name(spec.model.source)

    def export(checkpoint: Path, step: int) -> object:
        return export_all(
            checkpoint,
            artifacts_dir,
            step,
            base=model,
            tokenizer=tokenizer,
            lora=lora,
            base_name=base_name,
        )

    return export


def snapshot(params: Any) -> Any:
    """A detached copy of the pytree's structure (arrays are immutable, so not of the arrays):
    later in-place updates of the trainer's variables never reach what the engine serves."""
    return jax.tree.map(lambda x: x, params)


def build_engine(
    spec: JobSpec,
    model: Model,
    tokenizer: Tokenizer,
    device: DeviceThread,
    cleanup: contextlib.ExitStack,
    *,
    log_dir: Path | None = None,
    recorder: SpanRecorder | None = None,
    shared_base: bool = False,
) -> RolloutEngine:
    """The rollout engine the spec names: the JAX engine, running its device work on
    ``device``, or vLLM (`build_vllm_engine`). What must be undone when the run ends
    (a server, its files) is pushed on ``cleanup``. ``shared_base``: ``model`` is a base
    other runs of this process hold too; the engine samples with the run's adapters in
    a slot beside it (`AdapterPolicyEngine`), never with weights merged into a copy."""
    if spec.rollout.engine == "vllm":
        if model.config.alibi_slope:
            raise UnsupportedSpec(
                "rollout.engine",
                f"vLLM cannot serve {spec.model.source} (ALiBi on RoPE is no vLLM model); "
                "use rollout.engine: jax",
            )
        return build_vllm_engine(
            spec, model, tokenizer, cleanup, log_dir=log_dir, recorder=recorder
        )
    config = configs.engine_config(spec, tokenizer, model.config)
    if shared_base:
        lora = configs.trainer_config(spec).lora
        config = dataclasses.replace(config, adapter_slots=1, lora=lora)
        engine = JaxEngine(model, config=config, executor=device, tokenizer=tokenizer)
        return AdapterPolicyEngine(engine, slot=0)
    return JaxEngine(model, config=config, executor=device, tokenizer=tokenizer)


def build_vllm_engine(
    spec: JobSpec,
    model: Model,
    tokenizer: Tokenizer,
    cleanup: contextlib.ExitStack,
    *,
    log_dir: Path | None = None,
    recorder: SpanRecorder | None = None,
) -> RolloutEngine:
    """`VllmEngine` over ``rollout.vllm_url``, or over a server started here for the run, or
    with ``resources.rollout_servers`` R > 1 a `RolloutFleet` over R servers started here.

    The started server serves ``model`` exported as an untied HF folder (vLLM's in-place
    reload skips a tied LM head; see docs/vllm.md), with the checkpoint's tokenizer when it
    has one (grammars need it), token ids in and out either way.
    Weight updates are written as HF safetensors that the server reloads from this
    machine's filesystem, so a server at ``vllm_url`` must see the same files.
    """
    from rl_core.pretrained.chat_tokenizer import ChatTokenizer
    from rl_core.pretrained.export import export_hf, logprob_scorer, weights_writer
    from rl_core.pretrained.tokenizers_io import CheckpointTokenizer
    from rl_core.rollout.fleet import RolloutFleet
    from rl_core.rollout.vllm_engine import VllmEngine, WeightCheck
    from rl_core.rollout.vllm_server import VllmServer

    # The server computes in float32 whatever the trainer's dtype. A bfloat16 trainer's
    # own logprobs are off by its rounding, so its probe is judged more loosely (not
    # measured yet; a server on other weights was ~0.5 off in float32).
    check = WeightCheck(
        tokens=WeightCheck.probe(model.config.vocab_size),
        scorer=logprob_scorer(model),
        tolerance=1e-3 if model.config.dtype == "float32" else 0.1,
    )
    engine_args: dict[str, Any] = dict(
        stop_ids=configs.engine_config(spec, tokenizer, model.config).stop_ids,
        write_weights=weights_writer(model, untie=True),
        check=check,
        recorder=recorder,
        max_in_flight=spec.rollout.concurrency,
    )
    if spec.rollout.vllm_url is not None:
        user_server = VllmEngine(spec.rollout.vllm_url, **engine_args)
        user_server.connect(max_context=spec.agent.max_context)
        cleanup.callback(user_server.close)
        return user_server
    folder = Path(tempfile.mkdtemp(prefix="rlaas-vllm-model-"))
    cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
    # With a checkpoint's tokenizer in the folder the server loads it, which its
    # structured outputs need to compile a session's grammar (rl_core.rollout.vllm_server);
    # the builtin tokenizer has no such file, and its runs are served token ids only.
    served_tokenizer = (
        tokenizer if isinstance(tokenizer, ChatTokenizer | CheckpointTokenizer) else None
    )
    export_hf(model, folder, untie=True, tokenizer=served_tokenizer)
    servers = spec.resources.rollout_servers
    config = configs.vllm_server_config(spec, model.config.max_seq_len)
    cores = os.cpu_count() or 1
    share = max(1, cores // servers)
    started = []
    for i in range(servers):
        if servers > 1:  # a fleet: each server on cores of its own where there are enough
            pinned = f"{i * share}-{(i + 1) * share - 1}" if servers <= cores else None
            config = dataclasses.replace(config, threads=share, cpus=pinned)
        name = SERVER_LOG if servers == 1 else SERVER_LOG.replace(".log", f"-{i}.log")
        # Kept after the run (outside the folder removed at the end): a crash is read there.
        log_path = log_dir / name if log_dir else folder.with_name(folder.name + f"-{i}.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        server = VllmServer(folder, config, log_path=log_path)
        cleanup.callback(server.stop)
        started.append((server, name))
    # Started together: each takes tens of seconds to load.
    with ThreadPoolExecutor(max_workers=servers) as pool:
        list(pool.map(lambda pair: pair[0].start(), started))
    for server, _ in started:
        log.info("vLLM server on %s ready in %.1f s", server.url, server.start_s)
    # Errors name the log by its file name: it sits in the run's artifacts folder, and
    # a tenant reads the reason, not this machine's paths.
    members = [
        VllmEngine(
            server.url,
            server=server,
            server_log=name,
            # Named as the worker's log and the log files name them (0-based).
            name="the run's vLLM server" if servers == 1 else f"rollout server {i} of {servers}",
            recover_in_place=servers == 1,  # a fleet recovers its members itself
            **engine_args,
        )
        for i, (server, name) in enumerate(started)
    ]
    engine: VllmEngine | RolloutFleet = members[0] if servers == 1 else RolloutFleet(members)
    cleanup.callback(engine.close)
    return engine


def build_agent(
    spec: JobSpec,
    engine: RolloutEngine,
    tokenizer: Tokenizer,
    recorder: SpanRecorder,
    *,
    evaluation: bool = False,
) -> Agent:
    return Agent(
        engine=engine,
        tokenizer=tokenizer,
        config=configs.agent_config(spec),
        sampling=configs.sampling_params(spec, evaluation=evaluation),
        recorder=recorder,
    )


def build_sessions(
    spec: JobSpec,
    engine: RolloutEngine,
    tokenizer: Tokenizer,
    recorder: SpanRecorder | None = None,
) -> SessionBroker:
    """Where clients' sessions meet the collector's episodes (``environment.name: sessions``)."""
    if spec.train.eval_interval:
        raise UnsupportedSpec(
            "train.eval_interval",
            "a sessions run has no held-out episodes of its own yet (clients play them); "
            "set it to 0",
        )
    config = SessionConfig(
        sampling=configs.sampling_params(spec),
        max_new_tokens=spec.agent.max_new_tokens,
        max_context=spec.agent.max_context,
        client_sampling=ClientSampling(**spec.rollout.client_sampling.model_dump()),
    )
    return SessionBroker(
        engine=engine,
        tokenizer=tokenizer,
        config=config,
        group_size=spec.rollout.group_size,
        client_fault_budget=spec.rollout.client_fault_budget,
        episode_timeout_s=spec.rollout.episode_timeout_s,
        recorder=recorder,
    )


def build_evaluator(
    spec: JobSpec, agent: Agent, env: Environment, *, episode_prefix: str
) -> Evaluator | None:
    """Held-out episodes every ``train.eval_interval`` steps; None when that is 0."""
    t = spec.train
    if not t.eval_interval:
        return None
    if spec.environment.name == "dataset" and not spec.environment.config.get("split"):
        raise UnsupportedSpec(
            "environment.config.split",
            "held-out evaluation (train.eval_interval) plays the dataset's eval split and "
            "this config has none; give split (e.g. {eval: 0.05}) or set eval_interval to 0",
        )
    return Evaluator(
        agent=agent,
        env=env,
        env_config=spec.environment.config,
        episodes=t.eval_episodes,
        concurrency=spec.rollout.concurrency,
        seed=t.seed,
        episode_timeout_s=spec.rollout.episode_timeout_s,
        episode_prefix=episode_prefix,
        samples=t.eval_k,
        pass_threshold=t.eval_pass_threshold,
    )


def build_trainer(
    spec: JobSpec,
    model: Model,
    resume_from: str | None,
    trainer_hosts: StartHosts | None = None,
    cleanup: contextlib.ExitStack | None = None,
) -> tuple[TrainerAPI, int, Mapping[str, Any] | None]:
    """The trainer, the step it starts after and the collector's saved position.

    ``resume_from`` is a checkpoint of an earlier attempt; without it the run
    starts at step 0 with a fresh collector. With ``resources.hosts`` > 1 the trainer is
    a `TrainerGroup` over processes ``trainer_hosts`` starts (`rl_core.pipeline.hosted`),
    stopped by ``cleanup``; a checkpoint of any number of processes resumes on any other
    (it holds whole arrays).
    """
    config = configs.trainer_config(spec)
    trainer: TrainerAPI
    if spec.resources.hosts > 1:
        from rl_core.pipeline.hosted import trainer_group

        group = trainer_group(spec, config, trainer_hosts)
        if cleanup is not None:
            cleanup.callback(group.close)
        trainer = group
    else:
        trainer = Trainer(model, config, initial_adapters=initial_adapters(spec, model, config))
    if resume_from is None:
        return trainer, 0, None
    from rl_core.training.checkpointing import restore_checkpoint

    start_step, extra = restore_checkpoint(resume_from, trainer=trainer)
    log.info("resumed from %s at step %d", resume_from, start_step)
    return trainer, start_step, extra.get("collector")


def check_resources(spec: JobSpec, backend: str | None = None) -> None:
    """Refuse what ``spec.resources`` asks for and this process cannot give, before any
    work: more hosts or rollout servers than are built (the API refuses them first), or an
    accelerator this process's JAX does not run on (``backend``: `jax.default_backend()`),
    which means a worker serves a queue of another accelerator's. A spec that names no
    accelerator runs on whatever this process has, as every run did before."""
    r = spec.resources
    if r.hosts > MAX_HOSTS_BUILT:
        raise UnsupportedSpec(
            "resources.hosts",
            f"{r.hosts} hosts asked for; a run's trainer spans at most {MAX_HOSTS_BUILT} "
            "processes here",
        )
    if r.rollout_servers > MAX_ROLLOUT_SERVERS_BUILT:
        raise UnsupportedSpec(
            "resources.rollout_servers",
            f"{r.rollout_servers} rollout servers asked for; a run has at most "
            f"{MAX_ROLLOUT_SERVERS_BUILT} vLLM servers here",
        )
    if r.accelerator is None:
        return
    # jax names CUDA and ROCm devices alike "gpu".
    backend = backend or jax.default_backend()
    if backend != r.accelerator:
        raise UnsupportedSpec(
            "resources.accelerator",
            f"the run asks for {r.accelerator}, but JAX runs on {backend} here: a worker that "
            "consumes another accelerator's queue (its RLAAS_QUEUE against the API's "
            f"RLAAS_QUEUES), or a JAX install without {r.accelerator} support",
        )


def base_model(
    spec: JobSpec,
    colocation: Colocation | None,
    cleanup: contextlib.ExitStack,
    *,
    name: str,
) -> tuple[Model, Tokenizer, bool]:
    """The run's model and tokenizer, and whether other runs of the process share them:
    leased from the colocation's bases (released by ``cleanup``) when the run can share
    its base, else loaded for the run alone."""
    why_not = shares_base(spec)
    if colocation is None or why_not is not None:
        if colocation is not None:
            log.info("%s: loads its own %s: %s", name, spec.model.source, why_not)
        model, tokenizer = load_model(spec.model, seed=spec.train.seed)
        return model, tokenizer, False
    lease = cleanup.enter_context(colocation.bases.lease(spec.model, seed=spec.train.seed))
    log.info("%s: shares %s, held by %d run(s)", name, spec.model.source, lease.sharers)
    return lease.model, lease.tokenizer, True


def build_pipeline(
    spec: JobSpec,
    *,
    sink: RunSink,
    control: RunControl,
    artifacts_dir: Path | None,
    resume_from: str | None,
    episode_prefix: str,
    webhooks: Mapping[str, Any] | None,
    callbacks: Any,
    walls: WallPolicy | None = None,
    store: StoreTarget | None = None,
    colocation: Colocation | None = None,
    trainer_hosts: StartHosts | None = None,
) -> tuple[Pipeline, Callable[[], None]]:
    """The pipeline and a ``close`` to call when it has run (it stops the device thread and,
    with engine vllm, the server rlaas started). ``store``: the artifact store the run's
    checkpoints go to (`rl_core.training.stored`); None: ``artifacts_dir`` alone.
    ``colocation``: what the runs of this process share when it hosts several
    (`rl_core.pipeline.colocation`); None: the run is the process's only one.
    ``trainer_hosts``: starts the trainer processes of a ``resources.hosts`` > 1 run."""
    check_resources(spec)
    if spec.resources.hosts > 1:
        from rl_core.pipeline.hosted import check_hosts

        check_hosts(spec, trainer_hosts)
    r = spec.rollout
    clients_play = spec.environment.name == SESSIONS
    env = (
        None
        if clients_play
        else build_environment(
            spec.environment, webhooks=webhooks or {}, callbacks=callbacks, walls=walls
        )
    )
    # Undone by `close`, or here if building fails half-way (a vLLM server may be running).
    cleanup = contextlib.ExitStack()
    try:
        model, tokenizer, shared = base_model(spec, colocation, cleanup, name=episode_prefix)
    except BaseException:
        cleanup.close()
        raise
    recorder = SpanRecorder()
    owner = episode_prefix or f"run-{id(recorder):x}"
    device = DeviceThread(recorder, (colocation.device, owner) if colocation else None)

    def close() -> None:
        # The device thread first: a weight update it is running still needs the engine.
        try:
            device.shutdown(wait=True)
        finally:
            cleanup.close()

    try:
        engine = build_engine(
            spec,
            model,
            tokenizer,
            device,
            cleanup,
            log_dir=artifacts_dir,
            recorder=recorder,
            shared_base=shared,
        )
        stored = (
            RunArtifacts(artifacts_dir, store, keep=spec.train.keep_checkpoints)
            if artifacts_dir
            else None
        )
        if stored is not None and resume_from is not None:
            resume_from = stored.resolve(resume_from)  # downloaded when this disk lacks it
        trainer, start_step, position = build_trainer(
            spec, model, resume_from, trainer_hosts, cleanup
        )
        broker = build_sessions(spec, engine, tokenizer, recorder) if clients_play else None
        agent: EpisodePlayer = broker or build_agent(spec, engine, tokenizer, recorder)
        evaluator = (
            build_evaluator(
                spec,
                build_agent(spec, engine, tokenizer, recorder, evaluation=True),
                env,
                episode_prefix=episode_prefix,
            )
            if env is not None
            else None
        )

        def collector(admission: Admission, queue: GroupQueue) -> Collector:
            return Collector(
                agent=agent,
                env=env,
                admission=admission,
                queue=queue,
                group_size=r.group_size,
                concurrency=r.concurrency,
                seed=spec.train.seed,
                env_config=spec.environment.config,
                episode_timeout_s=r.episode_timeout_s,
                episode_prefix=episode_prefix,
                position=position,
            )

        stragglers = StragglerRewards()

        def batch(groups: list[Group]) -> Any:
            stragglers.observe(groups)
            return build_batch(
                groups,
                group_size=r.group_size,
                rows=spec.batch_size,
                pad_id=tokenizer.pad_id,
                scale_rewards=spec.algorithm.scale_rewards,
                min_length=configs.TRAIN_MIN_LENGTH,
                max_length=spec.agent.max_context,
                bucket=configs.TRAIN_LENGTH_BUCKET,
                credit=spec.algorithm.credit,
                baseline=spec.algorithm.baseline,
                gamma=spec.algorithm.gamma,
                straggler_reward=stragglers.value,
            )

        pipeline = Pipeline(
            config=configs.pipeline_config(spec),
            collector_factory=collector,
            engine=engine,
            trainer=trainer,
            build_batch=batch,
            snapshot=snapshot,
            tokenizer=tokenizer,
            device=device,
            recorder=recorder,
            sink=sink,
            control=control,
            profiler=Profiler(artifacts_dir / "profiles" if artifacts_dir else None),
            checkpointer=OrbaxCheckpointer(
                artifacts_dir,
                trainer,
                checkpoint_exports(spec, model, tokenizer, artifacts_dir),
                stored,
            )
            if artifacts_dir
            else None,
            evaluator=evaluator,
            start_step=start_step,
            sessions=broker,
            policy_weights=trainer.adapters if shared else None,
        )
    except BaseException:
        close()
        raise
    return pipeline, close
