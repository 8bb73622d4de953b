"""`blocksync {prepare,train,evaluate,run} --config conf/X.yaml [key.sub=value ...]`, and
`blocksync predict --model RUN_OR_MODEL --input PATH_OR_TABLE --output PATH` for new data, and
`blocksync clean --output DIR` for what stopped runs left beside an output (`leftovers`).

The console script, `python -m blocksync.pipeline.cli` and `spark-submit jobs/<stage>.py` all call
`console` (`main`, then exit). Settings are checked before Spark starts; the JVM then starts while
a thread imports what the stage needs (`session_with_preload`).
Exit codes: 0 ok; 2 bad input or config (one clear line on stderr, no
traceback); 1 runtime failure (the message, with the failing worker's own
error and rank when a worker failed); 130 on SIGINT and 143 on SIGTERM (the stage stopped, staging removed).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from blocksync.pipeline.run_config import RunConfig
    from blocksync.pipeline.run_files import RunFiles

STAGES = ("prepare", "train", "evaluate", "run")
log = logging.getLogger("blocksync")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} ({self.format_usage().strip()})")


class UsageError(ValueError):
    """Bad command line."""


def build_parser(stage: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="blocksync" if stage is None else f"jobs/{stage}.py",
                     description="Block-synchronous PyTorch training on Spark.")
    if stage is None:
        parser.add_argument("stage", choices=STAGES,
                            help="what to run (or: predict --model M --input I --output O; clean --output DIR)")
    parser.add_argument("--config", required=True, help="YAML run config, e.g. conf/local.yaml")
    parser.add_argument("--overwrite", action="store_true", help="replace existing results in output_dir")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar and no progress log lines; warnings, errors and the result only")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="override config values")
    return parser


def build_predict_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="blocksync predict", description="Score new data on the executors with a trained model.")
    parser.add_argument("--model", required=True,
                        help="a run directory (or its model/), or where a Spark ML model or PipelineModel was saved")
    parser.add_argument("--input", required=True, help="Parquet or CSV path (any Spark filesystem), or a table")
    parser.add_argument("--output", required=True, help="where to write the scored rows (Parquet)")
    parser.add_argument("--master", default="local[4]", help="Spark master when not under spark-submit")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, as spark-submit's --conf (e.g. spark.hadoop.fs.s3a.endpoint=...)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    parser.add_argument("--trust-custom-code", action="store_true",
                        help="allow a run's network named by an import path (imports and runs that code)")
    parser.add_argument("--quiet", action="store_true", help="warnings, errors and the result only")
    return parser


def build_clean_parser() -> argparse.ArgumentParser:
    from blocksync.pipeline.leftovers import STALE_HOURS

    parser = _Parser(prog="blocksync clean", description="Remove the staging folders that stopped runs left "
                     "beside (and inside) an output directory, where their process is provably gone.")
    parser.add_argument("--output", required=True, help="an output_dir, or a predict --output")
    parser.add_argument("--older-than-hours", type=float, default=STALE_HOURS, metavar="H",
                        help=f"remove a folder made on another host, or unsigned, once this old (default "
                        f"{STALE_HOURS:g})")
    parser.add_argument("--master", default="local[1]", help="Spark master (its filesystem layer reads the path)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    return parser


def execute_clean(args: argparse.Namespace) -> int:
    from blocksync.pipeline.run_config import RunConfig, SparkSettings
    from blocksync.pipeline.session import stop_session

    if args.older_than_hours < 0:
        raise ValueError(f"--older-than-hours {args.older_than_hours:g}: give 0 or more hours.")
    conf = dict(_key_value(item) for item in args.conf)
    spark = session_for(RunConfig(spark=SparkSettings(master=args.master, app_name="blocksync-clean", conf=conf)))
    spark.sparkContext.setLogLevel("ERROR")
    try:
        from blocksync.pipeline.leftovers import sweep
        from blocksync.pipeline.run_files import RunFiles

        removed, kept = sweep(RunFiles(spark, args.output, setting="--output"), stale_hours=args.older_than_hours)
    finally:
        stop_session(spark)
    for line in removed:
        print(f"removed {line}")
    for line in kept:
        print(f"kept {line}")
    print(f"{len(removed)} removed, {len(kept)} kept")
    return 0


COMMANDS = {"predict": (build_predict_parser, "execute_predict"), "clean": (build_clean_parser, "execute_clean")}
"""The commands beside the stages, each with its own flags (`blocksync predict ...`, `blocksync clean ...`)."""


def execute_predict(args: argparse.Namespace) -> int:
    from blocksync.pipeline.run_config import RunConfig, SparkSettings
    from blocksync.pipeline.session import stop_session

    if args.quiet:
        logging.getLogger().setLevel(logging.WARNING)
    conf = dict(_key_value(item) for item in args.conf)
    spark = session_with_preload(RunConfig(spark=SparkSettings(master=args.master, app_name="blocksync-predict",
                                                               conf=conf)), ["blocksync.pipeline.predict"])
    spark.sparkContext.setLogLevel("ERROR")
    try:
        from blocksync.pipeline.predict import predict

        rows = predict(spark, args.model, args.input, args.output, overwrite=args.overwrite,
                       trust_custom_code=args.trust_custom_code)
    finally:
        stop_session(spark)
    print(f"scored {rows} rows into {args.output}")
    return 0


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--conf {item!r}: give KEY=VALUE, e.g. --conf spark.hadoop.fs.defaultFS=hdfs://nn:8020.")
    return key.strip(), value


def stage_modules(stage: str, config: RunConfig) -> list[str]:
    """What `stage` imports as it runs: the stages (torch and the engine), scikit-learn for the bundled
    digits, matplotlib for the report."""
    modules = ["blocksync.pipeline.stages"]
    if stage in ("prepare", "run") and config.data.source == "digits":
        modules.append("sklearn.datasets")
    if stage in ("evaluate", "run"):
        modules.append("matplotlib.pyplot")
    return modules


SHARED_IMPORTS = ("numpy", "pandas", "pyarrow", "pyspark.sql", "unittest", "blocksync.pipeline.session")
"""What both starting a session and the stages import: loaded before the preload thread starts, so the
two threads never import one module at the same time (a concurrent circular import can hand a thread a
partially initialized module: pyspark.errors did). tests/test_entry_points.py checks that they share
nothing else."""


def session_with_preload(config: RunConfig, modules: list[str]) -> SparkSession:
    """`session_for(config)`, importing `modules` on a thread meanwhile.

    The JVM takes seconds to start, and the imports (about a second for torch alone) are Python work
    that overlaps it (the saving is measured in benchmarks/results/demo.md). The settings have been
    checked before this, without those imports (`checks`). An import that fails here is left to fail
    again, with its own error, where the stage imports the module.
    """
    for name in SHARED_IMPORTS:
        importlib.import_module(name)

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 (see the docstring)
                return

    loader = threading.Thread(target=load, name="blocksync-preload", daemon=True)
    loader.start()
    try:
        return session_for(config)
    finally:
        loader.join()


def session_for(config):  # type: ignore[no-untyped-def]
    """The SparkSession for a run: under spark-submit its command-line settings win."""
    from pyspark.sql import SparkSession

    from blocksync.pipeline.session import (
        LOCAL_DEFAULTS,
        create_session,
        jvm_log_path,
        jvm_output_to,
        local_session,
    )

    settings = config.spark
    conf = {k: str(v) for k, v in settings.conf.items()}
    # BarrierTaskContext.allGather waits this long (Spark's default is a year).
    conf.setdefault("spark.barrier.sync.timeout", str(config.train.timeouts.barrier_seconds))
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit: its settings win
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        submitted = SparkConf()
        builder = SparkSession.builder.appName(settings.app_name)
        defaults = LOCAL_DEFAULTS if submitted.get("spark.master", "").startswith("local") else {}
        for key, value in {**defaults, **conf}.items():
            if not submitted.contains(key):
                builder = builder.config(key, value)
        return builder.getOrCreate()
    master = settings.master or "local[4]"
    with jvm_output_to(jvm_log_path()):  # the JVM's banner and logs go to a file, not the terminal
        if master.startswith("local"):
            return local_session(master, settings.app_name, conf)
        return create_session(SparkSession.builder.master(master).appName(settings.app_name), conf)


def execute(stage: str, args: argparse.Namespace) -> int:
    from blocksync.pipeline.checks import check_checkpoint_dir, check_model, check_settings
    from blocksync.pipeline.run_config import load_config
    from blocksync.pipeline.run_files import RunFiles
    from blocksync.pipeline.session import jvm_log_path, stop_session

    config = load_config(args.config, args.overrides)
    if args.quiet:  # no progress bar, no progress log lines: warnings, errors and the result only
        config.progress = False
        logging.getLogger().setLevel(logging.WARNING)
    if stage == "run":  # before Spark starts: settings that would otherwise fail minutes later
        check_settings(config)
    elif stage == "train":
        check_checkpoint_dir(config.train.checkpoint.dir)
        check_model(config.train.model)
    spark = session_with_preload(config, stage_modules(stage, config))
    from blocksync.pipeline import stages as pipeline

    spark.sparkContext.setLogLevel("ERROR")
    try:
        files = RunFiles(spark, config.output_dir)
        if stage == "prepare":
            meta = pipeline.prepare_stage(spark, config, files, overwrite=args.overwrite)
            rows = meta["rows"]
            print(f"prepared {rows['train']} train and {rows['test']} test rows in {files.display('prepared')}")
        elif stage == "train":
            result = pipeline.train_stage(spark, config, files, overwrite=args.overwrite)
            m = result.metrics
            print(f"trained {m['steps']} steps on {m['num_workers']} workers ({m['backend']}): "
                  f"train_loss {m['train_loss']:.4f}, {m['samples_per_sec']:.0f} samples/s; "
                  f"model in {files.display('model')}")
        elif stage == "evaluate":
            _print_result(pipeline.evaluate_stage(spark, config, files), files)
        else:
            _print_result(pipeline.run(spark, config, overwrite=args.overwrite), files)
    finally:
        stop_session(spark)
    log = jvm_log_path()
    try:
        if log.exists() and files.exists():  # a finished run keeps Spark's log with its outputs
            files.upload(log, "spark.log", overwrite=True)
            log.unlink()
    except OSError as err:  # the run is done and written: say where the log stayed instead
        logging.getLogger("blocksync").warning("Spark's log stays at %s: %s", log, err)
    return 0


def _print_result(metrics: dict, files: RunFiles) -> None:
    if "test_accuracy" in metrics:
        print(f"test accuracy {metrics['test_accuracy']:.4f}, F1 {metrics['test_f1']:.4f}, "
              f"log loss {metrics['test_loss']:.4f}")
    else:
        print(f"test RMSE {metrics['test_rmse']:.4f}, R2 {metrics['test_r2']:.4f}")
    print(f"report: {files.display('report.png')}   metrics: {files.display('metrics.json')}")


def main(argv: Sequence[str] | None = None, stage: str | None = None) -> int:
    """Run a stage (`stage=None`: the one named in `argv`); returns the exit code."""
    from blocksync.engine.errors import CollectiveError, TrainingError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "pyspark", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        named = argv[0] if stage is None and argv else stage
        command = named if named in COMMANDS else None
        with sigterm_as_interrupt():
            if command is not None:
                parser, execute_command = COMMANDS[command]
                return globals()[execute_command](parser().parse_args(argv[1:] if stage is None else argv))
            args = build_parser(stage).parse_intermixed_args(argv)
            return execute(stage or args.stage, args)
    except (ValueError, FileExistsError) as err:
        print(f"blocksync: error: {err}", file=sys.stderr)
        return 2
    except TrainingError as err:
        if err.kind == "input":  # a rank found bad data or settings
            print(f"blocksync: error: {err}", file=sys.stderr)
            return 2
        return _failed(str(err))
    except CollectiveError as err:
        return _failed(str(err))
    except KeyboardInterrupt as err:
        if isinstance(err, Terminated):
            print("blocksync: terminated (SIGTERM): the stage was stopped and its staging folder removed",
                  file=sys.stderr)
            return 128 + signal.SIGTERM
        print("blocksync: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a Spark/JVM failure outside the barrier stage
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        return _failed(f"{type(err).__name__}: {' '.join(lines[:3])[:1500]}")


class Terminated(KeyboardInterrupt):
    """SIGTERM (what YARN, Kubernetes and `timeout` send), raised where the program is, as Ctrl-C is."""


def _on_sigterm(signum: int, frame: object) -> None:
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:  # as pyspark's own SIGINT handler does: stop the running stage at once
        with contextlib.suppress(Exception):  # a JVM going down as well: the stage is stopping anyway
            context.cancelAllJobs()
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM handled as SIGINT is: the stage is cancelled, the `finally` blocks remove the staging folders,
    and the command exits 143. Only the main thread can set a handler (a command run in a thread cannot)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _failed(message: str) -> int:
    """A runtime failure: one line, pointing at the JVM's log where this process started the JVM."""
    from blocksync.pipeline.session import jvm_log_path

    log = jvm_log_path()
    where = f" (Spark's log: {log})" if log.exists() else ""
    print(f"blocksync: failed: {message}{where}", file=sys.stderr)
    return 1


def console(argv: Sequence[str] | None = None, stage: str | None = None) -> NoReturn:
    """The entry point of the console script, of `python -m blocksync.pipeline.cli` and of jobs/<stage>.py:
    `main`, then exit with its code.

    Every object is first frozen out of the garbage collector (`gc.freeze`): otherwise the interpreter's
    teardown walks the heaps of torch, pandas, pyspark and matplotlib in a last collection, most of a
    second on 2 cores (benchmarks/results/demo.md). Everything is written and closed by then, and the
    atexit handlers (logging's flush among them) still run.
    """
    code = main(argv, stage)
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    console()
