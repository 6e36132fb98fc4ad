"""One wording for pydantic validation errors in messages users read (CLI, status, notes)."""

from __future__ import annotations

from pydantic import ValidationError


def validation_problems(
    exc: ValidationError, *, limit: int | None = None, root: str | None = None
) -> str:
    """`field.path: message; …` for the first `limit` errors (all by default). An error on the
    object as a whole is named `root` when given, else shown as its message alone."""
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"]) or root
        parts.append(f"{where}: {err['msg']}" if where else str(err["msg"]))
    return "; ".join(parts)
