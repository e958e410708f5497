"""Every dotted key of a config model, for fuzzers that should hit real keys most of the time."""

from __future__ import annotations

from typing import Any

from sqe._config_loader import ConfigSection, is_section


def dotted_keys(model: type[ConfigSection], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, info in model.model_fields.items():
        annotation: Any = info.annotation
        key = f"{prefix}{name}"
        keys.append(key)
        if is_section(annotation):
            keys.extend(dotted_keys(annotation, f"{key}."))
    return keys
