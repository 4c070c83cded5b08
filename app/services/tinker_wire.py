"""The protobuf messages the tinker SDK (0.38) sends and expects, read and written by hand.

The SDK posts ``forward_backward`` as a ``ForwardBackwardRequest`` message and asks for
``SampleResponse`` and ``ForwardBackwardOutput`` results as protobuf (``Accept:
application/x-protobuf``). Their schema is the SDK's ``tinker_public.proto``; the field
numbers below are those of 0.38. Protobuf's wire format is small (varints and
length-prefixed fields), so the control plane reads and writes these few messages
itself rather than depending on the SDK package or generated code at run time.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

from app.errors import BadRequest

PROTOBUF = "application/x-protobuf"

# DType enum
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32 = 1, 2, 3
_DTYPE_FORMAT = {DTYPE_FLOAT32: "f", DTYPE_INT64: "q", DTYPE_INT32: "i"}
STOP_REASON = {"stop": 0, "length": 1}


# --- reading -----------------------------------------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(buf):
            raise BadRequest(
                "body is not a valid protobuf message (truncated varint)", field="body"
            )
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): an int for a varint, bytes for the other types."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i : i + length], i + length
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise BadRequest(
                f"body is not a protobuf message this API reads (wire type {wire})", field="body"
            )
        if i > len(buf):
            raise BadRequest("body is not a valid protobuf message (truncated field)", field="body")
        yield number, wire, value


def _map_entry(buf: bytes) -> tuple[str, bytes | int]:
    key, value = "", b""
    for number, _, v in _fields(buf):
        if number == 1:
            key = bytes(v).decode()
        elif number == 2:
            value = v
    return key, value


def _tensor(buf: bytes, where: str) -> list[float]:
    dense, dtype = b"", 0
    for number, _, v in _fields(buf):
        if number == 1:
            dense = v
        elif number == 2:
            raise BadRequest(f"{where} is sparse; send dense tensors", field=where)
        elif number == 3:
            dtype = v
    fmt = _DTYPE_FORMAT.get(dtype)
    if fmt is None:
        raise BadRequest(f"{where} has dtype {dtype}; send float32 or int64", field=where)
    count = len(dense) // struct.calcsize(fmt)
    return [float(x) for x in struct.unpack(f"<{count}{fmt}", dense)]


def _datum(buf: bytes, index: int) -> dict[str, Any]:
    tokens: list[int] = []
    inputs: dict[str, list[float]] = {}
    for number, _, v in _fields(buf):
        if number == 1:  # Chunk
            for chunk_field, _, chunk in _fields(v):
                if chunk_field != 1:
                    raise BadRequest(
                        f"data[{index}].model_input has an image or audio chunk; only "
                        "encoded_text chunks are served",
                        field=f"data[{index}].model_input",
                    )
                for text_field, _, raw in _fields(chunk):
                    if text_field == 1:
                        tokens.extend(struct.unpack(f"<{len(raw) // 4}i", raw))
        elif number == 2:
            name, tensor = _map_entry(v)
            where = f"data[{index}].loss_fn_inputs.{name}"
            if not isinstance(tensor, bytes):
                raise BadRequest(f"{where} must be a Tensor message", field=where)
            inputs[name] = _tensor(tensor, where)
    return {"tokens": tokens, "inputs": inputs}


def _config_value(buf: bytes, key: str) -> float | str:
    """A ``LossConfigValue``: a number (double) or a text."""
    for number, wire, v in _fields(buf):
        if number == 1 and wire == 1:
            return float(struct.unpack("<d", v)[0])
        if number == 2 and wire == 2:
            return bytes(v).decode()
    field = f"loss_fn_config.{key}"
    raise BadRequest(f"{field} has no value", field=field)


def read_forward_backward(body: bytes) -> dict[str, Any]:
    """A ``ForwardBackwardRequest``: model_id, seq_id, loss_fn, forward_only, data and
    loss_fn_config (``loss_fn_config_v2`` when sent, as the SDK asks: it mirrors numbers
    into the legacy float map for older servers)."""
    out: dict[str, Any] = {"data": [], "seq_id": None, "forward_only": False, "model_id": ""}
    legacy: dict[str, float | str] = {}
    v2: dict[str, float | str] = {}
    for number, wire, v in _fields(body):
        if number == 1:
            out["model_id"] = bytes(v).decode()
        elif number == 2:
            out["seq_id"] = v
        elif number == 3:
            out["data"].append(_datum(v, len(out["data"])))
        elif number == 4:
            out["loss_fn"] = bytes(v).decode()
        elif number == 5 and wire == 2:
            key, value = _map_entry(v)
            if value == b"":  # a map entry may leave out a value of 0.0
                value = bytes(8)
            if not isinstance(value, bytes) or len(value) != 8:
                field = f"loss_fn_config.{key}"
                raise BadRequest(f"{field} must be a double", field=field)
            legacy[key] = float(struct.unpack("<d", value)[0])
        elif number == 6:
            out["forward_only"] = bool(v)
        elif number == 7 and wire == 2:
            key, value = _map_entry(v)
            v2[key] = _config_value(value if isinstance(value, bytes) else b"", key)
    out["loss_fn_config"] = (v2 or legacy) or None
    if not out.get("loss_fn"):
        raise BadRequest("loss_fn is missing", field="loss_fn")
    return out


# --- writing -----------------------------------------------------------------------------


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _put_varint(number << 3 | 2) + _put_varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _put_varint(number << 3) + _put_varint(value) if value else b""


def _packed(number: int, values: Sequence[int]) -> bytes:
    return _len(number, b"".join(_put_varint(v) for v in values)) if values else b""


def _floats(values: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


TopkRows = Sequence[Sequence[Sequence[float]] | None]  # per position: [(id, logprob)] or None
MASK_LOGPROB = -99999.0  # the SDK's sentinel for an empty top-k cell


def _topk(rows: TopkRows) -> bytes:
    """A ``TopkLogprobs``: dense [length, k] id and logprob matrices, row-major; a row with
    fewer than k pairs (or None: not scored) is filled with the sentinel (0, -99999.0)."""
    k = max((len(r) for r in rows if r), default=0)
    ids: list[int] = []
    lps: list[float] = []
    for row in rows:
        pairs = list(row or [])
        ids += [int(p[0]) for p in pairs] + [0] * (k - len(pairs))
        lps += [float(p[1]) for p in pairs] + [MASK_LOGPROB] * (k - len(pairs))
    return (
        _len(1, struct.pack(f"<{len(ids)}i", *ids))
        + _len(2, _floats(lps))
        + _int(3, k)
        + _int(4, len(rows))
    )


def write_sample_response(
    sequences: Sequence[dict[str, Any]],
    *,
    prompt_logprobs: Sequence[float | None] | None = None,
    topk_prompt: TopkRows | None = None,
) -> bytes:
    """A ``SampleResponse`` of ``{"tokens", "logprobs", "stop_reason", "topk"?}`` sequences,
    and the prompt's logprobs (None, not scored, travels as NaN) and top-k rows."""
    out = b""
    for seq in sequences:
        tokens = seq["tokens"]
        body = (
            _int(1, STOP_REASON[seq["stop_reason"]])
            + _len(2, struct.pack(f"<{len(tokens)}i", *tokens))
            + _len(3, _floats(seq["logprobs"]))
        )
        if seq.get("topk") is not None:
            body += _len(4, _topk(seq["topk"]))
        out += _len(1, body)
    if prompt_logprobs is not None:
        nan = float("nan")
        out += _len(2, _floats([nan if x is None else x for x in prompt_logprobs]))
    if topk_prompt is not None:
        out += _len(3, _topk(topk_prompt))
    return out


def write_forward_backward_output(logprobs: Sequence[Sequence[float]], loss: float) -> bytes:
    """A ``ForwardBackwardOutput``: one ArrayRecord of per-datum ``logprobs`` (float32), and
    ``loss:sum`` in metrics, as Tinker names it."""
    offsets, data, at = [0], b"", 0
    for row in logprobs:
        chunk = _floats(row)
        data += chunk
        at += len(chunk)
        offsets.append(at)
    batched = (
        _len(1, data) + _len(2, struct.pack(f"<{len(offsets)}q", *offsets)) + _int(3, DTYPE_FLOAT32)
    )
    record = (
        _len(1, b"ArrayRecord")
        + _len(2, _len(1, b"logprobs") + _len(2, batched))
        + _int(3, len(logprobs))
    )
    metric = _len(1, b"loss:sum") + _put_varint(2 << 3 | 1) + struct.pack("<d", loss)
    return _len(1, b"ArrayRecord") + _len(2, record) + _len(3, metric)
