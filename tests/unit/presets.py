"""A model preset (conf/model/<group>/<name>.yaml) as Hydra composes it: presets inherit from
another preset through their defaults list (``audio_small`` = ``audio_tiny`` + its differences),
so reading the file alone would miss the inherited keys."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

MODEL_CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


def load_preset(group: str, name: str) -> DictConfig:
    """The composed ``conf/model/<group>/<name>.yaml`` (``group``: ``encoder`` | ``decoder``)."""
    with initialize_config_dir(str(MODEL_CONF / group), version_base="1.3"):
        return compose(config_name=name)
