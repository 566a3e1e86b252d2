"""Two-rank CPU DDP (gloo) fit of a tiny classifier whose frozen encoder unfreezes at epoch 1 of
3; Lightning re-launches this file for rank 1, as it does for ``python -m mmtf.train
trainer=ddp_cpu``. Each rank trains on its own batches, so ranks that did not all-reduce the
encoder's gradients would end with different weights.

Usage: ``python ddp_unfreeze_script.py MODE OUT_DIR``; MODE ``full`` (epochs 0-2, writing
``OUT_DIR/epoch1.ckpt`` after epoch 1, past the unfreeze) or ``resume`` (epoch 2 from it). Each rank saves the encoder's
weights at each epoch end and the end state to ``OUT_DIR/<MODE>_rank<R>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from mmtf.reliability import ResumeState  # noqa: E402
from tests.unit.tasks.conftest import classifier, vision_encoder  # noqa: E402


class RankData(L.LightningDataModule):
    """Two batches of 4 images per epoch, different on each rank."""

    modality, num_classes, class_names = "image", 3, None     # what connect_data reads

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(100 + self.trainer.global_rank)
        batches = [{"image": torch.rand(4, 3, 32, 32, generator=g),
                    "label": torch.randint(0, 3, (4,), generator=g)} for _ in range(2)]
        return DataLoader(batches, batch_size=None, generator=torch.Generator())


class Save(Callback):
    def __init__(self, out: Path, mode: str) -> None:
        self.out, self.mode = out, mode
        self.epochs: dict[int, dict[str, torch.Tensor]] = {}
        self.states: list[tuple[int, bool, bool]] = []

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        enc = task.encoder
        self.states.append((trainer.current_epoch, all(p.requires_grad for p in enc.parameters()),
                            enc.training))

    def on_train_epoch_end(self, trainer, task) -> None:
        self.epochs[trainer.current_epoch] = {k: v.detach().clone()
                                              for k, v in task.encoder.state_dict().items()}
        if self.mode == "full" and trainer.current_epoch == 1:
            # what a run stopped here would write: the same hook, the same state
            trainer.save_checkpoint(self.out / "epoch1.ckpt")

    def on_train_end(self, trainer, task) -> None:
        torch.save({"epochs": self.epochs, "states": self.states, "weights": task.state_dict(),
                    "optimizer": trainer.optimizers[0].state_dict()["state"]},
                   self.out / f"{self.mode}_rank{trainer.global_rank}.pt")


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    task = classifier(encoder=vision_encoder(freeze=True), unfreeze_encoder_at_epoch=1,
                      encoder_lr_scale=0.5, warmup_steps=2)
    torch.save(task.encoder.state_dict(), out / "initial_encoder.pt")
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=3,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=out,
                        callbacks=[Save(out, mode), ResumeState()], use_distributed_sampler=False,
                        deterministic=True, num_sanity_val_steps=0)
    trainer.fit(task, datamodule=RankData(),
                ckpt_path=str(out / "epoch1.ckpt") if mode == "resume" else None, weights_only=True)


if __name__ == "__main__":
    main()
