"""A config that cannot work stops ``python -m mmtf.train`` early with one readable line.

Each case exits with status 2, prints one ``mmtf: error:`` line naming the offending key or
tensor and no traceback, and generates no data (the fresh ``paths.data_dir`` stays absent).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import save_file

from .conftest import cli_in_process, compose_train, tiny_overrides


def _wrong_width_export(folder: Path, data_dir: Path) -> None:
    """Export an audio_tiny encoder built with dim 48 (the tiny runs use dim 32)."""
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir), folder / "unused")
    enc_cfg = OmegaConf.to_container(cfg.model.encoder, resolve=True)
    enc_cfg.update(dim=48)
    encoder = instantiate(enc_cfg)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()},
              str(folder / "weights.safetensors"))
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(enc_cfg)))


CASES = {
    "missing_data_root": r"missing required config value\(s\): data\.root; set them on the "
                         r"command line",
    "context_dim": r"EncoderDecoder: model\.encoder\.dim \(32\) != model\.decoder\.context_dim "
                   r"\(64\)",
    "duration_and_batch_size": r"data\.batches\.batch_size \(4\) and data\.batches\.max_seconds_per_batch "
                               r"\(600\.0\): exactly one sets the training batches; set "
                               r"data\.batches\.batch_size=null to batch by seconds",
    "lora_target": r"model\.lora\.targets: \['qkv'\] names no projection of the attention "
                   r"core; the valid targets are \['q', 'k', 'v', 'o', 'mlp'\]",
    "pretrained_shapes": r"load_pretrained: tensor '[\w.]+' has shape \([\d, ]*48[\d, ]*\) in "
                         r"\S+weights\.safetensors but \([\d, ]*32[\d, ]*\) in this model",
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_is_one_readable_line_before_any_data(case, tmp_path):
    data_dir = tmp_path / "data"
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"
    if case == "missing_data_root":
        args = ["experiment=audio_captioning_clotho", f"paths.data_dir={data_dir}", run_dir]
    elif case == "context_dim":
        args = tiny_overrides("audio_captioning", data_dir, "model.decoder.context_dim=64",
                              run_dir)
    elif case == "duration_and_batch_size":
        args = tiny_overrides("audio_captioning", data_dir,
                              "data.batches.max_seconds_per_batch=600.0", run_dir)
    elif case == "lora_target":
        args = tiny_overrides("audio_captioning", data_dir, "model/lora=default",
                              "model.lora.targets=[q,qkv]", run_dir)
    else:
        _wrong_width_export(tmp_path / "enc", tmp_path / "unused_data")
        args = tiny_overrides("audio_captioning", data_dir,
                              f"model.encoder.pretrained={tmp_path / 'enc'}", run_dir)
    out = cli_in_process("mmtf.train", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("mmtf: error:")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert re.search(CASES[case], errors[0]), errors[0]
    assert not data_dir.exists()
