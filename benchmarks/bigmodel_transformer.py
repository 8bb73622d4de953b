"""The big-model benchmark's second job: blocksync's small transformer on token sequences (benchmarks/bigmodel.py)."""

from __future__ import annotations

from benchmarks import tokens
from benchmarks.bigmodel import Job
from benchmarks.bigmodel import run as run_job

TRANSFORMER = Job("bigmodel_transformer", "transformer, d_model 128, 4 heads, 2 layers, feed-forward 512, "
                  f"{tokens.LENGTH} tokens of {tokens.VOCAB}", tokens.NET, batch=128, lr=1e-3, files=tokens.token_files)


def run(spark) -> dict:
    return run_job(spark, TRANSFORMER)
