"""The notebook API: a checkpoint in, predictions out, no Hydra.

.. code-block:: python

    import mmtf
    model, tokenizer = mmtf.load("outputs/.../checkpoints/last.ckpt")
    model.caption(["a.wav", "b.flac"], strategy="beam", num_beams=4)
    model, _ = mmtf.load("openai/whisper-small")          # a Whisper folder or hub id, zero-shot
    model.transcribe(["talk.flac"], language="auto", timestamps=True)

A :class:`Model` is the checkpoint's task in eval mode (its attributes read through) with
``caption`` and ``transcribe``, whose keyword arguments override the generation settings for
that call, and, for a contrastive checkpoint, ``embed_audio`` / ``embed_image`` /
``embed_text`` (:mod:`mmtf.predict.embed`). Why not on the task: docs/design/task-interface.md
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import UserError
from mmtf.hub import CONFIG_FILE, is_hf_source, resolve_source
from mmtf.predict.embed import EmbedLongAudio, embed_media_inputs, embed_text_inputs, is_contrastive
from mmtf.predict.inputs import Input, predict_inputs
from mmtf.tasks.base import Task
from mmtf.tasks.rebuild import build_pretrained_task, build_task

if TYPE_CHECKING:
    from torch import Tensor

    from mmtf.text import Tokenizer


class Model:
    """A task rebuilt for inference, with the notebook calls; every other attribute is the
    task's.

    Args:
        task: the task (in eval mode, on its device).
    """

    def __init__(self, task: Task) -> None:
        self.task = task

    def __getattr__(self, name: str) -> Any:
        if name == "task":          # not set yet (copy, pickle): no attribute to read through
            raise AttributeError(name)
        return getattr(self.task, name)

    def caption(self, inputs: Sequence[Input] | Input, *, batch_size: int = 8,
                **generation: Any) -> list[str]:
        """One caption per input (:mod:`mmtf.predict.inputs`; long audio cropped);
        ``generation`` overrides the settings for this call."""
        if not hasattr(self.task, "generate_captions"):
            raise UserError(f"caption: a {type(self.task).__name__} writes no captions; use "
                            f"mmtf.predict.inputs.predict_inputs(model.task, inputs) for its "
                            f"rows.")
        return [row["caption"] for row in self._predict(inputs, batch_size, "crop", generation)]

    def answer(self, inputs: Sequence[Input] | Input, questions: Sequence[str] | str, *,
               batch_size: int = 8, **generation: Any) -> list[str]:
        """One reply per (input, question) of a prefix LM (:class:`~mmtf.tasks.PrefixLMTask`);
        each question is the user turn and holds the media placeholder (``<|audio|>``)
        where the media goes; long audio is cropped. ``generation`` overrides the settings for
        this call.

        Raises:
            UserError: the task answers no questions, the counts differ, or a question has no
                placeholder.
        """
        if not hasattr(self.task, "set_questions"):
            raise UserError(f"answer: a {type(self.task).__name__} answers no questions; load a "
                            f"prefix LM checkpoint (model=prefix_lm).")
        if isinstance(inputs, str | os.PathLike) or not isinstance(inputs, Sequence):
            inputs = [inputs]
        questions = [questions] if isinstance(questions, str) else list(questions)
        if len(questions) != len(inputs):
            raise UserError(f"answer: {len(questions)} questions for {len(inputs)} inputs; give "
                            f"one question per input.")
        replies: list[str] = []
        for start in range(0, len(inputs), batch_size):
            self.task.set_questions(questions[start:start + batch_size])
            rows = self._predict(list(inputs[start:start + batch_size]), batch_size, "crop",
                                 generation)
            replies += [row["answer"] for row in rows]
        return replies

    def transcribe(self, inputs: Sequence[Input] | Input, *, batch_size: int = 8,
                   long_form: str = "sequential", **generation: Any) -> list[dict[str, Any]]:
        """Transcribe speech with a :class:`~mmtf.tasks.speech.SpeechTask`, long files whole:
        one dict per input with ``text``, and ``language`` / ``segments`` when decoded.

        Args:
            inputs: audio files or waveforms.
            long_form: ``sequential`` or ``chunked``, for audio longer than 30 s.
            **generation: overrides for this call (``language="auto"``, ``timestamps=True``).

        Raises:
            UserError: the task decodes no speech.
        """
        speech = getattr(self.task, "speech", None)
        if speech is None:
            raise UserError(f"transcribe: a {type(self.task).__name__} decodes no speech; load "
                            f"a Whisper checkpoint (model=whisper) or use caption().")
        rows = self._predict(inputs, batch_size, long_form,
                             {"long_form": long_form, "task": speech.task or "transcribe",
                              **generation})
        return [{"path": row["path"], "text": row["caption"],
                 **{k: row[k] for k in ("language", "segments") if k in row}} for row in rows]

    def embed_audio(self, inputs: Sequence[Input] | Input, *, batch_size: int = 16,
                    long_audio: EmbedLongAudio = "crop") -> Tensor:
        """L2-normalised embeddings (n, e) of audio files or waveforms, from a contrastive
        checkpoint, in eval mode; audio longer than ``model.encoder.max_seconds`` is cropped
        to its start (``long_audio="crop"``) or embedded window by window and averaged
        (``"window"``). See :mod:`mmtf.predict.embed`."""
        return embed_media_inputs(self.task, inputs, modality="audio", batch_size=batch_size,
                                  long_audio=long_audio)

    def embed_image(self, inputs: Sequence[Input] | Input, *, batch_size: int = 16) -> Tensor:
        """L2-normalised embeddings (n, e) of image files, PIL images or (3, h, w) tensors, from
        a contrastive checkpoint (the stored eval transforms), in eval mode."""
        return embed_media_inputs(self.task, inputs, modality="image", batch_size=batch_size)

    def embed_text(self, texts: Sequence[str] | str, *, batch_size: int = 64,
                   **options: Any) -> Tensor:
        """Embeddings (n, e) of strings: a contrastive checkpoint's text tower (L2-normalised),
        or a text-encoder folder's sentence embeddings (``options``: its ``normalize``)."""
        if not is_contrastive(self.task) and callable(getattr(self.task, "embed_text", None)):
            return self.task.embed_text(texts, batch_size=batch_size, **options)
        if options:
            raise UserError(f"embed_text: {sorted(options)} are not options of a contrastive "
                            f"checkpoint's embed_text (it takes batch_size; the embeddings are "
                            f"always L2-normalised).")
        return embed_text_inputs(self.task, texts, batch_size=batch_size)

    def _predict(self, inputs: Sequence[Input] | Input, batch_size: int, long_audio: str,
                 generation: dict[str, Any]) -> list[dict[str, Any]]:
        """predict_inputs with ``generation`` over the settings for this call only."""
        saved = self.task.generation_state()
        self.task.update_generation(generation)
        try:
            return predict_inputs(self.task, inputs, batch_size=batch_size,
                                  long_audio=long_audio)
        finally:
            self.task.restore_generation(saved)


def load(ckpt_path: str | os.PathLike, *, device: str = "cpu", use_ema: bool = False,
         **generation: Any) -> tuple[Model, Tokenizer | None]:
    """Rebuild the task of an mmtf checkpoint (or a pretrained Whisper) for inference.

    Args:
        ckpt_path: a checkpoint written by ``mmtf.train`` (read with ``weights_only=True``), or
            a Hugging Face Whisper folder or hub id, used zero-shot, or an LLM folder (Llama,
            Qwen2, Qwen3: a :class:`~mmtf.pretrained.llm_text.PretrainedLM` with
            ``generate_text`` and ``lm_logits``), or a text-encoder folder (BERT, RoBERTa,
            XLM-RoBERTa, sentence-transformers: a
            :class:`~mmtf.pretrained.bert_text.PretrainedTextEncoder` with ``embed_text``).
        device: where the model runs.
        use_ema: the EMA of the weights (``callbacks=ema``) instead of the trained ones.
        **generation: generation settings kept for every later call.

    Returns:
        The :class:`Model` (in eval mode) and its tokenizer (None for classification).
    """
    from mmtf.pretrained.bert_text import PretrainedTextEncoder, is_text_encoder_folder

    # A missing "runs/last.ckpt" also looks like an org/name hub id: checkpoints keep their error.
    # A sentence-transformers folder may keep config.json in its module's subfolder.
    if ((is_hf_source(ckpt_path) or is_text_encoder_folder(ckpt_path))
            and Path(ckpt_path).suffix != ".ckpt"):
        if use_ema:
            raise UserError(f"use_ema=True: {ckpt_path} is a pretrained model, not an mmtf "
                            f"checkpoint trained with callbacks=ema; drop use_ema.")
        from mmtf.pretrained.llm_text import PretrainedLM, is_llm_folder

        folder = resolve_source(ckpt_path, owner=f"ckpt_path={ckpt_path}")
        if is_llm_folder(folder):
            task = PretrainedLM.from_folder(folder)
        elif is_text_encoder_folder(folder):
            task = PretrainedTextEncoder.from_folder(folder)
        else:
            check_zero_shot_family(folder, ckpt_path)
            task = build_pretrained_task(ckpt_path)
    else:
        task, _ = build_task(load_checkpoint(ckpt_path), ckpt_path, use_ema=use_ema)
    task = task.to(device).eval()
    task.update_generation(generation)
    return Model(task), task.tokenizer


def check_zero_shot_family(folder: Path, source: str | os.PathLike) -> None:
    """An unknown ``model_type`` is named with every family mmtf uses zero-shot."""
    import json

    from mmtf.pretrained import FAMILIES
    from mmtf.pretrained.bert import SUPPORTED as TEXT_ENCODERS
    from mmtf.pretrained.llm import SUPPORTED
    from mmtf.tasks.rebuild import ZERO_SHOT

    kinds = sorted(set().union(*(FAMILIES[f].model_types for f in ZERO_SHOT)))
    try:
        kind = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return                                  # build_pretrained_task names the problem
    if kind is not None and kind not in kinds:
        raise UserError(f"ckpt_path={source}: model_type {kind!r} is not supported zero-shot; "
                        f"mmtf reads {', '.join(kinds)}, the LLM families "
                        f"{SUPPORTED} and the text encoders {TEXT_ENCODERS}.")


__all__ = ["Model", "load"]
