"""A rank that does nothing: a plan needs a program that exists."""
