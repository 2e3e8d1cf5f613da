"""Command-line entry points: argparse -> config -> one call."""
