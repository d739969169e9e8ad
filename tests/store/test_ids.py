"""Step ids and attempt task ids are stored and compared across releases:
they must stay ``uuid.uuid5`` of their namespace, however they are computed."""

from __future__ import annotations

import random
import uuid

import pytest

from pikku_celery.celery.step_body import attempt_task_id
from pikku_celery.model.values import StepKind, StepState, StepStatus, step_id_for, uuid5_str

NAMES = ["", "s0", "charge card", "ü€😀", "a" * 300, "with-dash_and space"]


@pytest.mark.parametrize("name", NAMES)
def test_step_ids_are_uuid5_of_the_run_and_the_step_name(name: str) -> None:
    for _ in range(50):
        run = uuid.uuid4()
        spellings = (str(run), str(run).upper(), "{" + str(run) + "}", f"urn:uuid:{run}", run.hex)
        for spelled in spellings:
            assert step_id_for(spelled, name) == str(uuid.uuid5(run, name))


def test_attempt_task_ids_are_uuid5_of_the_step_and_the_attempt() -> None:
    rng = random.Random(5)
    for attempt in range(1, 20):
        step_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        step = StepState(step_id, "r", "s", 0, StepKind.TASK, StepStatus.RUNNING, attempt=attempt)
        expected = uuid.uuid5(uuid.UUID(step_id), f"attempt-{attempt}")
        assert attempt_task_id(step) == str(expected)


@pytest.mark.parametrize("bad", ["x" * 36, "", "123", "5d1f6f0e-7a53-4c55-9a4e-3b8c1f2d9e1"])
def test_a_namespace_that_is_no_uuid_is_refused_as_uuid_refuses_it(bad: str) -> None:
    with pytest.raises(ValueError, match="badly formed hexadecimal UUID string"):
        uuid5_str(bad, "a")
