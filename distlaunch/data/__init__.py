"""Datasets for the bundled trainer: the byte-level corpus, and folders made by ``distlaunch data prepare``."""
