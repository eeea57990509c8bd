"""``normlab config [PRESET|YAML|RUN_DIR] [--set KEY=VALUE ...] [--json]``: the resolved config before training,
every key with its type, default, allowed values and a one-line description (``normlab.config_help``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from normlab.io import dumps
from normlab.safety import printable
from normlab.presets import config_presets
from normlab.rundir.files import CONFIG_FILE
from normlab.rundir.readers import open_config


def run_config(args: argparse.Namespace) -> int:
    # torch: not loaded by `normlab --help`
    from normlab.config import load_config, new_config
    from normlab.config_help import describe_keys

    src = args.source
    if src and Path(src).is_dir():  # a run directory: its saved config, then --set
        open_config(src)  # one-line errors for a folder that is not a run
        cfg = load_config(Path(src) / CONFIG_FILE, args.overrides)  # completed as normlab train completes it
        origin = f"run directory {src}"
    elif src:
        cfg = load_config(src, args.overrides)
        origin = f"config {src}"
    else:
        cfg = new_config({}, args.overrides)
        origin = "defaults"
    rows = describe_keys(cfg)
    if args.json:
        print(dumps({"source": origin, "overrides": list(args.overrides), "config_hash": cfg.hash(),
                     "config": cfg.to_dict(), "keys": rows}))
        return 0

    def show(v: object) -> str:
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    sets = f" with --set {', '.join(args.overrides)}" if args.overrides else ""
    table = Table("key", "value", "type", "default", "allowed", "description",
                  title=printable(f"normlab config: {origin}{sets} (hash {cfg.hash()})"))
    for r in rows:
        changed = r["value"] != r["default"]
        table.add_row(r["key"], show(r["value"]) + (" *" if changed else ""), r["type"], show(r["default"]),
                      r["allowed"], r["description"])
    Console(width=max(160, Console().width), markup=False).print(table)
    print("* differs from the default. Set any key with --set KEY=VALUE (train, compare's 'set', this command).")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab config`` with its flags (called by ``normlab.cli.build_parser``)."""
    c = sub.add_parser("config", help="show the resolved config: every key's value, type, default, allowed values "
                                      "and meaning")
    c.add_argument("source", nargs="?", metavar="PRESET|YAML|RUN_DIR",
                   help=f"a preset ({', '.join(config_presets())}), a YAML file or a run directory (default: the "
                        "built-in defaults)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key as train does, e.g. --set model.norm=rmsnorm (repeatable)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_config)
