"""One adapter slot's training state in the artifact store (Tinker's save_state / load_state).

A saved state is a folder of three objects under the key its caller chose:

- ``adapter.safetensors``: the adapter, tensors ``<target>/a`` [d_in, r] and ``<target>/b``
  [r, d_out] (the keys of `lora.Adapters`);
- ``optimizer.safetensors``: Adam's moments, ``m/<target>/a`` ... ``v/<target>/b``;
- ``rlaas_tinker_state.json`` (`rl_core.artifacts.TINKER_STATE_MARKER`), written last:
  the step count, each file's size, and what the caller describes the state by (base
  model, LoRA rank), so a reader checks what it loads before it reads the tensors.

The folder is written once and never changed (`rl_core.store.folders`: visible whole
once its marker is there); another save is another folder. Arrays are stored in their
own dtype (bfloat16 too), so a load puts back exactly what was saved.
"""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np

from rl_core.artifacts import TINKER_STATE_MARKER as MARKER
from rl_core.errors import UnsupportedSpec
from rl_core.store.base import ArtifactStore, StoreError
from rl_core.training.multi_trainer import HostAdapters, SlotState

ADAPTER_FILE = "adapter.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
FORMAT = 1
# safetensors' dtype names, as its header writes them; its numpy reader knows no bfloat16.
_DTYPES: dict[str, Any] = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
}


def _flat(adapters: HostAdapters, prefix: str = "") -> dict[str, np.ndarray]:
    return {
        f"{prefix}{name}/{part}": np.ascontiguousarray(x)
        for name, pair in adapters.items()
        for part, x in pair.items()
    }


def _nested(flat: dict[str, np.ndarray], prefix: str = "") -> HostAdapters:
    out: HostAdapters = {}
    for key, x in flat.items():
        if key.startswith(prefix):
            name, _, part = key.removeprefix(prefix).rpartition("/")
            out.setdefault(name, {})[part] = x
    return out


def _encode(tensors: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return bytes(save(tensors))


def _decode(data: bytes, where: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError, deserialize

    try:
        entries = deserialize(data)  # type: ignore[no-untyped-call]
    except SafetensorError as exc:
        raise StoreError(f"{where} is not a safetensors file: {exc}") from exc
    out = {}
    for name, entry in entries:
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise StoreError(f"{where}: {name} has dtype {entry['dtype']}, not a float type")
        out[name] = np.frombuffer(entry["data"], dtype=dtype).reshape(entry["shape"])
    return out


def write_state(store: ArtifactStore, key: str, state: SlotState, info: dict[str, Any]) -> int:
    """Write ``state`` under ``key/``, the marker last; return the bytes written. ``info``
    (JSON) goes in the marker, for `read_info`."""
    key = key.strip("/")
    files = {
        ADAPTER_FILE: _encode(_flat(state.adapter)),
        OPTIMIZER_FILE: _encode({**_flat(state.m, "m/"), **_flat(state.v, "v/")}),
    }
    for name, data in files.items():
        store.put_bytes(f"{key}/{name}", data)
    marker = json.dumps(
        {
            "format": FORMAT,
            "step": state.step,
            "files": {name: len(data) for name, data in files.items()},
            "info": info,
        },
        sort_keys=True,
    ).encode()
    store.put_bytes(f"{key}/{MARKER}", marker)
    return sum(len(data) for data in files.values()) + len(marker)


def read_info(store: ArtifactStore, key: str) -> dict[str, Any]:
    """The marker of the state at ``key/``; `StoreError` when there is none (never saved
    whole, or deleted)."""
    key = key.strip("/")
    raw = store.get_bytes(f"{key}/{MARKER}")
    if raw is None:
        raise StoreError(f"no saved state at {store.url.rstrip('/')}/{key} (no {MARKER})")
    marker: dict[str, Any] = json.loads(raw)
    if marker.get("format") != FORMAT:
        found = marker.get("format")
        raise UnsupportedSpec("path", f"the saved state is of format {found}, not {FORMAT}")
    return marker


def read_state(store: ArtifactStore, key: str, *, optimizer: bool) -> SlotState:
    """The state at ``key/``; without ``optimizer`` its moments are not read (zeros of the
    adapter's shapes stand in, and step 0), as a weights-only load starts them again."""
    key = key.strip("/")
    marker = read_info(store, key)

    def tensors(name: str) -> dict[str, np.ndarray]:
        data = store.get_bytes(f"{key}/{name}")
        if data is None:
            raise StoreError(f"the saved state at {key} has a marker but no {name}")
        return _decode(data, f"{key}/{name}")

    adapter = _nested(tensors(ADAPTER_FILE))
    if not optimizer:
        zeros = {n: {p: np.zeros_like(x) for p, x in pair.items()} for n, pair in adapter.items()}
        return SlotState(adapter, zeros, zeros, 0)
    moments = tensors(OPTIMIZER_FILE)
    return SlotState(adapter, _nested(moments, "m/"), _nested(moments, "v/"), int(marker["step"]))
