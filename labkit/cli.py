"""The `labkit` command: a thin shell over labkit's functions, with no logic of its own.

Each command lives in the module that does the work, as `cli_main(argv) -> int`; this file only
routes to it, so `labkit --help` stays fast (nothing heavy is imported until a command runs).

Bad input is one line on stderr and exit status 2, before any work: LABKIT_PROFILE, LABKIT_CORES, LABKIT_MEMORY
and LABKIT_GPUS are checked before a command starts (each command reads them through machine.setting), and a
ValueError, TypeError or OSError escaping a command is printed as one line
(LABKIT_DEBUG=1 shows the traceback instead). (00_welcome)
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from labkit.base import config

# name -> (module, one-line help)
COMMANDS = {
    "doctor": ("labkit.doctor", "check Python, TensorFlow, Horovod, GPUs, cores, memory, disk and data"),
    "plan": ("labkit.plan", "the launches each notebook would make on this machine (LABKIT_CORES, LABKIT_MEMORY)"),
    "data": ("labkit.data", "fetch or locate data sets (CIFAR-10) for offline compute nodes"),
    "flops": ("labkit.flops", "per-layer params, MACs and FLOPs of a named model"),
    "conv-bench": ("labkit.conv.bench_cli", "time naive / im2col / tf.nn.conv2d / bare GEMM on ResNet-50 layers"),
    "scale": ("labkit.scale.scaling", "run Horovod data-parallel training for several worker counts"),
    "fit-bench": ("labkit.exercises.fitbench", "images/s of Keras model.fit with Horovod against labkit's custom loop"),
    "sweep": ("labkit.sweep.networks", "train the MATLAB white paper's 16 networks in parallel worker processes"),
    "exercises": ("labkit.exercises.build", "list the exercises, or build the learner edition without solutions"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labkit",
        description="labkit: tools behind the high-performance CNN training course.",
        epilog="Run `labkit COMMAND --help` for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        # add_help=False: the command's own parser answers --help with its real options
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        parser.error(f"unknown command {name!r}; choose from: {', '.join(COMMANDS)}")
    debug = os.environ.get("LABKIT_DEBUG", "").strip() not in ("", "0")
    asks_help = any(a in ("-h", "--help") for a in rest)
    if name != "doctor" and not asks_help:  # doctor reports a bad profile as one of its checks
        try:
            config.profile()
            _check_settings()
        except ValueError as err:
            return _one_line(name, err)
    module_name = COMMANDS[name][0]
    module = importlib.import_module(module_name)
    entry = getattr(module, "cli_main", None)
    if entry is None:
        print(f"labkit {name}: {module_name}.cli_main is missing", file=sys.stderr)
        return 2
    try:
        status = int(entry(rest) or 0)
        sys.stdout.flush()  # a reader that went away (labkit plan | head -1) is seen here, not at exit
        return status
    except BrokenPipeError:  # as any Unix tool whose reader closed the pipe: quiet, the status of a SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 128 + 13
    except KeyboardInterrupt:
        print(f"\nlabkit {name}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as err:
        if debug:
            raise
        return _one_line(name, err, hint=True)


def _check_settings() -> None:
    """ValueError (one line naming the variable) when LABKIT_CORES, LABKIT_MEMORY or LABKIT_GPUS is set to a value
    machine.setting refuses: a command that never reads one (labkit sweep and LABKIT_GPUS) still refuses it."""
    from labkit.base import machine

    for variable in (machine.CORES_ENV, machine.MEMORY_ENV, machine.GPUS_ENV):
        machine.setting(variable)


def _one_line(name: str, err: BaseException, hint: bool = False) -> int:
    """Print err as one line on stderr (what was wrong and the fix, no traceback); exit status 2."""
    text = " ".join(str(err).split()) or type(err).__name__
    more = " (LABKIT_DEBUG=1 shows the traceback)" if hint else ""
    print(f"labkit {name}: {text}{more}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
