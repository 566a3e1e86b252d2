"""Config helpers for the CLIs: a rich tree print, saving, and early checks with one-line errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import rich
import rich.syntax
import rich.tree
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

PRINT_ORDER = ("data", "model", "callbacks", "logger", "trainer", "paths")


@rank_zero_only
def print_config_tree(cfg: DictConfig, save_to: str | Path | None = None,
                      order: Sequence[str] = PRINT_ORDER) -> None:
    """Print the resolved config as a rich tree (groups first) and optionally save it as YAML."""
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    fields = [f for f in order if f in cfg] + [f for f in cfg if f not in order]
    for field in fields:
        branch = tree.add(str(field), style="bold", guide_style="dim")
        value = cfg[field]
        text = (OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig)
                else str(value))
        branch.add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    if save_to is not None:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        Path(save_to).write_text(OmegaConf.to_yaml(cfg, resolve=True))


def find_missing(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys whose value is still ``???`` (required but not given), as dotted paths."""
    missing = []
    for key in cfg:
        path = f"{prefix}{key}"
        if OmegaConf.is_missing(cfg, key):
            missing.append(path)
            continue
        value = cfg._get_node(key)
        if isinstance(value, DictConfig):
            missing += find_missing(value, f"{path}.")
    return missing
