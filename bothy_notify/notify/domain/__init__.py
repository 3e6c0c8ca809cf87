"""The pure decision: facts in, routes or a skip reason out.

No IO, no clock reads, no database, no Trio. The rules of SPEC section 6 are
stated at the top of :mod:`.decide` and every one of them lives there.
"""

from bothy_notify.kernel.results import SkipReason
from bothy_notify.notify.domain.decide import HintRules, decide, effective_kind, release_delayed
from bothy_notify.notify.domain.model import (
    DESKTOP_PLATFORMS,
    Decision,
    Delivery,
    Device,
    Fold,
    Hint,
    Policy,
    RecipientFacts,
    Route,
    Skip,
    Via,
    Window,
)
from bothy_notify.notify.domain.window import flush_hint, fold_into, only_deleted, open_window

__all__ = [
    "DESKTOP_PLATFORMS",
    "Decision",
    "Delivery",
    "Device",
    "Fold",
    "Hint",
    "HintRules",
    "Policy",
    "RecipientFacts",
    "Route",
    "Skip",
    "SkipReason",
    "Via",
    "Window",
    "decide",
    "effective_kind",
    "flush_hint",
    "fold_into",
    "only_deleted",
    "open_window",
    "release_delayed",
]
