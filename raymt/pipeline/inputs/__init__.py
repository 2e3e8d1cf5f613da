"""Inputs: each format read (``input_formats``: text, TSV, JSON lines in ``line_inputs``, CSV in ``csvfiles`` and ``csv_quotes``, Parquet in ``parquet_input`` and ``parquet_pins``), what an input names (``listing``), text sniffed and counted (``sniff``, ``textfiles``), the columns passed through (``passthrough``), a work unit and what reading one gives (``workunit``) and a whole corpus read at once (``corpus``).

Imports pyarrow and the pipeline's shared modules (``errors``, ``formats``, ``writers``, ``storage``); no other room, no ray, no torch."""
