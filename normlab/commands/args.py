"""Flags shared by several commands (each command module declares its own parser with ``add_parser``)."""

from __future__ import annotations

import argparse


def data_arg(p: argparse.ArgumentParser) -> None:
    """``--data SOURCE``: score another corpus with the run's own tokenizer (eval, calibrate, extrapolate, diagnose)."""
    p.add_argument("--data", metavar="SOURCE", help="score another corpus (any data.source) with the run's own "
                   "tokenizer; results go to files suffixed _data-<content hash> (default: the run's corpus, "
                   "refused if it changed since training)")


def eval_set_arg(p: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` for evaluation-time keys only (eval, extrapolate;
    ``normlab.rundir.readers.apply_eval_overrides``)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="evaluation-time key only, e.g. model.lssa_reweight=true")
