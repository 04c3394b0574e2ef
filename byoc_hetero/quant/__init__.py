"""Quantization: our own post-training quantizer and the checks of quantized models."""
