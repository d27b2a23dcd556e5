"""The body budget's queue (a2m.bodies): first come, first served, and nothing lost to a cancel."""

from __future__ import annotations

import asyncio

import pytest

from a2m.bodies import SMALL, BodyBudget

pytestmark = pytest.mark.timeout(30)
BIG = SMALL + 1


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_bodies_wait_in_order_and_a_large_one_is_not_passed_over() -> None:
    async def go() -> None:
        budget = BodyBudget(3 * BIG)
        assert budget.take_now(2 * BIG) == 2 * BIG
        order: list[str] = []

        async def take(name: str, size: int) -> None:
            await budget.take(size)
            order.append(name)

        large = asyncio.create_task(take("large", 3 * BIG))
        await _settle()
        medium = asyncio.create_task(take("medium", BIG))  # would fit now, but the large one came first
        await _settle()
        assert order == [] and budget.held == 2 * BIG
        budget.give(2 * BIG)
        await _settle()
        assert order == ["large"]
        budget.give(3 * BIG)
        await asyncio.wait_for(medium, 5)
        await large
        assert order == ["large", "medium"] and budget.held == BIG

    asyncio.run(go())


def test_a_body_larger_than_the_budget_passes_alone_and_small_ones_never_wait() -> None:
    async def go() -> None:
        budget = BodyBudget(2 * BIG)
        assert budget.take_now(10 * BIG) == 2 * BIG  # clamped: it passes, alone
        assert budget.take_now(BIG) is None
        assert budget.take_now(SMALL) == SMALL  # past the budget: a recall never queues behind writes
        budget.give(SMALL)
        budget.give(2 * BIG)
        assert budget.held == 0

    asyncio.run(go())


def test_a_body_larger_than_the_budget_that_must_wait_passes_once_the_budget_is_free() -> None:
    """Clamped when it waits too, not only when it passes at once: a wait for more than the whole
    budget is never granted, and such a body was answered 503 however idle the server became."""
    async def go() -> None:
        budget = BodyBudget(2 * BIG)
        assert budget.take_now(BIG) == BIG
        huge = asyncio.create_task(budget.take(10 * BIG))
        await _settle()
        assert not huge.done()
        budget.give(BIG)
        assert await asyncio.wait_for(huge, 5) == 2 * BIG
        budget.give(2 * BIG)
        assert budget.held == 0

    asyncio.run(go())


def test_a_cancelled_wait_lets_those_behind_it_go_and_keeps_nothing() -> None:
    async def go() -> None:
        budget = BodyBudget(2 * BIG)
        assert budget.take_now(BIG) == BIG
        first = asyncio.create_task(budget.take(2 * BIG))  # waits for the whole budget
        await _settle()
        second = asyncio.create_task(budget.take(BIG))  # fits, but queued behind the first
        await _settle()
        assert not second.done()
        first.cancel()  # the caller went away (its deadline): the one behind it fits, and goes
        assert await asyncio.wait_for(second, 5) == BIG
        assert budget.held == 2 * BIG

    asyncio.run(go())


def test_a_wait_granted_and_then_cancelled_gives_its_bytes_back() -> None:
    async def go() -> None:
        budget = BodyBudget(BIG)
        assert budget.take_now(BIG) == BIG
        waiter = asyncio.create_task(budget.take(BIG))
        await _settle()
        budget.give(BIG)  # granted: its bytes are taken for it before it runs again
        assert budget.held == BIG
        waiter.cancel()  # and cancelled before it ran on
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert budget.held == 0

    asyncio.run(go())


def test_a_wait_cancelled_and_then_reached_by_a_give_before_it_ran_on_keeps_nothing() -> None:
    """A deadline's cancel and another request's answer in one turn of the loop: the give reached the
    cancelled wait at the head of the queue before its task ran on. It set a result on the cancelled
    future (InvalidStateError, raised into the answering request) after counting its bytes as held, and
    the wait then failed to find itself in the queue: those bytes were held for good, a budget that
    shrank with every such race until no large body passed."""
    async def go() -> None:
        budget = BodyBudget(2 * BIG)
        assert budget.take_now(2 * BIG) == 2 * BIG
        waiter = asyncio.create_task(budget.take(BIG))
        behind = asyncio.create_task(budget.take(BIG))
        await _settle()
        waiter.cancel()  # its deadline: the cancel is delivered when the task next runs
        budget.give(2 * BIG)  # in the same turn, another request is answered
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await asyncio.wait_for(behind, 5) == BIG  # the one behind it got the bytes
        assert budget.held == BIG
        budget.give(BIG)
        assert budget.held == 0 and not budget._waiting

    asyncio.run(go())
