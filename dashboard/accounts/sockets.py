"""Open sockets told when their user's access ends or narrows.

A socket outlives the handshake that checked its login, so what ends or narrows a user's access
tells every socket of the user, each in its user's group, to check it again at once
(`access.check`, ws_auth.socket_user): a logout (the ended session's sockets close, by its key's
digest, since Django flushes the session after its signal), a password change, a deactivation, a
loss of staff status, a deletion, the user's tokens revoked. What changes without a signal (a
queryset update, a token past its expiry) the sockets find at their periodic check
(TRAINYARD_SOCKET_RECHECK_SECONDS).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

# The fields of a user whose change can end or narrow access: the session's login hash is the
# password's, and the owner-or-staff rule reads is_staff.
ACCESS_FIELDS = ("password", "is_active", "is_staff")
# The message's type: the consumers' `access_check` takes it (experiments/web/socket_login.py).
ACCESS_CHECK = "access.check"
_BEFORE = "_access_before"  # where pre_save leaves the row as it was, for post_save


def user_group(user_id: int) -> str:
    """The channel group of every socket the user has open, by session or token."""
    return f"user-{user_id}"


def session_digest(session_key: str) -> str:
    # The key itself never travels through the channel layer: it is a login.
    return hashlib.sha256(session_key.encode("ascii", "replace")).hexdigest()


def sockets_tell(*, group: str, message: dict[str, Any]) -> None:
    """Send to a group's sockets. The change is committed whatever happens here: a socket that
    misses the message finds the change at its next periodic check or fails its next
    handshake, so an unreachable channel layer only logs."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:
        log.warning("channel layer unreachable; the sockets of %s are told later", group)


def sockets_recheck(*, user_id: int, ended_session: str | None = None) -> None:
    """Once the change is committed, every socket of the user checks its access again; those of
    `ended_session` (a session key) close at once."""
    message = {
        "type": ACCESS_CHECK,
        "ended_session": session_digest(ended_session) if ended_session else None,
    }
    group = user_group(user_id)
    transaction.on_commit(lambda: sockets_tell(group=group, message=message))


# ---- signal handlers (AccountsConfig.ready connects them) ----


def user_logged_out_sockets(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or not user.pk:
        return
    session = getattr(request, "session", None)
    sockets_recheck(user_id=user.pk, ended_session=getattr(session, "session_key", None))


def user_saving(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    """pre_save: the row as it was, where this save may change a field of ACCESS_FIELDS (a
    login's save of last_login does not)."""
    if instance.pk is None or (update_fields and not set(update_fields) & set(ACCESS_FIELDS)):
        return
    before = sender.objects.filter(pk=instance.pk).values(*ACCESS_FIELDS).first()
    setattr(instance, _BEFORE, before)


def user_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    before = instance.__dict__.pop(_BEFORE, None)
    if before is not None and access_narrowed(before=before, after=instance):
        sockets_recheck(user_id=instance.pk)


def access_narrowed(*, before: dict[str, Any], after: Any) -> bool:
    """A new password, or a flag of access taken away (one given needs no socket closed)."""
    if before["password"] != after.password:
        return True
    return any(before[flag] and not getattr(after, flag) for flag in ("is_active", "is_staff"))


def user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    sockets_recheck(user_id=instance.pk)
