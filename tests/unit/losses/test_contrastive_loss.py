"""The contrastive loss against a float64 loop over the formula, CLIP's loss, and two gloo ranks
(forked, CPU) against one process holding the whole global batch: loss and DDP-averaged
gradients."""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mmtf.errors import UserError
from mmtf.losses import ContrastiveLoss, item_keys

# Five items: "c" occurs twice (a clip drawn twice into one global batch: one item), item
# captions 2, 1, 3, 2, 2 (a list index per caption row).
MEDIA_IDS = ["a", "b", "c", "d", "c"]
TEXT_OF = [0, 0, 1, 2, 2, 2, 3, 3, 4, 4]       # caption row -> media row it was drawn with


def reference_loss(media: torch.Tensor, text: torch.Tensor, media_ids: list[str],
                   text_ids: list[str], scale: torch.Tensor) -> torch.Tensor:
    """The formula of mmtf.losses.contrastive, element by element in float64 scalars."""
    def cos(u, v):
        return sum(u[k] * v[k] for k in range(len(u))) / (
            torch.sqrt(sum(x * x for x in u)) * torch.sqrt(sum(x * x for x in v)))

    m, t = len(media), len(text)
    sim = [[scale * cos(media[i], text[j]) for j in range(t)] for i in range(m)]
    media_side = 0.0
    for i in range(m):
        log_norm = torch.log(sum(torch.exp(sim[i][j]) for j in range(t)))
        pos = [j for j in range(t) if text_ids[j] == media_ids[i]]
        media_side = media_side + sum(log_norm - sim[i][j] for j in pos) / len(pos)
    text_side = 0.0
    for j in range(t):
        log_norm = torch.log(sum(torch.exp(sim[i][j]) for i in range(m)))
        pos = [i for i in range(m) if media_ids[i] == text_ids[j]]
        text_side = text_side + sum(log_norm - sim[i][j] for i in pos) / len(pos)
    return 0.5 * (media_side / m + text_side / t)


def _embeddings(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(len(MEDIA_IDS), 4, generator=g, dtype=dtype),
            torch.randn(len(TEXT_OF), 4, generator=g, dtype=dtype))


def test_loss_and_gradients_equal_a_float64_loop():
    media, text = _embeddings()
    media.requires_grad_(True)
    text.requires_grad_(True)
    loss_fn = ContrastiveLoss().double()
    text_ids = [MEDIA_IDS[i] for i in TEXT_OF]
    got = loss_fn(media, text, item_keys(MEDIA_IDS), item_keys(text_ids))
    got.backward()
    grads = [media.grad.clone(), text.grad.clone(), loss_fn.logit_scale.grad.clone()]

    m, t = media.detach().requires_grad_(True), text.detach().requires_grad_(True)
    # the initial value is tested below; float32 log(1 / 0.07), as the parameter holds it
    logit_scale = torch.tensor(math.log(1 / 0.07), dtype=torch.float32).double().requires_grad_()
    want = reference_loss(m, t, MEDIA_IDS, text_ids, logit_scale.exp())
    want.backward()
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
    for a, b in zip(grads, [m.grad, t.grad, logit_scale.grad]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_one_caption_per_item_is_clips_loss():
    g = torch.Generator().manual_seed(0)
    media, text = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    keys = item_keys(range(6))
    got = ContrastiveLoss(temperature=0.05)(media, text, keys, keys)
    logits = 20.0 * F.normalize(media, dim=-1) @ F.normalize(text, dim=-1).T
    labels = torch.arange(6)
    clip = 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))
    torch.testing.assert_close(got, clip, rtol=1e-6, atol=1e-6)


def test_scale_starts_at_one_over_0_07_and_is_clamped_at_100():
    loss_fn = ContrastiveLoss()
    assert float(loss_fn.logit_scale.detach()) == pytest.approx(math.log(1 / 0.07))
    assert float(loss_fn.scale()) == pytest.approx(1 / 0.07, rel=1e-6)
    with torch.no_grad():
        loss_fn.logit_scale.fill_(math.log(250.0))
    assert float(loss_fn.scale()) == pytest.approx(100.0)
    media, text = _embeddings(torch.float32)
    loss_fn(media, text[:5], item_keys(range(5)), item_keys(range(5))).backward()
    assert float(loss_fn.logit_scale.grad) == 0.0          # past the clamp: no gradient
    loss_fn.clamp_()                                        # CLIP's clamp after a step
    assert float(loss_fn.logit_scale.detach()) == pytest.approx(math.log(100.0))


def test_a_batch_of_one_item_is_a_one_line_user_error():
    media, text = _embeddings(torch.float32)
    keys = item_keys(["x", "x"])                            # one clip twice: still one item
    with pytest.raises(UserError, match=r"holds 1 item .*no negative.*data\.batches\.batch_size") as err:
        ContrastiveLoss()(media[:2], text[:3], keys, item_keys(["x"] * 3))
    assert "\n" not in str(err.value)


def test_keys_that_do_not_pair_rows_are_refused():
    media, text = _embeddings(torch.float32)
    with pytest.raises(ValueError, match="a caption's key matches no media row"):
        ContrastiveLoss()(media[:2], text[:3], item_keys("ab"), item_keys("abz"))
    with pytest.raises(ValueError, match="one key per row"):
        ContrastiveLoss()(media[:2], text[:3], item_keys("ab"), item_keys("ab"))


# ----------------------------------------------------------------------------- two ranks
class Dual(nn.Module):
    """Two towers and the loss, as a task holds them: one module for DDP to wrap."""

    def __init__(self, local_loss: bool) -> None:
        super().__init__()
        torch.manual_seed(7)                           # the same weights in every process
        self.media, self.text = nn.Linear(6, 4), nn.Linear(5, 4)
        self.loss = ContrastiveLoss(local_loss=local_loss)

    def forward(self, x, y, media_keys, text_keys):
        return self.loss(self.media(x), self.text(y), media_keys, text_keys)


def _global_batch():
    g = torch.Generator().manual_seed(11)
    return (torch.randn(len(MEDIA_IDS), 6, generator=g),
            torch.randn(len(TEXT_OF), 5, generator=g))


# Rank 0 holds media rows 0-2 and their 6 captions, rank 1 rows 3-4 and their 4 (uneven).
SHARDS = [(slice(0, 3), slice(0, 6)), (slice(3, 5), slice(6, 10))]


def _rank(rank: int, store: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        x, y = _global_batch()
        media_keys = item_keys(MEDIA_IDS)
        text_keys = item_keys([MEDIA_IDS[i] for i in TEXT_OF])
        rows, caps = SHARDS[rank]
        out = {}
        for local_loss in (False, True):
            model = DistributedDataParallel(Dual(local_loss))
            loss = model(x[rows], y[caps], media_keys[rows], text_keys[caps])
            loss.backward()                                     # DDP averages the gradients
            out[local_loss] = {"loss": loss.detach(),
                               **{n: p.grad for n, p in model.module.named_parameters()}}
        torch.save(out, Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_gloo_ranks_give_the_loss_and_gradients_of_one_process(tmp_path):
    # forked, not spawned: two new interpreters would spend ~10 s importing torch before gloo
    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="fork")
    x, y = _global_batch()
    media_keys = item_keys(MEDIA_IDS)
    text_keys = item_keys([MEDIA_IDS[i] for i in TEXT_OF])
    one = Dual(local_loss=False)
    loss = one(x, y, media_keys, text_keys)
    loss.backward()
    want = {"loss": loss.detach(), **{n: p.grad for n, p in one.named_parameters()}}
    assert want["loss"] > 0 and want["loss.logit_scale"].abs() > 0
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for local_loss in (False, True):
            for name, value in want.items():
                # rtol: the local loss sums its rows in another order (a few ulps of a loss ~2)
                torch.testing.assert_close(got[local_loss][name], value, rtol=1e-6, atol=1e-6,
                                           msg=f"rank {rank}, local_loss={local_loss}: {name}")
