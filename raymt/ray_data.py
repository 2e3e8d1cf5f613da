"""The Ray Data operator: ``ds.map_batches(Translate, fn_constructor_kwargs={"model": path})``
(``raymt.pipeline.decoders.data_operator``)."""
from raymt.pipeline.decoders.data_operator import ERROR_COLUMN, Translate, TranslateStats

__all__ = ["ERROR_COLUMN", "Translate", "TranslateStats"]
