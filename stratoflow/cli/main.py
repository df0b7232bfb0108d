"""The `stratoflow` command: run a pipeline locally through Airflow, list pipelines, compare runs.

    stratoflow run mnist --strategy mirrored --replicas 2 --epochs 3
    stratoflow run digits --conf '{"learning_rate": 0.01}' --no-promote
    stratoflow list
    stratoflow check [NAME|PATH ...]
    stratoflow compare mnist --limit 10 [--json] [--plot curves.png] [--run RUN_ID ...]
    stratoflow benchmark mnist [--epochs 3] [--strategies one_device,mirrored]
    stratoflow services up|status|down [--state-dir DIR] [--ray]
    stratoflow serve-model digits [--alias champion] [--port 5001] [--workers 1]
    stratoflow new-pipeline NAME [--from EXAMPLE] [--dir DIR]

The run flags come from the training settings' metadata (`stratoflow.config.training`), so a
typo is refused before Airflow starts. Tables and summaries go to stdout; progress and errors are
logged to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stratoflow.cli.tables import format_table
from stratoflow.config import discovery, extras, names, scaffold
from stratoflow.config.clusters import ClusterConfigError
from stratoflow.config.params import benchmark_params
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import list_pipelines, pipeline_problems
from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import TrainingConfig, settings_of
from stratoflow.tracking.model_serving import DEFAULT_PORT as DEFAULT_SERVING_PORT

log = logging.getLogger(__name__)

COMPARE_COLUMNS = (
    "strategy",
    "replicas",
    "workers",
    "loop",
    "epochs",
    "test_accuracy",
    "examples_per_second",
    "duration_s",
    "version",
    "champion",
)
CHAMPION_MARKER = "*"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `stratoflow` command line.

    Args:
        argv: the arguments after the program name; `sys.argv[1:]` by default.

    Returns:
        The exit code: 0 on success, 1 when the command failed (the reason is logged), 2 for a
        usage error (from argparse).
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        parser = build_parser()
    except ClusterConfigError as error:  # the run flags list the deployment's cluster names
        log.error("%s", error)
        return 2
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(parser, args)
    if args.command == "list":
        return _list()
    if args.command == "check":
        return _check(parser, args)
    if args.command == "serve":
        return _serve(parser, args)
    if args.command == "benchmark":
        return _benchmark(parser, args)
    if args.command == "services":
        return _services(args)
    if args.command == "new-pipeline":
        return _new_pipeline(args)
    if args.command == "serve-model":
        return _serve_model(args)
    return _compare(args)


def build_parser() -> argparse.ArgumentParser:
    """The `stratoflow` command line: every command and flag, as `main` parses them.

    Public so that what reads a command line elsewhere (the compose file's checks) parses it
    with the very parser the command uses.
    """
    parser = argparse.ArgumentParser(
        prog="stratoflow", description="Retrain TensorFlow models with Airflow and MLflow."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a pipeline once, for real, through Airflow (airflow dags test)",
        description="Run a pipeline's DAG once with `airflow dags test`, then print a summary. "
        "Flags override the same keys of --conf; unset ones keep the spec's defaults.",
    )
    run.add_argument("pipeline", type=_pipeline_name, metavar="PIPELINE")
    add_training_flags(run)
    run.add_argument(
        "--conf",
        default="{}",
        help="the run's Params as a JSON object, as for `airflow dags test -c`",
    )

    commands.add_parser(
        "list",
        help="list the pipelines, their schedules and DAG ids",
        description="List every pipeline that loads, with its DAG ids; log the file and field of "
        "each one that does not, and then exit 1.",
    )

    check = commands.add_parser(
        "check",
        help="check pipelines as a run's first task would, without Airflow (exit 1 on a failure)",
        description="Check each pipeline's spec, its run defaults, its dataset (prepared, or "
        "prepared now) and its own code on two training examples, as the first task of a run "
        "does; print a line per check, and the file and field of each failure.",
    )
    check.add_argument(
        "targets",
        nargs="*",
        metavar="NAME|PATH",
        help="a pipeline's name, a pipeline folder or a folder of them (default: every "
        "pipeline found)",
    )

    new = commands.add_parser(
        "new-pipeline",
        help="write a working pipeline folder to start your own from",
        description="Write DIR/NAME with pipeline.yaml and its own Python: by default a "
        "starter with its own model and preprocessing on an offline dataset; --from copies a "
        "bundled pipeline.",
    )
    new.add_argument("name", metavar="NAME")
    new.add_argument(
        "--from",
        dest="example",
        default=scaffold.STARTER,
        choices=scaffold.examples(),
        help="the template (default: starter)",
    )
    new.add_argument(
        "--dir",
        type=Path,
        help="the folder of pipelines to write into (default: the first STRATOFLOW_PIPELINES_PATH "
        "entry, else the current folder)",
    )

    serve = commands.add_parser(
        "serve",
        help="run a standing TensorFlow server (a parameter-server cluster's worker or ps)",
        description="Serve task INDEX of JOB in CLUSTER until killed. Without --cluster, read "
        "the cluster and the task from $TF_CONFIG (as Kubeflow's TFJob sets it).",
    )
    serve.add_argument("--job", choices=["worker", "ps"])
    serve.add_argument("--index", type=int, default=0)
    serve.add_argument("--cluster", help='JSON {"worker": ["host:port", ...], "ps": [...]}')

    benchmark = commands.add_parser(
        "benchmark",
        help="train briefly under every strategy this host can run and recommend one",
        description="Run a pipeline's strategy benchmark DAG once with `airflow dags test`, then "
        "print the comparison table and the recommended strategy. Registers no model.",
    )
    benchmark.add_argument("pipeline", type=_pipeline_name, metavar="PIPELINE")
    add_benchmark_flags(benchmark)
    benchmark.add_argument("--conf", default="{}", help="the benchmark's Params as a JSON object")
    services = commands.add_parser(
        "services",
        help="run the deployment locally: PostgreSQL, MLflow server, Airflow (up|status|down)",
        description="Start (up), describe (status) or stop (down) the stack of real processes "
        "in a state folder; every server binds 127.0.0.1 on a free port.",
    )
    services.add_argument("action", choices=["up", "status", "down"])
    services.add_argument(
        "--state-dir", help="the stack's folder (default: services/ in $STRATOFLOW_HOME)"
    )
    services.add_argument(
        "--ray",
        action="store_true",
        help="up: also start a single-node Ray head on 127.0.0.1 for `launcher: ray` runs",
    )

    serve_model = commands.add_parser(
        "serve-model",
        help="serve a pipeline's registered model over HTTP on 127.0.0.1 (MLflow's scoring server)",
        description="Serve models:/<the pipeline's registered model>@ALIAS with MLflow's scoring "
        "server in this environment (no virtualenv is built), from the tracking store stratoflow "
        "uses ($MLFLOW_TRACKING_URI, else the local SQLite store; credentials from "
        "$MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD), on 127.0.0.1 only, until "
        "Ctrl-C. The server has no authentication of its own.",
    )
    serve_model.add_argument("pipeline", type=_pipeline_name, metavar="PIPELINE")
    serve_model.add_argument(
        "--alias", default=names.CHAMPION, help=f"the version to serve (default: {names.CHAMPION})"
    )
    serve_model.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_SERVING_PORT,
        help=f"TCP port on 127.0.0.1 (default: {DEFAULT_SERVING_PORT}; 0: a free one, printed)",
    )
    serve_model.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="uvicorn worker processes, each loading the model (default: 1)",
    )

    compare = commands.add_parser("compare", help="compare a pipeline's tracked runs")
    compare.add_argument("pipeline", type=_pipeline_name, metavar="PIPELINE")
    compare.add_argument("--limit", type=_positive_int, default=20, help="newest N runs (20)")
    compare.add_argument(
        "--run",
        dest="run_ids",
        action="append",
        type=_run_id,
        metavar="RUN_ID",
        help="compare this MLflow run (repeat the flag); default: the newest --limit runs",
    )
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    compare.add_argument(
        "--plot",
        metavar="PATH",
        help="write a PNG overlaying the runs' val_loss and val_accuracy per epoch",
    )
    return parser


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per training setting, from its metadata (`stratoflow.config.training`).

    `--batch-size` for `batch_size`; a choice's allowed values are the flag's choices; a setting
    that is on by default gets a `--no-...` flag, one that is off by default a `--...` flag.
    Every flag defaults to None ("not given"), so that only the given ones override `--conf` and
    the spec.
    """
    defaults = TrainingConfig()
    for name, (kind, setting) in settings_of().items():
        flag = "--" + name.replace("_", "-")
        if kind is bool and not getattr(defaults, name):  # off by default: `--accept-drift`
            parser.add_argument(
                flag, dest=name, action="store_const", const=True, default=None, help=setting.help
            )
        elif kind is bool:
            parser.add_argument(
                f"--no-{name.replace('_', '-')}",
                dest=name,
                action="store_false",
                default=None,
                help=f"do not: {setting.help[0].lower()}{setting.help[1:]}",
            )
        elif (choices := setting.allowed()) is not None:
            parser.add_argument(flag, type=kind, choices=list(choices), help=setting.help)
        else:
            parser.add_argument(flag, type=kind, help=setting.help)


# A benchmark Param's JSON type -> how its flag's value is read (an array: comma-separated).
_FLAG_TYPES: dict[str, Callable[[str], Any]] = {"integer": int, "number": float}


def add_benchmark_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Param of the strategy-benchmark DAG, from its declaration
    (`stratoflow.config.params.benchmark_params`): its name, type and description."""
    for name, schema in benchmark_params().items():
        kind = _strategy_list if schema["type"] == "array" else _FLAG_TYPES[schema["type"]]
        text = schema["description"]
        if schema["type"] == "array":
            text = f"comma-separated. {text}"
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=text)


def _pipeline_name(value: str) -> str:
    if value not in list_pipelines():
        raise argparse.ArgumentTypeError(
            f"unknown pipeline {value!r}; available: {', '.join(list_pipelines())}"
        )
    return value


def _strategy_list(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {unknown[0]!r}; allowed: {', '.join(STRATEGIES)}"
        )
    return names


def _run_id(value: str) -> str:
    if not value or not all(c.isalnum() or c in "-_" for c in value):
        raise argparse.ArgumentTypeError(f"not an MLflow run id: {value!r}")
    return value


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _port(value: str) -> int:
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value!r}")
    return int(value)


def build_conf(conf_json: str, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The run's Params: the `--conf` JSON object, then every flag that was given.

    Args:
        conf_json: a JSON object, e.g. '{"epochs": 2}'.
        flags: flag values by Param name; None means "not given".

    Raises:
        ValueError: `conf_json` is not a JSON object.
    """
    try:
        conf = json.loads(conf_json or "{}")
    except json.JSONDecodeError as error:
        raise ValueError(f"--conf is not valid JSON: {error}") from None
    if not isinstance(conf, dict):
        raise ValueError(f"--conf must be a JSON object, got {type(conf).__name__}")
    return {**conf, **{key: value for key, value in flags.items() if value is not None}}


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from stratoflow.cli.runner import run_pipeline

    return _through_airflow(parser, args, list(settings_of()), run_pipeline)


def _benchmark(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from stratoflow.cli.runner import run_benchmark

    return _through_airflow(parser, args, list(benchmark_params()), run_benchmark)


def _through_airflow(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    flag_names: Sequence[str],
    run: Callable[[str, dict[str, Any]], int],
) -> int:
    """Run `args.pipeline` with `run` and the Params from `--conf` and the flags `flag_names`."""
    try:
        conf = build_conf(args.conf, {name: getattr(args, name) for name in flag_names})
    except ValueError as error:
        parser.error(str(error))
    return run(args.pipeline, conf)


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import os

    from stratoflow.config.clusters import parse_cluster
    from stratoflow.config.parsing import SpecError
    from stratoflow.distributed import server

    if args.cluster is None:
        if "TF_CONFIG" not in os.environ:
            parser.error("serve needs --job and --cluster, or $TF_CONFIG")
        server.serve_from_tf_config(os.environ["TF_CONFIG"])
        return 0
    if args.job is None:
        parser.error("serve --cluster needs --job")
    try:
        jobs = parse_cluster(args.cluster, "--cluster")
        server.serve(jobs, args.job, args.index)
    except (SpecError, ValueError) as error:
        parser.error(str(error))
    return 0


def _serve_model(args: argparse.Namespace) -> int:
    from stratoflow.cli.model_server import serve_model

    return serve_model(args.pipeline, args.alias, args.port, args.workers)


def _services(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.action == "up":  # before anything starts: the stack's parts come with extras
        try:
            extras.require("services", "stratoflow services up")
            if args.ray:
                extras.require("ray", "stratoflow services up --ray")
        except extras.MissingExtra as error:
            log.error("%s", error)
            return 1
    from stratoflow import services

    state = Path(args.state_dir) if args.state_dir else services.default_state_dir()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stack = services.Stack(state, attached=False)
    try:
        if args.action == "up":
            report = stack.up(ray=args.ray)
            waited = services.wait_for_dags(stack)
            sys.stdout.write(services.describe(stack, report, waited))
        elif args.action == "status":
            sys.stdout.write(services.describe(stack))
        else:
            stack.down()
            sys.stdout.write(f"stack in {state} stopped\n")
    except services.ServiceError as error:
        log.error("%s", error)
        return 1
    return 0


def _new_pipeline(args: argparse.Namespace) -> int:
    try:
        folder = scaffold.new_pipeline(args.name, args.example, args.dir)
    except SpecError as error:
        log.error("%s", error)
        return 1
    root = folder.parent
    on_path = any(root == entry.resolve() for entry in discovery.pipeline_roots()[1:])
    sys.stdout.write(f"wrote pipeline {args.name} in {folder}:\n")
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            sys.stdout.write(f"  {path.relative_to(folder)}\n")
    if not on_path:
        sys.stdout.write(
            f"add its folder of pipelines to the path:\n  export "
            f"{discovery.PIPELINES_PATH_ENV}={root}\n"
        )
    sys.stdout.write(f"then retrain it once: stratoflow run {args.name}\n")
    return 0


def _list() -> int:
    from stratoflow.cli.check import dag_ids
    from stratoflow.config.run_plan import load_pipeline

    rows, problems = [], []
    for name in list_pipelines():
        try:
            spec = load_pipeline(name)  # as the DAG files load it
        except SpecError as error:
            problems.append(f"pipeline {name!r}: {error}")
            continue
        rows.append(
            {
                "pipeline": name,
                "dataset": f"{spec.dataset.name} {spec.dataset.version}",
                "model": spec.model.builder,
                "schedule": spec.schedule or "manual only",
                "registered_model": spec.registered_model,
                "dag_ids": dag_ids(spec),
            }
        )
    sys.stdout.write(format_table(rows, list(rows[0]) if rows else []))
    problems += [f"{name}: {problem}" for name, problem in sorted(pipeline_problems().items())]
    for problem in problems:
        log.error("not loaded: %s", problem)
    return 1 if problems else 0


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from stratoflow.cli.check import TargetError, check_command

    try:
        return check_command(args.targets)
    except TargetError as error:
        parser.error(str(error))


def _compare(args: argparse.Namespace) -> int:
    from stratoflow.tracking import reports

    try:
        runs = reports.compare_runs(args.pipeline, args.limit, args.run_ids)
    except LookupError as error:
        log.error("%s", error)
        return 1
    except Exception:
        log.exception("Could not read the tracked runs of pipeline %s", args.pipeline)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(runs, indent=2, default=str) + "\n")
    elif not runs:
        sys.stdout.write(f"No tracked runs of pipeline {args.pipeline} yet.\n")
    else:
        rows = [{**run, "champion": CHAMPION_MARKER if run.get("champion") else ""} for run in runs]
        sys.stdout.write(format_table(rows, COMPARE_COLUMNS))
        sys.stdout.write(f"{CHAMPION_MARKER} = the registered model's current champion\n")
    if not runs:
        return 0
    # With --json, stdout stays pure JSON: the link and the plot's path go to the log (stderr).
    say = log.info if args.json else (lambda text: sys.stdout.write(text + "\n"))
    if args.plot:
        drawn = reports.plot_validation_curves(runs, args.plot)
        say(f"validation curves of {len(drawn)} run(s): {args.plot}")
    url = reports.compare_url(
        [run["run_id"] for run in runs], [run["experiment_id"] for run in runs]
    )
    say(f"compare them in the MLflow UI: {url}")
    if not reports.serves_ui():
        say(f"  (start the UI first: {reports.ui_command()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
