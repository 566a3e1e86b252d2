"""mmtf synthetic: the built-in data sets, generated into real-world layouts, then read as data.

Public API: ``SyntheticCaptionDataModule`` / ``SyntheticClassificationDataModule`` /
``SyntheticQADataModule`` (the ``_target_`` of conf/data/synth_*.yaml),
``ensure_synthetic(root, kind, **params)``, ``caption_parser(name)``, ``SETS``. Generators:
:mod:`mmtf.synthetic.audio`, :mod:`mmtf.synthetic.aqa` (questions about its clips),
:mod:`mmtf.synthetic.image`. Layer: just above ``mmtf.data``, which never imports it."""

from mmtf.synthetic.cache import SETS, caption_parser, ensure_synthetic
from mmtf.synthetic.datamodule import (
    SyntheticCaptionDataModule,
    SyntheticClassificationDataModule,
    SyntheticQADataModule,
)

__all__ = ["SETS", "SyntheticCaptionDataModule", "SyntheticClassificationDataModule",
           "SyntheticQADataModule", "caption_parser", "ensure_synthetic"]
