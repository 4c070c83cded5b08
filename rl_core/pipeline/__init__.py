"""The agentic RL pipeline: collector → bounded queue → trainer, with weight sync by version.

Modules: `queue` (admission control, the staleness gate), `collector` (episodes
in flight), `batch` (groups to a train batch), `device` (the one device thread),
`metrics` (per-step scalars), `evaluate` (held-out episodes), `pipeline` (the
step loop, sync and async), `configs` (the spec mapped to each part's config),
`build` (the real parts from a spec), `runner` (`train`: the entry point of the
worker and the CLI), `result`, `files` (``rlaas train --out`` files).
This package's ``__init__`` imports nothing, so the JAX-free modules stay JAX-free.
"""
