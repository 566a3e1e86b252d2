"""Constructors take parts (block options, front end, SpecAugment): configs and exports written
with the pre-#39 flat keys build the same modules as the flat constructors did.

The reference (``ctor_reference.json``) was computed by the pre-#39 code from flat keywords (see
:mod:`tests.unit.ctor_reference`): state_dict keys, and projections of each seeded tensor and of
an eval forward, equal to float rounding on any CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from mmtf.encoders import AudioEncoder
from mmtf.utils.parts import flatten_parts, upgrade_config
from tests.unit.ctor_reference import CASES, PRESETS, fingerprint, mismatches
from tests.unit.presets import load_preset

REFERENCE = json.loads((Path(__file__).with_name("ctor_reference.json")).read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_old_flat_config_builds_the_pre_39_module(name):
    """A flat (pre-#39) config, upgraded, gives the old keys, values and forward."""
    got = fingerprint(CASES[name], lambda spec: instantiate(upgrade_config(spec)))
    assert mismatches(got, REFERENCE[name]) == []


@pytest.mark.parametrize("group,name", PRESETS)
def test_new_presets_build_the_pre_39_module(group, name):
    """Today's nested presets give what the flat presets gave."""
    got = fingerprint(load_preset(group, name), instantiate)
    assert mismatches(got, REFERENCE[f"{group}/{name}"]) == []


def test_upgrade_moves_flat_keys_and_flatten_is_its_inverse():
    old = {"_target_": "mmtf.encoders.AudioEncoder", "dim": 64, "n_mels": 80, "dropout": 0.1,
           "freq_masks": 0, "max_seconds": 10.0}
    new = upgrade_config({"model": {"encoder": old}})["model"]["encoder"]
    assert new["block"] == {"_target_": "mmtf.nn.BlockOptions", "dropout": 0.1}
    assert new["frontend"] == {"_target_": "mmtf.encoders.audio.LogMelFrontEnd", "n_mels": 80}
    assert new["spec_augment"]["freq_masks"] == 0 and new["max_seconds"] == 10.0
    assert flatten_parts(new) == old
    assert upgrade_config(new) == new                     # already nested: unchanged


def test_flat_key_beside_its_part_is_refused_naming_the_new_key():
    with pytest.raises(ValueError, match=r"keep only block\.dropout"):
        upgrade_config({"_target_": "mmtf.decoders.TextDecoder", "dropout": 0.1,
                        "block": {"dropout": 0.2}})


def test_encoder_config_stays_flat_for_export_comparisons():
    enc = AudioEncoder(dim=32, depth=1, frontend={"n_mels": 16}, block={"dropout": 0.1})
    assert enc.config["n_mels"] == 16 and enc.config["dropout"] == 0.1
    assert enc.config["freq_masks"] == 2 and "frontend" not in enc.config


def test_flat_export_folder_loads(tmp_path):
    """An export folder written before #39 (flat config.yaml) rebuilds the same encoder."""
    from omegaconf import OmegaConf

    from mmtf.export import load_exported
    from mmtf.hub import write_export

    flat = {**CASES["audio_wide"], "pretrained": None, "freeze": False}
    torch.manual_seed(0)
    enc = instantiate(upgrade_config(flat))
    write_export(tmp_path, enc.state_dict(), OmegaConf.create(flat))
    back = load_exported(tmp_path)
    assert back.state_dict().keys() == enc.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                  enc.state_dict().values()))


@pytest.mark.parametrize("node,new", [
    ({"_target_": "mmtf.encoders.AudioEncoder", "n_mels": 80}, "frontend.n_mels"),
    ({"_target_": "mmtf.encoders.VisionEncoder", "stem": "conv"}, "patch.stem"),
    ({"_target_": "mmtf.decoders.TextDecoder", "dropout": 0.1}, "block.dropout")])
def test_an_old_flat_key_in_a_yaml_names_its_new_place(node, new):
    """A user's experiment YAML or override with a pre-#39 key fails up front, naming the key."""
    from mmtf.errors import ConfigError
    from mmtf.utils.config import check_target_signatures

    with pytest.raises(ConfigError, match=rf"Did you mean '{new}'"):
        check_target_signatures({"data": node})


def test_an_old_flat_data_key_names_its_new_place(tmp_path):
    """Data modules take **kwargs, so the signature check cannot see them: they refuse it."""
    from mmtf.data import CaptionDataModule
    from mmtf.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.batch_size is now data.batches.batch_size"):
        CaptionDataModule(format="clotho", root=str(tmp_path), batch_size=4)
