"""Choosing the default digits config (conf/local.yaml) by cross-validation on the training rows only.

The test rows decide nothing here: this benchmark prepares the same split as
`accuracy` (the pipeline's prepare stage) and reads only `train.parquet`. It
scores a fixed grid of deterministic settings, at the default's step count
(30 epochs of batch 64), by repeated stratified 5-fold cross-validation (2
repeats, 10 folds; every setting sees the same folds):

- `lr`: 0.001, 0.002, 0.004
- `weight_decay` (Adam's L2): 0, 1e-4, 1e-3
- `schedule`: constant, cosine
- `label_smoothing` (cross-entropy's): 0, 0.1
- `model.hidden`: [128, 64], [256, 128]

Dropout is left out: it would make the default draw random masks, and the
defaults stay deterministic. Each fold trains a plain single-process loop,
which the engine is proven equal to (tests/test_engine.py): the engine's own
`build_model`, `build_optimizer` and `build_schedule`, so the settings mean
what they mean in a run; a seeded shuffle per epoch; mean cross-entropy,
smoothed by the setting's label_smoothing.

The rule: among the settings with the default's network (`model.hidden`), so
the same compute per step and the same `make demo` time, the one with the
highest mean validation accuracy (a tie goes to the first in grid order)
replaces the default only if its mean gain over the default, fold by fold,
exceeds two standard errors of those paired differences. Otherwise the default
stays: a smaller gain could be the luck of picking the best of 36. The wider
network is scored and reported beside them, not adopted.

History, for the record. The first run (commit 0b7da03) applied the rule to
all 36 settings. It chose hidden [256, 128], lr=0.001, weight_decay=1e-3
(0.9808 against the default's 0.9753: +0.0055, two standard errors 0.0026), and
conf/local.yaml took it (commit 40241ec). That run then scored 0.9677 on the
test rows on every backend (the default before: 0.9736), and `make demo` took
30.9 s (median of 3; target under 30 s): the wider network costs more per step
(results/accuracy.md and demo.md as committed in 21cf992). The cost, not the
test score, is why the rule now holds the network fixed; but the test score
was seen before this change, and the closing note of 2026-12-05 says so.

`label_smoothing` joined the grid later (2026-12-05), with the engine's
`TrainConfig.label_smoothing`. Before that, an exploratory script scored one
comparison on these same folds, the default against the default with
label_smoothing 0.1: 0.9828 against 0.9753, a gain of +0.0076 with two standard
errors 0.0035, and no fold lower. No smoothed model had been scored on the test
rows when this grid and rule were committed (74aed9b). The run at that commit
adopted lr 0.004, weight_decay 1e-4, label_smoothing 0.1 (+0.0100 over the
default, two standard errors 0.0044) and conf/local.yaml took it; the test rows
were scored after that (results/accuracy.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.accuracy import CONFIG, read_arrays
from benchmarks.common import SettingError, write

FOLDS, REPEATS = 5, 2
GRID = {"lr": [0.001, 0.002, 0.004], "weight_decay": [0.0, 1e-4, 1e-3], "schedule": ["constant", "cosine"],
        "label_smoothing": [0.0, 0.1], "hidden": [[128, 64], [256, 128]]}


def fold_accuracy(train_cfg, x: np.ndarray, y: np.ndarray, fit: np.ndarray, held: np.ndarray) -> float:
    """Train on rows `fit` as the engine would (same builders, same step count), score rows `held`."""
    from blocksync.engine.models import build_model
    from blocksync.engine.optim import build_optimizer, build_schedule

    torch.manual_seed(train_cfg.seed)
    num_classes = int(y.max()) + 1
    model = build_model(train_cfg.model, x.shape[1], num_classes)
    xs, ys = torch.from_numpy(x[fit]).float(), torch.from_numpy(y[fit]).long()
    batch = train_cfg.batch_size
    steps_per_epoch = -(-len(fit) // batch)
    optimizer = build_optimizer(model, train_cfg)
    schedule = build_schedule(optimizer, steps_per_epoch * train_cfg.epochs, train_cfg)
    shuffle = torch.Generator().manual_seed(train_cfg.seed)
    for _ in range(train_cfg.epochs):
        order = torch.randperm(len(fit), generator=shuffle)
        for s in range(steps_per_epoch):
            rows = order[s * batch:(s + 1) * batch]
            optimizer.zero_grad()
            F.cross_entropy(model(xs[rows]), ys[rows], label_smoothing=train_cfg.label_smoothing).backward()
            optimizer.step()
            schedule.step()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x[held]).float()).argmax(1).numpy()
    return float((predicted == y[held]).mean())


def settings(base) -> list[tuple[str, object]]:
    """Every grid point as (label, TrainConfig), the default's own first."""
    points = []
    for lr, wd, schedule, smoothing, hidden in itertools.product(*GRID.values()):
        cfg = dataclasses.replace(base, lr=lr, weight_decay=wd, schedule=schedule, label_smoothing=smoothing,
                                  model=dataclasses.replace(base.model, hidden=hidden))
        label = f"lr={lr:g} weight_decay={wd:g} schedule={schedule} label_smoothing={smoothing:g} hidden={hidden}"
        points.append((label, cfg))
    is_default = [c.lr == base.lr and c.weight_decay == base.weight_decay and c.schedule == base.schedule
                  and c.label_smoothing == base.label_smoothing and c.model.hidden == base.model.hidden
                  for _, c in points]
    if not any(is_default):  # the rule compares every setting against the default, fold by fold
        raise SettingError(f"conf/local.yaml's lr={base.lr:g}, weight_decay={base.weight_decay:g}, "
                           f"schedule={base.schedule}, label_smoothing={base.label_smoothing:g} and "
                           f"hidden={base.model.hidden} are not a point of benchmarks/model_selection.py's GRID; "
                           "add its values there.")
    first = is_default.index(True)
    return [points[first], *points[:first], *points[first + 1:]]


def cross_validate(points, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Validation accuracy of every point on every fold: [points, folds]."""
    from sklearn.model_selection import RepeatedStratifiedKFold

    splits = list(RepeatedStratifiedKFold(n_splits=FOLDS, n_repeats=REPEATS, random_state=0).split(x, y))
    scores = np.zeros((len(points), len(splits)))
    for i, (label, cfg) in enumerate(points):
        scores[i] = [fold_accuracy(cfg, x, y, fit, held) for fit, held in splits]
        print(f"{label}: {scores[i].mean():.4f}", flush=True)
    return scores


def best_candidate(scores: np.ndarray, eligible: np.ndarray) -> int:
    """The eligible row with the highest mean over folds (the first of a tie)."""
    return int(np.argmax(np.where(eligible, scores.mean(axis=1), -np.inf)))


def decide(scores: np.ndarray, eligible: np.ndarray) -> tuple[int, float, float]:
    """(index chosen, the best eligible's mean gain over the default, two standard errors of the paired gain).

    Row 0 is the default (eligible by definition); `eligible` marks the rows that may replace it.
    """
    best = best_candidate(scores, eligible)
    diff = scores[best] - scores[0]
    two_se = float(2 * diff.std(ddof=1) / np.sqrt(len(diff))) if best else 0.0
    return (best if diff.mean() > two_se else 0), float(diff.mean()), two_se


def _markdown(points, scores: np.ndarray, eligible: np.ndarray, payload: dict) -> str:
    means, stds = scores.mean(axis=1), scores.std(axis=1, ddof=1)
    lines = [f"# Choosing the default digits config by {REPEATS}x{FOLDS}-fold cross-validation on the "
             f"{payload['train_rows']} training rows (test rows unused)", "",
             f"Default: `{points[0][0]}`, mean validation accuracy {means[0]:.4f}.",
             f"Best with the default's network: `{payload['best']}`, gain over the default "
             f"{payload['gain_over_default']:+.4f} (two standard errors of the paired gain: "
             f"{payload['two_standard_errors']:.4f}). Decision: {payload['verdict']}.",
             f"Best of all (a wider network costs more per step, so it is not a candidate): "
             f"`{payload['best_of_all']}`.", "",
             "| rank | setting | mean | std over folds | candidate |", "| --- | --- | --- | --- | --- |"]
    for rank, i in enumerate(np.argsort(-means, kind="stable")):
        shown = points[i][0] + (" (default)" if i == 0 else "")
        lines.append(f"| {rank + 1} | {shown} | {means[i]:.4f} | {stds[i]:.4f} | {'yes' if eligible[i] else 'no'} |")
    return "\n".join(lines) + "\n"


def _config():
    from blocksync.pipeline.run_config import load_config

    config = load_config(str(CONFIG), [])
    config.progress = False
    return config


def check() -> None:
    """Before Spark starts: conf/local.yaml's settings are a point of the grid."""
    settings(_config().train)


def run(spark) -> dict:
    from blocksync.pipeline import stages

    config = _config()
    points = settings(config.train)
    with tempfile.TemporaryDirectory() as tmp:
        stages.prepare_stage(spark, config, Path(tmp))
        x, y = read_arrays(Path(tmp) / "prepared" / "train.parquet")  # never test.parquet
    torch.set_num_threads(1)
    scores = cross_validate(points, x, y)
    eligible = np.array([cfg.model.hidden == config.train.model.hidden for _, cfg in points])
    chosen, gain, two_se = decide(scores, eligible)
    best = best_candidate(scores, eligible)
    verdict = (f"adopt `{points[chosen][0]}`" if chosen else
               "keep the default: the best candidate's gain is not above two standard errors")
    payload = {"config": "conf/local.yaml", "train_rows": len(y), "folds": FOLDS, "repeats": REPEATS, "grid": GRID,
               "rows": [{"setting": label, "candidate": bool(eligible[i]), "folds": scores[i].tolist()}
                        for i, (label, _) in enumerate(points)],
               "best": points[best][0], "best_of_all": points[int(np.argmax(scores.mean(axis=1)))][0],
               "gain_over_default": gain, "two_standard_errors": two_se, "chosen": points[chosen][0],
               "verdict": verdict}
    write("model_selection", payload, _markdown(points, scores, eligible, payload))
    print(f"best candidate {payload['best']}: {gain:+.4f} over the default (2 SE {two_se:.4f}); {verdict}", flush=True)
    return payload
