"""Live updates of runs to stream subscribers, within and across API processes.

- ``notes``: where a "run R changed" note comes from (NOTIFY at commit on
  Postgres, the session's commit on SQLite) and the listener that hears it.
- ``fanout``: the hub, one feed per run, a bounded queue per subscriber.
- ``stream``: the server-sent events of ``GET /v1/runs/{id}/metrics/stream``:
  frames, the database reader, the subscriber loop, ``live_updates`` for the lifespan.
"""
