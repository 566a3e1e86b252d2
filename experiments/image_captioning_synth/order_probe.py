"""Does a trained image captioner know *where* the object it just described is?

For every two-object row image of the validation split, teacher-force "A big red circle to the"
(the left object A first, whose continuation is "left") and the same with the right object B
first (continuation "right"), and read the model's probability of the right word among the two.
A model that binds position to content scores near 1 for both; a model that only learned the
captions' marginals gives the same answer for both prompts (mean near 0.5, one side near 1 and
the other near 0), and its greedy captions get left/right wrong.

    python experiments/image_captioning_synth/order_probe.py outputs/.../checkpoints/last.ckpt

Prints one line per side and a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.checkpoint_io import load_checkpoint
from mmtf.perf.results import append_result
from mmtf.synthetic.image import parse_caption
from mmtf.tasks.rebuild import build_task


def phrase(obj: tuple[str, str, str]) -> str:
    """(size, colour, shape) -> "a big red circle" (the grammar's words)."""
    size, colour, shape = obj
    return f"a {'big' if size == 'large' else 'small'} {colour} " \
           f"{'plus sign' if shape == 'cross' else shape}"


@torch.no_grad()
def probe(ckpt_path: str) -> dict[str, float]:
    task, stored = build_task(load_checkpoint(ckpt_path), ckpt_path)
    task.eval()
    data = instantiate(OmegaConf.create(stored["data"]))
    data.connect(task.tokenizer)
    data.setup("validate")
    dataset = data.val_dataloader().dataset
    tok = task.tokenizer
    correct: dict[str, list[float]] = {"left": [], "right": []}
    for i in range(len(dataset)):
        example = dataset[i]
        layout, objects = parse_caption(example["references"][0])
        if layout != "row" or len(objects) != 2:
            continue
        image = example["image"][None]                                   # (1, 3, h, w)
        for first, truth in ((objects[0], "left"), (objects[1], "right")):
            prefix = phrase(first).capitalize() + " to the"
            ids = [tok.bos_id, *tok.encode(prefix, add_special=False)]
            words = {w: tok.encode(f"{prefix} {w}", add_special=False)[len(ids) - 1]
                     for w in ("left", "right")}
            out = task.model(image, None, torch.tensor([[*ids, tok.eos_id]]))
            p = out.logits[0, len(ids) - 1].softmax(-1)                  # next-token probs
            correct[truth].append((p[words[truth]] / (p[words["left"]] + p[words["right"]]))
                                  .item())
    result = {}
    for side, values in correct.items():
        mean = sum(values) / len(values)
        above = sum(v > 0.5 for v in values) / len(values)
        print(f"{side:5s} object first ({len(values)} images): P(correct word) {mean:.3f}, "
              f"right in {above:.0%}")
        result[f"p_correct_{side}"] = round(mean, 4)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    print(json.dumps(append_result(__file__, probe(parser.parse_args().checkpoint))))
