"""How every options object is built: the one routine that merges an options object with
keyword overrides (:func:`build_options`), and the decorator that makes an options dataclass
refuse a misspelt field with "did you mean" (:func:`options_class`).

Every operation with more than a few settings has a frozen options dataclass (``PackOptions``,
``VerifyOptions``, ``ScrubOptions``, ``ExportOptions``, ``GcOptions``, ``LoaderOptions``, ...),
each default defined once in its field; ``Root``'s methods and the writers take the object
and/or its fields as keywords through :func:`build_options`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Collection, Iterable, Mapping
from typing import Any, TypeVar

from ..errors import UnknownOptionError, UsageError

__all__ = [
    "build_options",
    "check_keywords",
    "options_class",
]

_T = TypeVar("_T")


def check_keywords(given: Iterable[str], valid: Collection[str], where: str) -> None:
    """Refuse keywords that are not settings of ``where``, naming the nearest valid one.

    Options objects take overrides as keywords; a typo fails here, when the call is made, not
    later where the setting would have been read."""
    for name in sorted(set(given) - set(valid)):
        near = difflib.get_close_matches(name, sorted(valid), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else f"; valid: {', '.join(sorted(valid))}"
        raise UnknownOptionError(f"{where}: unknown keyword {name!r}{hint}")


def options_class(cls: type[_T]) -> type[_T]:
    """Make an options dataclass refuse an unknown keyword at construction with "did you
    mean" (:class:`UnknownOptionError`), as ``Root``'s keyword overrides do, instead of the
    dataclass ``__init__``'s plain ``TypeError``. Apply it above ``@dataclass``."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is no dataclass")
    init = cls.__init__
    names = tuple(f.name for f in dataclasses.fields(cls))

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        check_keywords(kwargs, names, cls.__name__)
        init(self, *args, **kwargs)

    setattr(cls, "__init__", checked_init)  # noqa: B010 - mypy refuses assigning a method
    return cls


def build_options(
    cls: type[_T], options: _T | None, overrides: Mapping[str, Any], where: str
) -> _T:
    """``options`` (default: ``cls()``) with the keyword ``overrides`` replacing single fields.

    An unknown keyword fails here, when the call is made, naming the nearest field ("did you
    mean"). ``None`` for a field whose default is not ``None`` means "the default": callers
    pass their optional arguments through without repeating the default.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is no options dataclass")
    if options is not None and not isinstance(options, cls):
        raise UsageError(
            f"{where}: options must be a {cls.__name__}, not {type(options).__name__}",
            options=("options",),
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keywords(overrides, fields, where)
    chosen = {
        name: value
        for name, value in overrides.items()
        if value is not None or fields[name].default is None
    }
    base: Any = options if options is not None else cls()
    return dataclasses.replace(base, **chosen)  # type: ignore[no-any-return]
