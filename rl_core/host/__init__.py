"""The interface between a run and the process that hosts it (the worker, the CLI, a test).

`sinks` (where reports go: the `RunSink` protocol), `control` (what the host
asks of a run: stop, profile, the in-flight snapshot), `telemetry` (stage spans
and the profiler, always on), `memory` (process settings for long runs), `trackers`
(the run's metrics mirrored to W&B, MLflow, TensorBoard). Pure
Python apart from the profiler hook: the agent and the pipeline both report here.
"""
