"""`python -m mmtf.export ckpt_path=... part=encoder out=enc/`: reusable weights without pickle.

Writes ``out/weights.safetensors`` (the part's state dict) and ``out/config.yaml`` (the part's
``_target_`` and constructor arguments). Any experiment loads it back with
``model.encoder.pretrained=out/`` (add ``model.encoder.freeze=true`` for a frozen encoder); a
decoder export also carries ``tokenizer.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import save_file

from mmtf.utils.checkpoint import build_task, load_checkpoint
from mmtf.utils.config import run_cli

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
PARTS = ("encoder", "decoder")


def export_part(ckpt_path: str | Path, part: str, out: str | Path) -> Path:
    """Export ``part`` of the checkpoint's model to the folder ``out``; return it."""
    if part not in PARTS:
        raise ValueError(f"part ({part!r}) must be one of {PARTS}.")
    checkpoint = load_checkpoint(ckpt_path)
    task, stored = build_task(checkpoint, ckpt_path)
    net = getattr(task, "model", task)          # CaptioningTask wraps an EncoderDecoder
    module = getattr(net, part, None)
    if module is None:
        raise ValueError(f"the checkpoint {ckpt_path} has no {part}; its model is "
                         f"{type(task).__name__}.")
    part_cfg: dict[str, Any] = dict(stored["model"][part])
    if part == "encoder":
        part_cfg.update(pretrained=None, freeze=False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(out / "weights.safetensors"),
              metadata={"part": part, "source": str(ckpt_path)})
    (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(part_cfg)))
    tokenizer = getattr(task, "tokenizer", None)
    if part == "decoder" and tokenizer is not None:
        tokenizer.save(out / "tokenizer.json")
    print(f"Exported {part} ({sum(v.numel() for v in state.values()):,} parameters) to {out}/")
    return out


def load_exported(path: str | Path, *, freeze: bool = False):
    """Rebuild an exported encoder/decoder from ``path/config.yaml`` and load its weights.

    The stored ``_target_`` must be an mmtf class (allowlist); weights come from safetensors.
    """
    from hydra.utils import instantiate

    from mmtf.utils.checkpoint import check_targets

    path = Path(path)
    config_file = path / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} does not exist; pass the folder written by "
                                f"python -m mmtf.export.")
    cfg = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
    check_targets(cfg, str(config_file))
    if "pretrained" in cfg:                       # encoders load their own weights
        module = instantiate({**cfg, "pretrained": str(path), "freeze": freeze})
    else:
        from safetensors.torch import load_file

        module = instantiate(cfg)
        module.load_state_dict(load_file(str(path / "weights.safetensors")), strict=True)
        if freeze:
            module.requires_grad_(False).eval()
    return module


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(lambda c: export_part(c.ckpt_path, c.part, c.out), cfg)


def main() -> None:
    """Console entry point (``mmtf-export``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
