"""The Keras estimator on TensorFlow: the train step's graph traced, scheduled and replayed through the allocator model."""
