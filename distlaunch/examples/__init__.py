"""Small example scripts that ship with distlaunch (run them with ``distlaunch run -m ...``)."""
