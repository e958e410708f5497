"""The worker's environment lockdown: only ticket credentials may ever sign a request.

pyarrow's S3 filesystem falls back to the AWS SDK's default chain (environment keys, profile files, web identity,
instance metadata) whenever it is given no keys. A worker never builds a FileIO without ticket keys, and on top of
that it removes every ``AWS_*`` variable at start and disables profile files and IMDS.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

# Only the ticket's keys may ever sign a request: no profile files, no instance metadata, no env keys.
LOCKED_ENVIRONMENT = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}


def scrub_environment(environ: MutableMapping[str, str]) -> list[str]:
    """Remove every ``AWS_*`` variable (keys, tokens, profiles, role and web-identity settings, endpoints) and
    disable profile files and IMDS. Returns the names removed (never values)."""
    removed = sorted(name for name in environ if name.upper().startswith("AWS_"))
    for name in removed:
        del environ[name]
    environ.update(LOCKED_ENVIRONMENT)
    return removed


def ambient_credentials_disabled(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is locked down as :func:`scrub_environment` leaves it."""
    extra = [name for name in environ if name.upper().startswith("AWS_") and name not in LOCKED_ENVIRONMENT]
    return not extra and all(environ.get(name) == value for name, value in LOCKED_ENVIRONMENT.items())
