"""Plain record classes for plans and results (issue 22).

Not `dataclasses`: importing it imports `inspect` and `re` (and with `re`,
`enum`), a third of this package's import, and a no-change plan counts the
interpreter's start. A record here has the fields it lists, in order, a
`repr`, equality and `as_dict()` (what `dataclasses.asdict` gives):

    class Item(Record):
        __slots__ = _fields = ("input", "output", "reason", "detail")
        _defaults = {"detail": None}
"""

from __future__ import annotations


class Record:
    __slots__ = ()
    # The field names, in order; each subclass sets them and its defaults.
    _fields: tuple[str, ...] = ()
    _defaults: dict[str, object] = {}

    def __init__(self, *args: object, **kwargs: object) -> None:
        cls = type(self)
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__} takes {len(cls._fields)} fields, not {len(args)}")
        for name, value in zip(cls._fields, args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}: field {name!r} given twice")
            kwargs[name] = value
        for name in cls._fields:
            if name in kwargs:
                object.__setattr__(self, name, kwargs.pop(name))
            elif name in cls._defaults:
                object.__setattr__(self, name, cls._defaults[name])
            else:
                raise TypeError(f"{cls.__name__}: field {name!r} is missing")
        if kwargs:
            raise TypeError(f"{cls.__name__} has no field {sorted(kwargs)[0]!r}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self)._fields)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in type(self)._fields)

    __hash__ = None  # mutable, as a dataclass is by default

    def as_dict(self) -> dict[str, object]:
        """The fields as a dict, records and their lists and dicts within
        turned into dicts too (as `dataclasses.asdict`)."""
        return {n: _plain(getattr(self, n)) for n in type(self)._fields}


def _plain(v: object) -> object:
    if isinstance(v, Record):
        return v.as_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v

