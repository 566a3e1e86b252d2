"""Two CPU ranks (gloo) fitting a tiny two-block model under ``trainer=fsdp`` (LoRA on
the second block, its base frozen); Lightning re-launches
this file for rank 1. The trainer is conf/trainer/fsdp.yaml, moved to the CPU.

Usage: ``python fsdp_script.py OUT_DIR MAX_STEPS ACTIVATION_CHECKPOINTING [CKPT_PATH]``; writes
``OUT_DIR/checkpoints/step=N.ckpt`` every 2 steps and ``last.ckpt`` (ModelCheckpoint),
``OUT_DIR/end.ckpt`` and, from rank 0,
``OUT_DIR/units.json`` (class names of the sharded modules, the parameter type).

Shapes: b batch, n = 5 positions, c = 16 features.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Subset, TensorDataset  # noqa: E402

from mmtf.nn import TransformerStack  # noqa: E402
from mmtf.nn.lora import LoRAConfig, add_lora, lora_trainable  # noqa: E402
from mmtf.tasks.fsdp import shard_model  # noqa: E402

CONF = Path(__file__).resolve().parents[2] / "conf"
DIM = 16


class Net(nn.Module):
    def __init__(self, activation_checkpointing: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(4, DIM)
        # The parts' switch (model.encoder/decoder.activation_checkpointing) is the stack's.
        self.stack = TransformerStack(depth=2, dim=DIM, num_heads=2,
                                      activation_checkpointing=activation_checkpointing)
        self.out = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # (b, n, 4) -> (b, n, 1)
        return self.out(self.stack(self.inp(x)))

    def pool(self, x: torch.Tensor) -> torch.Tensor:             # (b, n, 4) -> (b, c)
        return self.inp(x).mean(1)


def lora_net(activation_checkpointing: bool = False) -> Net:
    """The toy net with LoRA on its second block (q, v, mlp) and that block's base frozen: an
    FSDP unit that mixes frozen and trainable parameters, as a LoRA fine-tune has."""
    torch.manual_seed(0)
    net = Net(activation_checkpointing)
    block = net.stack.blocks[1]
    add_lora(block, LoRAConfig(r=2, alpha=4, targets=("q", "v", "mlp")))
    block.requires_grad_(False)
    for param in lora_trainable(block):
        param.requires_grad_(True)
    with torch.no_grad():                    # B = 0 would leave block 1's output unchanged
        for name, param in block.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.1)
    return net


class Toy(L.LightningModule):
    def __init__(self, activation_checkpointing: bool) -> None:
        super().__init__()
        self.net = lora_net(activation_checkpointing)

    def configure_model(self) -> None:
        shard_model(self)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self.net(x).squeeze(-1) - y).pow(2).mean() + 1e-3 * self.net.pool(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-2)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(16, 5, 4, generator=g)
        data = TensorDataset(x, x.sum(-1))
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return DataLoader(Subset(data, range(rank, len(data), world)), batch_size=2)


def main(out: Path, max_steps: int, activation_checkpointing: bool, ckpt_path: str | None):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[
            "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
            "trainer.precision=32-true", "trainer.strategy.process_group_backend=gloo",
            f"trainer.max_steps={max_steps}", "trainer.max_epochs=-1",
            f"paths.output_dir={out}"])
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=-1,
                                  every_n_train_steps=2, filename="{step}")
    trainer = instantiate(cfg.trainer, logger=False, callbacks=[checkpoints],
                          enable_progress_bar=False, enable_model_summary=False)
    model = Toy(activation_checkpointing)
    trainer.fit(model, ckpt_path=ckpt_path)
    trainer.save_checkpoint(out / "end.ckpt")
    if trainer.global_rank == 0:
        units = sorted({type(m).__name__ for m in model.modules() if type(m).__name__[:4] == "FSDP"})
        param = type(next(model.parameters())).__name__
        (out / "units.json").write_text(json.dumps({"units": units, "param": param,
                                                    "step": trainer.global_step}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "true",
         sys.argv[4] if len(sys.argv) > 4 else None)
