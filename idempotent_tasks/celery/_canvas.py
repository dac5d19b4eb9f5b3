"""Keys for canvases: every signature's key derives from its parent's key, its task name and
its position, so sending the same keyed canvas again re-runs nothing that completed.

``keyed(chain(a.s(1), group(b.s(), c.s())), key="order-42")`` gives ``a`` the key
``derive_key("order-42", "tasks.a", "0")``, the group ``derive_key("order-42", "celery.group",
"1")`` and ``b`` / ``c`` keys derived from the group's (positions ``0`` and ``1``); a chord's
body uses the position ``body``.  Derived keys are the hex SHA-256 of the length-prefixed
parts: collision-free between different (parent, name, position) triples, and 64 characters
whatever the parent's length.  A signature that already carries a key (``idempotency_key``
option or header) keeps it.  The keys travel as message headers, so every producer path
(chain steps, chord callbacks) keeps them.
"""

from __future__ import annotations

from typing import Any

from celery.canvas import Signature, _chain, chain, chord, group, maybe_signature

from .._core import keys
from ._delivery import KEY_HEADER, TENANT_HEADER


def derive_key(parent: str, name: str, position: str) -> str:
    """The key of the child at ``position`` named ``name`` under the key ``parent``.

    Args:
        parent: The key of the canvas the child belongs to.
        name: The child task's name.
        position: Where the child sits in the canvas (e.g. ``"0"``, ``"1.2"``).

    Returns:
        A key that is the same on every delivery of the same canvas and differs for any
        other (parent, name, position).
    """
    return keys.derive_key(parent, name, position)


def keyed(canvas: Any, key: str, *, tenant: str | None = None) -> Any:
    """A copy of ``canvas`` (signature, chain, group or chord) with a key on every task.

    The top-level object owns ``key`` (a single signature uses it as is); ``tenant`` is set on
    every task that has none.  The original canvas is not modified.

    Args:
        canvas: A Celery signature, chain, group or chord.
        key: The idempotency key of the whole canvas, made once per logical operation.
        tenant: The tenant set on every task that has none.

    Returns:
        The keyed copy, to ``apply_async()`` or ``delay()`` as usual.
    """
    return _assign(maybe_signature(canvas), key, tenant)


def idempotent_chain(key: str, *signatures: Any, tenant: str | None = None) -> Any:
    """``keyed(chain(*signatures), key, tenant=tenant)``.

    Args:
        key: The idempotency key of the chain.
        *signatures: The chain's signatures, in order.
        tenant: The tenant set on every task that has none.

    Returns:
        The keyed chain.
    """
    return keyed(chain(*signatures), key, tenant=tenant)


def _children(parent_key: str, tasks: Any, tenant: str | None, app: Any) -> list[Any]:
    out = []
    for position, child in enumerate(tasks):
        sig = maybe_signature(child, app=app)
        own = derive_key(parent_key, _name(sig), str(position))
        out.append(_assign(sig, own, tenant))
    return out


def _assign(sig: Signature, own_key: str, tenant: str | None) -> Any:
    app = sig._app
    new = sig.clone()
    if isinstance(new, chord):
        new.kwargs["header"] = _children(own_key, list(sig.tasks), tenant, app)
        body = maybe_signature(sig.body, app=app)
        new.kwargs["body"] = _assign(body, derive_key(own_key, _name(body), "body"), tenant)
    elif isinstance(new, (_chain, group)):
        new.kwargs["tasks"] = _children(own_key, list(sig.tasks), tenant, app)
    else:
        headers = dict(new.options.get("headers") or {})
        if new.options.get("idempotency_key") is None:
            headers.setdefault(KEY_HEADER, own_key)
        if tenant is not None and new.options.get("tenant") is None:
            headers.setdefault(TENANT_HEADER, tenant)
        new.options["headers"] = headers
    return new


def _name(sig: Signature) -> str:
    return str(sig.task or type(sig).__name__)
