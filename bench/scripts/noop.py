"""A rank that does nothing and never imports torch: measures the launcher's own overhead."""

import os

assert os.environ["RANK"]
