"""The bench apps of each system, configured by environment variables (see compare.py)."""
