"""The environment the set-up builds: Horovod with Gloo against this torch, started in barrier tasks."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from tests.helpers import allreduce_check


def test_horovod_imports_with_gloo_and_matches_torch():
    import horovod
    import horovod.torch as hvd

    assert horovod.__version__ == "0.28.1"
    assert hvd.gloo_built()  # what the engine needs; whether MPI is built too (adasum) is up to the machine
    # Horovod records the torch it was compiled against; a mismatch means a rebuild is due.
    metadata = json.loads((pathlib.Path(horovod.__file__).parent / "metadata.json").read_text())
    assert metadata["pytorch"] == torch.__version__


@pytest.mark.timeout(240)
def test_horovod_in_barrier_tasks_sums_exactly_twice(spark):
    # Twice in one session: Spark reuses the Python workers, so init/shutdown must be repeatable.
    for _ in range(2):
        reports = allreduce_check(spark, backend="horovod", num_workers=4, length=4096)
        assert [r["rank"] for r in reports] == [0, 1, 2, 3]
        assert all(r["size"] == 4 for r in reports)
        assert all(r["values"] == [10.0] for r in reports)  # 1 + 2 + 3 + 4


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["torch_gloo", "spark"])
def test_other_backends_sum_exactly(spark, backend):
    reports = allreduce_check(spark, backend=backend, num_workers=3, length=257)
    assert [r["values"] for r in reports] == [[6.0]] * 3
