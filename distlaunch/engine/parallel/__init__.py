"""One small module per parallelism, applied to the built model in a fixed order (see trainer.py)."""
