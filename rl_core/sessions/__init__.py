"""Client-driven agents: one OpenAI-compatible chat session, recorded token-exact.

A client runs its own agent loop with the official ``openai`` client pointed at a
session URL; each ``/chat/completions`` call is answered with the run's policy and
recorded, and when the client reports the episode's reward the session's calls are
assembled into a `rl_core.agent.ledger.Trajectory` for the trainer
(docs/sessions.md).

- `render`: a request's messages (and tools) to prompt token ids with the model's
  chat template; an assistant message this session produced is rendered from the
  exact text the model sampled.
- `reply`: the sampled tokens back to an answer (content and/or tool calls, whose
  arguments are the sampled text); `stop`: where a ``stop`` string cuts them.
- `ledger`: the calls of one session and their assembly into a trajectory by token
  prefix (a call whose prompt does not extend the previous call starts a new sample
  and is counted as a prefix break).
- `grammar`: the llguidance grammar a call's answer is sampled under when it asks for
  strict tools, a forced tool choice, one call at most or a JSON answer;
  `sampling`: the sampler of a call, the client's within the run's bounds
  (``rollout.client_sampling``).
- `session`: `ChatSession`, these together over a `RolloutEngine`; it also answers
  legacy text completions (`ChatSession.complete_text`: the client's text as the
  prompt, no chat template) into the same ledger.

The HTTP route, the choice of which process holds it, and session ids and
lifetimes belong to the gateway; this room has no web code (the wire bodies are in
`rl_core.protocol.chat_completions` and `rl_core.protocol.completions`). Pure Python:
importing this room starts no JAX.
"""
