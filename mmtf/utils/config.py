"""Config helpers for the CLIs: a rich tree print, saving, and early checks with one-line errors."""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import rich
import rich.syntax
import rich.tree
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from mmtf.errors import ConfigError, UserError
from mmtf.utils.parts import moved_keys

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


def find_missing(cfg: DictConfig) -> list[str]:
    """Keys whose value is still ``???`` (required but not given), as sorted dotted paths."""
    return sorted(OmegaConf.missing_keys(cfg))


def require_values(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming every required key (``???``) the user did not set."""
    missing = find_missing(cfg)
    if missing:
        raise ConfigError(f"missing required config value(s): {', '.join(missing)}; set them on "
                          f"the command line, e.g. {missing[0]}=...")


def generation_overrides(cfg: DictConfig | None) -> dict[str, Any]:
    """The ``generation.*`` keys of eval.yaml / predict.yaml the user set (null = not set)."""
    if not cfg:
        return {}
    values = OmegaConf.to_container(cfg, resolve=True)
    return {k: v for k, v in values.items() if v is not None}


# ---------------------------------------------------------------------------- signature checks
_HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}


def _resolve_target(target: str) -> Any:
    from hydra.utils import get_object

    try:
        return get_object(target)
    except Exception as err:
        raise ConfigError(f"_target_ {target!r} cannot be imported ({err}); check the spelling "
                          f"of the class path.") from None


def _type_ok(value: Any, annotation: Any) -> bool:
    """Loose check of a config value against a simple annotation (unknown -> accept)."""
    if value is None or annotation is inspect.Parameter.empty or isinstance(value, dict):
        return True
    if isinstance(annotation, str):
        names = {a.strip() for a in annotation.split("|")}
        if "None" in names and value is None:
            return True
        simple = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
        allowed = [simple[n] for n in names if n in simple]
        if len(allowed) != len(names - {"None"}):
            return True                               # something richer: do not guess
        if isinstance(value, bool) and "bool" not in names:
            return False
        return any(isinstance(value, t) for t in allowed)
    return True


def check_target_signatures(cfg: Any, path: str = "") -> None:
    """Every key under a ``_target_`` must be a parameter of that target, with a plausible type.

    Hydra's struct mode catches a misspelt key on the command line, but a misspelt key inside an
    experiment YAML is merged silently and only fails (or is ignored) much later, inside
    ``instantiate``. This walks the composed config first and names the key and the fix."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    if isinstance(cfg, list):
        for i, item in enumerate(cfg):
            check_target_signatures(item, f"{path}[{i}]")
        return
    if not isinstance(cfg, dict):
        return
    target = cfg.get("_target_")
    if isinstance(target, str):
        obj = _resolve_target(target)
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            names = [n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL]
            for key, value in cfg.items():
                if key in _HYDRA_KEYS:
                    continue
                where = f"{path}.{key}" if path else key
                if key not in params:
                    moved = moved_keys(target)   # a pre-#39 flat key: name its part's key
                    close = difflib.get_close_matches(key, [*names, *moved], n=1)
                    hint = f" Did you mean {moved.get(close[0], close[0])!r}?" if close else ""
                    raise ConfigError(f"config key '{where}' is not an argument of {target}."
                                      f"{hint} Fix the key in your experiment YAML or override.")
                if isinstance(value, str) and "${" in value:
                    continue
                if not _type_ok(value, params[key].annotation):
                    raise ConfigError(
                        f"config key '{where}' = {value!r} ({type(value).__name__}) does not fit "
                        f"{target}'s {key}: {params[key].annotation}.")
    for key, value in cfg.items():
        if key not in _HYDRA_KEYS:
            check_target_signatures(value, f"{path}.{key}" if path else key)


def user_error_message(err: BaseException) -> str | None:
    """The one-line message of a user error, None for anything else (a bug: keep the traceback).

    User errors are mmtf's :class:`~mmtf.errors.UserError` (also inside Hydra's
    ``InstantiationException``, which wraps what a ``_target_`` raised) and Hydra's
    ``ConfigCompositionException`` (a misspelt override)."""
    from hydra.errors import ConfigCompositionException, InstantiationException

    seen = err
    while isinstance(seen, InstantiationException) and seen.__cause__ is not None:
        seen = seen.__cause__
    if isinstance(seen, (UserError, ConfigCompositionException)):
        return f"{type(seen).__name__}: {seen}"
    return None


def run_cli(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run a CLI body; a user error exits with status 2 and one readable line.

    Any other exception is a bug in mmtf and propagates with its traceback.
    ``HYDRA_FULL_ERROR=1`` lets user errors propagate too, as Hydra does for its own errors.
    Why: see docs/design/cli-errors.md"""
    try:
        return fn(cfg)
    except Exception as err:
        message = user_error_message(err)
        if message is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"mmtf: error: {message}", file=sys.stderr)
        sys.exit(2)
