"""The trainer: the one stateful object. Holds the policy and its optimiser; takes steps.

A batch is padded to fixed shapes before it reaches the jitted step: a fixed
number of rows (the run's batch size) and a length bucket (`TrainBatch.pack`'s
``bucket``: powers of two, or the pipeline's quarter octaves), so a run compiles one
step per length bucket and never per batch. The loss's output head runs at each row's
trained positions only (``head_positions``), their count bucketed too. A step whose
shape is new to this trainer may run in a bigger one it compiled before, while that
padding costs less than a compile (``fit_compiled``: rl_core.training.shape_ledger).

One `train_step` is::

    score     pi_old (and V_old for PPO) and pi_ref, without gradients, when needed
    advantage GRPO: given per row; PPO: GAE over the masked tokens
    update    one AdamW update per mini-batch (rows shuffled by the trainer's RNG;
              whole groups with ``share_prefix``, each group's prompt computed once
              per micro-batch: rl_core.training.prefix_shared), each the sum of its
              micro-batches' gradients; ``epochs`` passes. With ``pack`` (GRPO) each
              mini-batch's rows, and the scoring's, are packed end to end into bins
              of the batch's length (rl_core.training.packing): the same numbers from
              fewer positions

Logprobs are recomputed here for every token (the sampler's are only used as
the behaviour policy of the importance weight), and the gap between the two
is reported as ``mismatch_kl``. The numerics live in `rl_core.training.train_step` and
`rl_core.algorithms`; checkpoints of this object in `rl_core.training.checkpointing`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl_core.algorithms.grpo import GrpoConfig
from rl_core.algorithms.ppo import PpoConfig, gae, last_token_rewards, whiten
from rl_core.models import Model
from rl_core.models.buckets import next_bucket
from rl_core.training import packing, prefix_layout
from rl_core.training import train_step as ts
from rl_core.training.chunked_logits import LOGITS_CHUNK
from rl_core.training.head_positions import (
    MIN_POSITIONS,
    index_width,
    shifted_positions,
    trained_positions,
)
from rl_core.training.lora import LoraConfig, init_adapters
from rl_core.training.prefix_shared import scatter
from rl_core.training.shape_ledger import Choice, ShapeLedger, StepShape

# A shared step is taken over a packed one only where it computes at most this share of
# the packed step's positions: a shared position costs more (the suffix's attention over
# the prompt's keys and values, a gather in and out, shapes of three buckets to compile).
# On B12's long-tail run (builtin:tiny, 2026-12-06) taking the fewer positions (1.0) made
# the train step 0.70 s against 0.45 s with sharing off; at 0.5, 0.51 s.
SHARE_OVER_PACK = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    learning_rate: float = 1e-4
    lr_schedule: str = "constant"  # constant | cosine
    warmup_steps: int = 0
    total_steps: int = 1  # optimiser updates in the run, for the cosine schedule
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    mini_batches: int = 1  # optimiser updates per pass over the batch
    epochs: int = 1  # passes over the batch per train_step (rows reshuffled each pass)
    micro_batches: int = 1  # gradient-accumulation slices per update (memory, not maths)
    # Logprobs are taken at the sampling temperature, so at temperature t the
    # trainer's policy is the one the sampler drew from (before top-k/top-p).
    temperature: float = 1.0
    min_length_bucket: int = 32
    # The loss's output head in chunks of this many positions (of the micro-batch's
    # rows x length): no [tokens, vocab] logits are held in the forward or the backward
    # (rl_core.training.chunked_logits). None: all positions' logits at once.
    logits_chunk: int | None = LOGITS_CHUNK
    # Where the loss's output head runs: at the trained positions only ("trained": the
    # rows' masked-in tokens, gathered; rl_core.training.head_positions), or at every
    # position ("all": the prompt's, observations' and padding's too, the old path).
    head_positions: Literal["trained", "all"] = "trained"
    # LoRA applied beside the frozen kernels in the loss's forward ("unmerged"), or merged
    # into them ("merged"): rl_core.training.lora_unmerged says why and what it saves.
    lora_apply: ts.LoraApply = "unmerged"
    # Prefix-shared training (rl_core.training.prefix_shared): per micro-batch, each
    # group's prompt computed once and its members' suffixes attending to its keys and
    # values; mini-batches shuffle whole groups, not rows. A step whose layout saves fewer
    # than ``share_prefix_min`` positions per row (of T-1) runs the plain forward instead.
    # With ``pack`` on too, each step takes sharing only where it computes at most
    # ``SHARE_OVER_PACK`` of packing's positions (`Trainer._layout_choice`;
    # bench/p2_time_to_learn.py measured the tool-use spec, B12 the long-tail game).
    # Not over several processes (rl_core.training.spmd): those steps run plain.
    share_prefix: bool = True
    share_prefix_min: int = 64
    # Sequence packing (rl_core.training.packing): each mini-batch's rows laid end to end
    # in bins of the batch's length, pi_old / pi_ref scored packed too; not for PPO (its
    # value head and GAE are per row) or over several processes, and not for a step that
    # packing would shrink by less than ``pack_min_saving`` of its positions: those take
    # the plain path (or the shared one), which ``pack=False`` keeps for every step.
    pack: bool = True
    pack_min_saving: float = 0.25
    # A step whose shape (length, bins, head width) is new may run in a bigger shape
    # already compiled, until the padding it pays for would have paid the compile
    # (rl_core.training.shape_ledger: both measured on this trainer's own steps). The
    # numbers are the step's own up to float32 rounding (sums over more padding).
    # Plain and packed steps in one process; not for PPO (GAE reads the row's end).
    fit_compiled: bool = True
    # Each block rematerialised in the loss's backward (`Model.hidden`'s ``remat``): the
    # trunk's activations (most of a step's memory once the head is chunked) for about
    # one more forward pass; the numbers are the same computation's.
    remat: bool = False
    grpo: GrpoConfig = dataclasses.field(default_factory=GrpoConfig)
    ppo: PpoConfig | None = None  # set: PPO with a value head and GAE instead of GRPO
    lora: LoraConfig | None = None  # set: train adapters only, base frozen
    seed: int = 0  # the trainer's RNG (mini-batch shuffling, LoRA init)

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy sampling trains at 1.0)")
        if self.mini_batches < 1 or self.micro_batches < 1 or self.epochs < 1:
            raise ValueError("mini_batches, micro_batches and epochs must be >= 1")
        if self.logits_chunk is not None and self.logits_chunk < 1:
            raise ValueError("logits_chunk must be >= 1 position, or None for no chunks")
        if not 0.0 <= self.pack_min_saving < 1.0:
            raise ValueError("pack_min_saving must be in [0, 1): a share of the positions")
        if self.share_prefix_min < 0:
            raise ValueError("share_prefix_min must be >= 0 positions per row")
        if self.head_positions not in ("trained", "all"):
            raise ValueError(
                f"head_positions must be 'trained' or 'all', not {self.head_positions!r}"
            )


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """Host arrays, already padded. Row i is one trajectory; zero mask rows are padding."""

    tokens: np.ndarray  # [B, T] int32
    loss_mask: np.ndarray  # [B, T] float32
    logprobs: np.ndarray  # [B, T] float32, sampler's, aligned with tokens
    advantages: np.ndarray  # [B] or, per token, [B, T] float32 (GRPO; ignored by PPO)
    rewards: np.ndarray | None = None  # [B] float32 episode rewards (PPO)
    # [B, T] float32: per token, the policy versions between the weights that sampled it
    # and the trainer's (0: the same); None: unknown. Splits the mismatch metrics.
    lag: np.ndarray | None = None
    # [B] int: the GRPO group of each row (-1: padding), for prefix-shared training
    # (TrainerConfig.share_prefix); None: groups are inferred from shared prefixes.
    groups: np.ndarray | None = None

    @classmethod
    def pack(
        cls,
        tokens: Sequence[Sequence[int]],
        loss_mask: Sequence[Sequence[int]],
        logprobs: Sequence[Sequence[float]],
        advantages: Sequence[float | Sequence[float]],
        *,
        rows: int,
        min_length: int = 32,
        max_length: int | None = None,
        pad_id: int = 0,
        rewards: Sequence[float] | None = None,
        lags: Sequence[Sequence[int]] | None = None,
        groups: Sequence[int] | None = None,
        bucket: Callable[[int, int], int] = next_bucket,
    ) -> TrainBatch:
        """``max_length``: no row is longer (the run's context), so no bucket need be:
        a 96-token context trains at 96, not at the bucket of 128 (a quarter of a train
        step's work was padding). A longer row still gets its own length, never cut.
        ``bucket(longest, min_length)``: the padded length (`rl_core.models.buckets`)."""
        if len(tokens) > rows:
            raise ValueError(f"{len(tokens)} trajectories do not fit in {rows} rows")
        longest = max((len(t) for t in tokens), default=1)
        length = bucket(longest, min_length)
        if max_length is not None:
            length = min(length, max(max_length, longest))
        tok = np.full((rows, length), pad_id, np.int32)
        mask = np.zeros((rows, length), np.float32)
        lp = np.zeros((rows, length), np.float32)
        per_token = any(isinstance(a, Sequence) for a in advantages)
        adv = np.zeros((rows, length) if per_token else (rows,), np.float32)
        for i, (t, m, p) in enumerate(zip(tokens, loss_mask, logprobs, strict=True)):
            tok[i, : len(t)], mask[i, : len(m)], lp[i, : len(p)] = t, m, p
            a = advantages[i]
            if isinstance(a, Sequence):
                adv[i, : len(a)] = a
            else:
                adv[i] = a
        rew = None
        if rewards is not None:
            rew = np.zeros((rows,), np.float32)
            rew[: len(rewards)] = rewards
        lag = None
        if lags is not None:
            lag = np.zeros((rows, length), np.float32)
            for i, row in enumerate(lags):
                lag[i, : len(row)] = row
        group = None
        if groups is not None:
            group = np.full((rows,), -1, np.int32)
            group[: len(groups)] = groups
        return cls(tok, mask, lp, adv, rew, lag, group)

    def padded(self, length: int) -> TrainBatch:
        """The same rows padded (zeros, off the mask) to ``length`` tokens: the same loss."""
        extra = length - self.tokens.shape[1]
        if extra < 0:
            raise ValueError(f"cannot pad {self.tokens.shape[1]} tokens down to {length}")

        def pad(x: np.ndarray) -> np.ndarray:
            return np.pad(x, ((0, 0), (0, extra)))

        advantages = self.advantages if self.advantages.ndim == 1 else pad(self.advantages)
        lag = None if self.lag is None else pad(self.lag)
        return dataclasses.replace(
            self,
            tokens=pad(self.tokens),
            loss_mask=pad(self.loss_mask),
            logprobs=pad(self.logprobs),
            advantages=advantages,
            lag=lag,
        )


def learning_rate_schedule(config: TrainerConfig) -> optax.Schedule:
    """Linear warm-up to the peak, then constant or cosine decay to 10% of it."""
    peak, warmup = config.learning_rate, config.warmup_steps
    decay_steps = max(config.total_steps - warmup, 1)

    def schedule(count: jax.Array) -> jax.Array:
        step = jnp.asarray(count, jnp.float32)
        ramp = jnp.minimum(1.0, (step + 1.0) / (warmup + 1.0))
        progress = jnp.clip((step - warmup) / decay_steps, 0.0, 1.0)
        cosine = 0.1 + 0.9 * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        decay = cosine if config.lr_schedule == "cosine" else jnp.ones_like(cosine)
        return peak * ramp * decay

    return schedule


class Trainer:
    """``Trainer(model, config)``: takes ``train_step``s; ``params()`` feeds the rollout engine.

    The model passed in is read once (its weights become the initial policy)
    and never mutated; the trainer keeps its own arrays.
    """

    def __init__(
        self,
        model: Model,
        config: TrainerConfig,
        *,
        initial_adapters: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.config = config
        self.schedule = learning_rate_schedule(config)
        self.tx = optax.chain(
            optax.clip_by_global_norm(config.max_grad_norm),
            optax.adamw(self.schedule, weight_decay=config.weight_decay),
        )
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
        self._graphdef: Any = graphdef
        self._rest: Any = rest  # non-trainable variables (none in today's decoder)
        self._cfg = ts.StepConfig(
            temperature=config.temperature,
            grpo=config.grpo,
            ppo=config.ppo,
            lora=config.lora,
            micro_batches=config.micro_batches,
            logits_chunk=config.logits_chunk,
            lora_apply=config.lora_apply,
            remat=config.remat,
        )
        rng = jax.random.key(config.seed)
        self._frozen: dict[str, Any] = {}
        if config.lora is not None:
            # Base frozen; it is also the KL reference (adapters at 0 = the initial policy).
            self._frozen["base"] = params
            rng, init_key = jax.random.split(rng)
            adapters = init_adapters(params, config.lora, init_key)
            if initial_adapters:
                # model.lora.init_from (rl_core.training.adapter_init, checked there): the
                # run starts from that policy, which is also its KL reference.
                adapters = _with_initial(adapters, initial_adapters)
                self._frozen["ref_adapters"] = jax.tree.map(jnp.copy, adapters)
            trainable: ts.Trainable = {"policy": adapters}
        else:
            trainable = {"policy": params}
            if config.grpo.kl_coef > 0:
                self._frozen["ref"] = jax.tree.map(jnp.copy, params)
        if config.ppo is not None:
            trainable["value"] = ts.init_value_head(model.config.d_model)
        self.trainable = trainable
        self.opt_state = self.tx.init(trainable)
        self.rng = rng
        self.updates = 0  # optimiser updates so far (the schedule's count)
        # The last train_step's updates: mini-batches packed and not, and the token
        # positions their forward passes computed against the plain path's (diagnostics).
        self.last_layout: dict[str, int] = {}
        single = jax.process_count() == 1
        self.shapes: ShapeLedger | None = None
        if config.fit_compiled and config.ppo is None and single:
            self.shapes = ShapeLedger(config.mini_batches * config.epochs)
        self._params_cache: tuple[int, Any] | None = None
        static = {"graphdef": self._graphdef, "cfg": self._cfg}
        # opt_state is donated (no one else holds it); the policy is not: the
        # rollout engine may still be serving the previous params().
        self._update = jax.jit(
            functools.partial(ts.update, tx=self.tx, **static), donate_argnums=(1,)
        )
        self._score = jax.jit(functools.partial(ts.score, self._graphdef, self._cfg))
        self._merged = jax.jit(functools.partial(ts.effective_params, lora=config.lora))

    # -- what the pipeline reads -------------------------------------------------------

    def params(self) -> Any:
        """The current policy weights (LoRA merged), as `nnx.state(model)`: for the engine."""
        if self._params_cache is None or self._params_cache[0] != self.updates:
            policy = self._merged(self.trainable, self._frozen)
            self._params_cache = (self.updates, nnx.merge_state(policy, self._rest))
        return self._params_cache[1]

    def adapters(self) -> Any:
        """The current policy's LoRA adapters (`rl_core.models.lora` layout), unmerged: what
        an engine on a shared base samples with (`rl_core.rollout.adapter_policy`)."""
        if self.config.lora is None:
            raise ValueError("adapters() is for LoRA runs; this trainer trains every weight")
        return self.trainable["policy"]

    def policy_model(self) -> Model:
        """A `Model` holding the current policy (LoRA merged).

        What `rl_core.pretrained.export` writes.
        """
        model: Model = nnx.merge(self._graphdef, self._policy(), self._rest)
        return model

    def logprobs(self, tokens: np.ndarray) -> np.ndarray:  # [B, T] -> [B, T]
        """Logprob of each token given its prefix (0 at position 0), as the trainer sees it."""
        lp, _ = self._score(self._policy(), self._rest, None, jnp.asarray(tokens))
        return np.asarray(jnp.pad(lp, ((0, 0), (1, 0))))

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update per mini-batch, ``epochs`` times over ``batch``; mean metrics
        (``_max`` ones: the largest)."""
        cfg = self.config
        rows = batch.tokens.shape[0]
        size = rows // cfg.mini_batches
        if size * cfg.mini_batches != rows or size % cfg.micro_batches:
            raise ValueError(
                f"{rows} rows do not split into {cfg.mini_batches} mini-batches of "
                f"{cfg.micro_batches} equal micro-batches; change the batch size or the split"
            )
        keys = []
        for _ in range(cfg.epochs):  # one shuffle a pass, drawn as the plain path draws them
            self.rng, key = jax.random.split(self.rng)
            keys.append(key)
        started = time.perf_counter()
        groups, plans = self._layout_choice(batch, keys)
        choice = None
        if self.shapes is not None:
            batch, groups, plans, choice = self._fit(batch, keys, groups, plans)
        run = None if choice is None else choice.run
        full = self._prepare(batch, groups, packed=plans is not None, shape=run)
        host = jax.device_get(full) if plans is not None else None
        width = None
        if plans is not None and cfg.head_positions == "trained":
            assert host is not None  # the host copy above: no second transfer of the mask
            width = packing.head_width([p for epoch in plans for p in epoch], host.mask)
            width = max(width, 0 if run is None else run.head)
        self.last_layout = {
            "packed": 0, "shared": 0, "plain": 0, "positions": 0, "plain_positions": 0
        }  # fmt: skip
        totals: dict[str, float] = {}
        seen: dict[str, int] = {}  # mini-batches that gave each mean (a NaN is none)
        worst: dict[str, float] = {}
        for epoch, key in enumerate(keys):
            if groups is not None:
                minis = self._shared_minis(batch, full, groups, key)
            elif plans is not None:
                assert host is not None
                minis = self._packed_minis(host, plans[epoch], width)
            else:
                minis = self._row_minis(full, key)
            for mb in minis:
                stats = self.last_layout
                kind = "packed" if mb.segments is not None else "plain"
                stats["shared" if mb.prefix is not None else kind] += 1
                stats["positions"] += int(np.prod(mb.tokens.shape)) + _prefix_positions(mb)
                stats["plain_positions"] += size * batch.tokens.shape[1]
                lr = float(self.schedule(self.updates))
                self.trainable, self.opt_state, metrics = self._update(
                    self.trainable, self.opt_state, self._frozen, self._rest, mb
                )
                self.updates += 1
                for name, value in jax.device_get(metrics).items():
                    if name.startswith("mismatch/") and math.isnan(value):
                        continue  # a split with no tokens in this mini-batch (a diverged
                        # loss stays NaN: the sink reports it)
                    if name.endswith("_max"):
                        worst[name] = max(worst.get(name, 0.0), float(value))
                    else:
                        totals[name] = totals.get(name, 0.0) + float(value)
                        seen[name] = seen.get(name, 0) + 1
                totals["lr"] = totals.get("lr", 0.0) + lr
                seen["lr"] = seen.get("lr", 0) + 1
        out = {name: value / seen[name] for name, value in totals.items()} | worst
        out["learning_rate"] = out["lr"]  # the name of the first metric files, kept
        # The optimiser's count after this step, restored with a checkpoint: the evidence that
        # a resumed policy holds each earlier step's update once (docs/lifecycle.md, lineage).
        out["optimizer_updates"] = float(self.updates)
        if choice is not None and self.shapes is not None:
            self.shapes.record(choice, time.perf_counter() - started)
            out["shapes/compiled"] = float(len(self.shapes.compiled))
            out["shapes/padded_steps"] = float(self.shapes.padded_steps)
        return out

    # -- internals ---------------------------------------------------------------------

    def _policy(self) -> Any:
        return self._merged(self.trainable, self._frozen)

    def _row_minis(self, full: ts.MiniBatch, key: jax.Array) -> Iterator[ts.MiniBatch]:
        """The plain path's mini-batches: equal slices of the rows, shuffled by ``key``."""
        m = self.config.mini_batches
        if m == 1:
            yield full
            return
        rows = full.tokens.shape[0]
        size = rows // m
        order = np.asarray(jax.random.permutation(key, rows))
        for i in range(m):
            idx = jnp.asarray(order[i * size : (i + 1) * size])
            yield jax.tree.map(lambda x, idx=idx: x[idx], full)

    def _packs(self) -> bool:
        """Whether steps may pack: PPO's value head and GAE are per row, and a trainer
        over several processes (rl_core.training.spmd) holds only its own rows on the
        host, where bins are laid out; both keep the plain path."""
        cfg = self.config
        single = jax.process_count() == 1
        return cfg.pack and cfg.ppo is None and single

    def _layout_choice(
        self, batch: TrainBatch, keys: list[jax.Array]
    ) -> tuple[list[np.ndarray] | None, list[list[packing.Packing]] | None]:
        """This step's layout: its groups for prefix sharing, or its packed plan, or
        neither (the plain path). With both on, sharing where it computes at most
        ``SHARE_OVER_PACK`` of packing's positions (a group's prompt long against its
        answers: the tool-use spec's worked demonstration), packing otherwise (ragged
        rows, prompts short or unshared). Either computes the plain path's numbers."""
        cfg = self.config
        mask = batch.loss_mask[:, 1:]
        groups = None
        if cfg.share_prefix and jax.process_count() == 1:
            # Over several processes each holds only its rows (rl_core.training.spmd):
            # groups are laid out on the host, as packing's bins are; both run plain.
            groups = prefix_layout.row_groups(
                batch.tokens, mask, batch.groups, cfg.share_prefix_min
            )
        plans = self._packed_plan(mask, keys) if self._packs() else None
        if groups is None or plans is None:
            return groups, plans
        m = cfg.mini_batches
        shared = sum(
            layout.rows.size * layout.width + _prefix_size(layout)
            for layout in self._layouts(batch, groups, None, m)
        ) * len(keys)
        packed = sum(p.rows.size for epoch in plans for p in epoch)
        return (groups, None) if shared <= SHARE_OVER_PACK * packed else (None, plans)

    def _fit(
        self,
        batch: TrainBatch,
        keys: list[jax.Array],
        groups: list[np.ndarray] | None,
        plans: list[list[packing.Packing]] | None,
    ) -> tuple[TrainBatch, list[np.ndarray] | None, list[list[packing.Packing]] | None, Choice]:
        """The step in a shape the ledger chooses: its own (``groups``: shared, else
        ``plans``), or a compiled one that holds another layout of it: packed or plain at
        its length, or at a longer compiled one (the batch padded, planned again)."""
        assert self.shapes is not None
        Option = tuple[StepShape, TrainBatch, list[np.ndarray] | None, Any]
        options: list[Option] = []
        if groups is not None:  # shared, or the layout packing or the plain path gives
            options.append((self._shared_shape(batch, groups), batch, groups, None))
            plans = self._packed_plan(batch.loss_mask[:, 1:], keys) if self._packs() else None
        options.append((self._shape(batch, plans), batch, None, plans))
        length = batch.tokens.shape[1]
        for longer in sorted({s.length for s in self.shapes.compiled if s.length > length}):
            padded = batch.padded(longer)
            mask = padded.loss_mask[:, 1:]
            plan = self._packed_plan(mask, keys) if self._packs() else None
            options.append((self._shape(padded, plan), padded, None, plan))
        choice = self.shapes.choose([shape for shape, *_ in options])
        _, batch, groups, plans = next(o for o in options if o[0] is choice.natural)
        if plans is not None and choice.run.rows != choice.natural.rows:
            plans = self._packed_plan(batch.loss_mask[:, 1:], keys, bins=choice.run.rows)
        return batch, groups, plans, choice

    def _shared_shape(self, batch: TrainBatch, groups: list[np.ndarray]) -> StepShape:
        """A shared step's shape: its layouts', priced as `_layout_choice` weighs them
        (positions over ``SHARE_OVER_PACK``), plus the head's positions the plain path's."""
        cfg = self.config
        layouts = self._layouts(batch, groups, None, cfg.mini_batches)
        detail = tuple(
            n
            for layout in layouts
            for n in (layout.rows.size, layout.width)
            + (() if layout.prefix is None else layout.prefix.shape)
        )
        trunk = sum(layout.rows.size * layout.width + _prefix_size(layout) for layout in layouts)
        rows, length = batch.tokens.shape
        head = _head_width(batch.loss_mask[:, 1:]) if cfg.head_positions == "trained" else length
        work = int(trunk * cfg.epochs / SHARE_OVER_PACK) + cfg.epochs * rows * head
        return StepShape("shared", length, rows, 0, detail=detail, work=work)

    def _shape(self, batch: TrainBatch, plans: list[list[packing.Packing]] | None) -> StepShape:
        """The shape a step of ``batch`` laid out as ``plans`` (None: plain) compiles."""
        cfg = self.config
        mask = batch.loss_mask[:, 1:]
        rows, length = batch.tokens.shape
        trained = cfg.head_positions == "trained"
        plain_head = _head_width(mask) if trained else 0
        score_rows, score_head, score_packed = 0, 0, False
        if cfg.mini_batches > 1 or cfg.epochs > 1 or cfg.grpo.kl_coef > 0:
            score_rows, score_head = rows, plain_head
            if plans is not None:
                scoring = self._scoring_plan(batch)
                if scoring is not None:
                    score_packed, score_rows = True, scoring.rows.shape[0]
                    scored = packing.gather_targets(mask, scoring)
                    score_head = _head_width(scored) if trained else 0
        if plans is None:
            update_rows, head = rows // cfg.mini_batches, plain_head
            return StepShape("plain", length, update_rows, head, False, score_rows, score_head)
        head = packing.head_width([p for e in plans for p in e], mask) if trained else 0
        return StepShape(
            "packed", length, plans[0][0].rows.shape[0], head, score_packed, score_rows, score_head
        )

    def _scoring_plan(self, batch: TrainBatch, bins: int = 0) -> packing.Packing | None:
        """pi_old / pi_ref's packed layout: the whole batch in the plain path's number of
        slices (its memory bound); None: plain."""
        cfg = self.config
        return packing.plan(
            range(batch.tokens.shape[0]),
            batch.loss_mask[:, 1:],
            multiple=cfg.mini_batches * cfg.micro_batches,
            min_saving=cfg.pack_min_saving,
            bins=bins,
        )

    def _packed_plan(
        self, mask: np.ndarray, keys: list[jax.Array], bins: int = 0
    ) -> list[list[packing.Packing]] | None:  # per pass, per mini-batch; None: plain
        """The plain path's mini-batches (the same shuffles, ``keys``: one per pass) packed
        (`rl_core.training.packing`), all in one shape; None when that saves too little.
        ``mask``: the batch's [B, T-1] loss mask, on the host."""
        cfg = self.config
        m = cfg.mini_batches
        rows = mask.shape[0]
        size = rows // m
        parts: list[np.ndarray] = []
        for key in keys:
            order = np.asarray(jax.random.permutation(key, rows)) if m > 1 else np.arange(rows)
            parts.extend(order[i * size : (i + 1) * size] for i in range(m))
        layouts = packing.plan_step(
            parts,
            mask,
            multiple=cfg.micro_batches,
            min_saving=cfg.pack_min_saving,
            bins=bins,
        )
        if layouts is None:
            return None
        return [layouts[i * m : (i + 1) * m] for i in range(len(keys))]

    def _packed_minis(
        self, host: ts.MiniBatch, layouts: list[packing.Packing], width: int | None
    ) -> Iterator[ts.MiniBatch]:
        for layout in layouts:
            yield packing.mini_batch(
                host,
                layout,
                head_width=width,
                sequence_weights=self.config.grpo.aggregation == "sequence_mean",
            )

    def _layouts(
        self, batch: TrainBatch, groups: list[np.ndarray], order: np.ndarray | None, parts: int
    ) -> list[prefix_layout.Layout]:
        """``groups``' rows (in ``order``) in ``parts`` mini-batches of the micro-batches'
        size; shared, or plain when sharing would save too little."""
        cfg = self.config
        rows_per_micro = batch.tokens.shape[0] // (cfg.mini_batches * cfg.micro_batches)
        minis = prefix_layout.plan(
            groups, order, parts, cfg.mini_batches * cfg.micro_batches // parts
        )
        layouts, _ = prefix_layout.layouts(
            batch.tokens,
            batch.loss_mask[:, 1:],
            minis,
            rows_per_micro=rows_per_micro,
            min_saving=cfg.share_prefix_min,
        )
        return layouts

    def _shared_minis(
        self, batch: TrainBatch, full: ts.MiniBatch, groups: list[np.ndarray], key: jax.Array
    ) -> Iterator[ts.MiniBatch]:
        """Mini-batches of whole groups (shuffled by ``key``), each group's rows together."""
        m = self.config.mini_batches
        order = np.asarray(jax.random.permutation(key, len(groups))) if m > 1 else None
        for layout in self._layouts(batch, groups, order, m):
            yield prefix_layout.mini_batch(full, layout)

    def _prepare(
        self,
        batch: TrainBatch,
        groups: list[np.ndarray] | None = None,
        *,
        packed: bool = False,
        shape: StepShape | None = None,
    ) -> ts.MiniBatch:
        """Device arrays of the whole batch, with pi_old / pi_ref / GAE where they are needed.
        ``groups`` (prefix-shared training): pi_old and pi_ref are scored prefix-shared too;
        ``packed`` (the step packs): scored packed. ``shape``: the compiled shape the step
        runs in (`_fit`), whose widths and scoring bins are at least the step's own."""
        cfg = self.config
        tokens = jnp.asarray(batch.tokens)
        mask = jnp.asarray(batch.loss_mask[:, 1:])
        old = ref = old_values = returns = None
        advantages = jnp.asarray(batch.advantages)
        if advantages.ndim == 2:  # per token: aligned with tokens[:, 1:], as the mask is
            advantages = advantages[:, 1:]
        needs_old = cfg.mini_batches > 1 or cfg.epochs > 1 or cfg.ppo is not None
        # pi_old and pi_ref too are read on the trained positions only: scored there alone.
        positions = None
        if cfg.head_positions == "trained":
            at_least = MIN_POSITIONS
            if shape is not None and not shape.score_packed:
                at_least = max(at_least, shape.score_head if packed else shape.head)
            positions = trained_positions(batch.loss_mask[:, 1:], minimum=at_least)
        scoring = None
        if groups is not None and (needs_old or cfg.grpo.kl_coef > 0):
            # One pass in the group order, micro-batch by micro-batch (as _score_chunked).
            (scoring,) = self._layouts(batch, groups, None, 1)
        packing_plan = None
        score_head = MIN_POSITIONS
        if packed and (needs_old or cfg.grpo.kl_coef > 0):
            # Scored packed too, in the plain path's number of slices (its memory bound).
            bins = 0
            if shape is not None and shape.score_packed:
                bins, score_head = shape.score_rows, max(score_head, shape.score_head)
            packing_plan = self._scoring_plan(batch, bins)
        if needs_old:
            if packing_plan is not None:
                old = self._scores_packed(self._policy(), batch, packing_plan, score_head)
            else:
                old, old_values = self._scores(
                    self._policy(), self.trainable.get("value"), tokens, scoring, positions
                )
        if cfg.grpo.kl_coef > 0:
            if "ref_adapters" in self._frozen:  # started from an adapter: that policy
                ref_params = self._merged({"policy": self._frozen["ref_adapters"]}, self._frozen)
            else:
                ref_params = self._frozen["base" if cfg.lora is not None else "ref"]
            if packing_plan is not None:
                ref = self._scores_packed(ref_params, batch, packing_plan, score_head)
            else:
                ref, _ = self._scores(ref_params, None, tokens, scoring, positions)
        if cfg.ppo is not None:
            if batch.rewards is None:
                raise ValueError("PPO needs TrainBatch.rewards (one episode reward per row)")
            assert old_values is not None
            rewards = last_token_rewards(jnp.asarray(batch.rewards), mask)
            advantages, returns = gae(rewards, old_values, mask, cfg.ppo.gamma, cfg.ppo.gae_lambda)
            if cfg.ppo.whiten_advantages:
                advantages = whiten(advantages, mask)
        return ts.MiniBatch(
            tokens=tokens,
            mask=mask,
            behaviour=jnp.asarray(batch.logprobs[:, 1:]),
            lag=None if batch.lag is None else jnp.asarray(batch.lag[:, 1:]),
            advantages=advantages,
            old_logprobs=old,
            ref_logprobs=ref,
            old_values=old_values,
            returns=returns,
            trained_at=positions,
        )

    def _scores(
        self,
        params: Any,
        value_head: Any,
        tokens: jax.Array,  # [B, T]
        layout: prefix_layout.Layout | None,
        positions: jax.Array | None,  # [B, K]: logprobs there only (0 elsewhere); None: all
    ) -> tuple[jax.Array, jax.Array | None]:  # logprobs [B, T-1], values [B, T-1] | None
        if layout is None or layout.prefix is None:
            return self._score_chunked(params, value_head, tokens, positions)
        # Positions the layout leaves out (prompts, untrained rows) are 0: off every mask.
        shape = (tokens.shape[0], tokens.shape[1] - 1)
        lp = jnp.zeros(shape, jnp.float32)
        values = None if value_head is None else jnp.zeros(shape, jnp.float32)
        parts = self.config.mini_batches * self.config.micro_batches
        for part in prefix_layout.micro_layouts(layout, parts):
            suffixes, prefix = prefix_layout.suffixes(tokens, part)
            rows, offsets = jnp.asarray(part.rows), jnp.asarray(part.offsets)
            at = None if positions is None else shifted_positions(positions, rows, offsets)
            got, got_values = self._score(params, self._rest, value_head, suffixes, prefix, at)
            lp = scatter(got, rows, offsets, shape[1], lp)
            if values is not None and got_values is not None:
                values = scatter(got_values, rows, offsets, shape[1], values)
        return lp, values

    def _scores_packed(
        self, params: Any, batch: TrainBatch, layout: packing.Packing, head: int = MIN_POSITIONS
    ) -> jax.Array:  # [B, T-1] logprobs in the row layout, 0 where no bin holds a target
        """The batch's logprobs scored on its packed ``layout``, slice by slice; the head's
        index at least ``head`` wide."""
        cfg = self.config
        tokens = packing.packed_tokens(batch.tokens, layout)
        mask = packing.gather_targets(batch.loss_mask[:, 1:], layout)
        trained = cfg.head_positions == "trained"
        positions = trained_positions(mask, minimum=head) if trained else None
        bins = tokens.shape[0]
        step = bins // (cfg.mini_batches * cfg.micro_batches)
        parts = []
        for i in range(0, bins, step):
            lp, _ = self._score(
                params,
                self._rest,
                None,
                jnp.asarray(tokens[i : i + step]),
                None,
                None if positions is None else jnp.asarray(positions[i : i + step]),
                positions=jnp.asarray(layout.positions[i : i + step]),
                segments=jnp.asarray(layout.segments[i : i + step]),
            )
            parts.append(np.asarray(lp))
        rows = batch.tokens.shape[0]
        return jnp.asarray(packing.scatter_targets(np.concatenate(parts), layout, rows))

    def _score_chunked(
        self, params: Any, value_head: Any, tokens: jax.Array, positions: jax.Array | None
    ) -> tuple[jax.Array, jax.Array | None]:
        # Scored in micro-batch slices: the no-gradient pass needs no more memory than training.
        rows = tokens.shape[0]
        step = max(rows // (self.config.mini_batches * self.config.micro_batches), 1)
        parts = [
            self._score(
                params,
                self._rest,
                value_head,
                tokens[i : i + step],
                None,
                None if positions is None else positions[i : i + step],
            )
            for i in range(0, rows, step)
        ]
        lp = jnp.concatenate([p[0] for p in parts])
        values = None if value_head is None else jnp.concatenate([p[1] for p in parts])
        return lp, values

    # -- checkpointed state (rl_core.training.checkpointing) --------------------------------------

    def training_state(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit-for-bit (base/reference excluded).

        The frozen base (LoRA) and the KL reference are the initial policy,
        rebuilt from the spec's model source by the fresh trainer.
        """
        return {
            "trainable": self.trainable,
            "opt_state": self.opt_state,
            "updates": np.asarray(self.updates, np.int64),
            "rng": jax.random.key_data(self.rng),
        }

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.trainable = state["trainable"]
        self.opt_state = state["opt_state"]
        self.updates = int(state["updates"])
        self.rng = jax.random.wrap_key_data(jnp.asarray(state["rng"]))
        self._params_cache = None


def _head_width(mask: np.ndarray) -> int:
    """`trained_positions`' width for a [B, L] mask, computed on the host."""
    return index_width(int((np.asarray(mask) > 0).sum(axis=1).max(initial=0)), mask.shape[1])


def _prefix_size(layout: prefix_layout.Layout) -> int:
    """Positions a layout's shared prefixes compute (0: it runs the plain forward)."""
    return 0 if layout.prefix is None else int(layout.prefix.size)


def _prefix_positions(mb: ts.MiniBatch) -> int:
    """Positions a mini-batch's shared prefixes compute, beside its rows' own."""
    return 0 if mb.prefix is None else int(np.prod(mb.prefix.tokens.shape))


def _with_initial(fresh: Any, initial: Mapping[str, Mapping[str, Any]]) -> Any:
    """``fresh`` adapters with those of ``initial`` in place (same keys and shapes, checked
    by the caller); a module ``initial`` lacks keeps its fresh pair (B = 0: no change)."""
    unknown = sorted(set(initial) - set(fresh))
    if unknown:
        raise ValueError(f"initial adapters for modules the LoRA does not target: {unknown}")
    out = dict(fresh)
    for name, pair in initial.items():
        out[name] = {}
        for part in ("a", "b"):
            want = fresh[name][part]
            if tuple(pair[part].shape) != tuple(want.shape):
                raise ValueError(f"initial {name}.{part} is {pair[part].shape}, not {want.shape}")
            out[name][part] = jnp.asarray(pair[part], want.dtype)
    return out


__all__ = [
    "TrainBatch",
    "Trainer",
    "TrainerConfig",
    "learning_rate_schedule",
]
