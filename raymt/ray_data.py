"""The Ray Data operator: ``ds.map_batches(Translate, fn_constructor_kwargs={"model": path})``
(``raymt.pipeline.ray_data``)."""
from raymt.pipeline.ray_data import ERROR_COLUMN, Translate, TranslateStats

__all__ = ["ERROR_COLUMN", "Translate", "TranslateStats"]
