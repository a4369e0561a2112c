"""The head node: node stores merged into the fleet store, accounting, lemon signals and policy,
history, job summaries. May import click-free libraries freely; imports node and core, never
report or the CLI."""
