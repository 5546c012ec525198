"""Experiments that reproduce and beat the TGS paper (`tgs bench NAME`). Each writes JSON,
a Markdown table and plots under bench/results/NAME/ (or where --json says) and prints
where. They run from a source checkout."""
