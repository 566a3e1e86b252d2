"""Seeing inside a captioning model: cross-attention of each generated token over the audio
(on a time axis under the spectrogram) or the image (a heatmap per token), self-attention maps,
and word-to-time alignment by DTW over the cross-attention, as Whisper's word timestamps.

From the command line: ``python -m mmtf.inspect ckpt_path=... input=clip.wav``. From Python::

    from mmtf.inspect import align, load_task
    task, _ = load_task("runs/x/checkpoints/last.ckpt")
    for word in align(task, "clip.wav"):
        print(word.word, word.start, word.end)

The maps come from the attention core's explicit path, asked of the chosen layers only through
``attention_layers=`` of the encoder/decoder forward (:mod:`mmtf.nn.transformer`).
"""

from mmtf.inspect.align import WordSpan, dtw_path, word_spans
from mmtf.inspect.attention import CaptionAttention, caption_attention
from mmtf.inspect.core import align, inspect_input, inspection_figures, load_task

__all__ = ["CaptionAttention", "WordSpan", "align", "caption_attention", "dtw_path",
           "inspect_input", "inspection_figures", "load_task", "word_spans"]
