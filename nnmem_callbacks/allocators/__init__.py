"""Allocator models, one home: the CUDA caching allocator, TensorFlow's BFC allocator and its CPU variants."""
