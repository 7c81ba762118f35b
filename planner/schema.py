"""Building blocks of every pydantic model read from a file: strict base model, catalog ids, fractions."""

import types
import typing
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = ["CatalogId", "EdgeModel", "Fraction", "Name"]

CatalogId = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9][a-z0-9.]*(-[a-z0-9.]+)*$"),
    Field(description="lowercase kebab-case identifier, e.g. hgx-h100 or llama-3.1-70b"),
]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f\[\]]*[^\s\[\]][^\x00-\x1f\x7f\[\]]*$"),
    Field(description="1-64 printable characters without newlines, control characters or square brackets (which field "
                      "paths and terminal markup use); quoted wherever a script uses it"),
]


class EdgeModel(BaseModel):
    """Base of every model read from a file: unknown fields are errors, NaN and infinite numbers are
    refused, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data):
        """YAML `true` is not a count or a price (pydantic would read it as 1)."""
        if isinstance(data, dict):
            for name, info in cls.model_fields.items():
                if isinstance(data.get(name), bool) and _numeric(info.annotation):
                    raise ValueError(f"{name}: {data[name]} is not a number\n    fix: write a number")
        return data


def _numeric(annotation) -> bool:
    """Whether a field holds a number (int or float, optionally None), not a bool or anything else."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(a in (int, float) for a in args)
    return False
