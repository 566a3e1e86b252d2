"""mmtf: multimodal encoder-decoder transformers."""
