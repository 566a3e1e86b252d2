"""Pretrained networks from the ecosystem (Hugging Face format) in mmtf's own modules.

:mod:`mmtf.pretrained.hf` reads a model folder or hub id (config.json + safetensors, never
pickles) and copies tensors by name; each family's module maps its names onto mmtf's encoders
and decoders.
"""
