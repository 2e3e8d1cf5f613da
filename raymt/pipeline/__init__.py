"""Corpus reading, dispatch to workers, sinks and stats (Ray lives here and in jobs/)."""
