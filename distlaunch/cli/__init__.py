"""The command-line interface: thin commands over the launcher library. No torch imports here."""
