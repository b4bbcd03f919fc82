"""The `tfgpu` command: `tfgpu env`, `tfgpu demo`, `tfgpu report RUN_DIR`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    from tfgpu import __version__

    parser = argparse.ArgumentParser(
        prog="tfgpu", description="Make Keras/TensorFlow training use the GPU well."
    )
    parser.add_argument("--version", action="version", version=f"tfgpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("env", help="TensorFlow, CUDA, driver and GPU facts, and what is wrong")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("demo", help="train a reference model naively, then with tfgpu, and compare")
    p.add_argument("--quick", action="store_true", help="a tiny run for tests (seconds)")
    p.add_argument("--dataset", default=None, help="a TensorFlow Datasets name, e.g. cifar10")
    p.add_argument(
        "--run-dir", default=None, help="where to write the run (default: runs/demo-TIME)"
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs per side")

    p = sub.add_parser("report", help="plots and a Markdown summary of a run directory")
    p.add_argument("run_dir", help="a directory written by GPUMonitor / StepTimer")
    p.add_argument("--out", default=None, help="where to write (default: RUN_DIR)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `tfgpu` command line.

    Args:
        argv: list of str, the arguments without the program name. Defaults to `sys.argv[1:]`.

    Returns:
        int, the exit status: 0 on success, 2 on bad input.

    Example:

    >>> from tfgpu.cli import main
    >>> main(["env", "--json"])  # doctest: +SKIP
    0
    """
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "env":
            from tfgpu.env import environment

            report = environment()
            print(json.dumps(report.to_dict(), indent=2) if args.json else report)
            return 0
        if args.command == "report":
            from tfgpu.report import write_report

            summary = write_report(args.run_dir, out_dir=args.out)
            print(f"Report written to {summary}")
            return 0
        if args.command == "demo":
            from tfgpu.demo import run_demo

            return run_demo(
                quick=args.quick, dataset=args.dataset, run_dir=args.run_dir, epochs=args.epochs
            )
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        print(f"tfgpu {args.command}: error: {e}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse guarantees this


if __name__ == "__main__":
    sys.exit(main())
