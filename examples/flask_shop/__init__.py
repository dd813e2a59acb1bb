"""The Flask example: a shop whose order confirmation is a taskq task (see README.md)."""
