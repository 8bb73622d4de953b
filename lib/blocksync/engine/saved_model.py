"""Reading a saved model back: every field and the weights checked, and a bad one named by its file.

A CLI run's `model/model.json` + `model.safetensors` and a Spark ML model's `metadata/` + `weights/` hold
the same description (network spec, widths, task, typed inputs) and the same safetensors bytes. `network`
rebuilds the network from them; a missing, truncated, edited or foreign file is a ValueError that names it
and says that it is not a blocksync model or is damaged.
"""

from __future__ import annotations

import json
from typing import Any

from torch import nn

from blocksync.engine.config import ModelSpec
from blocksync.engine.inputs import inputs_of

TASKS = ("classification", "regression")


def damaged(where: str, why: str) -> ValueError:
    return ValueError(f"{where} is not a blocksync model file or is damaged ({why}); save or train the model "
                      "again, or point at an intact copy.")


def parse_json(text: bytes, where: str) -> dict[str, Any]:
    """A JSON object from `text`, read from the file `where`."""
    try:
        value = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise damaged(where, f"not UTF-8 JSON: {err}") from err
    if not isinstance(value, dict):
        raise damaged(where, f"a JSON {type(value).__name__}, not an object")
    return value


def _count(meta: dict[str, Any], key: str, least: int) -> str | None:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        return f"{key}={value!r}: not a whole number >= {least}"
    return None


def problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with a saved model's description, or None. `mean`, `std` and `labels` (a CLI run's
    standardization and label values) are checked against the widths when present."""
    if not isinstance(meta.get("model"), dict):
        return f"model={meta.get('model')!r}: not a network spec"
    if meta.get("task") not in TASKS:
        return f"task={meta.get('task')!r}: not one of {list(TASKS)}"
    found = _count(meta, "num_features", 0) or _count(meta, "num_outputs", 1)
    if found:
        return found
    for key in ("mean", "std"):
        values = meta.get(key)
        if values is not None and (not isinstance(values, list) or len(values) != meta["num_features"]):
            return f"{key} holds {len(values) if isinstance(values, list) else values!r} values for " \
                   f"{meta['num_features']} features"
    labels = meta.get("labels")
    if labels is not None and meta["task"] == "classification" and (
            not isinstance(labels, list) or len(labels) != meta["num_outputs"]):
        return f"labels={labels!r} for {meta['num_outputs']} classes"
    return None


def spec_of(meta: dict[str, Any], meta_at: str) -> ModelSpec:
    """The network spec of a saved model's description, after `problem` and the typed inputs' check."""
    found = problem(meta)
    if found:
        raise damaged(meta_at, found)
    try:
        inputs_of(meta)
        return ModelSpec(**meta["model"])
    except (TypeError, ValueError) as err:
        raise damaged(meta_at, f"{type(err).__name__}: {err}") from err


def network(meta: dict[str, Any], weights: bytes, meta_at: str, weights_at: str) -> nn.Module:
    """The network `meta` (read from `meta_at`) describes, with `weights` (safetensors bytes, read from
    `weights_at`) loaded, in eval mode."""
    from safetensors.torch import load

    from blocksync.engine.models import build_model

    module = build_model(spec_of(meta, meta_at), meta["num_features"], meta["num_outputs"], inputs_of(meta))
    try:
        state = load(weights)
    except Exception as err:  # safetensors raises its own SafetensorError (an Exception) for a bad header or size
        raise damaged(weights_at, f"not safetensors: {err}") from err
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise damaged(weights_at, f"its tensors do not fit the network in {meta_at}: {first}") from err
    return module.eval()
