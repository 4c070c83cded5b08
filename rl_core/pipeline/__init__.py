"""The agentic RL pipeline: collector → bounded queue → trainer, with weight sync by version.

Modules: `ledger` (an episode's token ledger and readable record), `queue`
(admission control, the staleness gate), `collector` (episodes in flight),
`batch` (groups to a train batch), `device` (the one device thread),
`metrics` (per-step scalars), `pipeline` (the step loop, sync and async),
`build` (the real parts from a spec), `files` (``rlaas train --out`` files).
This package's ``__init__`` imports nothing, so the JAX-free modules stay JAX-free.
"""
