"""`SlotBoard`: which waiting slot a new session takes, and how long a slot waits.

A slot is one offer of a collector's episode to clients (`SessionBroker.play`); a
group is the collector's GRPO group, ``group_size`` slots of one task. The rules
(docs/sessions.md): the first session of a client's group name takes a group no
session has entered; the name's next sessions take that group's other slots, waiting
for them while the collector has not offered them yet (never starting a second group
meanwhile); once the name's groups need no more sessions, it starts another. Unnamed
sessions fill the unnamed groups already begun, then fresh ones. A slot offered again
after a client fault goes to the same kind of session: its name's next one, or the
next unnamed one. A named group's slots wait a bounded time for their name's session
(``fill_timeout_s``; ``reoffer_timeout_s`` for a slot offered again), then end unfilled.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any


@dataclasses.dataclass(eq=False)
class Slot:
    """One offer of a collector's episode, waiting for a client."""

    session_id: str
    group: int
    member: int
    claimed: asyncio.Future[Any]  # the session that takes it (`OpenSession`)
    reoffered: bool = False  # offered again after a client fault
    # The wait for a client; given a deadline once the slot's group belongs to a name.
    wait: asyncio.Timeout | None = None


@dataclasses.dataclass
class GroupState:
    """A collector group some client has opened a session in."""

    name: str | None  # the clients' group name; None: filled by unnamed sessions
    playing: int = 0  # members a client holds now
    ended: int = 0  # members whose episode ended for good (at group_size: forgotten)


class SlotBoard:
    def __init__(self, *, group_size: int, fill_timeout_s: float, reoffer_timeout_s: float):
        self.group_size = group_size
        self.fill_timeout_s = fill_timeout_s
        self.reoffer_timeout_s = reoffer_timeout_s
        self._waiting: dict[int, collections.OrderedDict[int, Slot]] = {}  # group -> members
        self._groups: dict[int, GroupState] = {}  # groups some client has opened a session in
        self._named: dict[str, list[int]] = {}  # client group name -> its groups, oldest first

    @property
    def waiting(self) -> int:
        return sum(len(m) for m in self._waiting.values())

    def add(self, slot: Slot) -> None:
        """``slot`` waits for a client; call inside its ``wait`` (the deadline is set)."""
        self._waiting.setdefault(slot.group, collections.OrderedDict())[slot.member] = slot
        group = self._groups.get(slot.group)
        if group is not None and group.name is not None:
            self._set_deadline(slot)

    def remove(self, slot: Slot) -> None:
        """``slot`` waits no more (taken, given up, or the run stopped)."""
        members = self._waiting.get(slot.group)
        if members is not None and members.get(slot.member) is slot:
            del members[slot.member]
            if not members:
                del self._waiting[slot.group]

    def take(self, name: str | None) -> Slot | None:
        """The slot a new session of ``name`` takes now (counted as played), or None."""
        slot = self._free_slot(name)
        if slot is None:
            return None
        self.remove(slot)
        state = self._groups.get(slot.group)
        if state is None:
            state = self._groups[slot.group] = GroupState(name=name)
            if name is not None:
                # The name holds the group until it needs no more sessions: the rest may
                # not be offered yet (the collector starts episodes as places free up).
                self._named.setdefault(name, []).append(slot.group)
                for waiting in self._waiting.get(slot.group, {}).values():
                    self._set_deadline(waiting)
        state.playing += 1
        return slot

    def session_over(self, group: int) -> None:
        """A session of ``group`` ended (its slot may be offered again)."""
        self._groups[group].playing -= 1

    def member_ended(self, group: int) -> None:
        """A member of ``group`` ended for good; with all of them, the group is forgotten
        (its name may start a new group)."""
        state = self._groups.get(group)
        if state is None:
            return
        state.ended += 1
        if state.ended < self.group_size:
            return
        del self._groups[group]
        if state.name is not None:
            self._named[state.name].remove(group)
            if not self._named[state.name]:
                del self._named[state.name]

    def _set_deadline(self, slot: Slot) -> None:
        if slot.wait is not None:
            wait_s = self.reoffer_timeout_s if slot.reoffered else self.fill_timeout_s
            slot.wait.reschedule(asyncio.get_running_loop().time() + wait_s)

    def _needs_sessions(self, group: int) -> bool:
        """Members of the taken ``group`` still to be played: waiting, or not offered yet."""
        state = self._groups[group]
        return state.playing + state.ended < self.group_size

    def _free_slot(self, name: str | None) -> Slot | None:
        if name is not None and name in self._named:
            # A member (maybe offered again) of a group the name holds; while one of them
            # still needs sessions, never a new group.
            held = self._named[name]
            for g in held:
                if slot := self._offered_in(g):
                    return slot
            if any(self._needs_sessions(g) for g in held):
                return None
        if name is None:
            # Unnamed sessions first fill the unnamed groups already begun.
            for g, state in self._groups.items():
                if state.name is None and (slot := self._offered_in(g)):
                    return slot
        # A group no one has opened a session in yet.
        fresh = (self._offered_in(g) for g in self._waiting if g not in self._groups)
        return next((slot for slot in fresh if slot is not None), None)

    def _offered_in(self, group: int) -> Slot | None:
        """A slot of ``group`` waiting for a client (not one whose wait just ended, its
        task not yet woken to take it back)."""
        members = self._waiting.get(group)
        if not members:
            return None
        return next((s for s in members.values() if not s.claimed.done()), None)


__all__ = ["GroupState", "Slot", "SlotBoard"]
