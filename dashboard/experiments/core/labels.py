"""What a run's owner says of it: tags to filter the list by, and a free text note."""

from __future__ import annotations

from typing import Any, Final

from dashboard.experiments.models import Experiment

MAX_TAGS: Final = 20
MAX_TAG_CHARS: Final = 40
MAX_NOTE_CHARS: Final = 5000
LABEL_FIELDS: Final = ("tags", "note")


def labels_check(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The fields to write (tags de-duplicated and stripped) and the errors, by field."""
    errors: dict[str, list[str]] = {}
    fields: dict[str, Any] = {}
    for key in payload:
        if key not in LABEL_FIELDS:
            errors[key] = [f"only {' and '.join(LABEL_FIELDS)} can be changed"]
    if "note" in payload:
        note = payload["note"]
        if not isinstance(note, str):
            errors["note"] = ["must be a string"]
        elif len(note) > MAX_NOTE_CHARS:
            errors["note"] = [f"at most {MAX_NOTE_CHARS} characters, not {len(note)}"]
        else:
            fields["note"] = note
    if "tags" in payload:
        tags, why = tags_clean(payload["tags"])
        if why:
            errors["tags"] = [why]
        else:
            fields["tags"] = tags
    return fields, errors


def tags_clean(value: Any) -> tuple[list[str], str]:
    """The tags in their order without repeats, or the reason they cannot be taken."""
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        return [], "must be a list of strings"
    tags = list(dict.fromkeys(tag.strip() for tag in value if tag.strip()))
    if len(tags) > MAX_TAGS:
        return [], f"at most {MAX_TAGS} tags, not {len(tags)}"
    long = [tag for tag in tags if len(tag) > MAX_TAG_CHARS]
    if long:
        return [], f"a tag has at most {MAX_TAG_CHARS} characters ({long[0][:50]!r}...)"
    return tags, ""


def experiment_labels_update(*, experiment: Experiment, fields: dict[str, Any]) -> None:
    """Write checked tags and note (``labels_check``); nothing else of the run changes."""
    for name, value in fields.items():
        setattr(experiment, name, value)
    Experiment.objects.filter(pk=experiment.pk).update(**fields)
