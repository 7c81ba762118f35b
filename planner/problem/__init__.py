"""A deployment problem: the pydantic input format, its resolution against the catalogs, and its reference text."""
