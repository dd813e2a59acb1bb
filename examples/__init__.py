"""Example applications using taskq."""
