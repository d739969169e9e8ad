"""The bakery's own Django tests, run with ``manage.py test``."""

from __future__ import annotations

import threading
from unittest import skipIf

from django.db import connection
from django.test import TestCase, TransactionTestCase

from pikku_celery import RunStatus

from .models import Order
from .workflows import approval, bake_order, pikku


def assert_the_run_is_in_djangos_database(test: TransactionTestCase, order_pk: int) -> None:
    run_id = Order.objects.get(pk=order_pk).run_id
    # The run ran in this process (task_always_eager) and is where the ORM is.
    handle = pikku.handle(run_id)
    test.assertIs(handle.status(), RunStatus.COMPLETED)
    test.assertEqual(handle.result()["loaf"], "loaf for 250")
    with connection.cursor() as cursor:
        cursor.execute("SELECT status FROM pikku_workflow_run WHERE id = %s", [run_id])
        test.assertEqual(cursor.fetchall(), [("completed",)])


@skipIf(connection.vendor == "sqlite", "SQLite: the test's transaction locks the tables")
class PlaceOrderTests(TestCase):
    def test_the_view_starts_a_run_in_the_test_database(self) -> None:
        with self.captureOnCommitCallbacks(execute=True):
            response = self.client.post("/orders/", {"cents": 250})
        self.assertEqual(response.status_code, 200)
        self.assertTrue(str(connection.settings_dict["NAME"]).startswith("test_"))
        assert_the_run_is_in_djangos_database(self, response.json()["order"])


class PlaceOrderCommittedTests(TransactionTestCase):
    def test_the_view_starts_a_run_when_its_transaction_commits(self) -> None:
        response = self.client.post("/orders/", {"cents": 250})
        self.assertEqual(response.status_code, 200)
        assert_the_run_is_in_djangos_database(self, response.json()["order"])


class WaitForTheRunTests(TransactionTestCase):
    """wait() listens for the run's end (LISTEN on PostgreSQL, on the test
    database): that connection must be gone before Django drops it."""

    def test_wait_returns_the_output_of_a_settled_run(self) -> None:
        run = bake_order.start({"id": 7, "cents": 300})
        self.assertEqual(run.wait(timeout=30), {"order": 7, "loaf": "loaf for 300"})

    @skipIf(connection.vendor == "sqlite", "SQLite: the in-memory test database is one thread's")
    def test_wait_wakes_when_another_thread_ends_the_run(self) -> None:
        run = approval.start()
        sender = threading.Thread(target=run.signal, args=("approve", "yes"))
        sender.start()
        try:
            self.assertEqual(run.wait(timeout=30), "yes")
        finally:
            sender.join()
