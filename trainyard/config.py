"""Where the server and the token come from: flags, then TRAINYARD_URL / TRAINYARD_TOKEN, then
the file `trainyard login` writes (~/.config/trainyard/config.json, mode 0600). The saved token
goes only to the saved server; another URL needs its own --token or TRAINYARD_TOKEN."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Profile:
    url: str
    token: str


def config_path() -> Path:
    explicit = os.environ.get("TRAINYARD_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainyard" / "config.json"


def config_load() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def config_save(*, url: str, token: str) -> Path:
    """Write the file readable by its owner alone, created so from the start (never a moment
    with the token readable by others), then moved into place."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump({"url": url, "token": token}, out, indent=2)
        out.write("\n")
    os.chmod(temporary, 0o600)  # an older file of that name may have had other bits
    os.replace(temporary, path)
    return path


def url_normalize(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"the server URL starts with http:// or https://, not {url!r}")
    return url


def _saved_token(url: str, saved: dict[str, str]) -> str:
    """The saved token, only for the server it was saved with: sent to any other URL (a typo,
    a TRAINYARD_URL left over, a URL someone suggested) it would hand that server the key."""
    if not saved.get("token"):
        raise ConfigError("no token: run `trainyard login URL`, or give --token or TRAINYARD_TOKEN")
    saved_url = saved.get("url", "")
    try:
        same = url_normalize(saved_url) == url
    except ConfigError:
        same = False
    if not same:
        raise ConfigError(
            f"no token for {url}: the saved token is for {saved_url or 'another server'} and is "
            f"sent there only; give --token or TRAINYARD_TOKEN, or run `trainyard login {url}`"
        )
    return saved["token"]


def profile_resolve(*, url: str | None, token: str | None) -> Profile:
    url = url or os.environ.get("TRAINYARD_URL")
    token = token or os.environ.get("TRAINYARD_TOKEN")
    saved = config_load() if not (url and token) else {}
    url = url or saved.get("url")
    if not url:
        raise ConfigError("no server: run `trainyard login URL`, or give --url or TRAINYARD_URL")
    url = url_normalize(url)
    token = token or _saved_token(url, saved)
    return Profile(url=url, token=token.strip())
