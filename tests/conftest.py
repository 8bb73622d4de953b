"""One local[4] Spark session for the whole run, loopback only, with a hard timeout per test."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from blocksync.pipeline.session import local_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spark")
    session = local_session(
        "local[4]",
        "blocksync-tests",
        {
            "spark.sql.warehouse.dir": str(tmp / "warehouse"),
            "spark.local.dir": str(tmp / "local"),
            "spark.driver.memory": "2g",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def synthetic_classification(num_rows: int, num_features: int, num_classes: int, seed: int) -> pd.DataFrame:
    """Seeded Gaussian blobs: features as a float array column, integer labels."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 2.0, size=(num_classes, num_features))
    labels = rng.integers(0, num_classes, size=num_rows)
    x = centers[labels] + rng.normal(0, 1.0, size=(num_rows, num_features))
    return pd.DataFrame({"features": list(x.astype(np.float32)), "label": labels.astype(np.int64)})
