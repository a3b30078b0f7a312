"""BodyBudget: large bodies in flight add up to at most the limit; the next one waits until bytes come back."""

import anyio

from exo.api.body_budget import BodyBudget


async def test_a_body_that_does_not_fit_waits_until_bytes_come_back() -> None:
    budget = BodyBudget(100)
    assert await budget.take(60) == 60
    taken: list[int] = []

    async def second() -> None:
        taken.append(await budget.take(60))

    async with anyio.create_task_group() as group:
        group.start_soon(second)
        await anyio.sleep(0.05)
        assert taken == []  # 60 + 60 is over the limit
        assert await budget.take(40) == 40  # what fits goes ahead
        await budget.give_back(60)
        await budget.give_back(40)
    assert taken == [60]
    assert budget.used == 60


async def test_a_claim_over_the_limit_takes_the_whole_limit() -> None:
    budget = BodyBudget(100)
    assert await budget.take(10**9) == 100
    await budget.give_back(100)
    await budget.settle()
    assert budget.used == 0
