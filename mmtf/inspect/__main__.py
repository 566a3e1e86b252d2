"""`python -m mmtf.inspect ckpt_path=... input=clip.wav` (or an image): see conf/inspect.yaml.

Prints the caption (and for audio the aligned words as a table) and writes the figures into
``out`` (default: the run dir). With ``synthetic_split=val`` it scores instead how often each
event named in the captions of the built-in synthetic set is aligned over its true time span.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mmtf.errors import UserError
from mmtf.utils.config import run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import share_cpu


def _list(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in (value if OmegaConf.is_list(value) or isinstance(value, list)
                             else [value])]


def _inspect(cfg: DictConfig) -> None:
    from mmtf.inspect.core import inspect_input, load_input, load_task, spans_table

    share_cpu(cfg.get("cpu_sharing"))
    if (cfg.input is None) == (cfg.synthetic_split is None):
        raise UserError("give exactly one of input=<audio or image file> and "
                        "synthetic_split=<train|val|test>.")
    device = "cuda" if cfg.accelerator in ("auto", "gpu") and torch.cuda.is_available() else "cpu"
    task, stored = load_task(cfg.ckpt_path, device)
    generation = {k: v for k, v in OmegaConf.to_container(cfg.generation).items()
                  if v is not None}
    if cfg.synthetic_split is not None:
        from mmtf.inspect.synthetic import event_overlap

        root = cfg.data_root or (stored.get("data") or {}).get("root")
        report = event_overlap(task, root, split=cfg.synthetic_split, num_clips=cfg.num_clips,
                               layers=_list(cfg.align_layers), heads=_list(cfg.align_heads),
                               medfilt_width=cfg.medfilt_width)
        print(report.table())
        return
    inputs, lengths = load_input(cfg.input, task.model, stored.get("data"))
    out = Path(cfg.out) if cfg.out else Path(HydraConfig.get().runtime.output_dir)
    result = inspect_input(
        task, inputs, lengths, out, name=cfg.name or Path(cfg.input).stem,
        layers=_list(cfg.layers), head=cfg.head, encoder_self=_list(cfg.encoder_self),
        decoder_self=_list(cfg.decoder_self), with_alignment=cfg.align,
        align_layers=_list(cfg.align_layers), align_heads=_list(cfg.align_heads),
        medfilt_width=cfg.medfilt_width, generation=generation, data_cfg=stored.get("data"))
    print(f"caption: {result.attention.caption}")
    if result.spans:
        print(spans_table(result.spans))
    for path in result.files:
        print(f"wrote {path}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="inspect")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(_inspect, cfg)


def main() -> None:
    """Console entry point (``mmtf-inspect``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
