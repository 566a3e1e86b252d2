"""Seeing inside a captioning model: cross-attention per generated token (over the audio's time
axis or the image), self-attention maps, and word-to-time alignment by DTW (as Whisper's word
timestamps). ``python -m mmtf.inspect ckpt_path=... input=clip.wav``, or ``align(task, path)``
after ``load_task(ckpt)``. The maps come from the attention core's explicit path
(``attention_layers=``, :mod:`mmtf.nn.transformer`)."""

from mmtf.decoders.align import WordSpan, dtw_path, word_spans
from mmtf.inspect.attention import CaptionAttention, caption_attention
from mmtf.inspect.core import align, inspect_input, inspection_figures, load_task

__all__ = ["CaptionAttention", "WordSpan", "align", "caption_attention", "dtw_path",
           "inspect_input", "inspection_figures", "load_task", "word_spans"]
