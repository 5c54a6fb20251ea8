"""The `specdec` command line."""
