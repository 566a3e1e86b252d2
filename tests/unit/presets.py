"""A model preset (conf/model/<group>/<name>.yaml) as Hydra composes it: presets inherit from
another preset through their defaults list (``audio_small`` = ``audio_tiny`` + its differences),
so reading the file alone would miss the inherited keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mmtf.utils.parts import nest

MODEL_CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


def load_preset(group: str, name: str) -> DictConfig:
    """The composed ``conf/model/<group>/<name>.yaml`` (``group``: ``encoder`` | ``decoder``)."""
    with initialize_config_dir(str(MODEL_CONF / group), version_base="1.3"):
        return compose(config_name=name)


def flat(cls: type, **kwargs: Any) -> Any:
    """``cls`` built from pre-#39 flat keywords (``n_mels=16, dropout=0.1``), mapped into its
    parts as an old config is (:func:`mmtf.utils.parts.nest`)."""
    return cls(**nest(f"{cls.__module__}.{cls.__name__}", **kwargs))
