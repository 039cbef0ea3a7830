"""Other trainers' names for the config keys (Hugging Face's Trainer, nanoGPT, PyTorch's examples): ``max_steps``
and ``--max-steps`` are train.steps here. One table for both places they come up: a flag given to
``distlaunch train`` (answered with the ``--set`` that says the same) and an unknown key in a config
(``train.learning_rate``: did you mean train.lr?).

``distlaunch train`` takes no such flags on purpose: every training setting is a config key, set in the TOML file
or with ``--set``, so one name means one thing in the file, on the command line and in the docs.
"""

from __future__ import annotations

# another trainer's name (underscores) -> the config key
KEY_ALIASES: dict[str, str] = {
    "steps": "train.steps",
    "max_steps": "train.steps",
    "max_iters": "train.steps",  # nanoGPT
    "lr": "train.lr",
    "learning_rate": "train.lr",
    "batch_size": "train.global_batch_size",
    "global_batch_size": "train.global_batch_size",
    "micro_batch_size": "train.micro_batch_size",
    "per_device_train_batch_size": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.grad_accum_steps",
    "grad_accum_steps": "train.grad_accum_steps",
    "seq_len": "train.seq_len",
    "block_size": "train.seq_len",  # nanoGPT
    "warmup_steps": "train.warmup_steps",
    "weight_decay": "train.weight_decay",
    "max_grad_norm": "train.grad_clip",
    "grad_clip": "train.grad_clip",
    "seed": "train.seed",
    "precision": "train.precision",
    "model": "model.preset",
    "preset": "model.preset",
    "data": "data.path",
    "data_path": "data.path",
    "output_dir": "checkpoint.dir",
    "checkpoint_dir": "checkpoint.dir",
    "save_steps": "checkpoint.every",
    "eval_steps": "train.eval_every",
    "log_every": "train.log_every",
    "logging_steps": "train.log_every",
    "report_to": "train.report_to",
}
# what a name means beyond its key, where the two trainers differ
ALIAS_NOTES: dict[str, str] = {"batch_size": "all ranks' batch together; one rank's is train.micro_batch_size"}
# names whose value does not carry over: a switch that stands for one value of a key, a count in other units
EPOCHS = "train.steps=N: distlaunch train counts steps, not epochs"
SETTING_ALIASES: dict[str, str] = {
    "bf16": "train.precision=bf16",
    "fp16": "train.precision=fp16",
    "epochs": EPOCHS,
    "num_train_epochs": EPOCHS,
}
