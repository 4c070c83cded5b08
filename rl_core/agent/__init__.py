"""The agent: one episode's conversation between the policy and an environment.

`agent` runs the turns (render, generate, parse tool calls, step the environment,
apply the episode limits); `toolcalls` parses and renders tool calls; `ledger`
keeps the exact token ids the model produced, the observation tokens after them
and the loss mask (1 only on model-produced tokens), never re-tokenised.
"""
