"""Errors that reach the user as one line and exit code 2.

Every validation failure in kvsim that is the *user's* fault (a bad name, a bad
number, a bad file) raises :class:`InputError`.  The CLI turns it into
``error: <field>: <value> — <allowed>`` on stderr with exit code 2 and no
traceback.  Programmatic callers can catch it and read the structured fields.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin


class InputError(ValueError):
    """Bad user input: names the field, the offending value and what is allowed."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(self.one_line())

    def __reduce__(self) -> tuple[Any, tuple[str, Any, str]]:
        # NOTE: raised in worker processes (plan/sweep pools): must survive pickling
        return (type(self), (self.field, self.value, self.allowed))

    def one_line(self) -> str:
        shown = repr(self.value) if not isinstance(self.value, str) else f"'{self.value}'"
        if len(shown) > 120:
            shown = shown[:117] + "..."
        return single_line(f"{self.field}: {shown} — {self.allowed}")


_LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def single_line(text: str) -> str:
    """``text`` with every character that ends a line (``str.splitlines``' set: ``\\n``,
    ``\\r``, ``\\u2028``...) turned into a space, so a value a user wrote cannot split
    the one error line."""
    return _LINE_BREAKS.sub(" ", text)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread while a command runs (kvsim.cli.main), as
    KeyboardInterrupt is for Ctrl-C, so what the command holds is closed on the way out.

    NOTE: a BaseException, so no ``except Exception`` on the way (a sweep point's
    failure handling) takes it for a failed run."""


class RunStopped(InputError):
    """A run stopped early by a user-set bound (a trace too large for one run's results
    memory, a dead server during a replay).

    NOTE: the run's results so far are a value: ``Results.stopped`` holds this stop;
    the recorder raises it inside the engine only to end the run there.
    """


def capacity_hint(max_requests: int) -> str:
    """What the user can do about a workload over ``max_requests`` requests."""
    return (f"at most {max_requests:,} requests per run keep it within ~400-500 MB of memory; "
            "down-sample it (kvsim trace sample, workload.max_sessions), cut it "
            "(sim.max_sim_time_s) or split the trace")


def closest_names(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Closest candidate names for a "did you mean" hint (difflib ratio)."""
    pool = sorted(set(candidates))
    hits = difflib.get_close_matches(name.lower(), pool, n=n, cutoff=0.3)
    return hits or pool[:n]


LIST_ALL_UP_TO = 10
"""Catalogues this small are listed whole in an unknown-name message."""


def unknown_name(field: str, name: str, candidates: Iterable[str],
                 also: str = "") -> InputError:
    """An :class:`InputError` for a name that is not in a catalogue.

    Up to :data:`LIST_ALL_UP_TO` candidates are all listed (``unknown; one of: ...``,
    closest first, then the rest sorted); a larger catalogue gets the three closest
    (``unknown; closest: ...``).  ``also`` is appended, e.g. "or a path to a .yaml file".
    """
    pool = sorted(set(candidates))
    if not pool:
        allowed = "unknown; none are available"
    elif len(pool) <= LIST_ALL_UP_TO:
        near = closest_names(name, pool, n=len(pool))
        allowed = "unknown; one of: " + ", ".join(near + [c for c in pool if c not in near])
    else:
        allowed = "unknown; closest: " + ", ".join(closest_names(name, pool))
    return InputError(field, name, f"{allowed} ({also})" if also else allowed)


def short_value(value: Any) -> Any:
    """A value fit for a one-line message: a mapping becomes the list of its keys."""
    if isinstance(value, dict):
        return "a mapping with keys " + ", ".join(map(str, value)) if value else "{}"
    return value


def from_validation_error(exc: Any, prefix: str = "", sep: str = ".",
                          model: Any = None) -> InputError:
    """Turn the first error of a pydantic ``ValidationError`` into an InputError.

    The field is ``prefix`` + ``sep`` + the error's dotted location; a required field
    that is absent reads ``<field>: 'missing' — required ...``; a whole mapping is never
    shown as the value (its keys are).  With ``model`` (the pydantic class validated), a
    key it does not have is answered with the keys it has at that place.
    """
    err = exc.errors()[0]
    parts = [str(p) for p in err.get("loc", ()) if p != "__root__"]
    given = err.get("input")
    original = (err.get("ctx") or {}).get("error")
    if isinstance(original, InputError):
        # NOTE: a model-level validator sees the whole model (a dict input, no loc of its
        # own): name the sub-field it rejected, not the dict.
        if isinstance(given, dict) and original.field:
            parts.append(original.field)
        value, allowed = original.value, original.allowed
    elif err.get("type") in ("union_tag_invalid", "union_tag_not_found"):
        ctx = err.get("ctx") or {}
        key = str(ctx.get("discriminator", "kind")).strip("'\"")
        parts.append(key)
        value = ctx.get("tag", "missing")
        allowed = "one of " + str(ctx["expected_tags"]) if "expected_tags" in ctx else \
            f"required: '{key}' says which kind this is"
    elif err.get("type") == "extra_forbidden":
        value = short_value(given)
        keys = _keys_at(model, parts[:-1])
        allowed = ("not a key here; allowed: " + ", ".join(keys)) if keys else \
            "not a key here (extra keys are not allowed)"
    elif err.get("type") == "missing":
        keys = ", ".join(map(str, given)) if isinstance(given, dict) and given else ""
        value, allowed = "missing", "required" + (f" (given: {keys})" if keys else "")
    else:
        value = short_value(given)
        allowed = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    loc = ".".join(parts)
    field = f"{prefix}{sep}{loc}" if prefix and loc else (prefix or loc or "input")
    return InputError(field, value, allowed)


def _keys_at(model: Any, path: list[str]) -> list[str]:
    """The field names of the pydantic model found at ``path`` inside ``model``: through
    fields, list/tuple indices and tagged unions (a ``kind`` in the path picks the member);
    [] when there is no model or the path cannot be followed."""
    cur, rest = model, list(path)
    while True:
        cur = _unwrap(cur)
        members = [m for m in get_args(cur) if _is_model(m)] \
            if get_origin(cur) in (Union, UnionType) else []
        if members:
            tag = rest.pop(0) if rest else None
            cur = next((m for m in members if "kind" in m.model_fields
                        and m.model_fields["kind"].default == tag), None)
            continue
        if get_origin(cur) in (list, tuple) and rest and rest[0].isdigit():
            rest.pop(0)
            cur = get_args(cur)[0]
            continue
        if not _is_model(cur):
            return []
        fields = cur.model_fields
        if not rest:
            return list(fields)
        name = rest.pop(0)
        if name not in fields:
            return []
        cur = fields[name].annotation


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel  # NOTE: lazily: `kvsim --help` needs no pydantic

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _unwrap(tp: Any) -> Any:
    """``tp`` without ``Annotated[...]`` and ``X | None``."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return tp
