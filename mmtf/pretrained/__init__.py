"""Pretrained networks from the ecosystem (Hugging Face format) in mmtf's own modules.

:mod:`mmtf.pretrained.hf` reads a model folder or hub id (config.json + safetensors, never
pickles) and copies tensors by name; each family's module maps its names onto mmtf's encoders
and decoders, and back.

A family registers itself in :data:`HF_FAMILIES` (family -> module). Its module provides:

* builders, the ``_target_`` of its YAML parts (``mmtf.pretrained.<family>.<builder>``), whose
  sizes may be null in the YAML (read from ``config.json``);
* ``resolved_sizes(part, module) -> dict``: those sizes of a built part, recorded in the run's
  config (:func:`record_resolved`) so a checkpoint rebuilds its model without the pretrained
  folder;
* ``export_hf(task, out)``: the trained model written back in the Hugging Face layout
  (``python -m mmtf.export ... format=hf``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from mmtf.errors import UserError

HF_FAMILIES: dict[str, str] = {"whisper": "mmtf.pretrained.whisper",
                               "gpt2": "mmtf.pretrained.gpt2"}


def family_of(part_cfg: Any) -> str | None:
    """The family whose builder a part's config targets (``mmtf.pretrained.<family>.*``)."""
    target = part_cfg.get("_target_", "") if isinstance(part_cfg, Mapping) else ""
    for family, module in HF_FAMILIES.items():
        if str(target).startswith(module + "."):
            return family
    return None


def family_module(family: str) -> ModuleType:
    return importlib.import_module(HF_FAMILIES[family])


def record_resolved(run_config: MutableMapping[str, Any], parts: Mapping[str, nn.Module]) -> None:
    """Write into the run's config (a plain dict) every value read from a pretrained folder, in
    place, so a checkpoint rebuilds and preprocesses without that folder: the null sizes of
    pretrained-family parts (from the built ``parts``) and the settings of each
    ``preprocessor_config.json`` its image transforms read
    (:func:`mmtf.data.image.record_image_processors`)."""
    from mmtf.data.image import record_image_processors

    model_cfg = run_config["model"]
    for name, module in parts.items():
        node = model_cfg.get(name)
        family = family_of(node)
        if family is None:
            continue
        sizes = family_module(family).resolved_sizes(name, module)
        for key, value in sizes.items():
            if node.get(key) is None:
                node[key] = value
    record_image_processors(run_config.get("data") or {})


def export_hf(task: Any, model_cfg: Mapping[str, Any], out: str | Path) -> Path:
    """Write ``task``'s model in the Hugging Face layout of its family; return the folder.

    Raises:
        UserError: the model is mmtf's own (no family to export to).
    """
    families = {f for f in (family_of(model_cfg.get(p)) for p in ("encoder", "decoder")) if f}
    if len(families) != 1:
        raise UserError(f"export format=hf: the checkpoint's model is not one imported family "
                        f"({sorted(families) or 'mmtf modules only'}); format=hf writes models "
                        f"built from {sorted(HF_FAMILIES)} (model=whisper, "
                        f"model/decoder=gpt2 ...); use format=mmtf for mmtf's own models.")
    out = Path(out)
    family_module(families.pop()).export_hf(task, out)
    return out
