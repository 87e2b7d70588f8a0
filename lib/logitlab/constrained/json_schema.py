"""From a JSON Schema to a regular expression, for constrained decoding.

Chapter 11 ("When the output must match a pattern") explains this module.

A JSON value of a bounded shape is a regular language: ``to_regex`` writes the pattern, which
``logitlab.Constraint`` then compiles to a token mask. The subset covers what structured-output
requests mostly use, and ``HONOURED`` lists the keywords each type takes:

* ``object`` with ``properties``, every one of them ``required`` (written in the schema's
  order; no other property is ever written, so ``additionalProperties`` true or false holds
  either way); ``string`` (``minLength``, ``maxLength``, ``format: date``), ``integer``
  (``minimum`` 0 or 1), ``number`` (no bounds), ``boolean``, ``null``; ``enum`` and ``const``
  of any JSON values; ``array`` with ``items``, ``minItems``, ``maxItems``; ``anyOf`` and
  lists of types (each type taking the keywords that apply to it);
* nesting up to ``max_depth`` levels.

Anything else raises ``ValueError`` naming it: an unknown keyword, a keyword the type does not
honour (``minimum`` on a number, ``maxLength`` on an integer), a keyword beside ``enum``,
``const`` or ``anyOf``, a ``required`` name with no schema in ``properties``. Some of it cannot
be a regular expression at all: a recursive schema (``$ref`` to itself) describes nesting of any
depth, which needs a stack (a grammar); the rest (optional properties, numeric ranges, string
patterns) is regular but left out to keep the compiler short.

``whitespace`` is the pattern allowed wherever JSON allows whitespace; it may match only JSON's
own whitespace, the four characters space, tab, line feed and carriage return (``\\s`` would
also admit ``\\v`` and ``\\f``, which no JSON parser accepts). The default, at most one space,
keeps outputs compact; ``JSON_WHITESPACE`` (any amount, all that JSON allows) lets a model
emit spaces and newlines for ever, which chapter 11 shows on the real model.

Every string the pattern matches is a JSON text that ``json.loads`` reads and that is valid
under the schema: a string's ``\\u`` escapes leave out the surrogates (a pair of them is one
character to JSON Schema but would count as two here), and ``format: date`` is an RFC 3339
full date, with the days of each month and February 29 in leap years only (years 0001 to
9999: Python's dates, and so ``jsonschema``'s format check, have no year 0).
"""

from __future__ import annotations

import json
import re

from .._validate import check_int
from .regex import compile_regex

# One character of a JSON string: any character but '"', '\' and controls, or an escape; a \u
# escape of a surrogate (D800-DFFF) is left out.
STRING_CHARACTER = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = INTEGER + r"(\.[0-9]+)?([eE][-+]?[0-9]+)?"
# Years 0001 to 9999 (Python's datetime, and so jsonschema's format check, has no year 0).
_YEAR = "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
FORMATS = {"date": '"(' + _YEAR + "-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
                   + "|" + _YEAR + "-(0[13-9]|1[0-2])-(29|30)"
                   + "|" + _YEAR + "-(0[13578]|1[02])-31"
                   + "|" + _LEAP_YEAR + '-02-29)"'}
SIMPLE = {"boolean": "(true|false)", "null": "null", "number": NUMBER}

JSON_WHITESPACE = r"[ \t\n\r]*"  # what JSON allows between its tokens: any amount of these four
_JSON_WHITESPACE_BYTES = b" \t\n\r"
ANNOTATIONS = {"title", "description", "$schema"}  # change nothing about what is valid
# The keywords each type honours here, and the ones JSON Schema applies to it (a keyword that
# applies to a type but is not honoured, such as a number's minimum, raises).
HONOURED = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "format"},
    "integer": {"minimum"},
    "number": set(),
    "boolean": set(),
    "null": set(),
}
APPLIES = {**HONOURED, "number": {"minimum"}}
KNOWN = ANNOTATIONS | {"type", "enum", "const", "anyOf"} | set().union(*APPLIES.values())


def to_regex(schema: dict, whitespace: str = r"[ ]?", max_depth: int = 5) -> str:
    """The regular expression of JSON texts valid under ``schema`` (the subset above), with
    ``whitespace`` wherever JSON allows whitespace. ``ValueError`` for anything outside the
    subset, and for a ``whitespace`` that matches anything but JSON's whitespace."""
    if not isinstance(schema, dict):
        raise ValueError(f"schema must be a dict (a JSON Schema), got {type(schema).__name__}")
    check_whitespace(whitespace)
    check_int(max_depth, "max_depth", 0)
    return _value(schema, whitespace, max_depth, "schema")


def check_whitespace(whitespace) -> None:
    """``ValueError`` unless ``whitespace`` is a regular expression whose every match is made of
    JSON's whitespace characters (space, \\t, \\n, \\r): its automaton may move on no other byte."""
    if not isinstance(whitespace, str):
        raise ValueError(f"whitespace must be a regular expression (str), got {type(whitespace).__name__}")
    try:
        dfa = compile_regex(whitespace)
    except ValueError as error:
        raise ValueError(f"whitespace: {error}") from None
    others = [byte for byte in range(256) if byte not in _JSON_WHITESPACE_BYTES]
    if (dfa.table[:, others] >= 0).any():
        raise ValueError(f"whitespace must match only JSON's whitespace (space, \\t, \\n, \\r; all of it is "
                         f"JSON_WHITESPACE = {JSON_WHITESPACE!r}), but {whitespace!r} matches other characters")


def _value(schema, ws: str, depth: int, where: str) -> str:
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a dict, got {type(schema).__name__}")
    unknown = sorted(set(schema) - KNOWN)
    if unknown:
        raise ValueError(f"{where}: {unknown[0]!r} is not supported by this JSON Schema subset")
    if "const" in schema or "enum" in schema:
        return _literals(schema, where)
    if "anyOf" in schema:
        _only(schema, {"anyOf"}, "beside anyOf (put it inside each alternative)", where)
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise ValueError(f"{where}: anyOf must be a non-empty list of schemas")
        return "(" + "|".join(_value(s, ws, depth, f"{where}.anyOf[{i}]") for i, s in enumerate(options)) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return _type_list(schema, kind, ws, depth, where)
    if kind not in HONOURED:
        raise ValueError(f"{where}: type {kind!r} is not supported (use object, array, string, integer, number, "
                         "boolean, null, enum, const or anyOf)")
    for key in sorted(set(schema) - ANNOTATIONS - {"type"} - HONOURED[kind]):
        why = "applies to it but is not implemented here" if key in APPLIES[kind] else "does not apply to it"
        supported = ", ".join(sorted(HONOURED[kind])) or "none"
        raise ValueError(f"{where}: {key!r} is not supported for type {kind!r} (it {why}; the keywords "
                         f"a {kind} takes: {supported})")
    if kind in ("object", "array") and depth <= 0:
        raise ValueError(f"{where}: nested deeper than max_depth; recursive schemas are not regular")
    if kind == "object":
        return _object(schema, ws, depth - 1, where)
    if kind == "array":
        return _array(schema, ws, depth - 1, where)
    if kind == "string":
        return _string(schema, where)
    if kind == "integer":
        return _integer(schema, where)
    return SIMPLE[kind]


def _only(schema, allowed: set, what: str, where: str) -> None:
    """``ValueError`` for the first keyword of ``schema`` outside ``allowed`` and the annotations."""
    others = sorted(set(schema) - ANNOTATIONS - allowed)
    if others:
        raise ValueError(f"{where}: {others[0]!r} {what} is not supported")


def _type_list(schema, kinds: list, ws: str, depth: int, where: str) -> str:
    """One alternative per type, each with the keywords that apply to it."""
    if not kinds or any(k not in HONOURED for k in kinds):
        raise ValueError(f"{where}: type must be one of {sorted(HONOURED)} or a non-empty list of them, "
                         f"got {kinds!r}")
    applying = set().union(*(APPLIES[k] for k in kinds))
    for key in sorted(set(schema) - ANNOTATIONS - {"type"} - applying):
        raise ValueError(f"{where}: {key!r} applies to none of the types {kinds}")
    branches = [_value({key: value for key, value in schema.items() if key in ANNOTATIONS or key in APPLIES[k]}
                       | {"type": k}, ws, depth, where) for k in kinds]
    return "(" + "|".join(branches) + ")"


def _literals(schema, where: str) -> str:
    """``const`` or ``enum``: the JSON texts of the values, each checked against ``type``."""
    _only(schema, {"const", "enum", "type"}, "beside const or enum", where)
    if "const" in schema and "enum" in schema:
        raise ValueError(f"{where}: const and enum together are not supported (use one)")
    values = [schema["const"]] if "const" in schema else schema["enum"]
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: enum must be a non-empty list")
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not kinds or any(k not in HONOURED for k in kinds):
            raise ValueError(f"{where}: type must be one of {sorted(HONOURED)} or a non-empty list of them, "
                             f"got {schema['type']!r}")
        for value in values:
            if not any(_is_type(value, k) for k in kinds):
                raise ValueError(f"{where}: the value {value!r} is not of type {schema['type']!r}")
    texts = []
    for value in values:
        try:
            texts.append(json.dumps(value, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: the value {value!r} is not JSON ({error})") from None
    if len(texts) == 1:
        return re.escape(texts[0])
    return "(" + "|".join(re.escape(text) for text in texts) + ")"


def _is_type(value, kind: str) -> bool:
    """Whether a Python value (as ``json.loads`` makes it) is of JSON Schema type ``kind``."""
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    python = {"null": type(None), "boolean": bool, "string": str, "array": (list, tuple), "object": dict}
    return isinstance(value, python[kind])


def _count(schema, key: str, where: str, default: int | None) -> int | None:
    value = schema.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {key} must be a whole number >= 0, got {value!r}")
    return value


def _object(schema, ws: str, depth: int, where: str) -> str:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict):
        raise ValueError(f"{where}: properties must be a dict of schemas, got {type(properties).__name__}")
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise ValueError(f"{where}: required must be a list of property names")
    missing = [name for name in required if name not in properties]
    if missing:
        raise ValueError(f"{where}: required names {missing[0]!r}, which is not in properties (every required "
                         "name needs a schema there)")
    optional = [name for name in properties if name not in required]
    if optional:
        raise ValueError(f"{where}: optional properties are not supported ({optional[0]!r} is not in required)")
    if not isinstance(schema.get("additionalProperties", False), bool):
        raise ValueError(f"{where}: additionalProperties must be true or false (a schema for extra properties "
                         "is not supported); no extra property is ever written")
    members = [re.escape(json.dumps(name, ensure_ascii=False)) + ws + ":" + ws
               + _value(sub, ws, depth, f"{where}.{name}") for name, sub in properties.items()]
    return r"\{" + ws + (ws + "," + ws).join(members) + ws + r"\}"


def _array(schema, ws: str, depth: int, where: str) -> str:
    item = _value(schema.get("items", {"type": "string"}), ws, depth, f"{where}.items")
    low, high = _count(schema, "minItems", where, 0), _count(schema, "maxItems", where, None)
    if high is not None and high < low:
        raise ValueError(f"{where}: maxItems is below minItems")
    if high == 0:
        return r"\[" + ws + r"\]"
    more = "{%d,%s}" % (max(low - 1, 0), "" if high is None else high - 1)
    items = "(" + item + "(" + ws + "," + ws + item + ")" + more + ")"
    return r"\[" + ws + (items if low > 0 else items + "?") + ws + r"\]"


def _string(schema, where: str) -> str:
    if "format" in schema:
        _only(schema, {"type", "format"}, "beside format", where)
        if schema["format"] not in FORMATS:
            raise ValueError(f"{where}: format {schema['format']!r} is not supported (only {sorted(FORMATS)})")
        return FORMATS[schema["format"]]
    low, high = _count(schema, "minLength", where, 0), _count(schema, "maxLength", where, None)
    if high is not None and high < low:
        raise ValueError(f"{where}: maxLength is below minLength")
    if low == 0 and high is None:
        return '"' + STRING_CHARACTER + '*"'
    return '"' + STRING_CHARACTER + "{%d,%s}" % (low, "" if high is None else high) + '"'


def _integer(schema, where: str) -> str:
    minimum = schema.get("minimum")
    if minimum is None:
        return INTEGER
    if isinstance(minimum, bool) or minimum not in (0, 1):
        raise ValueError(f"{where}: minimum {minimum!r} is not supported (only 0 or 1)")
    return "(0|[1-9][0-9]*)" if minimum == 0 else "[1-9][0-9]*"
