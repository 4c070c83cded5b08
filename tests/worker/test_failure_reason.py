"""What a tenant reads when a run fails: the reason, never a traceback or this machine's paths."""

from __future__ import annotations

import traceback

from rl_core.errors import RolloutError
from worker.job import failure_reason


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # a real traceback, to leave out
        assert traceback.format_exc()
        return caught


def test_the_reason_is_type_and_message_without_a_traceback() -> None:
    reason = failure_reason(_raised(RolloutError("vLLM at http://127.0.0.1:8000 stopped")))
    assert reason == "RolloutError: vLLM at http://127.0.0.1:8000 stopped"
    assert "Traceback" not in reason and "File " not in reason


def test_paths_of_the_worker_machine_become_file_names() -> None:
    exc = RolloutError(
        "the server exited; its log: /srv/rlaas/runs/r-1/vllm-server.log "
        "(python at /home/w/.venv-vllm/bin/python, ratio 1/2, url http://h:1/health)"
    )
    reason = failure_reason(_raised(exc))
    assert "/srv" not in reason and "/home" not in reason
    assert "its log: vllm-server.log" in reason and "python at python" in reason
    # What only looks like a path is kept: a URL's path and a fraction.
    assert "http://h:1/health" in reason and "ratio 1/2" in reason


def test_an_empty_message_gives_the_type() -> None:
    assert failure_reason(_raised(ValueError())) == "ValueError"


def test_the_artifact_stores_address_is_not_the_tenants_to_read() -> None:
    exc = RolloutError(
        "s3://ops-bucket/rlaas-prod/runs/r-1/checkpoints/step_00000004 is not a complete "
        "checkpoint in the store; uploading /tmp/w/x.bin to file:///srv/store/runs/r-1/x.bin"
    )
    reason = failure_reason(_raised(exc))
    assert "ops-bucket" not in reason and "rlaas-prod" not in reason and "/srv" not in reason
    assert "the artifact store's step_00000004 is not a complete checkpoint" in reason
    assert "uploading x.bin to the artifact store's x.bin" in reason
