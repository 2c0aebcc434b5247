"""The Keras 3 estimator: one entry point, a backend each (TensorFlow graph replay, JAX/XLA, torch), layer rules as fallback."""
