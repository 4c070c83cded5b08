"""Mirroring a run's metrics to the experiment trackers its spec names (docs/trackers.md).

`mirror` holds the queue-and-thread machinery and the sink that feeds it; `base` the
`Tracker` protocol; one module per kind (`wandb_offline`, `mlflow_rest`,
`tensorboard_files`) and `fake` for tests. Each kind imports its library when it opens.
"""
