"""``normlab`` command line: thin subcommands over the library.

Every user error is one line on stderr and exit status 2 (``--debug`` shows the traceback); every command that
prints results takes ``--json`` and then prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from normlab.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NormlabError
from normlab.provenance import version_string
from normlab.safety import guarded, printable
from normlab.train.heap import set_heap_policy
from normlab.train.threads import check_thread_variables, set_wait_policy
from normlab.validate import check_environment


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message)
        message = re.sub(r"^argument (--[\w-]+)(?:/\S+)?: must", r"\1 must", message)  # a range flag (validate.py)

        print(f"error: {printable(message)} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


COMMAND_MODULES = ("train", "config", "eval", "convert", "remove_norm", "quantize", "export", "import_", "generate",
                   "calibrate", "extrapolate", "diagnose", "compare", "runs", "report", "scaling", "claims", "advise",
                   "probe", "norms", "attention")
"""normlab.commands modules, in the order their commands appear in ``normlab --help``."""


class _Version(argparse.Action):
    """``--version``, computed only when asked (the git lookup costs a subprocess)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"normlab {version_string()}")
        raise SystemExit(0)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="normlab", description="Normalization lab for transformer language models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print normlab's version (and git commit when run from a checkout) and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:  # each command module declares its own flags (add_parser)
        importlib.import_module(f"normlab.commands.{name}").add_parser(sub)
    return p


PATH_FLAGS = ("out", "write")
"""Options naming a path to write: an empty value would silently mean the default location or the current
directory, so it is refused."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for dest in PATH_FLAGS:
        if getattr(args, dest, None) == "":
            parser.error(f"--{dest} is empty: give a path, or leave --{dest} out for the default")
    return guarded(lambda: int(args.func(args) or 0), debug=args.debug, command=getattr(args, "command", None))


def set_process_policies() -> None:
    """Before torch is imported: the ``NORMLAB_*`` variables checked (normlab.validate.check_environment), the
    OpenMP wait policy with the threads ``auto`` may take (normlab.train.threads.set_wait_policy) and the C heap's
    policy (normlab.train.heap.set_heap_policy), for this process and, through the environment, its children (sweep
    workers, DDP ranks). The ``normlab`` command and ``make demo`` call it first."""
    try:  # every NORMLAB_* variable and the OpenMP/MKL thread counts: bad input is one line, exit 2, before anything
        check_environment()  # runs (libgomp reads OMP_NUM_THREADS when torch loads it)
        for note in check_thread_variables():
            print(note, file=sys.stderr)
    except NormlabError as e:
        print(f"error: {printable(e)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    set_wait_policy()  # the wait policy and auto's threads, from the machine's state now (kept if a parent set it)
    os.environ.setdefault("NORMLAB_HEAP_NOTE", set_heap_policy())


def entry() -> None:
    """Console-script entry point. A Ctrl-C while the parser is built (outside ``guarded``) is exit 130 too.
    First, before torch is imported, ``set_process_policies``."""
    set_process_policies()
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); nothing was written", file=sys.stderr)
        code = EXIT_INTERRUPTED
    sys.exit(code)


if __name__ == "__main__":
    entry()
