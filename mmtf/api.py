"""The notebook API: a checkpoint in, predictions out, no Hydra.

.. code-block:: python

    import mmtf
    model, tokenizer = mmtf.load("outputs/.../checkpoints/last.ckpt")
    model.caption(["a.wav", "b.flac"])                  # -> ["a dog barks ...", ...]
    model.caption([waveform], strategy="beam", num_beams=4)
    model, _ = mmtf.load("openai/whisper-small")          # a Whisper folder or hub id, zero-shot
    model.transcribe(["talk.flac"], language="auto", timestamps=True)

``model`` is the checkpoint's task (a LightningModule, in eval mode); ``caption`` preprocesses
as :mod:`mmtf.data.inputs` says (the checkpoint's sample rate and image transforms) and generates
with the checkpoint's settings, which keyword arguments override for that call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import UserError
from mmtf.hub import is_hf_source
from mmtf.tasks.rebuild import build_pretrained_task, build_task

if TYPE_CHECKING:
    from mmtf.tasks.base import Task
    from mmtf.text import Tokenizer


def load(ckpt_path: str | os.PathLike, *, device: str = "cpu", use_ema: bool = False,
         **generation: Any) -> tuple[Task, Tokenizer | None]:
    """Rebuild the task of an mmtf checkpoint (or a pretrained Whisper) for inference.

    Args:
        ckpt_path: a checkpoint written by ``mmtf.train`` (read with ``weights_only=True``; its
            config may name only allowlisted ``_target_``s), or a Hugging Face Whisper folder
            or hub id, used zero-shot (:func:`mmtf.tasks.rebuild.build_pretrained_task`).
        device: where the model runs (``"cpu"``, ``"cuda"``, ...).
        use_ema: the exponential moving average of the weights (trained with
            ``callbacks=ema``) instead of the trained weights.
        **generation: generation settings kept for every later call (``strategy="beam"`` ...).

    Returns:
        ``(model, tokenizer)``: the task in eval mode, and its tokenizer (None for
        classification).
    """
    # A missing "runs/last.ckpt" also looks like an org/name hub id: checkpoints keep their error.
    if is_hf_source(ckpt_path) and Path(ckpt_path).suffix != ".ckpt":
        if use_ema:
            raise UserError(f"use_ema=True: {ckpt_path} is a pretrained model, not an mmtf checkpoint "
                            f"trained with callbacks=ema; drop use_ema.")
        task = build_pretrained_task(ckpt_path)
    else:
        task, _ = build_task(load_checkpoint(ckpt_path), ckpt_path, use_ema=use_ema)
    task = task.to(device).eval()
    task.update_generation(generation)
    return task, task.tokenizer
