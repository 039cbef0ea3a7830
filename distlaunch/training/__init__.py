"""What a training job of the bundled engine is, without torch: its config (TOML and ``--set``), the model
presets, the layout checked against the model and the batch, the memory and step-time planner, and the format
of its checkpoint folders. The launcher reads this to check a ``train`` job before any rank starts; the engine
(``distlaunch.engine``, the torch part) reads the same modules to build it."""
