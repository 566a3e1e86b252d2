"""mmtf synthetic: the built-in data sets, generated into real-world layouts, then read as data.

Public API::

    SyntheticCaptionDataModule, SyntheticClassificationDataModule
                                                  data modules of the built-in sets (Hydra
                                                  `_target_` of conf/data/synth_*.yaml)
    ensure_synthetic(root, kind, **params)        generate a built-in set (cached, atomic)
    caption_parser(name)                          caption -> event sequence of the set called
                                                  `name` (None: no event accuracy)
    SETS                                          the sets by name: writer, version, format,
                                                  caption parser

Generators: :mod:`mmtf.synthetic.audio` (sound events, Clotho / ESC-50 layouts) and
:mod:`mmtf.synthetic.image` (shapes, COCO captions / ImageFolder). Layer: just above
``mmtf.data`` (it writes the formats ``mmtf.data`` reads); ``mmtf.data`` never imports it.
"""

from mmtf.synthetic.cache import SETS, caption_parser, ensure_synthetic
from mmtf.synthetic.datamodule import (
    SyntheticCaptionDataModule,
    SyntheticClassificationDataModule,
)

__all__ = ["SETS", "SyntheticCaptionDataModule", "SyntheticClassificationDataModule",
           "caption_parser", "ensure_synthetic"]
