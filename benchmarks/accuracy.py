"""Test accuracy of the default digits config (conf/local.yaml) against scikit-learn on the same split,
and of conf/digits_tokens.yaml: the `transformer` reading each image as 64 pixel tokens (vocabulary 17).

The pipeline's prepare stage cuts the split and standardizes it once; then
the default config trains on it with each backend (horovod, torch_gloo,
spark) through the same train and evaluate stages `make demo` runs. The spark
backend computes the same model (BSP equivalence, tests/test_engine.py) but
exchanges gradients through BarrierTaskContext.allGather at about a second a
step, so its 690 steps make it the slowest row (about 12 minutes).
scikit-learn's MLPClassifier (its defaults, max_iter=1000, seeds 0 to 4) and
SVC (RBF, its defaults) fit the same standardized train split and score the
same test split. The tokens config prepares its own split (raw pixels, not
standardized) with the same seed and fraction; the benchmark checks that its
test rows are the default config's (un-standardized) and records it as
`same_split`.

scikit-learn's MLP is shown over 5 seeds; so is the default config, on torch_gloo
with `train.seed` 0 to 4 (seed 0 is the backend row's own run; the split stays
the same). That row shows how far the training seed alone moves the score on
these 341 rows. It is a spread, not a choice: conf/local.yaml keeps seed 0
whatever it shows, since picking the seed by its test score would tune on the
test rows.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import write

BACKENDS = ["horovod", "torch_gloo", "spark"]
SKLEARN_SEEDS = range(5)
TRAIN_SEEDS = range(5)
SEED_BACKEND = "torch_gloo"
CONFIG = Path(__file__).resolve().parent.parent / "conf" / "local.yaml"
TOKENS_CONFIG = CONFIG.with_name("digits_tokens.yaml")


def read_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    frame = pd.read_parquet(path)
    return np.stack(frame["features"].to_numpy()), frame["label"].to_numpy()


def sklearn_accuracies(prepared: Path) -> dict[str, list[float]]:
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import SVC

    x, y = read_arrays(prepared / "train.parquet")
    xt, yt = read_arrays(prepared / "test.parquet")
    mlp = [float((MLPClassifier(random_state=s, max_iter=1000).fit(x, y).predict(xt) == yt).mean())
           for s in SKLEARN_SEEDS]
    return {"sklearn MLPClassifier": mlp, "sklearn SVC": [float((SVC().fit(x, y).predict(xt) == yt).mean())]}


def tokens_run(spark, tmp: Path, default_prepared: Path) -> tuple[dict, bool]:
    """The transformer config end to end; and whether its test split holds the default config's rows."""
    from blocksync.pipeline import stages
    from blocksync.pipeline.run_config import load_config

    config = load_config(str(TOKENS_CONFIG), [f"output_dir={tmp / 'tokens'}", "progress=false"])
    acc = stages.run(spark, config)["test_accuracy"]
    meta = json.loads((default_prepared / "prepare.json").read_text())
    x, y = read_arrays(default_prepared / "test.parquet")
    pixels = np.rint(x.astype(np.float64) * np.asarray(meta["std"]) + np.asarray(meta["mean"]))
    tokens = pd.read_parquet(tmp / "tokens" / "prepared" / "test.parquet")
    raw = tokens[[f"pixel_{i}" for i in range(64)]].to_numpy()
    same = (sorted(map(tuple, np.column_stack([pixels, y])))
            == sorted(map(tuple, np.column_stack([raw, tokens["label"]]))))
    return {"contender": "blocksync transformer, 64 pixel tokens (conf/digits_tokens.yaml, horovod)",
            "accuracies": [acc]}, same


def default_run(spark, config, prepared_run: Path, run_dir: Path, **train) -> float:
    """Test accuracy of the default config with `train` changed, trained on the prepared split."""
    from blocksync.pipeline import stages

    run_dir.mkdir()
    (run_dir / "prepared").symlink_to(prepared_run / "prepared")
    cfg = dataclasses.replace(config, train=dataclasses.replace(config.train, **train))
    stages.train_stage(spark, cfg, run_dir)
    return float(stages.evaluate_stage(spark, cfg, run_dir)["test_accuracy"])


def run(spark) -> dict:
    from blocksync.pipeline import stages
    from blocksync.pipeline.run_config import load_config

    config = load_config(str(CONFIG), [])
    config.progress = False
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prepared_run = Path(tmp) / "prepared-run"
        stages.prepare_stage(spark, config, prepared_run)
        by_backend: dict[str, float] = {}
        for backend in BACKENDS:
            by_backend[backend] = default_run(spark, config, prepared_run, Path(tmp) / backend, backend=backend)
            rows.append({"contender": f"blocksync default config ({backend})", "accuracies": [by_backend[backend]]})
            print(f"{backend}: test accuracy {by_backend[backend]:.4f}", flush=True)
        seeds = [by_backend[SEED_BACKEND] if seed == config.train.seed else
                 default_run(spark, config, prepared_run, Path(tmp) / f"seed{seed}", backend=SEED_BACKEND, seed=seed)
                 for seed in TRAIN_SEEDS]
        seed_label = f"train.seed {TRAIN_SEEDS[0]} to {TRAIN_SEEDS[-1]}"
        rows.append({"contender": f"blocksync default config ({SEED_BACKEND}), {seed_label}", "accuracies": seeds})
        print(f"{SEED_BACKEND}, {seed_label}: {seeds}", flush=True)
        tokens_row, same_split = tokens_run(spark, Path(tmp), prepared_run / "prepared")
        rows.append(tokens_row)
        print(f"transformer: {tokens_row['accuracies']}, same split: {same_split}", flush=True)
        test_rows = len(pd.read_parquet(prepared_run / "prepared" / "test.parquet"))
        for name, accs in sklearn_accuracies(prepared_run / "prepared").items():
            rows.append({"contender": name, "accuracies": accs})
            print(f"{name}: {accs}", flush=True)
    payload = {"rows": rows, "test_rows": test_rows, "config": "conf/local.yaml",
               "model": dataclasses.asdict(config.train.model), "epochs": config.train.epochs,
               "tokens_config": "conf/digits_tokens.yaml", "same_split": same_split}
    split = "same split" if same_split else "NOT the same split (see same_split)"
    lines = [f"# Test accuracy on digits: the default config and the transformer against scikit-learn, {split} "
             f"({test_rows} test rows)", "", "| contender | test accuracy | runs |", "| --- | --- | --- |"]
    for r in rows:
        accs = r["accuracies"]
        shown = f"{accs[0]:.4f}" if len(accs) == 1 else f"{min(accs):.4f} to {max(accs):.4f} (mean {np.mean(accs):.4f})"
        lines.append(f"| {r['contender']} | {shown} | {len(accs)} |")
    write("accuracy", payload, "\n".join(lines) + "\n")
    return payload
