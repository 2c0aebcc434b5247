"""Measuring during training for every adapter: meters, epoch comparison, phase tracking, TensorBoard output."""
