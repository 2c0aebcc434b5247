"""The adapters: the Lightning and Keras callbacks and their planning glue; only they touch a trainer."""
