"""Typed inputs: several feature columns, each with its own kind, dtype and shape (`train(..., inputs=)`).

Without `inputs` the model reads one float32 matrix (`features`). With them, it receives a dict of
tensors keyed by input name, one per input:

- `numeric`: float32 [rows, width], from one array<number> or ML vector column, or from one or more
  numeric columns side by side.
- `tokens`: int64 [rows, length], token ids in [0, cardinality) (the vocabulary size), from one
  array column or several integer-valued numeric columns. `pad` names the id that marks padding
  (the `transformer` masks it). Ids go from Spark to the model as int64: never through float32.
- `categorical`: int64 [rows], category codes in [0, cardinality), from one integer column (index
  strings first, e.g. with pyspark.ml.feature.StringIndexer).

The cardinality policy and how inputs lie in the blocks: `InputSpec`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

KINDS = ("numeric", "tokens", "categorical")
FEATURES = "features"
LABEL = "label"
WEIGHT = "weight"
IDS = "ids"
"""The blocks' column of id inputs side by side (array<bigint>), beside `features`."""


@dataclass(frozen=True)
class Input:
    """One model input: `name` (its key in the model's dict), `kind`, and where its values come from."""

    name: str
    kind: str = "numeric"
    """`numeric`, `tokens` or `categorical` (module docstring)."""
    columns: tuple[str, ...] | str | None = None
    """Source columns: None (the column called `name`), a list, or a glob such as `pixel_*` (the
    DataFrame's column order)."""
    cardinality: int | None = None
    """tokens: the vocabulary size; categorical: the number of categories. Ids are 0..cardinality-1;
    None: measured on the training rows (max id + 1)."""
    pad: int | None = None
    """tokens: the id that marks padding (masked by `transformer`); None: no padding."""
    width: int = 0
    """Values per row, measured by the driver (0: not yet); categorical: 1."""

    def __post_init__(self) -> None:
        where = f"inputs[{self.name!r}]"
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"an input has no name ({self!r}); give each input a 'name'.")
        if self.kind not in KINDS:
            raise ValueError(f"{where}.kind={self.kind!r} is not one of {', '.join(KINDS)}; pick one of those.")
        for key in ("cardinality", "pad"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{where}.{key}={value!r} must be a whole number (or unset).")
        if self.cardinality is not None and (self.kind == "numeric" or int(self.cardinality) <= 0):
            raise ValueError(f"{where}.cardinality={self.cardinality!r}: only tokens and categorical inputs have "
                             "one, and it must be > 0.")
        if self.pad is not None and (self.kind != "tokens" or int(self.pad) < 0):
            raise ValueError(f"{where}.pad={self.pad!r}: only tokens inputs have a padding id, and it is >= 0.")
        if isinstance(self.columns, list):
            object.__setattr__(self, "columns", tuple(self.columns))

    @property
    def is_ids(self) -> bool:
        return self.kind != "numeric"


@dataclass(frozen=True)
class InputSpec:
    """The resolved inputs (widths and cardinalities known), as the model factory receives them.

    `cardinality` unset: the driver measures it on the training rows as max id + 1. Policy for an id at
    or beyond it (a token outside the vocabulary, a category unseen when the cardinalities were
    measured, in training or in scoring): an error on the driver, naming the input; there is no
    reserved "unknown" index, since an embedding never trained on would score noise.

    In the blocks, an input keeps its dtype: every rank holds a float32 matrix of the numeric inputs
    side by side and an int64 matrix of the id inputs side by side, in `inputs` order (`InputSpec.slices`),
    so a step's batch is two row gathers whatever the number of inputs; the model's dict holds views
    into them.
    """

    inputs: tuple[Input, ...]

    @property
    def float_width(self) -> int:
        return sum(i.width for i in self.inputs if not i.is_ids)

    @property
    def id_width(self) -> int:
        return sum(i.width for i in self.inputs if i.is_ids)

    def slices(self) -> dict[str, tuple[int, int]]:
        """name -> (start, stop) of its values in the float matrix (numeric) or the id matrix (others)."""
        at = {False: 0, True: 0}
        out = {}
        for i in self.inputs:
            out[i.name] = (at[i.is_ids], at[i.is_ids] + i.width)
            at[i.is_ids] += i.width
        return out

    def id_limits(self) -> np.ndarray:
        """Per position of the id matrix, the cardinality its ids stay below."""
        return np.array([i.cardinality for i in self.inputs if i.is_ids for _ in range(i.width)], dtype=np.int64)

    def model_input(self, floats: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's dict of views: numeric [n, w] float32, tokens [n, w] int64, categorical [n] int64."""
        out = {}
        for i, (lo, hi) in zip(self.inputs, self.slices().values(), strict=True):
            part = (ids if i.is_ids else floats)[:, lo:hi]
            out[i.name] = part[:, 0] if i.kind == "categorical" else part
        return out

    def probe(self, rows: int) -> dict[str, torch.Tensor]:
        """A dict of `rows` rows of zeros (valid ids), to check a network's forward pass on the driver."""
        return self.model_input(torch.zeros(rows, self.float_width), torch.zeros(rows, self.id_width,
                                                                                 dtype=torch.int64))

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(i) for i in self.inputs]

    @classmethod
    def from_dicts(cls, items: Sequence[dict[str, Any]]) -> InputSpec:
        return cls(tuple(Input(**item) for item in items))


def parse_inputs(items: Sequence[Input | dict[str, Any]]) -> list[Input]:
    """User inputs (Input objects or dicts such as {"name": "city", "kind": "categorical"}), checked."""
    if not items:
        raise ValueError("inputs is empty; name at least one input, or leave inputs unset for one feature matrix.")
    parsed = []
    for n, item in enumerate(items):
        if isinstance(item, Input):
            parsed.append(item)
            continue
        if not isinstance(item, dict):
            raise ValueError(f"inputs[{n}] is {item!r}; each input is a mapping such as "
                             "{'name': 'city', 'kind': 'categorical'}.")
        unknown = sorted(set(item) - {"name", "kind", "columns", "cardinality", "pad"})
        if unknown:
            raise ValueError(f"inputs[{n}] has unknown key(s) {unknown}; an input takes name, kind, columns, "
                             "cardinality and pad.")
        parsed.append(Input(**item))
    names = [i.name for i in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"input names {names} repeat; give each input its own name.")
    return parsed


def source_columns(item: Input, columns: Collection[str]) -> list[str]:
    """The DataFrame columns `item` reads, in the DataFrame's order for a glob; a ValueError if missing."""
    if item.columns is None:
        wanted = [item.name]
    elif isinstance(item.columns, str):
        wanted = [c for c in columns if fnmatch.fnmatchcase(c, item.columns)] if any(
            ch in item.columns for ch in "*?[") else [item.columns]
    else:
        wanted = list(item.columns)
    missing = [c for c in wanted if c not in columns]
    if not wanted or missing:
        raise ValueError(f"inputs[{item.name!r}] reads column(s) {missing or [item.columns]} that the DataFrame "
                         f"lacks (columns: {sorted(columns)}); fix its 'columns' (or 'name').")
    if item.kind == "categorical" and len(wanted) != 1:
        raise ValueError(f"inputs[{item.name!r}] is categorical over {len(wanted)} columns; a categorical input "
                         "reads one integer column: give each its own input.")
    return wanted


def with_measured(item: Input, width: int, largest: int | None) -> Input:
    """`item` with its width, and its cardinality (measured as max id + 1 when unset)."""
    if not item.is_ids:
        return replace(item, width=width)
    cardinality = item.cardinality if item.cardinality is not None else (largest or 0) + 1
    return replace(item, width=width, cardinality=int(cardinality))


def inputs_of(meta: dict[str, Any]) -> InputSpec | None:
    """The typed inputs a saved model's metadata records (`inputs`), or None for one feature matrix."""
    return InputSpec.from_dicts(meta["inputs"]) if meta.get("inputs") else None


def network_input(spec: InputSpec | None, floats: np.ndarray, ids: np.ndarray | None = None
                  ) -> torch.Tensor | dict[str, torch.Tensor]:
    """What the network takes for rows of packed values (`input_columns.packed_columns`): the float matrix,
    or with typed inputs the dict built from it and the int64 id matrix."""
    x = torch.from_numpy(np.ascontiguousarray(floats, dtype=np.float32))
    if spec is None:
        return x
    if ids is None:
        ids = np.zeros((x.shape[0], 0), np.int64)
    return spec.model_input(x, torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)))


LEAST_TOTAL_WEIGHT = float(np.finfo(np.float32).tiny)
"""The least summed row weight of the training rows: an epoch's loss and weight are summed in float32, where
a smaller total is 0, and a global batch whose weights sum to 0 has no mean."""


def total_weight_problem(total: float, where: str, rows: str = "the training rows") -> str | None:
    """Why `rows`' summed weight `total` (of the weights `where` names) cannot train, or None."""
    if total >= LEAST_TOTAL_WEIGHT:
        return None
    return (f"{where}: {rows}' weights sum to {total:g}, and a loss weighted by them has no mean "
            f"(the total must be at least {LEAST_TOTAL_WEIGHT:.3g}); give some rows a positive weight, or scale "
            "the weights up: only their ratios matter")
