"""Building blocks of every pydantic model read from a file: strict base model, catalog ids, fractions."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

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
