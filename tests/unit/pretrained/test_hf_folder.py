"""Opening Hugging Face–format folders: what is accepted, and the one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mmtf.errors import UserError
from mmtf.hub import open_hf_model
from mmtf.pretrained.names import copy_weights, link


def write_folder(path, *, model_type="gpt2", weights=True, pickled=False):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "n_embd": 4}))
    if weights:
        save_file({"w.weight": torch.arange(12.0).reshape(3, 4), "w.bias": torch.ones(3)},
                  str(path / "model.safetensors"))
    if pickled:
        (path / "pytorch_model.bin").write_bytes(b"not to be unpickled")
    return path


def test_a_folder_opens_and_its_tensors_copy_by_name(tmp_path):
    model = open_hf_model(write_folder(tmp_path / "m"), model_types={"gpt2"}, owner="test")
    assert model.model_type == "gpt2" and model.field("n_embd", owner="test") == 4
    layer = nn.Linear(4, 3)
    copy_weights(layer, model.tensors(), [link("weight", "w.weight"), link("bias", "w.bias")],
                 owner="test", source="m")
    assert torch.equal(layer.weight, torch.arange(12.0).reshape(3, 4))
    assert torch.equal(layer.bias, torch.ones(3))


def test_only_pickled_weights_are_refused_with_the_conversion(tmp_path):
    folder = write_folder(tmp_path / "m", weights=False, pickled=True)
    with pytest.raises(UserError, match=r"only pickled weights \(pytorch_model.bin\).*"
                                        r"save_pretrained\(folder, safe_serialization=True\)"):
        open_hf_model(folder, model_types={"gpt2"}, owner="test")


@pytest.mark.parametrize("setup,message", [
    (lambda p: p.mkdir(), r"config.json not found"),
    (lambda p: write_folder(p, weights=False), r"model.safetensors not found"),
    (lambda p: write_folder(p, model_type="bert"),
     r"model_type='bert', but this loader reads 'gpt2'"),
])
def test_bad_folders_name_the_file_or_field(tmp_path, setup, message):
    setup(tmp_path / "m")
    with pytest.raises(UserError, match=message):
        open_hf_model(tmp_path / "m", model_types={"gpt2"}, owner="test")


def test_a_path_that_is_neither_folder_nor_hub_id_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"neither a folder nor a hub id"):
        open_hf_model(tmp_path / "nowhere", model_types={"gpt2"}, owner="test")


def test_a_shape_mismatch_names_both_shapes_and_copies_nothing(tmp_path):
    model = open_hf_model(write_folder(tmp_path / "m"), model_types={"gpt2"}, owner="test")
    layer = nn.Linear(5, 3)
    before = layer.bias.clone()
    with pytest.raises(UserError, match=r"'w.weight' in m has shape \(3, 4\) but mmtf's "
                                        r"'weight' has \(3, 5\)"):
        copy_weights(layer, model.tensors(), [link("bias", "w.bias"), link("weight", "w.weight")],
                     owner="test", source="m")
    assert torch.equal(layer.bias, before)
    with pytest.raises(UserError, match=r"no source in m: bias"):
        copy_weights(nn.Linear(4, 3), model.tensors(), [link("weight", "w.weight")], owner="test",
                     source="m")
