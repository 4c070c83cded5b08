"""Training: the one stateful object (`trainer.Trainer`) and what it is made of.

`train_step` (the jitted loss and update over a padded batch), `lora` (low-rank
adapters), `checkpointing` (training state with Orbax: parameters, optimiser
state, step, RNG and the collector's position). The loss numerics are pure
functions in `rl_core.algorithms`.
"""
