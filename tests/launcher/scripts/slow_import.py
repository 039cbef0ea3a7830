"""A module that takes a minute to import (``--preload slow_import``): a stop must not wait for it."""

import time

time.sleep(60)
