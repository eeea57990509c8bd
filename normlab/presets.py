"""The presets shipped inside the package, listed from its files (never a hand-written list).

``normlab/configs/*.yaml`` are run configs (``normlab train tiny``, ``normlab config small``);
``normlab/configs/sweeps/*.yaml`` are sweeps (``normlab compare --preset quick``). Torch-free and import-light:
``--help`` texts and one-line errors name the presets from here.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # package data: shipped run configs
SWEEP_DIR = CONFIG_DIR / "sweeps"  # package data: shipped sweeps


def config_presets() -> list[str]:
    """The names of the shipped run configs, sorted (``tiny`` for ``configs/tiny.yaml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def sweep_presets() -> list[str]:
    """The names of the shipped sweeps, sorted (``quick`` for ``configs/sweeps/quick.yaml``)."""
    return sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))
