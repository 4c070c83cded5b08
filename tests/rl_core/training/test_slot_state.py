"""A slot's training state leaves one trainer and enters another exactly (Tinker's save_state,
then load_state on any worker): through the artifact store and back the adapter, Adam
moments and step count are bit for bit what was saved, and the slot that took them
trains on as the one that saved them would have (the same losses, weights and moments,
bit for bit). A weights-only load starts the optimizer again; a state of another rank
is refused naming the field; a folder without its marker is not a saved state."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from rl_core.errors import UnsupportedSpec
from rl_core.models import ModelConfig
from rl_core.models.decoder import Model
from rl_core.store import StoreError, open_store
from rl_core.training.lora import LoraConfig
from rl_core.training.multi_trainer import MultiLoraTrainer, SlotCall, SlotState
from rl_core.training.primitives import AdamParams, Datum
from rl_core.training.slot_state import MARKER, read_info, read_state, write_state

LORA = LoraConfig(rank=4, alpha=4.0, targets=("q", "k", "v", "o"))
ADAM = AdamParams(learning_rate=1e-2, beta1=0.8)


def _data(vocab: int, seed: int) -> list[Datum]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(3):
        tokens = rng.integers(0, vocab, 9).tolist()
        out.append(Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": [1.0] * 8}))
    return out


def _step(trainer: MultiLoraTrainer, slot: int, data: list[Datum]) -> float:
    (result,) = trainer.forward_backward([SlotCall(slot, data)], "cross_entropy")
    trainer.optim_step(slot, ADAM)
    return result.loss


def _equal(a: SlotState, b: SlotState) -> None:
    assert a.step == b.step
    for x, y in ((a.adapter, b.adapter), (a.m, b.m), (a.v, b.v)):
        assert sorted(x) == sorted(y)
        for name in x:
            for part in ("a", "b"):
                assert x[name][part].dtype == y[name][part].dtype
                np.testing.assert_array_equal(x[name][part], y[name][part])


def test_a_slot_saved_and_loaded_elsewhere_trains_on_exactly(tiny_config: ModelConfig) -> None:
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    first = MultiLoraTrainer(model, slots=2, lora=LORA)
    first.reset(1, seed=3)
    for i in range(2):
        _step(first, 1, _data(tiny_config.vocab_size, i))
    saved = first.export_slot(1)
    assert saved.step == 2

    store = open_store("memory://")
    info = {"base_model": "builtin:tiny", "lora_rank": 4}
    size = write_state(store, "tinker/t1/ck1", saved, info)
    assert size == sum(o.size for o in store.list("tinker/t1/ck1"))
    assert read_info(store, "tinker/t1/ck1")["info"] == info
    _equal(read_state(store, "tinker/t1/ck1", optimizer=True), saved)

    # Another trainer (another worker), another slot, beside a model of its own.
    second = MultiLoraTrainer(model, slots=2, lora=LORA)
    second.reset(1, seed=9)
    second.import_slot(0, read_state(store, "tinker/t1/ck1", optimizer=True), optimizer=True)
    _equal(second.export_slot(0), saved)

    for i in range(2, 4):
        data = _data(tiny_config.vocab_size, i)
        assert _step(second, 0, data) == _step(first, 1, data)
    _equal(second.export_slot(0), first.export_slot(1))

    # Weights only: the adapter as saved, the optimizer from zero, no gradient left over.
    _step(second, 1, _data(tiny_config.vocab_size, 7))
    second.forward_backward([SlotCall(1, _data(tiny_config.vocab_size, 8))], "cross_entropy")
    second.import_slot(1, read_state(store, "tinker/t1/ck1", optimizer=False), optimizer=False)
    fresh = second.export_slot(1)
    assert fresh.step == 0
    _equal(SlotState(fresh.adapter, saved.m, saved.v, 2), saved)
    for leaf in jax.tree.leaves((fresh.m, fresh.v)):
        np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    for leaf in jax.tree.leaves(second.grads):
        assert not np.any(np.asarray(leaf)[1])
    # Its first step is Adam's first step from the saved weights: the moments saved at
    # step 2 would have moved them otherwise.
    data = _data(tiny_config.vocab_size, 2)
    third = MultiLoraTrainer(model, slots=1, lora=LORA)
    third.import_slot(0, saved, optimizer=False)
    assert _step(second, 1, data) == _step(third, 0, data)
    _equal(second.export_slot(1), third.export_slot(0))


def test_a_state_of_another_rank_is_refused_naming_the_field(tiny_config: ModelConfig) -> None:
    model = Model(tiny_config, rngs=nnx.Rngs(0))
    rank4 = MultiLoraTrainer(model, slots=1, lora=LORA).export_slot(0)
    rank2 = MultiLoraTrainer(model, slots=1, lora=LoraConfig(rank=2, alpha=2.0))
    with pytest.raises(UnsupportedSpec) as refused:
        rank2.import_slot(0, rank4, optimizer=False)
    assert refused.value.field == "lora.rank" and "another base or LoRA rank" in str(refused.value)
    only_q = MultiLoraTrainer(model, slots=1, lora=LoraConfig(rank=4, alpha=4.0, targets=("q",)))
    with pytest.raises(UnsupportedSpec, match="adapts") as refused:
        only_q.import_slot(0, rank4, optimizer=True)
    assert refused.value.field == "lora.targets"


def test_bfloat16_goes_through_the_store_exactly_and_a_folder_needs_its_marker() -> None:
    rng = np.random.default_rng(0)

    def adapters(dtype: type) -> dict[str, dict[str, np.ndarray]]:
        return {
            "layers.0.attn.q": {
                "a": rng.normal(size=(8, 2)).astype(dtype),
                "b": rng.normal(size=(2, 8)).astype(dtype),
            }
        }

    state = SlotState(adapters(ml_dtypes.bfloat16), adapters(np.float32), adapters(np.float32), 5)
    store = open_store("memory://")
    write_state(store, "k", state, {})
    _equal(read_state(store, "k", optimizer=True), state)

    # Killed before its marker: no state there, saying so.
    store.delete([f"k/{MARKER}"])
    with pytest.raises(StoreError, match="no saved state"):
        read_state(store, "k", optimizer=False)
