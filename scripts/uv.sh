# Sourced by bootstrap.sh and vllm_venv.sh. `ensure_uv` finds or installs uv (into .uv/,
# git-ignored); `uv_install VENV ARGS...` installs into VENV with it. uv resolves and
# downloads in parallel: vLLM's venv took pip 13.5 min on this 2-core machine and uv
# 2 min, for the same versions. uv reads no pip.conf, so the machine's pip settings that
# matter are passed on: its local wheel folders (torch's CPU build lies there) and its
# constraints files.
ensure_uv() {
  UV=$(command -v uv || true)
  if [ -z "$UV" ]; then
    [ -x .uv/bin/uv ] || { python3 -m venv .uv && .uv/bin/python -m pip install -q 'uv>=0.9,<1'; }
    UV=$PWD/.uv/bin/uv
  fi
  export UV
}

# One of pip's settings, from each configuration file and the environment (a list).
_pip_setting() {
  python3 -m pip config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | tr ' ' '\n' | sort -u
}

uv_install() {
  local venv=$1
  shift
  [ -n "${UV:-}" ] || ensure_uv
  local extra=() item
  for item in $(_pip_setting find-links); do
    [ -d "$item" ] && extra+=(--find-links "$item")
  done
  for item in $(_pip_setting constraint); do
    [ -f "$item" ] && extra+=(--constraint "$item")
  done
  "$UV" pip install --quiet --python "$venv/bin/python" "${extra[@]}" "$@"
}
