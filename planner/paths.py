"""Where the built-in catalogs live: inside the installed package, or at the top of a checkout."""

from pathlib import Path

__all__ = ["data_dir"]

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Directory of a built-in catalog: "topologies", "models" or "problems".

    A wheel carries the catalogs as `planner/_data/<name>` (pyproject force-include); an editable
    install or a plain checkout reads them from the repository root.
    """
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"built-in catalog '{name}' not found next to {_PACKAGE_DIR}")
