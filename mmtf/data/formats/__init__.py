"""Dataset index readers (and the writers the synthetic generators use).

Caption formats: ``clotho`` and ``audiocaps`` (audio), ``coco`` (images), ``manifest`` and
``shards`` (WebDataset tar shards) (either);
speech (transcripts are the captions): ``librispeech``, ``common_voice``, ``manifest``.
Label formats: ``esc50`` (audio), ``image_folder`` (images).
Question formats: ``aqa`` (multiple-choice audio questions as JSONL, :mod:`.aqa`).
Instruction format: ``instruction`` (conversations about a clip or image as JSONL,
:mod:`.instruction`; its items are caption items with ``messages``), read by the caption
modules for a prefix LLM.

Every reader is ``read_<format>(root, split, *, report, ...)``: the dataset folder, our split
(``train|val|test``), and the callback each problem is reported to (:data:`base.Report`).
"""

from mmtf.data.formats.aqa import QAItem, read_aqa, write_aqa_jsonl
from mmtf.data.formats.audiocaps import read_audiocaps
from mmtf.data.formats.base import SPLITS, CaptionItem, LabelItem, LabelSet, QAFields
from mmtf.data.formats.clotho import read_clotho, write_clotho_csv
from mmtf.data.formats.coco import read_coco, write_coco_json
from mmtf.data.formats.common_voice import read_common_voice
from mmtf.data.formats.esc50 import read_esc50, write_esc50_csv
from mmtf.data.formats.image_folder import read_image_folder
from mmtf.data.formats.instruction import read_instruction, write_instruction_jsonl
from mmtf.data.formats.librispeech import read_librispeech
from mmtf.data.formats.manifest import read_manifest
from mmtf.data.shards.index import ShardItem, read_shards

# format -> (reader, modality); manifest's modality comes from config.
CAPTION_FORMATS = {
    "clotho": (read_clotho, "audio"),
    "audiocaps": (read_audiocaps, "audio"),
    "coco": (read_coco, "image"),
    "manifest": (read_manifest, None),
    "librispeech": (read_librispeech, "audio"),
    "common_voice": (read_common_voice, "audio"),
    "shards": (read_shards, None),      # mmtf.data.shards.ShardDataModule (data=shards)
    "instruction": (read_instruction, None),   # chats; read with a chat template (data=instruction)
}
LABEL_FORMATS = {
    "esc50": (read_esc50, "audio"),
    "image_folder": (read_image_folder, "image"),
}
QA_FORMATS = {
    "aqa": (read_aqa, "audio"),
}

__all__ = [
    "CAPTION_FORMATS", "LABEL_FORMATS", "QA_FORMATS", "SPLITS", "CaptionItem", "LabelItem",
    "LabelSet", "QAFields", "QAItem", "ShardItem", "read_shards", "read_instruction",
    "write_instruction_jsonl",
    "read_aqa", "read_audiocaps", "read_clotho", "read_coco", "read_common_voice", "read_esc50",
    "read_image_folder", "read_librispeech", "read_manifest", "write_clotho_csv", "write_coco_json", "write_esc50_csv",
    "write_aqa_jsonl",
]
