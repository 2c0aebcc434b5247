"""The Hugging Face ``Trainer`` adapter: the callback, its estimation and the planning of ``TrainingArguments``."""
