"""The trainer engine: a GPT and its data, tensor, pipeline and ZeRO parallelism (plain PyTorch)."""
