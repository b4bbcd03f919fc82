"""The `tfgpu` command: `tfgpu env`, `tfgpu demo`, `tfgpu report LOG_DIR`, `tfgpu run SCRIPT.py`,
`tfgpu tune SCRIPT.py`.

Arguments are checked before TensorFlow is imported; errors exit 2, never with a traceback
(docs/guarantees.md, "Errors: one rule, raised before any work")."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tfgpu._internal.helpers.processes import startup_log_held_back
from tfgpu._internal.measure.rules import OBSERVE_BUDGET_S, PROCESS_BUDGET_S


def _build_parser() -> argparse.ArgumentParser:
    from tfgpu import __version__

    parser = argparse.ArgumentParser(
        prog="tfgpu", description="Make Keras/TensorFlow training use the GPU well."
    )
    parser.add_argument("--version", action="version", version=f"tfgpu {__version__}")
    verbose_help = (
        "also show TensorFlow's C++ start-up log (held back unless TF_CPP_MIN_LOG_LEVEL=0)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a command without the flag keeps what was given before it (`tfgpu -v env`).
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
    )

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=summary)

    p = command("env", "TensorFlow, CUDA, driver and GPU facts, and what is wrong")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = command("demo", "train a reference model naively, then with tfgpu, and compare")
    p.add_argument("--quick", action="store_true", help="a tiny run for tests (seconds)")
    p.add_argument("--dataset", help="a TensorFlow Datasets name, e.g. cifar10")
    p.add_argument(
        "--log-dir",
        metavar="LOG_DIR",
        help="a new or empty directory for the run (default: runs/demo-TIME); one that "
        "holds an earlier run is refused",
    )
    p.add_argument("--epochs", type=int, help="epochs per side (>= 1)")

    p = command("report", "plots and a Markdown summary of a run directory")
    p.add_argument(
        "log_dir", metavar="LOG_DIR", help="a run directory written by GPUMonitor / StepTimer"
    )
    p.add_argument("--out", help="where to write (default: LOG_DIR)")

    def script_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("script", metavar="SCRIPT.py", help="a script that builds a model and fits")
        p.add_argument(
            "script_args",
            nargs="...",
            metavar="ARGS",
            help="the script's own arguments (everything after SCRIPT.py: give tfgpu's options "
            "before it)",
        )

    p = command(
        "run",
        "run a training script unchanged: every fit recorded, the longest diagnosed, the "
        "report written",
    )
    script_arguments(p)
    p.add_argument(
        "--log-dir",
        metavar="LOG_DIR",
        help="the run directory, one fit-K directory per fit (default: runs/SCRIPT-TIME)",
    )
    p.add_argument(
        "--diagnose-budget-s",
        type=float,
        default=OBSERVE_BUDGET_S,
        help=f"seconds for the diagnosis at the end (default {OBSERVE_BUDGET_S:g})",
    )
    p.add_argument(
        "--no-diagnose", action="store_true", help="record and report only: no diagnosis"
    )

    p = command(
        "tune",
        "try every speed setting on a training script, unchanged: in its own process "
        "(tfgpu.tune's) and in fresh ones (precision, XLA auto-clustering, threads, GPU "
        "thread mode and allocator)",
    )
    script_arguments(p)
    p.add_argument("--steps", type=int, default=30, help="timed steps per run (>= 3)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps per run (>= 1)")
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=PROCESS_BUDGET_S,
        help=f"seconds for the whole search (each run restarts Python; default {PROCESS_BUDGET_S:g})",
    )
    p.add_argument("--log-dir", metavar="LOG_DIR", help="write tune.json and tune.png here")

    sub.add_parser(
        "data-service",
        help="run a tf.data service dispatcher or worker; its ports are open to anyone who "
        "reaches them (`tfgpu data-service --help`)",
        add_help=False,
    )
    for p in sub.choices.values():  # reports its command's argument errors (see `main`)
        p.set_defaults(command_parser=p)
    return parser


def _check_arguments(args: argparse.Namespace) -> None:
    """Checks a command's arguments (no TensorFlow), filling in the demo's default run directory;
    raises TypeError/ValueError naming the flags and values a command line can pass (`--out`)."""
    from tfgpu._internal.helpers.checks import check_dir, check_int, invalid_value

    def check_path(flag: str, value: str | None) -> None:
        check_dir(flag, value, allow_none=True, expected="a directory path")

    if args.command in ("run", "tune"):
        _check_flags_after_script(args)
    if args.command == "demo":
        from tfgpu.demo import check_arguments

        if args.dataset is not None and not args.dataset.strip():
            raise invalid_value(
                "--dataset",
                args.dataset,
                "a TensorFlow Datasets name such as cifar10 (without --dataset: offline "
                "synthetic data)",
            )
        check_path("--log-dir", args.log_dir)
        if args.epochs is not None:
            check_int("--epochs", args.epochs, minimum=1)
        args.log_dir = check_arguments(
            args.quick, args.dataset, args.log_dir, args.epochs, flags=True
        )
    elif args.command == "report":
        check_path("LOG_DIR", args.log_dir)
        check_path("--out", args.out)
    elif args.command == "run":
        from tfgpu._internal.helpers.checks import check_number, check_script

        check_script("SCRIPT.py", args.script)
        check_path("--log-dir", args.log_dir)
        check_number(
            "--diagnose-budget-s",
            args.diagnose_budget_s,
            minimum=0,
            exclusive_minimum=True,
            expected="a finite number of seconds > 0",
        )
    elif args.command == "tune":
        from tfgpu.tuning._script import check_arguments as check_tune_arguments

        check_tune_arguments(
            args.script, args.script_args, args.steps, args.warmup, args.time_budget_s,
            args.log_dir, flags=True,
        )  # fmt: skip


def _check_flags_after_script(args: argparse.Namespace) -> None:
    """Refuses one of the command's own flags after SCRIPT.py (`tfgpu tune train.py
    --time-budget-s 60`): it would go to the script, unseen, and the command run on its
    default. A flag the script's text names is the script's own and goes to it."""
    from tfgpu._internal.helpers.checks import invalid_value

    own = [
        flag
        for action in args.command_parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag not in ("--help", "--verbose")
    ]
    given = [
        flag
        for flag in own
        for arg in args.script_args
        if arg == flag or arg.startswith(f"{flag}=")
    ]
    if not given:
        return
    try:
        text = Path(args.script).read_text(encoding="utf-8", errors="replace")
    except OSError:  # check_script reports an unreadable script
        return
    for flag in given:
        if flag not in text:
            raise invalid_value(
                flag,
                None,
                f"tfgpu's options before the script: `tfgpu {args.command} {flag} ... "
                "SCRIPT.py [ARGS]` (everything after SCRIPT.py is the script's own)",
                received=f"{flag} after SCRIPT.py, where it goes to the script "
                f"{args.script!r}, which does not mention it",
            )


def _hold_back_startup_log(verbose: bool, environ: Mapping[str, str]) -> bool:
    """Whether to hold back TensorFlow's start-up log: yes unless `--verbose` or
    `TF_CPP_MIN_LOG_LEVEL=0` (TensorFlow writes it before reading the variable, so `=2` alone
    cannot quiet it). Pure."""
    return not verbose and environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() != "0"


def _load_tensorflow() -> None:
    """Imports TensorFlow and lists its GPUs (no runtime start): the noisy part of start-up."""
    try:
        import tensorflow as tf

        tf.config.list_physical_devices("GPU")
    except Exception:  # a broken install raises anything here: the command itself (`tfgpu
        pass  # env`) says what is wrong with TensorFlow, so the command line never crashes


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `tfgpu` command line.

    Args:
        argv: list of str, the arguments without the program name. Defaults to `sys.argv[1:]`.

    Returns:
        int, the exit status: 0 on success, 2 when the command failed or (`report`) a file
        of the run directory could not be read.

    Raises:
        SystemExit: 2 for a malformed argument (after argparse's usage and `error:` line),
            0 for `--help` / `--version`.

    Example:

    >>> from tfgpu.cli import main
    >>> main(["env", "--json"])  # doctest: +SKIP
    0
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["data-service"]:  # its own parser (its --help included); servers log to stderr
        from tfgpu._internal.adapters.data_service import main as data_service

        return data_service(argv[1:])
    args = _build_parser().parse_args(argv)
    try:
        _check_arguments(args)
    except (TypeError, ValueError) as e:
        args.command_parser.error(str(e))  # usage, then the error; exit status 2
    hold_back = _hold_back_startup_log(args.verbose, os.environ)
    try:
        if args.command == "env":
            from tfgpu.env import environment

            with startup_log_held_back(hold_back):
                report = environment()
            print(json.dumps(report.to_dict(), indent=2) if args.json else report)
            return 0
        if args.command == "report":
            from tfgpu.report import write_report_and_problems

            summary, problems = write_report_and_problems(args.log_dir, out_dir=args.out)
            print(f"Report written to {summary}")
            for error in problems.errors:
                print(f"tfgpu report: error: {error}", file=sys.stderr)
            if problems.notes:
                print(
                    f"tfgpu report: {len(problems.notes)} note(s) on what was worked around: "
                    f"see the Problems section of {summary}",
                    file=sys.stderr,
                )
            return 2 if problems.errors else 0
        # demo and tune report no environment variables: quiet TensorFlow's own log too (not
        # under `run`: the script's environment is the one it has under `python SCRIPT.py`).
        if args.command != "run":
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if args.verbose else "2")
        with startup_log_held_back(hold_back):
            _load_tensorflow()
        if args.command == "demo":
            from tfgpu.demo import run_demo

            return run_demo(
                quick=args.quick, dataset=args.dataset, log_dir=args.log_dir, epochs=args.epochs
            )
        if args.command == "run":
            from tfgpu.run import run_script

            return run_script(
                args.script,
                args.script_args,
                log_dir=args.log_dir,
                diagnose=not args.no_diagnose,
                diagnose_budget_s=args.diagnose_budget_s,
            )
        if args.command == "tune":
            from tfgpu.tuning._script import run_command

            return run_command(args)
    except (ValueError, TypeError, OSError, ImportError) as e:
        print(f"tfgpu {args.command}: error: {e}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse guarantees this


if __name__ == "__main__":
    sys.exit(main())
