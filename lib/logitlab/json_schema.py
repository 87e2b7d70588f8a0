"""From a JSON Schema to a regular expression, for constrained decoding.

Chapter 10 ("When the output must match a pattern") explains this module.

A JSON value of a bounded shape is a regular language: ``to_regex`` writes the pattern, which
``logitlab.Constraint`` then compiles to a token mask. The subset covers what structured-output
requests mostly use:

* ``object`` with ``properties``, every one of them ``required`` (written in the schema's
  order); ``string`` (``minLength``, ``maxLength``, ``format: date``), ``integer``
  (``minimum`` 0 or 1), ``number``, ``boolean``, ``null``; ``enum`` and ``const`` of any JSON
  values; ``array`` with ``items``, ``minItems``, ``maxItems``; ``anyOf`` and lists of types;
* nesting up to ``max_depth`` levels.

Anything else raises ``ValueError`` naming it. Some of it cannot be a regular expression at
all: a recursive schema (``$ref`` to itself) describes nesting of any depth, which needs a
stack (a grammar); the rest (optional properties, numeric ranges, string patterns) is regular
but left out to keep the compiler short.

``whitespace`` is the pattern allowed wherever JSON allows whitespace. The default, at most one
space, keeps outputs compact; ``r"\\s*"`` (what JSON itself allows) lets a model emit spaces
and newlines for ever, which chapter 10 shows on the real model.
"""

from __future__ import annotations

import json
import re

STRING_CHARACTER = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = INTEGER + r"(\.[0-9]+)?([eE][-+]?[0-9]+)?"
FORMATS = {"date": r'"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"'}
SIMPLE = {"boolean": "(true|false)", "null": "null", "number": NUMBER}
KNOWN = {"type", "properties", "required", "items", "minItems", "maxItems", "minLength", "maxLength", "enum",
         "const", "anyOf", "minimum", "format", "additionalProperties", "title", "description", "$schema"}


def to_regex(schema: dict, whitespace: str = r"[ ]?", max_depth: int = 5) -> str:
    """The regular expression of every JSON text valid under ``schema`` (the subset above)."""
    if not isinstance(schema, dict):
        raise ValueError(f"schema must be a dict (a JSON Schema), got {type(schema).__name__}")
    if not isinstance(whitespace, str):
        raise ValueError(f"whitespace must be a regular expression (str), got {type(whitespace).__name__}")
    return _value(schema, whitespace, max_depth, "schema")


def _value(schema, ws: str, depth: int, where: str) -> str:
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a dict, got {type(schema).__name__}")
    unknown = sorted(set(schema) - KNOWN)
    if unknown:
        raise ValueError(f"{where}: {unknown[0]!r} is not supported by this JSON Schema subset")
    if "const" in schema:
        return re.escape(json.dumps(schema["const"], ensure_ascii=False))
    if "enum" in schema:
        if not isinstance(schema["enum"], list) or not schema["enum"]:
            raise ValueError(f"{where}: enum must be a non-empty list")
        return "(" + "|".join(re.escape(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]) + ")"
    if "anyOf" in schema:
        return "(" + "|".join(_value(s, ws, depth, f"{where}.anyOf[{i}]") for i, s in enumerate(schema["anyOf"])) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "(" + "|".join(_value({**schema, "type": k}, ws, depth, where) for k in kind) + ")"
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
    if kind in SIMPLE:
        return SIMPLE[kind]
    raise ValueError(f"{where}: type {kind!r} is not supported (use object, array, string, integer, number, "
                     "boolean, null, enum, const or anyOf)")


def _object(schema, ws: str, depth: int, where: str) -> str:
    properties = schema.get("properties", {})
    optional = [name for name in properties if name not in schema.get("required", [])]
    if optional:
        raise ValueError(f"{where}: optional properties are not supported ({optional[0]!r} is not in required)")
    members = [re.escape(json.dumps(name, ensure_ascii=False)) + ws + ":" + ws
               + _value(sub, ws, depth, f"{where}.{name}") for name, sub in properties.items()]
    return r"\{" + ws + (ws + "," + ws).join(members) + ws + r"\}"


def _array(schema, ws: str, depth: int, where: str) -> str:
    item = _value(schema.get("items", {"type": "string"}), ws, depth, f"{where}.items")
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    if high is not None and high < low:
        raise ValueError(f"{where}: maxItems is below minItems")
    if high == 0:
        return r"\[" + ws + r"\]"
    more = "{%d,%s}" % (max(low - 1, 0), "" if high is None else high - 1)
    items = "(" + item + "(" + ws + "," + ws + item + ")" + more + ")"
    return r"\[" + ws + (items if low > 0 else items + "?") + ws + r"\]"


def _string(schema, where: str) -> str:
    if "format" in schema:
        if schema["format"] not in FORMATS:
            raise ValueError(f"{where}: format {schema['format']!r} is not supported (only {sorted(FORMATS)})")
        return FORMATS[schema["format"]]
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if low == 0 and high is None:
        return '"' + STRING_CHARACTER + '*"'
    return '"' + STRING_CHARACTER + "{%d,%s}" % (low, "" if high is None else high) + '"'


def _integer(schema, where: str) -> str:
    minimum = schema.get("minimum")
    if minimum is None:
        return INTEGER
    if minimum == 0:
        return "(0|[1-9][0-9]*)"
    if minimum == 1:
        return "[1-9][0-9]*"
    raise ValueError(f"{where}: minimum {minimum!r} is not supported (only 0 or 1)")
