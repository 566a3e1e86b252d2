"""Training objectives that are not part of one model: the contrastive (InfoNCE) loss of a
dual encoder, with several captions per item and negatives from the global batch."""

from mmtf.losses.contrastive import ContrastiveLoss, item_keys, multi_positive_nce

__all__ = ["ContrastiveLoss", "item_keys", "multi_positive_nce"]
