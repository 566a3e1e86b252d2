"""ClassificationTask: logged metrics against a float64 recomputation, the class-count check,
and unfreezing a frozen encoder at a given epoch."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from mmtf.errors import UserError

from .conftest import classifier, fake_datamodule, vision_encoder


def _batches(n_batches: int, batch_size: int = 6) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"image": torch.rand(batch_size, 3, 32, 32, generator=g),
             "label": torch.arange(batch_size) % 3,          # every class present
             "ids": [f"{b}-{i}" for i in range(batch_size)]} for b in range(n_batches)]


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **kw)


def _reference(logits: np.ndarray, labels: np.ndarray, k: int) -> dict[str, float]:
    """Accuracy, macro F1 (every class has support) and mean cross-entropy, in float64."""
    pred = logits.argmax(1)
    f1 = []
    for c in range(k):
        tp = np.sum((pred == c) & (labels == c))
        fp = np.sum((pred == c) & (labels != c))
        fn = np.sum((pred != c) & (labels == c))
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    shifted = logits - logits.max(1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return {"test/accuracy": float(np.mean(pred == labels)), "test/macro_f1": float(np.mean(f1)),
            "test/loss": float(-log_probs[np.arange(len(labels)), labels].mean())}


def test_test_metrics_match_a_float64_recomputation():
    task = classifier().eval()
    batches = _batches(3)
    with torch.no_grad():
        # Centre and spread the head's logits so the predicted class varies between items (a
        # fresh head predicts one class for every random image).
        head = task.head[-1]
        head.weight.mul_(50)
        head.bias.sub_(torch.cat([task(b["image"]) for b in batches]).mean(0))
        logits = torch.cat([task(b["image"]) for b in batches]).double().numpy()
    labels = torch.cat([b["label"] for b in batches]).numpy()
    assert len(set(logits.argmax(1))) > 1, "degenerate case: one predicted class"
    (got,) = _trainer().test(task, dataloaders=DataLoader(batches, batch_size=None))
    expected = _reference(logits, labels, 3)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-5), key


def test_predict_batch_names_the_classes():
    task = classifier().eval()
    task.class_names = ["cat", "dog", "owl"]
    images = _batches(1)[0]["image"]
    rows = task.predict_batch(images, None)
    labels = task(images).argmax(-1).tolist()
    assert [r["label"] for r in rows] == labels
    assert [r["class"] for r in rows] == [["cat", "dog", "owl"][k] for k in labels]


def test_data_with_another_class_count_is_rejected_with_the_fix():
    with pytest.raises(UserError, match=r"the data has 5 classes but model.num_classes is 3; "
                                        r"set model.num_classes=5"):
        classifier().connect_data(fake_datamodule(modality="image", num_classes=5))


def test_num_classes_below_two_is_rejected():
    with pytest.raises(UserError, match=r"num_classes \(1\) must be >= 2"):
        classifier(num_classes=1)


class _Recorder(L.Callback):
    """Per epoch: did any encoder parameter get a gradient; encoder weights at the epoch's end."""

    def __init__(self) -> None:
        self.grads: dict[int, list[bool]] = {}
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_after_backward(self, trainer, task) -> None:
        self.grads.setdefault(trainer.current_epoch, []).append(
            any(p.grad is not None and bool(p.grad.abs().sum() > 0)
                for p in task.encoder.parameters()))

    def on_train_epoch_end(self, trainer, task) -> None:
        self.weights[trainer.current_epoch] = {k: v.detach().clone()
                                               for k, v in task.encoder.state_dict().items()}


def test_frozen_encoder_unfreezes_at_the_given_epoch():
    task = classifier(encoder=vision_encoder(freeze=True), unfreeze_encoder_at_epoch=1)
    before = {k: v.detach().clone() for k, v in task.encoder.state_dict().items()}
    recorder = _Recorder()
    _trainer(max_epochs=2, callbacks=[recorder]).fit(
        task, train_dataloaders=DataLoader(_batches(2), batch_size=None))
    assert recorder.grads == {0: [False, False], 1: [True, True]}
    assert all(torch.equal(recorder.weights[0][k], v) for k, v in before.items())
    changed = [k for k, v in before.items() if not torch.equal(recorder.weights[1][k], v)]
    assert changed and all(p.requires_grad for p in task.encoder.parameters())
