"""apimachinery's name validation and ``field.Error`` formatting, with upstream's words.

Ports ``k8s.io/apimachinery/pkg/api/validate/content`` (where v1.37 keeps label keys, label
values and DNS subdomains, lengths counted in bytes), ``pkg/util/validation``'s
``IsDNS1123Label`` (lengths in characters) and the ``String()`` of ``pkg/util/validation/field``
errors. Every module that checks a name a user typed checks it here, so tally refuses exactly
the names the API server refuses and says so in the API server's sentence; a second regex
would drift (one copy here has already lacked the "must not contain dots" case).

Each ``is_*`` returns upstream's list of messages: empty when the value is valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Final

DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_MAX_LENGTH: Final = 63
DNS1123_SUBDOMAIN_FMT: Final = f"{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*"
DNS1123_SUBDOMAIN_MAX_LENGTH: Final = 253
QUALIFIED_NAME_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_MAX_LENGTH: Final = 63
LABEL_VALUE_FMT: Final = f"({QUALIFIED_NAME_FMT})?"
LABEL_VALUE_MAX_LENGTH: Final = 63

_DNS1123_LABEL_ERR: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_ERR: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character"
)
_QUALIFIED_NAME_ERR: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_LABEL_VALUE_ERR: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character"
)

_DNS1123_LABEL_RE: Final = re.compile(DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN_RE: Final = re.compile(DNS1123_SUBDOMAIN_FMT)
_QUALIFIED_NAME_RE: Final = re.compile(QUALIFIED_NAME_FMT)
_LABEL_VALUE_RE: Final = re.compile(LABEL_VALUE_FMT)


def regex_error(message: str, fmt: str, *examples: str) -> str:
    """``RegexError``, double spaces included (``"'a',  or 'b', "``)."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(length: int, unit: str = "bytes") -> str:
    """``MaxLenError``: ``content`` counts bytes; ``util/validation`` still says characters."""
    return f"must be no more than {length} {unit}"


def is_dns1123_label(value: str) -> list[str]:
    """``IsDNS1123Label``: a namespace's name, a Service's, a label of a host name."""
    errors: list[str] = []
    if len(value) > DNS1123_LABEL_MAX_LENGTH:
        errors.append(max_len_error(DNS1123_LABEL_MAX_LENGTH, "characters"))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        if _DNS1123_SUBDOMAIN_RE.fullmatch(value):
            # A valid subdomain that is not a valid label: with the length checked, dots.
            errors.append("must not contain dots")
        else:
            errors.append(regex_error(_DNS1123_LABEL_ERR, DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errors


def is_dns1123_subdomain(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: most objects' names, API groups, label key prefixes."""
    errors: list[str] = []
    if len(value.encode()) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(regex_error(_DNS1123_SUBDOMAIN_ERR, DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def is_qualified_name(value: str) -> list[str]:
    """``IsQualifiedName`` (``IsLabelKey``): ``[prefix/]name``, a label key, an annotation's."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend(f"prefix part {message}" for message in is_dns1123_subdomain(prefix))
    else:
        return [
            "a valid label key "
            + regex_error(_QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name.encode()) > QUALIFIED_NAME_MAX_LENGTH:
        errors.append(f"name part {max_len_error(QUALIFIED_NAME_MAX_LENGTH)}")
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errors.append(
            "name part "
            + regex_error(_QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errors


def is_label_value(value: str) -> list[str]:
    """``IsLabelValue``: empty, or a qualified name's name part."""
    errors: list[str] = []
    if len(value.encode()) > LABEL_VALUE_MAX_LENGTH:
        errors.append(max_len_error(LABEL_VALUE_MAX_LENGTH))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errors.append(
            regex_error(_LABEL_VALUE_ERR, LABEL_VALUE_FMT, "MyValue", "my_value", "12345")
        )
    return errors


# --- field.Error -----------------------------------------------------------------------------
# ``field.Error.Error()``: ``<path>: <type>: <value>: <detail>``, the value as JSON.


def show(value: object) -> str:
    """A bad value as ``field.Error`` prints it: JSON, maps with sorted keys, ``null`` if unset."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def required(path: str, detail: str = "") -> str:
    """``field.Required``."""
    return f"{path}: Required value" + (f": {detail}" if detail else "")


def forbidden(path: str, detail: str) -> str:
    """``field.Forbidden``."""
    return f"{path}: Forbidden: {detail}"


def invalid(path: str, shown: str, detail: str) -> str:
    """``field.Invalid``; ``shown`` is the value already printed (:func:`show`)."""
    return f"{path}: Invalid value: {shown}: {detail}"


def duplicate(path: str, value: object) -> str:
    """``field.Duplicate``."""
    return f"{path}: Duplicate value: {show(value)}"


def not_supported(path: str, value: object, supported: Sequence[str]) -> str:
    """``field.NotSupported``."""
    listed = ", ".join(json.dumps(v) for v in supported)
    return f"{path}: Unsupported value: {show(value)}: supported values: {listed}"
