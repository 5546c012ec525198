"""The `tgs` CLI's command groups, one module each."""
