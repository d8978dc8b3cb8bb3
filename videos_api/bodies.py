"""The fields of a POST body as the Videos API reads them: a JSON object, a multipart form or an
urlencoded form, every text field UTF-8. A body that is not (a lone surrogate escape "\\ud800" in
JSON, bytes that are not UTF-8 in a form field), a JSON body nested deeper than MAX_JSON_DEPTH or
a key sent twice is refused with 400 INVALID_ARG naming the field, before anything is stored: a
stored job's text always renders (the list and the job's GET cannot fail on it).
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from . import fields

MAX_JSON_DEPTH = 8  # a create body nests 3 deep at most ({"input_reference": {"image_url": ...}}, lists)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object of `pairs` (json.loads' object_pairs_hook). Raises ApiError 400 INVALID_ARG
    naming a key sent twice, as form_fields does for a repeated form field (json alone would keep
    the last value)."""
    body = {}
    for key, value in pairs:
        if key in body:
            raise fields.invalid(f"{key} was sent twice: it takes one value", key)
        body[key] = value
    return body


def _not_utf8(text: str) -> int | None:
    """The index of the first character of `text` that UTF-8 cannot encode (a lone surrogate,
    U+D800..U+DFFF), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def check_json(body: object) -> None:
    """Raise ApiError 400 INVALID_ARG for a parsed JSON body nested deeper than MAX_JSON_DEPTH or
    holding a string (key or value) that is not UTF-8 text, naming its top-level field: "prompt
    holds a lone surrogate U+D800 at character 11: text must be UTF-8"."""
    stack = [(body, None, 1)]
    while stack:
        value, field, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise fields.invalid(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", field)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            at = _not_utf8(key) if isinstance(key, str) else None
            if at is not None and field is None:  # a top-level field's own name: shown escaped
                raise fields.invalid(f"the field name {ascii(key)} {_surrogate(key, at)}")
            name = field or key  # the top-level field the value belongs to
            for text in (key, item):
                at = _not_utf8(text) if isinstance(text, str) else None
                if at is not None:
                    raise fields.invalid(f"{name} {_surrogate(text, at)}", name)
            stack.append((item, name, depth + 1))


def _surrogate(text: str, at: int) -> str:
    return f"holds a lone surrogate U+{ord(text[at]):04X} at character {at}: text must be UTF-8"


def _text(name: str | None, data: bytes) -> str:
    """The bytes of form field `name`'s value (None: of a field's name) as UTF-8 text; ApiError
    400 INVALID_ARG naming the field otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        where = f"byte 0x{data[error.start]:02X} at byte {error.start}"
        if name is None:
            raise fields.invalid(f"a field name is not UTF-8 text: {where}") from None
        raise fields.invalid(f"{name} is not UTF-8 text: {where}", name) from None


class _Utf8MultiPartParser(MultiPartParser):
    """Starlette's multipart parser, but a text field that is not UTF-8 raises ApiError 400
    (Starlette decodes it as Latin-1 instead)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            _text(part.field_name, bytes(part.data))
        super().on_part_end()


async def read_form(request: Request, max_part_bytes: int) -> dict:
    """The fields of a POST body: a JSON object, or multipart / urlencoded form fields
    (fields.form_fields; an uploaded file's value its bytes). max_part_bytes: the largest
    multipart field that is not a file (a data URL), in bytes. Raises ApiError 400 INVALID_ARG
    for a body that is not valid JSON, not an object, nested too deep, or holds text that is not
    UTF-8 (module docstring), a malformed form, or another Content-Type."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            body = json.loads(await request.body(), object_pairs_hook=_unique_keys)
        except RecursionError:
            raise fields.invalid(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels") from None
        except ValueError as error:
            raise fields.invalid(f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise fields.invalid("the JSON body must be an object")
        check_json(body)
        return body
    if kind == "application/x-www-form-urlencoded":
        # bytes that are not UTF-8, raw or percent-encoded, are kept as surrogate escapes until _text
        text = (await request.body()).decode("utf-8", "surrogateescape")
        pairs = parse_qsl(text, keep_blank_values=True, errors="surrogateescape")
        items = [(_text(None, k.encode("utf-8", "surrogateescape")), v) for k, v in pairs]
        return fields.form_fields([(k, _text(k, v.encode("utf-8", "surrogateescape"))) for k, v in items])
    if kind == "multipart/form-data":
        parser = _Utf8MultiPartParser(request.headers, request.stream(), max_part_size=max_part_bytes)
        try:
            form = await parser.parse()
        except MultiPartException as error:
            raise fields.invalid(f"the multipart body is malformed: {error.message}") from None
        try:
            items = [
                (key, await value.read() if isinstance(value, UploadFile) else value)
                for key, value in form.multi_items()
            ]
        finally:
            await form.close()
        return fields.form_fields(items)
    raise fields.invalid(
        f"Content-Type {kind or 'none'!r} is not served: "
        "send application/json, multipart/form-data or application/x-www-form-urlencoded"
    )
